#include "transport/mpi_set_channel.h"

#include "transport/mpi_util.h"

namespace hvdcompat {

MpiSetChannel::MpiSetChannel(MPI_Comm comm) : comm_(comm) {
  HVD_MPI_CHECK(comm_, MPI_Comm_rank(comm_, &rank_));
  HVD_MPI_CHECK(comm_, MPI_Comm_size(comm_, &size_));
}

void MpiSetChannel::AllgatherFixed(const void* mine, size_t bytes, void* all) {
  HVD_MPI_CHECK(comm_, MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all,
                                     static_cast<int>(bytes), MPI_BYTE, comm_));
}

std::vector<int64_t> MpiSetChannel::AlltoallCounts(const std::vector<int64_t>& send) {
  return ExchangeAlltoallRows(comm_, send);
}

std::vector<int> MpiSetChannel::NodeOf(int per_node) {
  if (per_node > 0) return NodesByCount(size_, per_node);
  MPI_Comm node = MPI_COMM_NULL;
  HVD_MPI_CHECK(comm_, MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL,
                                           &node));
  int first = rank_;
  const int rc = MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  HVD_MPI_CHECK(comm_, rc);
  std::vector<int> all(size_);
  HVD_MPI_CHECK(comm_, MPI_Allgather(&first, 1, MPI_INT, all.data(), 1, MPI_INT, comm_));
  return all;
}

}  // namespace hvdcompat
