// One process set's engine: its communicator, negotiation state (controller,
// response cache, coordinator on set rank 0), data-plane backends and the
// background thread that runs them. Sets never share a thread or a
// communicator, so two sets' traffic does not serialise.
//
// Threads: Enqueue/Shutdown are called by API threads; everything else runs
// on the worker thread. Completion callbacks (HandleTable::Complete) run
// without holding the worker's lock.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "autotune/parameter_manager.h"
#include "negotiation/controller.h"
#include "core/engine_stats.h"
#include "core/env.h"
#include "gpu/gpu_context.h"
#include "engine/handle_table.h"
#include "transport/mpi_transport.h"
#include "ops/backend.h"
#include "transport/poller.h"
#include "negotiation/stall_inspector.h"
#include "engine/timeline.h"

namespace gloo {
class Context;
}

namespace hvdcompat {

class GlooWatch;

// What a worker runs on: an MPI communicator (the worker owns it), or a Gloo
// context of its own (the Gloo controller, transport/gloo_context.h).
struct WorkerComm {
  WorkerComm(MPI_Comm c) : mpi(c) {}  // NOLINT: implicit, as callers pass communicators
  WorkerComm(std::shared_ptr<gloo::Context> c, GlooWatch* w) : gloo(std::move(c)), watch(w) {}
  MPI_Comm mpi = MPI_COMM_NULL;
  std::shared_ptr<gloo::Context> gloo;
  GlooWatch* watch = nullptr;  // the job's (Note [Lost peers on Gloo]); outlives the worker
};

class ProcessSetWorker {
 public:
  // Takes ownership of `comm` (an MPI communicator is freed when the worker
  // is destroyed).
  // `timeline` (may be inactive), `stats` and `gpu` (may be null: host
  // buffers only) must outlive the worker.
  ProcessSetWorker(int id, WorkerComm comm, std::vector<int> global_ranks, const Config& config,
                   HandleTable* handles, const MpiOps* mpi_ops, EngineStats* stats,
                   Timeline* timeline, GpuContext* gpu = nullptr);
  ~ProcessSetWorker();
  ProcessSetWorker(const ProcessSetWorker&) = delete;
  ProcessSetWorker& operator=(const ProcessSetWorker&) = delete;

  int id() const { return id_; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  // The configuration the worker started with, after the plan knobs' agreement
  // (Note [Plan knobs from set rank 0]); tuning does not change it.
  const Config& start_config() const { return start_config_; }

  // Hands an op to the worker; its handle completes later. Its name must be
  // unique among the set's pending ops (the handle table holds it until the
  // caller has seen the op finish). After the worker stopped, the handle
  // completes at once with the reason.
  void Enqueue(std::unique_ptr<TensorEntry> entry);

  // Tells the other ranks of the set (one last negotiation cycle), fails
  // whatever is still pending, and joins the thread. Idempotent. A wait on a
  // peer that never comes is ended after HVDCOMPAT_SHUTDOWN_TIMEOUT_SECONDS
  // (Note [Ending a stuck wait], transport/request_wait.h).
  void Shutdown();

  // Whether a wait was ended by the abort flag: a call may still be posted
  // in MPI, so its communicator stays allocated and MPI_Finalize must not run.
  bool aborted() const { return shutdown_abort_.load(); }

  // Backend::Abandon on every backend (an elastic reset; any thread).
  void Abandon(const std::string& why);

 private:
  void Loop();
  // The steps of one turn of Loop, in order. Waits (spinning briefly, then
  // on cv_) until there is something to negotiate, moves the queued entries
  // to `fresh`, and returns whether shutdown was requested.
  bool WaitForWork(bool progressed, int64_t* backoff_us,
                   std::deque<std::unique_ptr<TensorEntry>>* fresh);
  // Submits the fresh entries to the controller; the worker owns them from now.
  void Admit(std::deque<std::unique_ptr<TensorEntry>>& fresh, Clock::time_point now);
  // One negotiation cycle, then executes what it decided and inspects
  // stalls; returns whether anything was decided.
  bool NegotiateAndExecute(bool want_shutdown, Clock::time_point now, bool* peer_shutdown);
  void Execute(std::vector<Response> responses);
  void Complete(std::unique_ptr<TensorEntry> entry, Status status);
  void CompleteByName(const std::string& name, const Status& status);
  void FailEverything(const Status& status);
  // Stall reporting; may end the worker when HOROVOD_STALL_SHUTDOWN_TIME_SECONDS passes.
  void InspectStalls(Clock::time_point now);
  std::vector<StallInspector::Pending> PendingWaits(Clock::time_point now) const;
  std::string DescribeFailure(const std::exception& e) const;
  // Set ranks (as a failure names them) as global ranks.
  std::vector<int> GlobalRanks(const std::vector<int>& set_ranks) const;
  // Writes the lost ranks (set ranks, named by their global ranks and hosts)
  // to the rank supervisor's report pipe, when there is one (HVDCOMPAT_REPORT_FD).
  void ReportLostRanks(const std::vector<int>& set_ranks) const;
  void RecordNegotiated(const std::vector<Response>& responses, Clock::time_point now);
  // Autotune (global set only): switch to negotiated settings; feed the
  // coordinator's tuner what a cycle executed.
  void ApplyTuning(const TunedParams& params);
  void ScoreCycle(const std::vector<std::string>& names, int64_t bytes);

  class TimelineSink : public ActivitySink {
   public:
    TimelineSink(Timeline* t, int pid) : timeline_(t), pid_(pid) {}
    bool enabled() const override { return timeline_->active(); }
    void Record(const char* phase, Clock::time_point s, Clock::time_point e) override {
      timeline_->Span(pid_, "engine", phase, s, e);
    }

   private:
    Timeline* timeline_;
    int pid_;
  };

  const int id_;
  MPI_Comm comm_;
  std::shared_ptr<gloo::Context> gloo_;
  GlooWatch* watch_ = nullptr;
  std::vector<int> global_ranks_;
  Config config_;
  HandleTable* handles_;
  EngineStats* stats_;
  Timeline* timeline_;
  TimelineSink timeline_sink_;
  int rank_ = 0;

  std::atomic<bool> abort_{false};  // ends the negotiation's waits (stall or shutdown bound)
  std::atomic<bool> shutdown_abort_{false};  // ends the data waits too (the shutdown bound only)
  std::atomic<bool> pending_hint_{false};  // set with incoming_/shutdown, read without the lock
  Poller poller_;
  std::unique_ptr<ControlTransport> transport_;
  MpiTransport* mpi_transport_ = nullptr;  // transport_, on MPI
  // config_ once set rank 0's plan knobs are in it, before anything below uses
  // them (Note [Plan knobs from set rank 0]).
  Config start_config_;
  Controller controller_;
  StallInspector stall_;
  std::vector<std::unique_ptr<CollectiveBackend>> backends_;

  // Guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<TensorEntry>> incoming_;
  bool shutdown_requested_ = false;
  bool stopped_ = false;
  Status stop_status_;
  std::condition_variable loop_exited_cv_;
  bool loop_exited_ = false;
  // Set by Shutdown before abort_ when its bound passed (Note [Ending a stuck wait]).
  std::string shutdown_failure_;

  // Worker thread only.
  std::unordered_map<std::string, std::unique_ptr<TensorEntry>> entries_;
  std::string stall_failure_;  // set when the stall shutdown time passed
  std::unique_ptr<ParameterManager> tuner_;  // global set rank 0 with HOROVOD_AUTOTUNE=1

  std::thread thread_;
};

}  // namespace hvdcompat
