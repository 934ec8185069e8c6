#include "engine/runtime.h"

#include <algorithm>
#include <sstream>

#include "core/logging.h"

namespace hvdcompat {

namespace {

int64_t WaitSpinMicros() {
  // Not a documented knob: the synchronize() spin before sleeping.
  const char* v = std::getenv("HVDCOMPAT_WAIT_SPIN_MICROS");
  return v ? std::max<int64_t>(0, std::atoll(v)) : 100;
}

std::string RankListString(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string OpLabel(OpType op) {
  std::string s = OpTypeName(op);
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(s[0]));
  return s;
}

}  // namespace

Runtime::Runtime(const InitOptions& options)
    : config_(Config::FromEnvironment()),
      handles_(WaitSpinMicros()),
      dynamic_(options.dynamic_process_sets || KnobBool(Knob::kDynamicProcessSets)) {
  mpi_ = std::make_unique<MpiContext>(options.comm.value_or(MPI_COMM_WORLD), options.ranks);
  ConfigureLogging(mpi_->rank());
  config_.rank_hosts = mpi_->hosts();
  config_.worker_core =
      WorkerCoreFor(config_.thread_affinity, mpi_->local_rank(), mpi_->local_size());
  if (!config_.timeline_path.empty() && config_.timeline_path != "DYNAMIC" && mpi_->rank() == 0) {
    timeline_.Start(config_.timeline_path, config_.timeline_mark_cycles);
  }
  gpu_ = std::make_unique<GpuContext>(config_, mpi_->local_rank());
  std::vector<int> all(mpi_->size());
  for (int i = 0; i < mpi_->size(); ++i) all[i] = i;
  std::lock_guard<std::mutex> lock(sets_mu_);
  set_ranks_[0] = all;
  workers_[0] = std::make_shared<ProcessSetWorker>(0, mpi_->Duplicate(), all, config_, &handles_,
                                                   &mpi_->ops(), &stats_, &timeline_, gpu_.get());
  for (size_t i = 0; i < options.process_sets.size(); ++i) {
    RegisterLocked(options.process_sets[i],
                   i < options.process_set_ids.size() ? options.process_set_ids[i] : -1);
  }
}

Runtime::~Runtime() {
  Stop();
  mpi_.reset();
}

void Runtime::Stop() {
  std::map<int, std::shared_ptr<ProcessSetWorker>> workers;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    stopped_ = true;
    workers.swap(workers_);
  }
  // Sub-sets first, the global set last: its shutdown cycle tells everyone.
  for (auto it = workers.rbegin(); it != workers.rend(); ++it) it->second->Shutdown();
  workers.clear();
  timeline_.Stop();
}

void Runtime::Abandon(const std::string& why) {
  std::vector<std::shared_ptr<ProcessSetWorker>> workers;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& [id, w] : workers_) workers.push_back(w);
  }
  for (auto& w : workers) w->Abandon(why);
}

void Runtime::StartTimeline(const std::string& path, bool mark_cycles) {
  if (config_.timeline_path != "DYNAMIC") {
    throw InvalidArgument(
        "Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage (hvd.start_timeline / "
        "hvd.stop_timeline); it must be set before hvd.init().");
  }
  if (mpi_->rank() == 0) timeline_.Start(path, mark_cycles);
}

void Runtime::StopTimeline() {
  if (config_.timeline_path != "DYNAMIC") {
    throw InvalidArgument("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.");
  }
  timeline_.Stop();
}

int Runtime::Enqueue(EnqueueArgs args) {
  std::shared_ptr<ProcessSetWorker> worker;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    if (stopped_) {
      throw InvalidArgument(OpLabel(args.op) + " '" + args.name +
                            "': hvdcompat has been shut down on this rank; call hvd.init() "
                            "before further collectives.");
    }
    auto w = workers_.find(args.process_set);
    if (w == workers_.end()) {
      if (set_ranks_.count(args.process_set)) {
        throw InvalidArgument(OpLabel(args.op) + ": Rank " + std::to_string(mpi_->rank()) +
                              " is not a member of the provided process set (id " +
                              std::to_string(args.process_set) + ", ranks " +
                              RankListString(set_ranks_.at(args.process_set)) +
                              "). Only member ranks may call collectives on it.");
      }
      throw InvalidArgument(OpLabel(args.op) +
                            ": Process set provided does not exist, or has not been "
                            "registered (id " +
                            std::to_string(args.process_set) + "). Register it with "
                            "hvd.add_process_set or hvd.init(process_sets=...).");
    }
    worker = w->second;
  }
  auto entry = std::make_unique<TensorEntry>();
  Request& q = entry->request;
  q.op = args.op;
  q.name = std::move(args.name);
  q.auto_named = args.auto_named;
  q.reduce_op = args.reduce_op;
  q.prescale = args.prescale;
  q.postscale = args.postscale;
  q.device = args.inputs.empty() ? kCpuDevice : args.inputs[0].device;
  q.dtype = args.inputs.empty() ? DataType::kUInt8 : args.inputs[0].dtype;
  for (const auto& b : args.inputs) {
    if (b.device != q.device) {
      throw InvalidArgument(OpLabel(args.op) + " '" + q.name +
                            "': Tensors in list must be on same device (found " +
                            std::to_string(q.device) + " and " + std::to_string(b.device) + ")");
    }
    if (b.dtype != q.dtype) {
      throw InvalidArgument(OpLabel(args.op) + " '" + q.name +
                            "': tensors in a group must share one dtype (found " +
                            DataTypeName(q.dtype) + " and " + DataTypeName(b.dtype) + ")");
    }
    q.shapes.push_back(b.shape);
  }
  if (args.op == OpType::kBroadcast) {
    const auto& ranks = worker->global_ranks();
    auto it = std::find(ranks.begin(), ranks.end(), args.root);
    if (it == ranks.end()) {
      throw InvalidArgument("broadcast received invalid root rank " + std::to_string(args.root) +
                            ": it is not a member of " +
                            (args.process_set ? "process set " + std::to_string(args.process_set) +
                                                    " " + RankListString(ranks)
                                              : "the job (size " + std::to_string(mpi_->size()) + ")") +
                            ". root_rank is a global rank.");
    }
    q.root = static_cast<int>(it - ranks.begin());
  }
  if (args.op == OpType::kAlltoall) {
    for (const auto& s : args.splits) {
      if (static_cast<int>(s.size()) != worker->size()) {
        throw InvalidArgument("alltoall '" + q.name + "': Number of entries in splits (" +
                              std::to_string(s.size()) +
                              ") does not equal number of workers (" +
                              std::to_string(worker->size()) + ").");
      }
    }
  }
  for (const auto& b : args.outputs) {
    if (b.device != q.device) {
      throw InvalidArgument(OpLabel(args.op) + " '" + q.name + "': outputs must be on the inputs' "
                            "device (found " + std::to_string(q.device) + " and " +
                            std::to_string(b.device) + ")");
    }
  }
  if (q.device != kCpuDevice) {
    entry->ready = gpu_->PrepareEnqueue(std::string(OpTypeName(args.op)) + " '" + q.name + "'",
                                        q.device, args.stream);
    // Ranks negotiate the kind of device, not its index: each rank drives its
    // own GPU (its index stays in the buffers), and a cached response must
    // serve every rank.
    q.device = 0;
  }
  entry->inputs = std::move(args.inputs);
  entry->outputs = std::move(args.outputs);
  entry->splits = std::move(args.splits);
  int handle = handles_.Create();
  entry->handle = handle;
  try {
    worker->Enqueue(std::move(entry));
  } catch (...) {
    handles_.Discard(handle);
    throw;
  }
  return handle;
}

int Runtime::RegisterLocked(std::vector<int> ranks, int wanted_id) {
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= mpi_->size() || (i && ranks[i] == ranks[i - 1])) {
      throw InvalidArgument("process set " + RankListString(ranks) +
                            ": ranks must be distinct and in [0, " + std::to_string(mpi_->size()) +
                            ")");
    }
  }
  if (ranks.empty()) throw InvalidArgument("a process set needs at least one rank");
  for (const auto& kv : set_ranks_) {
    if (kv.second == ranks) {
      throw InvalidArgument("Attempted to add a duplicate process set: ranks " +
                            RankListString(ranks) + " are already process set " +
                            std::to_string(kv.first));
    }
  }
  MPI_Comm comm = mpi_->comm();
  // Every rank must be registering the same set: compare a digest.
  uint64_t digest = 1469598103934665603ull;
  for (int r : ranks) digest = (digest ^ static_cast<uint64_t>(r + 1)) * 1099511628211ull;
  uint64_t minmax[2] = {digest, ~digest};
  HVD_MPI_CHECK(comm, MPI_Allreduce(MPI_IN_PLACE, minmax, 2, MPI_UINT64_T, MPI_MIN, comm));
  if (minmax[0] != digest || ~minmax[1] != digest) {
    throw InvalidArgument("add_process_set(" + RankListString(ranks) +
                          "): ranks passed different process sets. Every rank of the job must "
                          "call add_process_set with the same ranks, in the same order.");
  }
  MPI_Group world_group, group;
  HVD_MPI_CHECK(comm, MPI_Comm_group(comm, &world_group));
  HVD_MPI_CHECK(comm, MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &group));
  MPI_Comm set_comm = MPI_COMM_NULL;
  HVD_MPI_CHECK(comm, MPI_Comm_create(comm, group, &set_comm));
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  int id;
  if (wanted_id > 0) {
    // Ids below it that stay unused are handed out later.
    id = wanted_id;
    for (int i = next_id_; i < id; ++i) free_ids_.push_back(i);
    next_id_ = std::max(next_id_, id + 1);
    free_ids_.erase(std::remove(free_ids_.begin(), free_ids_.end(), id), free_ids_.end());
  } else if (!free_ids_.empty()) {
    id = free_ids_.front();
    free_ids_.pop_front();
  } else {
    id = next_id_++;
  }
  set_ranks_[id] = ranks;
  if (set_comm != MPI_COMM_NULL) {
    MPI_Comm_set_errhandler(set_comm, MPI_ERRORS_RETURN);
    workers_[id] = std::make_shared<ProcessSetWorker>(id, set_comm, ranks, config_, &handles_,
                                                      &mpi_->ops(), &stats_, &timeline_, gpu_.get());
  }
  return id;
}

int Runtime::AddProcessSet(std::vector<int> ranks) {
  std::lock_guard<std::mutex> lock(sets_mu_);
  return RegisterLocked(std::move(ranks));
}

bool Runtime::RemoveProcessSet(int id) {
  std::shared_ptr<ProcessSetWorker> worker;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    if (id == 0 || !set_ranks_.count(id)) return false;
    set_ranks_.erase(id);
    auto it = workers_.find(id);
    if (it != workers_.end()) {
      worker = it->second;
      workers_.erase(it);
    }
    free_ids_.push_back(id);
  }
  if (worker) worker->Shutdown();
  MPI_Comm comm = mpi_->comm();
  HVD_MPI_CHECK(comm, MPI_Barrier(comm));
  return true;
}

std::optional<ProcessSetInfo> Runtime::GetProcessSet(int id) const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  auto it = set_ranks_.find(id);
  if (it == set_ranks_.end()) return std::nullopt;
  ProcessSetInfo info{id, it->second, false, -1};
  auto pos = std::find(it->second.begin(), it->second.end(), mpi_->rank());
  if (pos != it->second.end()) {
    info.included = true;
    info.rank = static_cast<int>(pos - it->second.begin());
  }
  return info;
}

std::vector<int> Runtime::ProcessSetIds() const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  std::vector<int> ids;
  for (const auto& kv : set_ranks_) ids.push_back(kv.first);
  return ids;
}

}  // namespace hvdcompat
