#include "process_set_worker.h"

#include <pthread.h>
#include <sys/prctl.h>

#include <sstream>

#include "fusion.h"
#include "gpu/gpu_backends.h"
#include "logging.h"
#include "ops/mpi_ops.h"

namespace hvdcompat {

namespace {

std::string JoinInts(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

ProcessSetWorker::ProcessSetWorker(int id, MPI_Comm comm, std::vector<int> global_ranks,
                                   const Config& config, HandleTable* handles,
                                   const MpiOps* mpi_ops, EngineStats* stats, GpuContext* gpu)
    : id_(id),
      comm_(comm),
      global_ranks_(std::move(global_ranks)),
      config_(config),
      handles_(handles),
      stats_(stats),
      poller_(config.poll_spin_micros, config.poll_max_sleep_micros, &abort_),
      transport_(comm, mpi_ops, &poller_),
      controller_(&transport_, static_cast<size_t>(config.cache_capacity), global_ranks_, id,
                  stats) {
  rank_ = transport_.rank();
  AddGpuBackends(&backends_, comm_, mpi_ops, config_, gpu);
  backends_.push_back(std::make_unique<MpiBackend>(comm_, mpi_ops, config_));
  next_stall_report_ = Clock::now();
  thread_ = std::thread([this] { Loop(); });
}

ProcessSetWorker::~ProcessSetWorker() {
  Shutdown();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
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
  const std::string& name = entry->request.name;
  if (!in_flight_.insert(name).second) {
    throw InvalidArgument(
        std::string(OpTypeName(entry->request.op)) + " '" + name +
        "': an operation with this name is still in flight on this rank. Requested to "
        "allreduce, allgather, or broadcast a tensor with the same name as another tensor "
        "that is currently being processed. Wait for the first one (hvd.synchronize) or use "
        "a different name.");
  }
  incoming_.push_back(std::move(entry));
  lock.unlock();
  cv_.notify_one();
}

void ProcessSetWorker::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_requested_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void ProcessSetWorker::Complete(std::unique_ptr<TensorEntry> entry, Status status) {
  if (!status.ok()) stats_->errors.fetch_add(1, std::memory_order_relaxed);
  {
    // The name is free again before the handle reports done, so a caller
    // that synchronizes and immediately reuses the name is not refused.
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.erase(entry->request.name);
  }
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

void ProcessSetWorker::ReportStalls(Clock::time_point now) {
  if (config_.stall_check_seconds <= 0 || now < next_stall_report_) return;
  next_stall_report_ = now + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(config_.stall_check_seconds));
  Coordinator* coord = controller_.coordinator();
  if (!coord) return;
  auto stalled = coord->FindStalled(config_.stall_check_seconds, now);
  if (stalled.empty()) return;
  std::ostringstream os;
  os << "One or more tensors were submitted to be reduced, gathered or broadcast by a subset of "
        "ranks and are waiting for the remaining ranks"
     << (id_ ? " (process set " + std::to_string(id_) + ")" : std::string()) << ":";
  for (const auto& s : stalled) {
    os << "\n  " << OpTypeName(s.op) << " '" << s.name << "' waiting "
       << static_cast<int>(s.waited_seconds) << " s: submitted by rank(s) " << JoinInts(s.submitted)
       << "; missing on rank(s) " << JoinInts(s.missing);
  }
  os << "\nUsual causes: ranks submit different names or a different order (name your ops "
        "consistently), or some ranks have less data than others (use hvd.join()).";
  HVD_LOG(kWarning) << os.str();
}

void ProcessSetWorker::Loop() {
  std::string thread_name = "hvd-ps" + std::to_string(id_);
  pthread_setname_np(pthread_self(), thread_name.c_str());
  // Short sleeps while polling peers should be short: tighten timer slack.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);

  bool progressed = true;
  int64_t backoff_us = 10;
  const auto cycle_time = std::chrono::duration<double, std::milli>(config_.cycle_time_ms);
  try {
    while (true) {
      std::deque<std::unique_ptr<TensorEntry>> fresh;
      bool want_shutdown;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!controller_.HasPending() && incoming_.empty() && !shutdown_requested_) {
          // Idle: sleep until work arrives; wake up now and then for stall checks.
          while (incoming_.empty() && !shutdown_requested_) {
            if (config_.stall_check_seconds > 0 && controller_.coordinator()) {
              cv_.wait_for(lock, std::chrono::seconds(1));
              lock.unlock();
              ReportStalls(Clock::now());
              lock.lock();
            } else {
              cv_.wait(lock);
            }
          }
          if (config_.cycle_time_ms > 0 && !shutdown_requested_) {
            // Batching window: let more tensors arrive before negotiating.
            cv_.wait_for(lock, cycle_time, [&] { return shutdown_requested_; });
          }
        } else if (!progressed && incoming_.empty() && !shutdown_requested_) {
          // Pending work that did not match last cycle: peers are elsewhere.
          cv_.wait_for(lock, std::chrono::microseconds(backoff_us),
                       [&] { return !incoming_.empty() || shutdown_requested_; });
          backoff_us = std::min<int64_t>(backoff_us * 2, 1000);
        }
        fresh.swap(incoming_);
        want_shutdown = shutdown_requested_;
      }
      auto now = Clock::now();
      for (auto& e : fresh) {
        controller_.Submit(e->request, now);
        std::string name = e->request.name;
        entries_[name] = std::move(e);
      }
      Controller::Outcome out = controller_.RunCycle(
          want_shutdown, now, config_.stall_check_seconds, config_.stall_shutdown_seconds);
      progressed = !out.responses.empty() || !fresh.empty();
      if (progressed) backoff_us = 10;
      Execute(std::move(out.responses));
      ReportStalls(Clock::now());
      if (want_shutdown || out.peer_shutdown) {
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
    std::string msg = std::string("hvdcompat background worker") +
                      (id_ ? " of process set " + std::to_string(id_) : std::string()) +
                      " failed: " + e.what();
    HVD_LOG(kError) << msg;
    FailEverything(Status::Error(StatusCode::kInternal, msg));
  }
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
    try {
      backend->Execute(r, units);
    } catch (const InvalidArgument& e) {
      for (const auto& u : r.units) {
        CompleteByName(u.name, Status::Error(StatusCode::kInvalidArgument, e.what()));
      }
      continue;
    } catch (const std::exception& e) {
      std::string msg = std::string(backend->name()) + " " + OpTypeName(r.op) + " of '" +
                        r.units[0].name + "'" + (r.units.size() > 1 ? " (fused)" : "") +
                        " failed: " + e.what();
      for (const auto& u : r.units) CompleteByName(u.name, Status::Error(StatusCode::kInternal, msg));
      throw;  // the communicator cannot be trusted any more
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
