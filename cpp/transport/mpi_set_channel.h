// SetChannel over a process set's MPI communicator (the MPI controller).
#pragma once

#include <mpi.h>

#include "transport/set_channel.h"

namespace hvdcompat {

class MpiSetChannel : public SetChannel {
 public:
  // `comm` is the set's and outlives this channel (not owned); `per_node`:
  // HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE (0: nodes from shared memory).
  MpiSetChannel(MPI_Comm comm, int64_t per_node);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "MPI"; }
  void AllgatherFixed(const void* mine, size_t bytes, void* all) override;
  std::vector<int64_t> AlltoallCounts(const std::vector<int64_t>& send) override;
  std::vector<std::string> NodeLabels() override;

 private:
  MPI_Comm comm_;
  int64_t per_node_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace hvdcompat
