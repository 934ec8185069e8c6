// A data-plane backend runs negotiated (possibly fused) responses. Backends
// are asked in registration order; the first that can execute a response
// runs it (MPI for host buffers; NCCL for CUDA buffers when loaded).
#pragma once

#include <atomic>

#include <chrono>
#include <string>
#include <vector>

#include "core/tuned_params.h"
#include "core/message.h"
#include "core/tensor_entry.h"

namespace hvdcompat {

// A reduction's scale factors, the same on every host backend: the user's
// prescale, and the postscale with Average folded in (Average = Sum, then
// 1/size).
inline void ReduceScales(const Response& r, int size, double* pre, double* post) {
  *pre = r.prescale;
  *post = r.postscale;
  if (r.reduce_op == ReduceOp::kAverage) *post /= size;
}

// Average's factor is applied to float32 in double (bit-equal to torch's
// sum / size); user factors alone keep Horovod's rounding in the tensor's type.
inline bool PostInDouble(ReduceOp op) { return op == ReduceOp::kAverage; }

// One response unit on this rank. `entry` is null on a rank that has joined
// (it contributes identity values and keeps no output).
struct ExecUnit {
  const ResponseUnit* unit;
  TensorEntry* entry;
};

// Receives the phases of a running collective (fusion copies, the transfer
// itself) for the timeline. Called on the worker thread.
class ActivitySink {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~ActivitySink() = default;
  virtual bool enabled() const = 0;
  virtual void Record(const char* phase, Clock::time_point start, Clock::time_point end) = 0;
};

class CollectiveBackend {
 public:
  virtual ~CollectiveBackend() = default;
  // Where to report phases; may stay null.
  void set_activity(ActivitySink* activity) { activity_ = activity; }
  virtual const char* name() const = 0;
  virtual bool CanExecute(const Response& response) const = 0;
  // Runs the collective on every rank of the set; writes outputs and fills
  // entry->result (except status). Throws on failure.
  virtual void Execute(const Response& response, std::vector<ExecUnit>& units) = 0;
  // Takes the autotuner's settings. Called on the worker thread between
  // collectives, in the same cycle on every rank (Note [Tuned params in
  // negotiation], controller.h); a backend keeps what it does not use.
  virtual void ApplyTuning(const TunedParams& params) {}
  // True where this backend can switch hierarchical allreduce/allgather at
  // such a point: only then does the autotuner try the flags.
  virtual bool TunesHierarchical() const { return false; }
  // The job this backend serves is being rebuilt from the survivors of a
  // failure (Note [Elastic reset], engine/elastic_reset.h): peers may be dead,
  // so whatever the backend holds that waits on them (device communicators)
  // is aborted now rather than destroyed later. Any thread, any time, once;
  // collectives that meet the aborted state fail.
  virtual void Abandon(const std::string& why) {}
  // The worker's abort flag (Note [Ending a stuck wait], request_wait.h):
  // once it is set, a wait of this backend still in progress ends with
  // CommunicationError. Called once, on the worker thread, before any
  // collective; a backend that wraps another passes it on.
  virtual void SetAbortFlag(const std::atomic<bool>* abort) {}

 protected:
  bool recording() const { return activity_ && activity_->enabled(); }
  // Runs `f`, reporting it as `phase` when the timeline records.
  template <typename F>
  void Timed(const char* phase, F&& f) {
    if (!recording()) return f();
    auto start = ActivitySink::Clock::now();
    f();
    activity_->Record(phase, start, ActivitySink::Clock::now());
  }
  ActivitySink* activity_ = nullptr;
};

}  // namespace hvdcompat
