#include "ops/gloo_hierarchical_ops.h"

#include <algorithm>
#include <cstring>

#include "ops/host_reduce.h"

namespace hvdcompat {

namespace {

// GlooBackend's other slots: Gloo's collectives 0x01-0x08, the ring
// reduce-scatter 0x40, Adasum 0x41.
constexpr uint8_t kHierarchySlotPrefix = 0x42;

// `count` split into `parts` blocks, the first count % parts one longer.
void SplitEvenly(int64_t count, int parts, std::vector<int64_t>* displs,
                 std::vector<int64_t>* counts) {
  displs->resize(parts);
  counts->resize(parts);
  int64_t at = 0;
  for (int i = 0; i < parts; ++i) {
    (*counts)[i] = count / parts + (i < count % parts ? 1 : 0);
    (*displs)[i] = at;
    at += (*counts)[i];
  }
}

int Mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

GlooHierarchy::GlooHierarchy(std::shared_ptr<gloo::Context> context,
                             const std::vector<int>& global_ranks, const Config& config)
    : peers_(std::move(context), kHierarchySlotPrefix) {
  const int rank = peers_.rank();
  groups_ = GroupByNode(
      NodeLabels(global_ranks, config.rank_hosts, config.hierarchical_local_size), rank);
  const HierarchyChoice choice =
      ChooseHierarchy(config, local_size(), cross_size(), groups_.min_local, groups_.max_local,
                      groups_.consecutive, rank == 0);
  allreduce_ = choice.allreduce;
  allgather_ = choice.allgather;
}

void GlooHierarchy::RingReduceScatter(const std::vector<int>& group, int me, char* buf,
                                      const std::vector<int64_t>& displs,
                                      const std::vector<int64_t>& counts, DataType dtype,
                                      ReduceOp op) {
  const int n = static_cast<int>(group.size());
  if (n == 1) return;
  const size_t es = DataTypeSize(dtype);
  const int64_t largest = *std::max_element(counts.begin(), counts.end());
  char* incoming = incoming_.Reserve(static_cast<size_t>(std::max<int64_t>(largest, 1)) * es);
  const HostReduceFn reduce = HostReduceFor(dtype, op);
  const int next = group[Mod(me + 1, n)], prev = group[Mod(me - 1, n)];
  // Step k: send block me-k-1 on, add block me-k-2 from the previous member;
  // after n-1 steps block me holds every member's contribution.
  for (int k = 0; k < n - 1; ++k) {
    const int send = Mod(me - k - 1, n), recv = Mod(me - k - 2, n);
    peers_.SendRecv(buf + displs[send] * es, static_cast<size_t>(counts[send]) * es, next,
                    incoming, static_cast<size_t>(counts[recv]) * es, prev);
    char* block = buf + displs[recv] * es;
    reduce(block, block, incoming, static_cast<size_t>(counts[recv]));
  }
}

void GlooHierarchy::RingAllgather(const std::vector<int>& group, int me, char* buf,
                                  const std::vector<int64_t>& displs,
                                  const std::vector<int64_t>& counts) {
  const int n = static_cast<int>(group.size());
  const int next = group[Mod(me + 1, n)], prev = group[Mod(me - 1, n)];
  // Step k: pass on block me-k (this member's own first), receive block me-k-1.
  for (int k = 0; k < n - 1; ++k) {
    const int send = Mod(me - k, n), recv = Mod(me - k - 1, n);
    peers_.SendRecv(buf + displs[send], static_cast<size_t>(counts[send]), next,
                    buf + displs[recv], static_cast<size_t>(counts[recv]), prev);
  }
}

void GlooHierarchy::Allreduce(void* buf, int64_t count, DataType dtype, ReduceOp op) {
  const size_t es = DataTypeSize(dtype);
  char* data = static_cast<char*>(buf);
  std::vector<int64_t> displs, counts;
  SplitEvenly(count, local_size(), &displs, &counts);
  RingReduceScatter(groups_.local, groups_.local_rank, data, displs, counts, dtype, op);
  // This rank's shard across nodes: a ring allreduce of its C blocks.
  char* shard = data + displs[groups_.local_rank] * es;
  std::vector<int64_t> sub_displs, sub_counts;
  SplitEvenly(counts[groups_.local_rank], cross_size(), &sub_displs, &sub_counts);
  RingReduceScatter(groups_.cross, groups_.cross_rank, shard, sub_displs, sub_counts, dtype, op);
  for (size_t i = 0; i < sub_counts.size(); ++i) {
    sub_displs[i] *= static_cast<int64_t>(es);
    sub_counts[i] *= static_cast<int64_t>(es);
  }
  RingAllgather(groups_.cross, groups_.cross_rank, shard, sub_displs, sub_counts);
  for (size_t i = 0; i < counts.size(); ++i) {
    displs[i] *= static_cast<int64_t>(es);
    counts[i] *= static_cast<int64_t>(es);
  }
  RingAllgather(groups_.local, groups_.local_rank, data, displs, counts);
}

void GlooHierarchy::Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts) {
  // Nodes are consecutive ranks (UseAllgather): node c holds ranks c*L ..
  // c*L+L-1, and its part of the output is contiguous.
  const int size = static_cast<int>(counts.size());
  const int per_node = local_size(), nodes = cross_size();
  std::vector<int64_t> displs(size + 1, 0);
  for (int r = 0; r < size; ++r) displs[r + 1] = displs[r] + counts[r];
  char* out = static_cast<char*>(recv);
  const int first = groups_.local.front();
  const int me = groups_.local_rank;
  // 1. Every block to the node's first rank.
  if (me == 0) {
    for (int i = 1; i < per_node; ++i) {
      peers_.PostRecv(out + displs[first + i], static_cast<size_t>(counts[first + i]), first + i);
    }
    if (out + displs[first] != send) {
      std::memcpy(out + displs[first], send, static_cast<size_t>(counts[first]));
    }
  } else {
    peers_.PostSend(send, static_cast<size_t>(counts[first + me]), first);
  }
  peers_.Wait();
  // 2. The node blocks among the first ranks (the cross group of index 0, in node order).
  if (me == 0) {
    std::vector<int64_t> node_displs(nodes), node_counts(nodes);
    for (int c = 0; c < nodes; ++c) {
      node_displs[c] = displs[c * per_node];
      node_counts[c] = displs[(c + 1) * per_node] - displs[c * per_node];
    }
    RingAllgather(groups_.cross, groups_.cross_rank, out, node_displs, node_counts);
  }
  // 3. The whole result inside the node, along a binomial tree from its first rank:
  // member i receives from i - d (d the largest power of two <= i), then sends
  // to i + 2d, i + 4d, ... while they exist.
  const size_t total = static_cast<size_t>(displs[size]);
  int d = 1;
  if (me > 0) {
    while (d * 2 <= me) d *= 2;
    peers_.PostRecv(out, total, groups_.local[me - d]);
    peers_.Wait();
    d *= 2;
  }
  for (; d < per_node; d *= 2) {
    if (me + d < per_node) peers_.PostSend(out, total, groups_.local[me + d]);
  }
  peers_.Wait();
}

}  // namespace hvdcompat
