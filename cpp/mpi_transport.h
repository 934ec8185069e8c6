// ControlTransport over an MPI communicator, with nonblocking collectives
// waited on by a Poller (so waiting for late peers neither burns a core nor
// blocks shutdown/stall handling).
#pragma once

#include <mpi.h>

#include "control_transport.h"
#include "mpi_util.h"
#include "poller.h"

namespace hvdcompat {

class MpiTransport : public ControlTransport {
 public:
  MpiTransport(MPI_Comm comm, const MpiOps* ops, Poller* poller);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void CombineFlags(std::vector<uint64_t>& words) override;
  void GatherBlobs(const std::string& mine, size_t max_bytes,
                   std::vector<std::string>* all) override;
  void BroadcastBlob(std::string* blob) override;

 private:
  MPI_Comm comm_;
  const MpiOps* ops_;
  Poller* poller_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<char> gather_send_;
  std::vector<char> gather_recv_;
};

}  // namespace hvdcompat
