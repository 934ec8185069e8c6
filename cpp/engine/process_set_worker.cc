#include "engine/process_set_worker.h"

#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "engine/plan_agreement.h"
#include "negotiation/fusion.h"
#include "ops/gpu_backends.h"
#include "core/logging.h"
#include "ops/gloo_ops.h"
#include "ops/mpi_ops.h"
#include "transport/gloo_transport.h"
#include "transport/gloo_watch.h"

namespace hvdcompat {

namespace {

MPI_Comm DupOrNull(MPI_Comm comm, bool wanted) {
  if (!wanted) return MPI_COMM_NULL;
  MPI_Comm dup;
  HVD_MPI_CHECK(comm, MPI_Comm_dup(comm, &dup));
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  return dup;
}

TunedParams TunedFromConfig(const Config& c) {
  TunedParams p;
  p.fusion_threshold_bytes = c.fusion_threshold_bytes;
  p.cycle_time_ms = c.cycle_time_ms;
  p.fusion_chunk_bytes = c.fusion_chunk_bytes;
  p.max_call_bytes = c.max_call_bytes;
  p.hierarchical_allreduce = c.hierarchical_allreduce;
  return p;
}

// The timeline row of an op: its name, or one row per kind for unnamed ops,
// whose names ("allreduce.noname.<k>") are new on every call (Note [Timeline
// continues across runtimes], engine/timeline.h).
std::string TimelineRow(const std::string& name, bool auto_named) {
  if (!auto_named) return name;
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

std::string Upper(const char* s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::unique_ptr<ControlTransport> MakeTransport(const WorkerComm& comm, const MpiOps* ops,
                                                Poller* poller) {
  if (comm.gloo) return std::make_unique<GlooTransport>(comm.gloo);
  return std::make_unique<MpiTransport>(comm.mpi, ops, poller);
}

}  // namespace

ProcessSetWorker::ProcessSetWorker(int id, WorkerComm comm, std::vector<int> global_ranks,
                                   const Config& config, HandleTable* handles,
                                   const MpiOps* mpi_ops, EngineStats* stats, Timeline* timeline,
                                   GpuContext* gpu)
    : id_(id),
      comm_(comm.mpi),
      gloo_(comm.gloo),
      watch_(comm.watch),
      global_ranks_(std::move(global_ranks)),
      config_(config),
      handles_(handles),
      stats_(stats),
      timeline_(timeline),
      timeline_sink_(timeline, id),
      poller_(config.poll_spin_micros, config.poll_max_sleep_micros, &abort_),
      transport_(MakeTransport(comm, mpi_ops, &poller_)),
      start_config_([&] {
        AgreeOnPlanKnobs(transport_.get(), &config_, id, global_ranks_);
        return config_;
      }()),
      controller_(transport_.get(), static_cast<size_t>(config_.cache_capacity), global_ranks_,
                  id, stats),
      stall_(DupOrNull(comm.mpi, comm.mpi != MPI_COMM_NULL && (config.stall_check_seconds > 0 ||
                                                               config.stall_shutdown_seconds > 0)),
             transport_->rank(), global_ranks_, id,
             config.stall_check_seconds > 0 ? config.stall_check_seconds
                                            : config.stall_shutdown_seconds) {
  rank_ = transport_->rank();
  if (gloo_) {
    AddGpuBackendsOnGloo(&backends_, gloo_, global_ranks_, config_, gpu);
    backends_.push_back(std::make_unique<GlooBackend>(gloo_, config_, global_ranks_, stats_));
  } else {
    mpi_transport_ = static_cast<MpiTransport*>(transport_.get());
    AddGpuBackends(&backends_, comm_, mpi_ops, config_, gpu);
    backends_.push_back(std::make_unique<MpiBackend>(comm_, mpi_ops, config_, stats_));
  }
  for (auto& b : backends_) {
    b->set_activity(&timeline_sink_);
    b->SetAbortFlag(&shutdown_abort_);
  }
  if (id_ == 0) {
    TunedParams start = TunedFromConfig(config_);
    start.active = config_.autotune;
    stats_->tuning.Start(start);
    if (config_.autotune && rank_ == 0) {
      AutotuneOptions options = AutotuneOptions::FromConfig(config_);
      bool hierarchical = false;
      for (auto& b : backends_) hierarchical = hierarchical || b->TunesHierarchical();
      options.tune_hierarchical_allreduce =
          hierarchical && !KnobExplicit(Knob::kHierarchicalAllreduce);
      tuner_ = std::make_unique<ParameterManager>(options, start, Clock::now());
      // Nothing to tune: say so to every rank in the first cycle.
      if (!tuner_->active()) controller_.AnnounceParams(tuner_->current());
    }
  }
  // While waiting for peers, keep stall reports flowing (runs on this thread).
  poller_.set_tick([this](double) { InspectStalls(Clock::now()); });
  thread_ = std::thread([this] {
    if (!PinCurrentThread(config_.worker_core)) {
      HVD_LOG(kWarning) << "could not pin the engine thread of process set " << id_ << " to core "
                  << config_.worker_core << " (HOROVOD_THREAD_AFFINITY); it runs unpinned";
    }
    if (!RequestSchedulerSlice(config_.engine_slice_micros)) {
      HVD_LOG(kDebug) << "the scheduler refused the engine thread of process set " << id_
                      << " a slice of " << config_.engine_slice_micros
                      << " us (HVDCOMPAT_ENGINE_SLICE_MICROS); it keeps the default";
    }
    Loop();
    {
      std::lock_guard<std::mutex> lock(mu_);
      loop_exited_ = true;
    }
    loop_exited_cv_.notify_all();
  });
}

ProcessSetWorker::~ProcessSetWorker() {
  Shutdown();
  int finalized = 0;
  MPI_Finalized(&finalized);
  // An abandoned negotiation or data collective may still progress on comm_
  // (Note [Abandoned requests]): freeing it would pull it from under MPI.
  // Leave it allocated.
  if (!finalized && comm_ != MPI_COMM_NULL && !mpi_transport_->abandoned() && !aborted()) {
    MPI_Comm_free(&comm_);
  }
}

void ProcessSetWorker::Abandon(const std::string& why) {
  // backends_ is fixed once constructed; each backend's Abandon is thread-safe.
  for (auto& b : backends_) b->Abandon(why);
}

void ProcessSetWorker::Enqueue(std::unique_ptr<TensorEntry> entry) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopped_ || shutdown_requested_) {
    Status s = stopped_ ? stop_status_
                        : Status::Error(StatusCode::kAborted, "hvdcompat is shutting down");
    lock.unlock();
    Complete(std::move(entry), s);
    return;
  }
  entry->enqueued = Clock::now();
  incoming_.push_back(std::move(entry));
  pending_hint_.store(true, std::memory_order_release);
  lock.unlock();
  cv_.notify_one();
}

void ProcessSetWorker::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_requested_ = true;
  }
  pending_hint_.store(true, std::memory_order_release);
  cv_.notify_one();
  // The peers close this set's pairs once they are done: no loss.
  if (watch_ && gloo_) watch_->Forget(gloo_.get());
  if (!thread_.joinable()) return;
  // Note [Ending a stuck wait]: the last cycle or a data collective may wait
  // on a peer that stopped; past the bound, the abort flag ends the wait.
  if (config_.shutdown_timeout_seconds > 0) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto bound = std::chrono::duration<double>(config_.shutdown_timeout_seconds);
    if (!loop_exited_cv_.wait_for(lock, bound, [&] { return loop_exited_; })) {
      std::vector<int> peers;
      for (int r : global_ranks_) {
        if (r != global_ranks_[rank_]) peers.push_back(r);
      }
      std::ostringstream os;
      os << "hvd.shutdown() on rank " << global_ranks_[rank_] << " ended a wait on rank(s) "
         << JoinInts(peers) << (id_ ? " of process set " + std::to_string(id_) : std::string())
         << " after " << config_.shutdown_timeout_seconds
         << " s (HVDCOMPAT_SHUTDOWN_TIMEOUT_SECONDS): a peer stopped taking part in a collective "
            "it had agreed to (stopped by a signal, hung on its device, or held in a debugger). "
         << (gloo_ ? "Gloo's waits on it were ended; look at that peer."
                   : "This process will skip MPI_Finalize at exit; look at that peer.");
      shutdown_failure_ = os.str();
      shutdown_abort_.store(true);
      abort_.store(true);
      // Gloo's waits do not look at the flags: failing the pairs ends them.
      if (gloo_) GlooWatch::Abort(*gloo_, shutdown_failure_);
    }
  }
  thread_.join();
}

void ProcessSetWorker::Complete(std::unique_ptr<TensorEntry> entry, Status status) {
  if (!status.ok()) stats_->errors.fetch_add(1, std::memory_order_relaxed);
  entry->result.status = std::move(status);
  handles_->Complete(entry->handle, std::move(entry->result));
}

void ProcessSetWorker::CompleteByName(const std::string& name, const Status& status) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return;
  std::unique_ptr<TensorEntry> e = std::move(it->second);
  entries_.erase(it);
  Complete(std::move(e), status);
}

void ProcessSetWorker::FailEverything(const Status& status) {
  std::deque<std::unique_ptr<TensorEntry>> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    stop_status_ = status;
    pending.swap(incoming_);
  }
  for (auto& kv : entries_) Complete(std::move(kv.second), status);
  entries_.clear();
  for (auto& e : pending) Complete(std::move(e), status);
}

std::vector<StallInspector::Pending> ProcessSetWorker::PendingWaits(Clock::time_point now) const {
  std::vector<StallInspector::Pending> out;
  out.reserve(entries_.size());
  for (const auto& kv : entries_) {
    if (kv.second->request.op == OpType::kJoin) continue;
    out.push_back({kv.first, kv.second->request.op,
                   std::chrono::duration<double>(now - kv.second->submitted).count()});
  }
  return out;
}

void ProcessSetWorker::InspectStalls(Clock::time_point now) {
  if (!stall_.enabled()) return;
  std::vector<StallInspector::Pending> mine = PendingWaits(now);
  stall_.Tick(mine, controller_.coordinator(), now);
  if (config_.stall_shutdown_seconds <= 0 || !stall_failure_.empty()) return;
  double oldest = 0;
  for (const auto& p : mine) oldest = std::max(oldest, p.waited_seconds);
  if (oldest < config_.stall_shutdown_seconds) return;
  std::string detail = stall_.Describe(mine, controller_.coordinator(), now, 0);
  std::ostringstream os;
  os << "hvdcompat stopped this rank's collectives" << (id_ ? " in process set " + std::to_string(id_) : "")
     << " after an operation waited " << static_cast<int>(oldest)
     << " s for other ranks (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="
     << config_.stall_shutdown_seconds << ").";
  if (!detail.empty()) {
    os << " " << detail;
  } else {
    os << " Pending here:";
    for (const auto& p : mine) os << " " << OpTypeName(p.op) << " '" << p.name << "'";
    os << ". Set rank 0's stall warning names the ranks that did not submit.";
  }
  stall_failure_ = os.str();
  abort_.store(true);  // the poller throws on its next wake-up; the loop reports it
  // Gloo's waits do not poll: end the loop here (this runs on the worker thread).
  if (gloo_) throw std::runtime_error(stall_failure_);
}

void ProcessSetWorker::RecordNegotiated(const std::vector<Response>& responses,
                                        Clock::time_point now) {
  if (!timeline_->active()) return;
  for (const auto& r : responses) {
    std::string phase = "NEGOTIATE_" + Upper(OpTypeName(r.op));
    for (const auto& u : r.units) {
      auto it = entries_.find(u.name);
      if (it == entries_.end()) continue;
      timeline_->Span(id_, TimelineRow(u.name, it->second->request.auto_named), phase.c_str(),
                      it->second->submitted, now,
                      r.is_error() ? "\"error\": true" : std::string());
    }
  }
}

void ProcessSetWorker::Loop() {
  std::string thread_name = "hvd-ps" + std::to_string(id_);
  pthread_setname_np(pthread_self(), thread_name.c_str());
  // Short sleeps while polling peers should be short: tighten timer slack.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);

  bool progressed = true;
  int64_t backoff_us = 10;
  try {
    while (true) {
      std::deque<std::unique_ptr<TensorEntry>> fresh;
      const bool want_shutdown = WaitForWork(progressed, &backoff_us, &fresh);
      const auto now = Clock::now();
      const bool admitted = !fresh.empty();
      Admit(fresh, now);
      bool peer_shutdown = false;
      progressed = NegotiateAndExecute(want_shutdown, now, &peer_shutdown) || admitted;
      if (progressed) backoff_us = 10;
      if (want_shutdown || peer_shutdown) {
        std::string who = want_shutdown ? "this rank" : "another rank";
        FailEverything(Status::Error(
            StatusCode::kAborted,
            "hvdcompat has been shut down (" + who + " called hvd.shutdown() or exited" +
                (id_ ? ", process set " + std::to_string(id_) : std::string()) +
                ") before this operation completed. If a rank exited early, look for its "
                "error first; otherwise make every rank run the same collectives."));
        return;
      }
    }
  } catch (const std::exception& e) {
    std::string msg;
    const auto* ce = dynamic_cast<const CommunicationError*>(&e);
    std::vector<int> lost;
    // Gloo names an address; the watch knows which peers' pairs closed.
    if (gloo_ && watch_ && (!ce || ce->failed_ranks().empty())) lost = watch_->Lost(gloo_);
    msg = lost.empty() ? DescribeFailure(e) : DescribeFailure(CommunicationError(e.what(), lost));
    HVD_LOG(kError) << msg;
    if (lost.empty() && ce) lost = ce->failed_ranks();
    if (!lost.empty()) ReportLostRanks(lost);
    FailEverything(Status::Error(StatusCode::kInternal, msg));
  }
}

bool ProcessSetWorker::WaitForWork(bool progressed, int64_t* backoff_us,
                                   std::deque<std::unique_ptr<TensorEntry>>* fresh) {
  if (!controller_.HasPending()) {
    // Work often follows work (the next gradient, the next step): watch
    // for it briefly before sleeping, since waking a sleeping thread costs
    // tens of microseconds on some machines. Never by yielding (Note
    // [Engine-owned waiting]): a yielding thread loses a busy core for a
    // whole slice.
    auto until = Clock::now() + std::chrono::microseconds(config_.poll_spin_micros);
    while (!pending_hint_.load(std::memory_order_acquire) && Clock::now() < until) {
      CpuRelax();
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!controller_.HasPending() && incoming_.empty() && !shutdown_requested_) {
    // Idle: sleep until work arrives; the coordinator wakes up every
    // second to read other ranks' stall reports.
    while (incoming_.empty() && !shutdown_requested_) {
      if (stall_.enabled() && rank_ == 0) {
        cv_.wait_for(lock, std::chrono::seconds(1));
        lock.unlock();
        InspectStalls(Clock::now());
        lock.lock();
      } else {
        cv_.wait(lock);
      }
    }
    if (config_.cycle_time_ms > 0 && !shutdown_requested_) {
      // Batching window: let more tensors arrive before negotiating. Read
      // each time round: the autotuner may change it.
      const auto cycle_time = std::chrono::duration<double, std::milli>(config_.cycle_time_ms);
      cv_.wait_for(lock, cycle_time, [&] { return shutdown_requested_; });
    }
  } else if (!progressed && incoming_.empty() && !shutdown_requested_) {
    // Pending work that did not match last cycle: peers are elsewhere.
    cv_.wait_for(lock, std::chrono::microseconds(*backoff_us),
                 [&] { return !incoming_.empty() || shutdown_requested_; });
    *backoff_us = std::min<int64_t>(*backoff_us * 2, 1000);
  }
  fresh->swap(incoming_);
  pending_hint_.store(false, std::memory_order_relaxed);
  return shutdown_requested_;
}

void ProcessSetWorker::Admit(std::deque<std::unique_ptr<TensorEntry>>& fresh,
                             Clock::time_point now) {
  for (auto& e : fresh) {
    e->submitted = now;
    if (timeline_->active()) {
      timeline_->Span(id_, TimelineRow(e->request.name, e->request.auto_named), "QUEUE",
                      e->enqueued, now);
    }
    controller_.Submit(e->request, now);
    std::string name = e->request.name;
    entries_[name] = std::move(e);
  }
}

bool ProcessSetWorker::NegotiateAndExecute(bool want_shutdown, Clock::time_point now,
                                           bool* peer_shutdown) {
  if (timeline_->active() && timeline_->mark_cycles()) {
    timeline_->Instant(id_, "engine", "CYCLE_START", now);
  }
  // Requests cached but unmatched for half the check time go through the
  // coordinator, so the stall warning can name who has not submitted.
  double reroute = config_.stall_check_seconds > 0 ? config_.stall_check_seconds / 2 : 0;
  Controller::Outcome out = controller_.RunCycle(want_shutdown, now, reroute);
  *peer_shutdown = out.peer_shutdown;
  const bool decided = !out.responses.empty();
  RecordNegotiated(out.responses, Clock::now());
  if (out.params) ApplyTuning(*out.params);
  std::vector<std::string> scored;
  int64_t scored_bytes = 0;
  if (tuner_ && tuner_->active()) {
    for (const auto& r : out.responses) {
      if (r.is_error() || r.op == OpType::kJoin || r.op == OpType::kBarrier) continue;
      scored_bytes += r.TotalBytes();
      // Unnamed ops get a new name each call and cannot mark steps.
      if (!r.auto_named) scored.push_back(r.units[0].name);
    }
  }
  Execute(std::move(out.responses));
  if (tuner_ && tuner_->active()) ScoreCycle(scored, scored_bytes);
  InspectStalls(Clock::now());
  return decided;
}

void ProcessSetWorker::ApplyTuning(const TunedParams& p) {
  config_.fusion_threshold_bytes = p.fusion_threshold_bytes;
  config_.cycle_time_ms = p.cycle_time_ms;
  config_.fusion_chunk_bytes = p.fusion_chunk_bytes;
  config_.max_call_bytes = p.max_call_bytes;
  config_.hierarchical_allreduce = p.hierarchical_allreduce;
  for (auto& b : backends_) b->ApplyTuning(p);
  stats_->tuning.Apply(controller_.cycles(), p);
  if (tuner_) tuner_->Applied(Clock::now());
}

void ProcessSetWorker::ScoreCycle(const std::vector<std::string>& names, int64_t bytes) {
  if (auto next = tuner_->Update(names, bytes, Clock::now())) controller_.AnnounceParams(*next);
}

void ProcessSetWorker::Execute(std::vector<Response> responses) {
  for (auto& r : FuseResponses(std::move(responses), config_.fusion_threshold_bytes)) {
    if (r.is_error()) {
      for (const auto& u : r.units) CompleteByName(u.name, Status::Error(r.error_code, r.error));
      continue;
    }
    if (r.op == OpType::kJoin) {
      for (auto& kv : entries_) {
        if (kv.second->request.op != OpType::kJoin) continue;
        kv.second->result.join_last_rank = r.last_joined >= 0 ? global_ranks_[r.last_joined] : -1;
        CompleteByName(std::string(kv.first), Status::OK());
        break;
      }
      continue;
    }
    std::vector<ExecUnit> units;
    units.reserve(r.units.size());
    size_t tensors = 0;
    for (const auto& u : r.units) {
      auto it = entries_.find(u.name);
      units.push_back({&u, it == entries_.end() ? nullptr : it->second.get()});
      tensors += u.shapes.size();
    }
    CollectiveBackend* backend = nullptr;
    for (auto& b : backends_) {
      if (b->CanExecute(r)) {
        backend = b.get();
        break;
      }
    }
    if (!backend) {
      Status s = Status::Error(StatusCode::kInvalidArgument,
                               std::string(OpTypeName(r.op)) + " '" + r.units[0].name +
                                   "': no backend can run it on device " +
                                   std::to_string(r.device) +
                                   " (GPU tensors need NCCL or HOROVOD_GPU_OPERATIONS=MPI)");
      for (const auto& u : r.units) CompleteByName(u.name, s);
      continue;
    }
    auto start = Clock::now();
    try {
      backend->Execute(r, units);
    } catch (const InvalidArgument& e) {
      for (const auto& u : r.units) {
        CompleteByName(u.name, Status::Error(StatusCode::kInvalidArgument, e.what()));
      }
      continue;
    }
    // Any other failure propagates: the communicator cannot be trusted any
    // more, and the loop fails every pending entry with the reason.
    if (timeline_->active()) {
      auto end = Clock::now();
      std::string phase = Upper(OpTypeName(r.op));
      std::string args = "\"tensors\": " + std::to_string(tensors) +
                         ", \"bytes\": " + std::to_string(r.TotalBytes()) + ", \"backend\": \"" +
                         backend->name() + "\"";
      for (const auto& u : units) {
        const bool unnamed = u.entry ? u.entry->request.auto_named : r.auto_named;
        timeline_->Span(id_, TimelineRow(u.unit->name, unnamed), phase.c_str(), start, end, args);
      }
    }
    stats_->collectives.fetch_add(1, std::memory_order_relaxed);
    stats_->tensors.fetch_add(tensors, std::memory_order_relaxed);
    stats_->bytes.fetch_add(static_cast<uint64_t>(r.TotalBytes()), std::memory_order_relaxed);
    if (tensors > 1) {
      stats_->fused_collectives.fetch_add(1, std::memory_order_relaxed);
      stats_->fused_tensors.fetch_add(tensors, std::memory_order_relaxed);
    }
    for (const auto& u : r.units) CompleteByName(u.name, Status::OK());
  }
}

}  // namespace hvdcompat
