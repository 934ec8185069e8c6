#include "transport/mpi_set_channel.h"

#include "transport/mpi_util.h"

namespace hvdcompat {

MpiSetChannel::MpiSetChannel(MPI_Comm comm, int64_t per_node) : comm_(comm), per_node_(per_node) {
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

std::vector<std::string> MpiSetChannel::NodeLabels() {
  std::vector<std::string> labels(size_);
  if (per_node_ > 0) {
    for (int r = 0; r < size_; ++r) labels[r] = std::to_string(r / per_node_);
    return labels;
  }
  // A node is named by its lowest set rank.
  MPI_Comm node = MPI_COMM_NULL;
  HVD_MPI_CHECK(comm_, MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL,
                                           &node));
  int first = rank_;
  const int rc = MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  HVD_MPI_CHECK(comm_, rc);
  std::vector<int> all(size_);
  HVD_MPI_CHECK(comm_, MPI_Allgather(&first, 1, MPI_INT, all.data(), 1, MPI_INT, comm_));
  for (int r = 0; r < size_; ++r) labels[r] = "node of rank " + std::to_string(all[r]);
  return labels;
}

}  // namespace hvdcompat
