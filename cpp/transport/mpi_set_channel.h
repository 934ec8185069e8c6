// SetChannel over a process set's MPI communicator (the MPI controller).
#pragma once

#include <mpi.h>

#include "transport/set_channel.h"

namespace hvdcompat {

class MpiSetChannel : public SetChannel {
 public:
  // `comm` is the set's and outlives this channel (not owned).
  explicit MpiSetChannel(MPI_Comm comm);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "MPI"; }
  void AllgatherFixed(const void* mine, size_t bytes, void* all) override;
  std::vector<int64_t> AlltoallCounts(const std::vector<int64_t>& send) override;
  std::vector<int> NodeOf(int per_node) override;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace hvdcompat
