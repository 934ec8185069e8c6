// Adasum allreduce of host buffers, over any point-to-point transport.
// See Note [Adasum], Note [Adasum with any number of ranks], Note [Adasum
// weights] and Note [Adasum peers]. The element-wise half is in
// ops/adasum_kernels.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "negotiation/fusion.h"
#include "ops/adasum_kernels.h"
#include "ops/backend.h"

namespace hvdcompat {

// Note [Adasum]
// Adasum combines two vectors a and b (one tensor each) as
//   ca * a + cb * b,  ca = 1 - a.b / (2 |a|^2),  cb = 1 - a.b / (2 |b|^2)
// with a.b, |a|^2 and |b|^2 summed in double (a zero vector, |v|^2 below
// sqrt(DBL_MIN), keeps coefficient 1). Orthogonal vectors add up; parallel
// ones average. (That is Horovod's rule, for operands that stand for equal
// numbers of ranks; Note [Adasum weights] gives the general one.) A fused
// buffer is combined tensor by tensor: every tensor gets its own
// coefficients, as if it had been reduced alone.
//
// Across ranks the combination runs as a binary tree in rank order,
// ((r0 + r1) + (r2 + r3)) + ..., computed by recursive vector halving and
// distance doubling. At level L = 1, 2, 4, ... rank c exchanges half of its
// current segment with rank c ^ L: the lower rank keeps the first half, the
// upper the second, each receives the partner's copy of the half it keeps.
// Both hold the same segment of two partial results (the left operand is
// the block of lower ranks), so each rank computes the dots of its slice of
// every tensor; those partial dots are summed over the 2L ranks that the
// level combines (recursive doubling with ranks c ^ 1, c ^ 2, ..., c ^ L:
// every rank of the group ends with the same sums), which gives the whole
// tensor's coefficients, and the rank combines its slice. After the last
// level every rank owns 1/P of the result; the reverse phase swaps halves
// with the same partners in the opposite order until every rank holds all
// of it. Each element is sent log2(P) times in each phase, as in a
// reduce-scatter + allgather.
//
// Note [Adasum with any number of ranks]
// Recursive halving needs a power of two, P, of ranks. With N = P + E ranks
// (0 < E < P), the first 2E ranks fold in pairs first: rank 2i+1 sends its
// vector to rank 2i, which combines r(2i) + r(2i+1) (as any pair above) and
// takes part in the P-rank algorithm; ranks from 2E on take part as they
// are. Rank 2i sends the final result to rank 2i+1 at the end. The result
// is the binary tree over the P leaves (r0 + r1), ..., (r(2E-2) + r(2E-1)),
// r(2E), ..., r(N-1), in rank order: 3 ranks give (r0 + r1) + r2, 5 give
// ((r0 + r1) + r2) + (r3 + r4), 6 give ((r0 + r1) + (r2 + r3)) + (r4 + r5).
// On a power of two it is exactly the tree of Note [Adasum]. Folding
// adjacent ranks keeps the extra traffic between ranks that usually share a
// node. The leaves stand for different numbers of ranks (a folded pair for
// two), which the combination weighs (Note [Adasum weights]).
//
// Note [Adasum weights]
// With Horovod's rule alone, the tree over unequal leaves would weigh the
// ranks unequally: parallel inputs (every rank's vector a multiple of one
// vector) would give (r0 + r1)/4 + r2/2 at 3 ranks, not the mean. So each
// operand carries the number of ranks it stands for (a leaf: 1, a folded
// pair: 2, a subtree: the sum of its leaves), and a (wa ranks) and b (wb)
// combine, with W = wa + wb, as
//   ca * a + cb * b,  ca = 1 - (wa/W) a.b / |a|^2,  cb = 1 - (wb/W) a.b / |b|^2.
// Orthogonal vectors still add up. For b = k a the result is
// (1 - wa k/W + k - wb/W) a = (wa a + wb b) / W, the weighted mean, which is
// again parallel to a and stands for W ranks: the whole tree of parallel
// inputs gives their mean over all N ranks, whatever N. Where wa == wb,
// wa/W is 0.5 exactly and the rule is Horovod's: every combination of a
// power of two (and every pair of the fold) gives the same bits as the
// unweighted rule. The weights depend on the tree's shape only: every rank
// of a group computes the same ones, with no message.
//
// A zero vector (a joined rank's, or a tensor with |v|^2 below sqrt(DBL_MIN))
// still counts for its ranks. It is left out of the value (its coefficient
// is 1 and a.b = 0, so the other operand comes out as it was) and its share
// goes to the operand it meets, as under Horovod's rule on a power of two
// (the pair 0 + b counts as two ranks at the next level). Weighing it 0
// would make parallel inputs average over the other ranks instead, but
// would change the results of powers of two from Horovod's whenever a
// tensor is zero on some rank, and the zero test would have to travel with
// the dots.
//
// On the GPU path (Note [GPU Adasum], ops/nccl_ops.h) the leaves are nodes,
// each holding its node's average. Every node runs the same number of ranks,
// so weighing a node 1 (a folded pair of nodes 2) is weighing it by its
// ranks, and parallel inputs give the mean over all ranks there too.
//
// Note [Adasum peers]
// The algorithm needs only two things of its transport: an exchange of
// bytes with one peer (each side sends what the other receives; the sizes
// are known to both), and, for the GPU path's shards, a sum of a few
// doubles over the ranks holding the other shards. AdasumPeers is that
// interface; the MPI controller implements it with MPI_Sendrecv
// (ops/adasum_mpi.h), the Gloo controller with Gloo's point-to-point
// messages (ops/gloo_peers.h). Every rank runs the same code in the same
// order on either, so an MPI job and a Gloo job given the same inputs
// return the same bits.

// The tensors of one Adasum response in order: where each one's input and
// output live (both null on a joined rank, whose tensors are zeros, Adasum's
// identity) and its element count. Shared by the host and the NCCL paths.
struct AdasumPiece {
  const char* in;
  char* out;
  int64_t count;
};
struct AdasumLayout {
  std::vector<AdasumPiece> pieces;
  std::vector<int64_t> counts;  // pieces' counts, the per-tensor split of the buffer
  int64_t total = 0;            // elements in all
};
AdasumLayout AdasumLayoutOf(const std::vector<ExecUnit>& units);

// The transport Adasum runs on (Note [Adasum peers]). Used by one thread.
class AdasumPeers {
 public:
  virtual ~AdasumPeers() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends `send_bytes` at `send` to `peer` and receives `recv_bytes` from it
  // into `recv`; `peer` makes the mirror call. Either size may be 0. Throws
  // on a transport failure.
  virtual void Exchange(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                        int peer) = 0;
  // Whether other ranks hold other shards of the vectors (ReduceShardInPlace);
  // then SumOverShards adds `n` values over them in place.
  virtual bool shards() const { return false; }
  virtual void SumOverShards(double* values, int n) {}
};

// Runs Adasum over `peers` (not owned). Worker thread only; every rank must
// call the same reductions in the same order.
class Adasum {
 public:
  explicit Adasum(AdasumPeers* peers);

  // Reduces `buf` in place on every rank: `counts[i]` elements of tensor i,
  // back to back, of `dtype` (float32 or float64).
  void ReduceInPlace(void* buf, DataType dtype, const std::vector<int64_t>& counts);

  // The same on a shard: `shard` holds elements [lo, lo + n) of such a
  // buffer (every rank of `peers` the same range), and the other shards are
  // reduced at the same time by other groups of ranks (peers.shards()).
  // Partial dot products are summed over those first, so every tensor still
  // gets the coefficients of the whole tensor. This is the cross-node step of
  // the GPU Adasum (Note [GPU Adasum], ops/nccl_ops.h).
  void ReduceShardInPlace(void* shard, DataType dtype, const std::vector<int64_t>& counts,
                          int64_t lo, int64_t n);

  // A negotiated (possibly fused) host allreduce with op Adasum: prescale,
  // widen float16/bfloat16 to float32, reduce, narrow, postscale. A joined
  // rank (null entry) contributes zeros, the identity of Adasum.
  void Allreduce(const Response& r, std::vector<ExecUnit>& units);

 private:
  // The rank of `peers` of core rank `core` (Note [Adasum with any number of ranks]).
  int PeerRank(int core) const { return core < extra_ ? 2 * core : core + extra_; }
  // How many ranks the core ranks [lo, hi) stand for: those below extra_
  // are folded pairs (Note [Adasum weights]).
  int RanksOf(int lo, int hi) const {
    return (hi - lo) + std::max(0, std::min(hi, extra_) - lo);
  }
  // Sums dots_ over the shards, then over the 2 * level core ranks that
  // share this rank's group (level 0: over the shards only).
  void SumOverGroup(int core, int level);
  // Combines this rank's segment [lo, lo + n) of `mine` with `theirs` (the
  // partner's copy of the same segment) for every tensor it intersects;
  // `mine_left`: this rank's data is the left operand; the left operand
  // stands for `wa` ranks, the right for `wb`. `level` 0: the fold, no group
  // beyond the shards.
  void CombineSegment(char* mine, const char* theirs, int64_t lo, int64_t n, bool mine_left,
                      int wa, int wb, int core, int level, DataType dtype);

  AdasumPeers* peers_;
  int rank_ = 0;
  int size_ = 1;
  int core_size_ = 1;  // the largest power of two <= size_
  int extra_ = 0;      // size_ - core_size_
  std::vector<int64_t> offsets_;  // first element of each tensor in the buffer
  std::vector<int64_t> counts_;
  std::vector<AdasumDots> dots_;
  std::vector<double> send_dots_, recv_dots_;
  HostScratch recv_;
  HostScratch work_;
};

}  // namespace hvdcompat
