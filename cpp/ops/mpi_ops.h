// Host-memory collectives over MPI. See Note [Streaming fused allreduce].
#pragma once

#include <mpi.h>

#include <memory>

#include "core/engine_stats.h"
#include "core/env.h"
#include "negotiation/fusion.h"
#include "transport/mpi_util.h"
#include "ops/adasum_mpi.h"
#include "ops/backend.h"
#include "transport/request_wait.h"

namespace hvdcompat {

class MpiHierarchy;
class NetworkAllreduce;

// Note [Streaming fused allreduce]
// A fused allreduce never packs the whole fused payload at once. It fills a
// chunk-sized scratch from the inputs (applying the prescale in the same
// pass), reduces the chunk in place, and copies it out (applying the
// postscale), chunk after chunk. The chunk stays in cache between the three
// steps, so a CPU whose limit is memory bandwidth reads each input once and
// writes each output once, instead of streaming the whole payload through
// DRAM three extra times. An unfused tensor, and a fused one of at least
// `inplace_min_bytes`, skips the fusion copy and is reduced in place in
// equal calls of at most `max_call_bytes` (HVDCOMPAT_MAX_CALL_BYTES, 16 MiB
// by default; 24 MiB goes as two 12 MiB calls): Open MPI allocates a
// message-sized temporary for large calls (a fresh mmap each time past
// 32 MiB), so a large reduction runs faster as several such calls, and the
// postscale (1/size for Average) then runs on cache-hot data.
// Out-of-place reductions without a prescale reduce from the input straight
// into the output (one pass over each; the library may still stage
// internally); with a prescale, the scaling pass writes the output and the
// reduction runs in place there. float16 and
// bfloat16 always take the streamed path: they are widened to float32 while
// packing and rounded once while unpacking.
class MpiBackend : public CollectiveBackend {
 public:
  // `stats` (may be null) counts the node-aware calls.
  MpiBackend(MPI_Comm comm, const MpiOps* ops, const Config& config,
             EngineStats* stats = nullptr);
  ~MpiBackend() override;

  const char* name() const override { return "MPI"; }
  bool CanExecute(const Response& response) const override;
  void Execute(const Response& response, std::vector<ExecUnit>& units) override;
  // Chunk size and call split (the fusion threshold is the worker's).
  void ApplyTuning(const TunedParams& params) override;
  void SetAbortFlag(const std::atomic<bool>* abort) override;

 private:
  struct Piece {
    const char* in;
    char* out;
    int64_t count;  // elements
    double pre;     // prescale (1 for a joined rank's identity values)
  };

  void Allreduce(const Response& r, std::vector<ExecUnit>& units);
  void Allgather(const Response& r, std::vector<ExecUnit>& units);
  void Broadcast(const Response& r, std::vector<ExecUnit>& units);
  void Alltoall(const Response& r, std::vector<ExecUnit>& units);
  void Reducescatter(const Response& r, std::vector<ExecUnit>& units);

  void ReduceDirect(const Piece& p, DataType dtype, ReduceOp op, double post);
  void ReduceStreamed(const std::vector<Piece>& pieces, DataType dtype, ReduceOp op, double post);
  // Splits a count past INT_MAX into several calls.
  void AllreduceElements(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op);
  // MPI_Allgatherv on comm_, node-aware when HOROVOD_HIERARCHICAL_ALLGATHER applies.
  void AllgathervBlocks(const void* send, int send_count, void* recv, const std::vector<int>& counts,
                        const std::vector<int>& displs, MPI_Datatype type, size_t esize);
  // Completes a nonblocking call of this backend (Note [Engine-owned waiting]).
  void Wait(MPI_Request* request, const char* what);

  MPI_Comm comm_;
  const MpiOps* ops_;
  int rank_ = 0;
  int size_ = 1;
  int64_t chunk_bytes_;
  int64_t inplace_min_bytes_;
  int64_t max_call_bytes_;
  AdasumMpi adasum_;  // op Adasum (Note [Adasum])
  WaitPolicy wait_;
  HostScratch scratch_a_;
  HostScratch scratch_b_;
  std::vector<std::unique_ptr<HostScratch>> joined_buffers_;
  // Node and cross-node communicators; only with a hierarchical knob set.
  std::unique_ptr<MpiHierarchy> hierarchy_;
  // The network plan of the host allreduce; null on the host plan (Note [Link plans]).
  std::unique_ptr<NetworkAllreduce> network_;
  EngineStats* stats_;
};

}  // namespace hvdcompat
