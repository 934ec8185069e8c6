#include "ops/mpi_hierarchical_ops.h"

#include <vector>

#include "ops/node_layout.h"
#include "transport/mpi_util.h"

namespace hvdcompat {

NodeSplit SplitByNode(MPI_Comm comm, int rank, const Config& config) {
  NodeSplit s;
  const int64_t per_node = config.hierarchical_local_size;
  if (per_node > 0) {
    HVD_MPI_CHECK(comm, MPI_Comm_split(comm, static_cast<int>(rank / per_node), rank, &s.local));
  } else {
    HVD_MPI_CHECK(comm, MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                                            &s.local));
  }
  MPI_Comm_set_errhandler(s.local, MPI_ERRORS_RETURN);
  HVD_MPI_CHECK(s.local, MPI_Comm_rank(s.local, &s.local_rank));
  HVD_MPI_CHECK(s.local, MPI_Comm_size(s.local, &s.local_size));
  HVD_MPI_CHECK(comm, MPI_Comm_split(comm, s.local_rank, rank, &s.cross));
  MPI_Comm_set_errhandler(s.cross, MPI_ERRORS_RETURN);
  HVD_MPI_CHECK(s.cross, MPI_Comm_rank(s.cross, &s.cross_rank));
  HVD_MPI_CHECK(s.cross, MPI_Comm_size(s.cross, &s.cross_size));
  return s;
}

MpiHierarchy::MpiHierarchy(MPI_Comm comm, const Config& config) : comm_(comm) {
  HVD_MPI_CHECK(comm_, MPI_Comm_rank(comm_, &rank_));
  HVD_MPI_CHECK(comm_, MPI_Comm_size(comm_, &size_));
  split_ = SplitByNode(comm_, rank_, config);

  // {min local size, -max local size, nodes of consecutive ranks everywhere}
  int facts[3] = {split_.local_size, -split_.local_size,
                  rank_ == split_.cross_rank * split_.local_size + split_.local_rank ? 1 : 0};
  HVD_MPI_CHECK(comm_, MPI_Allreduce(MPI_IN_PLACE, facts, 3, MPI_INT, MPI_MIN, comm_));
  const HierarchyChoice choice =
      ChooseHierarchy(config, split_.local_size, split_.cross_size, facts[0], -facts[1],
                      facts[2] == 1, rank_ == 0);
  allreduce_ = choice.allreduce;
  allgather_ = choice.allgather;
}

MpiHierarchy::~MpiHierarchy() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&split_.cross, &split_.local}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

// Failures are reported against comm_ (the set's communicator), so a lost
// peer is named by its rank in the set and comm_ is revoked for the other
// pending operations, as on the flat path.
void MpiHierarchy::Allreduce(void* buf, int count, MPI_Datatype type, size_t esize, MPI_Op op) {
  // Shard i of the node: count / L elements, the first count % L shards one more.
  std::vector<int> counts(split_.local_size), displs(split_.local_size);
  int at = 0;
  for (int i = 0; i < split_.local_size; ++i) {
    counts[i] = count / split_.local_size + (i < count % split_.local_size ? 1 : 0);
    displs[i] = at;
    at += counts[i];
  }
  const int mine = counts[split_.local_rank];
  char* shard = shard_.Reserve(static_cast<size_t>(mine) * esize);
  HVD_MPI_CHECK(comm_, MPI_Reduce_scatter(buf, shard, counts.data(), type, op, split_.local));
  HVD_MPI_CHECK(comm_, MPI_Allreduce(MPI_IN_PLACE, shard, mine, type, op, split_.cross));
  HVD_MPI_CHECK(comm_, MPI_Allgatherv(shard, mine, type, buf, counts.data(), displs.data(),
                                       type, split_.local));
}

void MpiHierarchy::Allgatherv(const void* send, int send_count, void* recv, const int* counts,
                              const int* displs, MPI_Datatype type, size_t esize) {
  // Nodes are consecutive ranks (checked at construction): node c holds ranks
  // c*L .. c*L+L-1, and its block of the output is contiguous.
  const int first = split_.cross_rank * split_.local_size;
  std::vector<int> lcounts(split_.local_size), ldispls(split_.local_size);
  for (int i = 0; i < split_.local_size; ++i) {
    lcounts[i] = counts[first + i];
    ldispls[i] = displs[first + i] - displs[first];
  }
  char* node_block = static_cast<char*>(recv) + static_cast<size_t>(displs[first]) * esize;
  HVD_MPI_CHECK(comm_, MPI_Gatherv(send, send_count, type, node_block, lcounts.data(),
                                    ldispls.data(), type, 0, split_.local));
  if (split_.local_rank == 0) {
    // The cross communicator of local rank 0 holds the nodes' first ranks, in node order.
    std::vector<int> ncounts(split_.cross_size), ndispls(split_.cross_size);
    for (int c = 0; c < split_.cross_size; ++c) {
      int64_t n = 0;
      for (int i = 0; i < split_.local_size; ++i) n += counts[c * split_.local_size + i];
      ncounts[c] = static_cast<int>(n);
      ndispls[c] = displs[c * split_.local_size];
    }
    HVD_MPI_CHECK(comm_, MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv,
                                         ncounts.data(), ndispls.data(), type, split_.cross));
  }
  const int64_t total = static_cast<int64_t>(displs[size_ - 1]) + counts[size_ - 1];
  HVD_MPI_CHECK(comm_, MPI_Bcast(recv, static_cast<int>(total), type, 0, split_.local));
}

}  // namespace hvdcompat
