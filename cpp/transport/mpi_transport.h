// ControlTransport over an MPI communicator, with nonblocking collectives
// waited on by a Poller (so waiting for late peers neither burns a core nor
// blocks shutdown/stall handling).
//
// Note [Abandoned requests]: when a wait is aborted (stall shutdown,
// shutdown while a peer never comes), the posted collective stays in MPI and
// may still complete later, once the peers post theirs, writing into its
// buffers and running on its communicator. So every buffer a nonblocking
// call uses is a member, and on abort the buffers are handed to a
// deliberate, never-freed holder; the communicator must then not be freed
// either (abandoned() tells its owner).
#pragma once

#include <mpi.h>

#include "transport/control_transport.h"
#include "transport/mpi_util.h"
#include "transport/poller.h"

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

  // A wait was aborted with a collective still posted on the communicator.
  bool abandoned() const { return abandoned_; }

 private:
  MPI_Comm comm_;
  const MpiOps* ops_;
  Poller* poller_;
  // Waits; on failure abandons the buffers (Note [Abandoned requests]).
  void Wait(MPI_Request* request, const char* what);

  int rank_ = 0;
  int size_ = 1;
  bool abandoned_ = false;
  std::vector<uint64_t> flags_;
  // Contiguous type of flags_type_words_ words (never freed while a
  // combine is in flight; kept across cycles).
  MPI_Datatype flags_type_ = MPI_DATATYPE_NULL;
  size_t flags_type_words_ = 0;
  std::vector<char> gather_send_;
  std::vector<char> gather_recv_;
  std::vector<char> bcast_first_;
  std::vector<char> bcast_rest_;
};

}  // namespace hvdcompat
