// Host-memory collectives over Gloo (the Gloo controller, Note [Gloo
// controller] in transport/gloo_context.h): the same responses as
// MpiBackend, fused or not, with the same scaling and 16-bit rules (float16
// and bfloat16 are widened to float32 while packing and rounded once while
// unpacking, as on MPI). A single tensor of another type is reduced from its
// input straight into its output; fused tensors are packed into one buffer
// and reduced in one call. Reducescatter packs every rank's block rank-major
// and reduces it in a ring, each rank ending with its own block. Adasum runs
// the shared algorithm over Gloo's point-to-point messages (Note [Adasum
// peers]); the hierarchical knobs take the node-aware steps of Note
// [Hierarchical collectives on Gloo].
#pragma once

#include <chrono>
#include <memory>

#include "core/engine_stats.h"
#include "core/env.h"
#include "negotiation/fusion.h"
#include "ops/collective_layout.h"
#include "ops/backend.h"

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

  // out = reduction over ranks of `in` (`in` may equal `out`), in `dtype`
  // (never a 16-bit float: those are widened first).
  void AllreduceElements(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op);
  // Reduces `buf` (rank-major blocks of `wire` elements, `layout`) so that
  // this rank's block holds every rank's sum; the other blocks are left partial.
  void RingReduceScatter(char* buf, const ScatterLayout& layout, DataType wire, ReduceOp op);
  // Every rank's `counts[rk]` bytes at `send` into `recv`, by rank.
  void AllgatherBytes(const void* send, void* recv, const std::vector<int64_t>& counts);
  // The same for an allgather's data, node-aware when HOROVOD_HIERARCHICAL_ALLGATHER applies.
  void GatherBlocks(const void* send, void* recv, const std::vector<int64_t>& counts);
  // Labels a failure with the op and this rank.
  [[noreturn]] void Fail(const char* what, const std::exception& e) const;

  std::shared_ptr<gloo::Context> context_;
  int rank_ = 0;
  int size_ = 1;
  HostScratch scratch_a_;
  HostScratch scratch_b_;
  std::vector<std::unique_ptr<HostScratch>> joined_buffers_;
  std::unique_ptr<GlooAdasumPeers> adasum_peers_;  // op Adasum (Note [Adasum peers])
  std::unique_ptr<Adasum> adasum_;
  // Node-aware steps; only with a hierarchical knob set.
  std::unique_ptr<GlooHierarchy> hierarchy_;
  EngineStats* stats_;
};

}  // namespace hvdcompat
