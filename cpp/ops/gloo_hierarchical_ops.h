// Node-aware (hierarchical) host collectives on the Gloo controller.
// See Note [Hierarchical collectives on Gloo].
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "negotiation/fusion.h"
#include "ops/gloo_peers.h"
#include "ops/node_layout.h"

namespace hvdcompat {

// Note [Hierarchical collectives on Gloo]
// The plan of Note [Hierarchical host collectives] (ops/mpi_hierarchical_ops.h),
// under the same knobs and rules: HOROVOD_HIERARCHICAL_ALLREDUCE reduces an
// in-place buffer by a ring reduce-scatter inside the node (each rank ends
// with its shard: count / L elements, the first count % L shards one more),
// a ring allreduce of the shard among the ranks with the same index on every
// node (reduce-scatter, then allgather), and a ring allgather of the shards
// inside the node; HOROVOD_HIERARCHICAL_ALLGATHER sends every rank's block
// to the first rank of its node, ring-allgathers the node blocks among the
// first ranks, and broadcasts the result inside each node along a binomial
// tree. Both run where they can help (several nodes of several ranks each,
// the same number on every node; for the allgather, nodes of consecutive
// ranks), otherwise the flat Gloo collectives, and rank 0 says why.
//
// The node and cross groups are not Gloo contexts of their own: the process
// set's context already connects every pair of its members, so the steps
// are point-to-point messages on it (ops/gloo_peers.h) on a slot of their
// own. That costs no connection, store key or watch at init, and keeps
// Note [Lost peers on Gloo] whole: every wait is on the set's context, which
// the watch fails as a whole once it sees a member lost. (Separate node and
// cross contexts would each be failed only where a loss is seen, so a rank
// waiting on a live peer that is stuck in another group would wait out the
// Gloo timeout.)
//
// Nodes are the set's ranks with the same host name (the topology's: the
// launch's HOROVOD_HOSTNAME under hvdcompatrun --gloo, else gethostname()),
// or with HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE=K the set ranks r with equal
// r / K, as on MPI.

// The node layout of one process set and the steps over it. Built on the API
// thread with the set's worker (no communication: every rank knows every
// rank's host); used by the worker thread only.
class GlooHierarchy {
 public:
  // `global_ranks`: the set's members; `config.rank_hosts` their hosts.
  GlooHierarchy(std::shared_ptr<gloo::Context> context, const std::vector<int>& global_ranks,
                const Config& config);

  // Whether an in-place allreduce of `count` elements takes the three steps.
  bool UseAllreduce(int64_t count) const { return allreduce_ && count >= local_size(); }
  bool UseAllgather() const { return allgather_; }

  // In place on `buf` (`count` elements of `dtype`, never a 16-bit float).
  void Allreduce(void* buf, int64_t count, DataType dtype, ReduceOp op);
  // Every rank's `counts[r]` bytes at `send` into `recv`, in rank order.
  void Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts);

  int local_size() const { return static_cast<int>(groups_.local.size()); }
  int cross_size() const { return static_cast<int>(groups_.cross.size()); }

 private:
  // Ring reduce-scatter over `group` (set ranks; this rank is group[me]):
  // block i of `buf` (elements [displs[i], displs[i] + counts[i])) ends
  // reduced over the group on member i; other blocks are left partial.
  void RingReduceScatter(const std::vector<int>& group, int me, char* buf,
                         const std::vector<int64_t>& displs, const std::vector<int64_t>& counts,
                         DataType dtype, ReduceOp op);
  // Ring allgather over `group`: block i (bytes) from member i to everyone.
  void RingAllgather(const std::vector<int>& group, int me, char* buf,
                     const std::vector<int64_t>& displs, const std::vector<int64_t>& counts);

  GlooPeers peers_;
  NodeGroups groups_;
  bool allreduce_ = false;
  bool allgather_ = false;
  HostScratch incoming_;
};

}  // namespace hvdcompat
