// Host allreduce for communicators that span hosts. See Note [Link plans].
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/engine_stats.h"
#include "core/env.h"
#include "negotiation/fusion.h"
#include "ops/mpi_hierarchical_ops.h"
#include "transport/mpi_util.h"
#include "transport/request_wait.h"

namespace hvdcompat {

// Note [Link plans]
// The host allreduce has two transport plans, chosen per process set when
// its backend is made (HVDCOMPAT_LINK_PLAN=auto):
//
// * host, when every rank of the set shares one host's memory: the
//   streaming fused allreduce (Note [Streaming fused allreduce]) with
//   cache-sized chunks and calls split for Open MPI's shared-memory path.
//   Each call completes before the next starts; on shared memory a call is
//   short and the copies are what costs.
// * network, when the set spans hosts: the link is what costs, and it must
//   never idle. The payload goes as pipelined segments of
//   HVDCOMPAT_NETWORK_SEGMENT_BYTES with HVDCOMPAT_NETWORK_PIPELINE_DEPTH of
//   them in flight (the next segment is packed and the finished one unpacked
//   while the others travel). Tensors that skip the fusion copy are
//   segmented in place; small ones are packed into per-slot buffers. With
//   several ranks on every host and the same number on each, each segment is
//   reduced hierarchically: a reduce-scatter inside the host, an allreduce
//   of the rank's shard with its peers of the same local rank on the other
//   hosts (each host sends and receives the segment once instead of 2(n-1)/n
//   times of a flat ring whose edges cross hosts), and an allgather inside
//   the host; such a segment is local_size times the segment size, so each
//   rank still puts one segment's worth on the link per step.
//   HOROVOD_HIERARCHICAL_ALLREDUCE=0 keeps this plan flat; =1 asks
//   for the hierarchy (where the layout allows it) whatever the plan.
//
// float16/bfloat16 travel as 16-bit elements (Note [16-bit wire]).
//
// Every call is nonblocking and completed by WaitRequest; testing any one
// request progresses all of them, so segments travel while the worker packs,
// unpacks or waits on a local step. Collectives on one communicator are
// started in program order, the same on every rank (segments, their sizes
// and the hierarchical/flat choice depend only on element counts, dtype and
// the layout), never in the order requests happen to finish.
//
// Hosts are the ranks that share memory, or groups of
// HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE consecutive ranks when that testing knob
// is set (so one machine can exercise both plans). HVDCOMPAT_LINK_PLAN=host
// or =network forces a plan.

// One tensor's part of a fused allreduce (see MpiBackend::Allreduce).
struct NetworkPiece {
  const char* in;
  char* out;
  int64_t count;  // elements
  double pre;     // prescale (1 for a joined rank's identity values)
};

class NetworkAllreduce {
 public:
  // Where WaitRequest looks for the worker's abort flag (MpiBackend::SetAbortFlag).
  void SetAbortFlag(const std::atomic<bool>* abort) { wait_.abort = abort; }
  // Decides the plan for `comm` (collective over it unless the plan is
  // forced to host). Returns null when the host plan applies.
  static std::unique_ptr<NetworkAllreduce> Create(MPI_Comm comm, const MpiOps* ops,
                                                  const Config& config, EngineStats* stats);
  ~NetworkAllreduce();
  NetworkAllreduce(const NetworkAllreduce&) = delete;
  NetworkAllreduce& operator=(const NetworkAllreduce&) = delete;

  // Reduces every piece with `op` (in place where in == out), then scales by
  // `post` (in double when `post_in_double`). Pieces of at least
  // `inplace_min_bytes` (or a single piece) whose dtype needs no widening are
  // reduced where they lie; the others are packed, widened to the host
  // reduction type.
  void Allreduce(const std::vector<NetworkPiece>& pieces, DataType dtype, ReduceOp op,
                 double post, bool post_in_double, int64_t inplace_min_bytes);

  bool hierarchical() const { return hierarchical_; }
  std::string Describe() const;

 private:
  NetworkAllreduce(MPI_Comm comm, const MpiOps* ops, const Config& config, EngineStats* stats);

  // One segment in flight (or being prepared) in pipeline slot `slot`.
  struct Segment;
  struct Slot;
  struct Pipeline;

  // One call's pipeline: the next free slot (finishing the oldest segment in
  // flight when all `depth_` are taken), a segment's start, the drain.
  Slot& Acquire(Pipeline& pipe);
  void Launch(Pipeline& pipe, Slot& slot);
  void Drain(Pipeline& pipe);
  // A piece reduced where it lies, in equal segments of at most segment_bytes_.
  void ReduceDirect(Pipeline& pipe, const NetworkPiece& p);
  // The pieces packed (and widened to the wire type) into segments.
  void ReducePacked(Pipeline& pipe, const std::vector<const NetworkPiece*>& packed);

  MPI_Op OpFor(const Slot& slot) const;
  void Start(Segment& s, Slot& slot);
  void Finish(Segment& s, Slot& slot);
  void Wait(MPI_Request* request, const char* what);

  MPI_Comm comm_;  // the set's; not owned
  NodeSplit split_;  // the node and cross communicators (owned) and this rank's place in them
  const MpiOps* ops_;
  EngineStats* stats_;
  WaitPolicy wait_;
  int rank_ = 0, size_ = 1;
  int hosts_ = 1;
  bool homogeneous_ = true;
  bool hierarchical_ = false;
  int64_t segment_bytes_;
  int depth_;
  bool wire_16bit_;  // Note [16-bit wire]
  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace hvdcompat
