// Node-aware (hierarchical) host collectives over MPI.
// See Note [Hierarchical host collectives].
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include "core/env.h"
#include "negotiation/fusion.h"

namespace hvdcompat {

// Note [Hierarchical host collectives]
// HOROVOD_HIERARCHICAL_ALLREDUCE runs an in-place allreduce in three steps:
// a reduce-scatter inside each node (shared memory: MPI's intra-node
// transport), an allreduce of each rank's 1/local_size shard among the ranks
// with the same local rank on every node (the cross communicator; every rank
// of a node drives its own share of the inter-node traffic), and an
// allgather of the shards inside the node. HOROVOD_HIERARCHICAL_ALLGATHER
// gathers each node's blocks to its first rank, allgathers the node blocks
// among the first ranks, and broadcasts the whole result inside the node.
//
// Both replace one MPI call on a buffer that already holds this rank's
// (prescaled, widened, identity-for-joined) contribution, so every dtype, op
// and scaling rule of the flat path holds unchanged. They are used only where
// they can help: several nodes with several ranks each, the same number of
// ranks on every node (the shard split must match across nodes), and for the
// allgather nodes made of consecutive ranks (node blocks are then contiguous
// in the output). Otherwise the flat collectives run, and rank 0 logs why at
// info level. An allreduce of fewer elements than local_size stays flat (a
// shard would be empty; three latencies for a few values never pay off).
//
// Nodes are the ranks that share memory (MPI_COMM_TYPE_SHARED), or, when
// HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE=K is set, ranks r with the same r / K: a
// way to exercise the multi-node steps on one host in tests.

// The node and cross-node communicators of one process set's communicator and
// the collectives over them. Construction is collective over `comm`; after
// that it is used by the set's worker thread only.
// The node and cross communicators of `comm` (the ranks sharing memory, or
// consecutive groups of `config.hierarchical_local_size` ranks for testing;
// then the ranks of equal node index across nodes), with this rank's place in
// them. Collective over `comm`; both get MPI_ERRORS_RETURN. The caller frees them.
struct NodeSplit {
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm cross = MPI_COMM_NULL;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
};
NodeSplit SplitByNode(MPI_Comm comm, int rank, const Config& config);

class MpiHierarchy {
 public:
  MpiHierarchy(MPI_Comm comm, const Config& config);
  ~MpiHierarchy();
  MpiHierarchy(const MpiHierarchy&) = delete;
  MpiHierarchy& operator=(const MpiHierarchy&) = delete;

  // Whether an in-place allreduce of `count` elements takes the three steps.
  bool UseAllreduce(int64_t count) const { return allreduce_ && count >= split_.local_size; }
  // Whether an allgather with `total` output elements takes the three steps.
  bool UseAllgather(int64_t total) const { return allgather_ && total <= INT32_MAX; }

  // In place on `buf` (count <= INT_MAX); same result on every rank.
  void Allreduce(void* buf, int count, MPI_Datatype type, size_t esize, MPI_Op op);
  // MPI_Allgatherv's contract on the process set's communicator (`counts`
  // and `displs` indexed by its ranks, displacements in rank order).
  void Allgatherv(const void* send, int send_count, void* recv, const int* counts,
                  const int* displs, MPI_Datatype type, size_t esize);

  int local_size() const { return split_.local_size; }
  int cross_size() const { return split_.cross_size; }

 private:
  MPI_Comm comm_;  // not owned
  NodeSplit split_;  // the node and cross communicators (owned) and this rank's place in them
  int rank_ = 0, size_ = 1;
  bool allreduce_ = false;
  bool allgather_ = false;
  HostScratch shard_;
};

}  // namespace hvdcompat
