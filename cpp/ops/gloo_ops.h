// Host-memory collectives over Gloo (the Gloo controller, Note [Gloo
// controller] in transport/gloo_context.h): the same responses as
// MpiBackend, fused or not, with the same scaling and 16-bit rules (float16
// and bfloat16 are widened to float32 while packing and rounded once while
// unpacking, as on MPI). Allreduce runs GlooRing (Note [Gloo ring]): a lone
// tensor of another type, and fused ones of at least HVDCOMPAT_INPLACE_MIN_BYTES,
// are reduced where their outputs lie (an out-of-place input copied in, and
// prescaled, segment by segment); the other fused tensors are packed into one
// buffer and unpacked from it segment by segment inside the ring's pipeline.
// Reducescatter packs every rank's block rank-major and reduces it in a
// ring, each rank ending with its own block. Adasum runs
// the shared algorithm over Gloo's point-to-point messages (Note [Adasum
// peers]); the hierarchical knobs take the node-aware steps of Note
// [Hierarchical collectives on Gloo].
//
// Note [16-bit wire on Gloo]
// float16 and bfloat16 follow the MPI controller's rules: within one host
// they are widened to float32 while packing and rounded once while
// unpacking; when the set spans hosts (or HVDCOMPAT_LINK_PLAN=network), they
// travel and are reduced as 16-bit elements, each reduction step widening
// both operands and rounding back (Note [16-bit wire], ops/mpi_16bit_ops.h),
// so fp16 compression halves the bytes on the link as it does on MPI;
// HVDCOMPAT_NETWORK_16BIT_WIRE=0 keeps the float32 wire. Hosts are the node
// labels of the hierarchical steps (host names, or pseudo-nodes of
// HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE ranks), the same on every rank. Both
// knobs hold set rank 0's values on every rank (Note [Plan knobs from set
// rank 0], engine/plan_agreement.h), as on the MPI controller.
#pragma once

#include <chrono>
#include <memory>

#include "core/engine_stats.h"
#include "core/env.h"
#include "negotiation/fusion.h"
#include "ops/collective_layout.h"
#include "ops/backend.h"
#include "ops/gloo_ring.h"

namespace gloo {
class Context;
}

namespace hvdcompat {

class Adasum;
class GlooAdasumPeers;
class GlooHierarchy;

class GlooBackend : public CollectiveBackend {
 public:
  // `global_ranks`: the set's members (their hosts make the nodes of the
  // hierarchical steps); `stats` (may be null) counts the node-aware calls.
  GlooBackend(std::shared_ptr<gloo::Context> context, const Config& config,
              const std::vector<int>& global_ranks, EngineStats* stats = nullptr);
  ~GlooBackend() override;

  const char* name() const override { return "Gloo"; }
  bool CanExecute(const Response& response) const override;
  void Execute(const Response& response, std::vector<ExecUnit>& units) override;

 private:
  void Allreduce(const Response& r, std::vector<ExecUnit>& units);
  void Allgather(const Response& r, std::vector<ExecUnit>& units);
  void Broadcast(const Response& r, std::vector<ExecUnit>& units);
  void Alltoall(const Response& r, std::vector<ExecUnit>& units);
  void Reducescatter(const Response& r, std::vector<ExecUnit>& units);

  // One tensor of an allreduce: its place in the payload and, when it is
  // packed, in the fusion buffer (null: reduced where `out` lies).
  struct Piece {
    const char* in;
    char* out;
    int64_t count;
    double pre;     // prescale (1 for a joined rank's identity values)
    int64_t first;  // its first element in the payload
    char* packed;
  };
  std::vector<Piece> CollectPieces(const Response& r, std::vector<ExecUnit>& units, double pre,
                                   int64_t* total);
  // The allreduce on GlooRing (Note [Gloo ring]), and on the node-aware steps.
  void RingAllreduce(const Response& r, std::vector<Piece>& pieces, int64_t total, double post);
  void NodeAwareAllreduce(const Response& r, std::vector<Piece>& pieces, int64_t total,
                          double post);
  // Reduces `buf` (rank-major blocks of `wire` elements, `layout`) so that
  // this rank's block holds every rank's sum; the other blocks are left partial.
  void RingReduceScatter(char* buf, const ScatterLayout& layout, DataType wire, ReduceOp op);
  // Every rank's `counts[rk]` bytes at `send` into `recv`, by rank.
  void AllgatherBytes(const void* send, void* recv, const std::vector<int64_t>& counts);
  // The same for an allgather's data, node-aware when HOROVOD_HIERARCHICAL_ALLGATHER applies.
  void GatherBlocks(const void* send, void* recv, const std::vector<int64_t>& counts);
  // The type an allreduce of `dtype` travels and is reduced in (Note [16-bit
  // wire on Gloo]).
  DataType WireType(DataType dtype) const;
  // Counts an allreduce of `elements` on the network route (engine stats).
  void CountNetwork(int64_t elements, size_t wire_size);
  // Labels a failure with the op and this rank.
  [[noreturn]] void Fail(const char* what, const std::exception& e) const;

  std::shared_ptr<gloo::Context> context_;
  int rank_ = 0;
  int size_ = 1;
  int64_t inplace_min_bytes_;  // fused tensors this large are not packed
  GlooRing ring_;              // the allreduce (Note [Gloo ring])
  HostScratch scratch_a_;
  HostScratch scratch_b_;
  std::vector<std::unique_ptr<HostScratch>> joined_buffers_;
  std::unique_ptr<GlooAdasumPeers> adasum_peers_;  // op Adasum (Note [Adasum peers])
  std::unique_ptr<Adasum> adasum_;
  // Node-aware steps; only with a hierarchical knob set.
  std::unique_ptr<GlooHierarchy> hierarchy_;
  EngineStats* stats_;
  bool network_ = false;     // HVDCOMPAT_LINK_PLAN's route: the set spans hosts, or forced
  bool wire_16bit_ = false;  // ... and 16-bit floats travel as 16 bits
};

}  // namespace hvdcompat
