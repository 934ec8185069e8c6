#include "engine/runtime.h"

#include <algorithm>
#include <sstream>

#include "core/checked_math.h"
#include "core/logging.h"
#include "engine/plan_agreement.h"
#include "transport/mpi_comm_agreement.h"

namespace hvdcompat {

namespace {

constexpr const char* kInitCaller = "hvd.init(process_sets=...)";

}  // namespace

Runtime::Runtime(const InitOptions& options)
    : config_(Config::FromEnvironment()),
      handles_(KnobInt(Knob::kWaitSpinMicros)),
      dynamic_(options.dynamic_process_sets || KnobBool(Knob::kDynamicProcessSets)) {
  if (options.controller == "gloo") {
    if (options.comm || !options.ranks.empty()) {
      throw InvalidArgument("hvd.init(comm=...) on the Gloo controller: a communicator or rank "
                            "list is MPI's; under torchrun or hvdcompatrun --gloo every launched "
                            "rank joins. Use hvd.add_process_set for a subset.");
    }
    if (!options.comm_refused.empty()) {
      throw InvalidArgument("hvd.init(comm=" + options.comm_text + ") on the Gloo controller: " +
                            options.comm_refused + ". Pass comm=None (every launched rank joins).");
    }
    gloo_ = std::make_unique<GlooJob>(options.gloo);
    job_ = gloo_.get();
  } else if (options.controller == "mpi") {
    if (options.agree_on_comm) {
      // A comm equal to the universe is init's default (the world an elastic reset left).
      const MPI_Comm given = options.comm && *options.comm != options.universe ? *options.comm
                                                                                : MPI_COMM_NULL;
      AgreeOnInitComm(options.universe,
                      DescribeInitComm(options.universe, given, options.ranks, options.comm_text,
                                       options.comm_refused),
                      KnobDouble(Knob::kInitTimeoutSeconds));
    }
    mpi_ = std::make_unique<MpiContext>(options.comm.value_or(MPI_COMM_WORLD), options.ranks);
    job_ = mpi_.get();
  } else {
    throw InvalidArgument("hvd.init: unknown controller '" + options.controller +
                          "'; HOROVOD_CONTROLLER must be 'mpi' or 'gloo'");
  }
  ConfigureLogging(job().rank);
  std::vector<int> all(job().size);
  for (int i = 0; i < job().size; ++i) all[i] = i;
  // Before any worker exists, so bad or differing sets fail hvd.init() on
  // every rank with nothing started (Note [Agreeing on init's sets]).
  InitSetsRequest request{dynamic_, {}, options.refused};
  for (const auto& ranks : options.process_sets) request.sets.push_back({false, true, ranks});
  request.sets.insert(request.sets.end(), options.requested_sets.begin(),
                      options.requested_sets.end());
  const std::vector<std::vector<int>> sets = AgreeOnInitSets(
      *job_, request,
      [&](const std::string& subject, const std::vector<std::vector<int>>& lists) {
        std::map<int, std::vector<int>> planned{{0, all}};
        for (size_t i = 0; i < lists.size(); ++i) {
          std::vector<int> ranks = lists[i];
          try {
            CheckNewSet(subject, &ranks, planned);
          } catch (const InvalidArgument& e) {
            return std::string(e.what());
          }
          planned[i < options.process_set_ids.size() ? options.process_set_ids[i]
                                                     : static_cast<int>(i) + 1] = ranks;
        }
        return std::string();
      });
  config_.rank_hosts = job().hosts;
  config_.worker_core =
      WorkerCoreFor(config_.thread_affinity, job().local_rank, job().local_size);
  StartInitTimeline(options.continue_timeline);
  gpu_ = std::make_unique<GpuContext>(config_, job().local_rank);
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    set_ranks_[0] = all;
    WorkerComm comm = gloo_ ? WorkerComm(gloo_->NewContext(), &gloo_->watch())
                            : WorkerComm(mpi_->Duplicate());
    workers_[0] = std::make_shared<ProcessSetWorker>(0, std::move(comm), all, config_, &handles_,
                                                     mpi_ ? &mpi_->ops() : nullptr, &stats_,
                                                     &timeline_, gpu_.get());
    // Sets registered later start from the global set's agreed plan knobs.
    CopyPlanKnobs(workers_[0]->start_config(), &config_);
  }
  std::lock_guard<std::mutex> control(control_mu_);
  for (size_t i = 0; i < sets.size(); ++i) {
    RegisterLocked(sets[i],
                   i < options.process_set_ids.size() ? options.process_set_ids[i] : -1,
                   kInitCaller);
  }
}

void Runtime::StartInitTimeline(bool continue_trace) {
  // Rank 0 alone writes the timeline, and a file it cannot open must fail
  // hvd.init on every rank, not on rank 0 alone with its peers left waiting
  // for it: one word's agreement (every rank makes it, whatever its own
  // HOROVOD_TIMELINE says), then rank 0's reason for everyone.
  std::string failure;
  if (!config_.timeline_path.empty() && config_.timeline_path != "DYNAMIC" && job().rank == 0) {
    try {
      timeline_.Start(config_.timeline_path, config_.timeline_mark_cycles, continue_trace);
    } catch (const InvalidArgument& e) {
      failure = e.what();
    }
  }
  uint64_t ok = failure.empty() ? 1 : 0;
  job_->AllreduceMin(&ok, 1);
  if (ok) return;
  const std::string why = job_->AllgatherStrings(failure)[0];
  throw InvalidArgument("hvd.init(): rank 0 writes the timeline (HOROVOD_TIMELINE) and cannot: " +
                        why);
}

Runtime::~Runtime() {
  Stop();
  // A call abandoned on a stopped peer may still use the job's communicators
  // (Note [Ending a stuck wait]): leave them allocated.
  if (waits_abandoned_) {
    mpi_.release();  // NOLINT(bugprone-unused-return-value): deliberately never freed
    gloo_.release();  // NOLINT(bugprone-unused-return-value): likewise
    return;
  }
  mpi_.reset();
  gloo_.reset();
}

void Runtime::Stop() {
  std::map<int, std::shared_ptr<ProcessSetWorker>> workers;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    stopped_ = true;
    workers.swap(workers_);
  }
  // Sub-sets first, the global set last: its shutdown cycle tells everyone.
  for (auto it = workers.rbegin(); it != workers.rend(); ++it) {
    it->second->Shutdown();
    if (it->second->aborted()) waits_abandoned_ = true;
  }
  workers.clear();
  // After a racing StartTimeline: stopped_ is set, so none starts after this.
  std::lock_guard<std::mutex> timeline(timeline_mu_);
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
  // Held across the check and the start, so a concurrent Stop() either
  // finds this timeline started (and stops it) or makes this call fail.
  std::lock_guard<std::mutex> timeline(timeline_mu_);
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    if (stopped_) {
      throw InvalidArgument("start_timeline('" + path + "'): hvdcompat has been shut down on rank " +
                            std::to_string(job().rank) + "; call hvd.init() first.");
    }
  }
  if (job().rank == 0) timeline_.Start(path, mark_cycles);
}

void Runtime::StopTimeline() {
  if (config_.timeline_path != "DYNAMIC") {
    throw InvalidArgument("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.");
  }
  timeline_.Stop();
}

// Every caller mistake the engine reports starts with its subject:
// "allreduce 'allreduce.fc1.weight' on rank 3".
std::string Runtime::Subject(const std::string& op, const std::string& name) const {
  std::string s = op;
  if (!name.empty()) s += " '" + name + "'";
  return s + " on rank " + std::to_string(job().rank);
}

std::string Runtime::DescribeSet(int id, const std::vector<int>& ranks) const {
  if (id == 0) return "the global process set (ranks 0 to " + std::to_string(job().size - 1) + ")";
  return "process set " + std::to_string(id) + " (ranks " + RankListString(ranks) + ")";
}

std::shared_ptr<ProcessSetWorker> Runtime::MemberWorker(const std::string& op,
                                                        const std::string& name,
                                                        int process_set) const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  if (stopped_) {
    throw InvalidArgument(Subject(op, name) +
                          ": hvdcompat has been shut down on this rank; call hvd.init() before "
                          "further collectives.");
  }
  auto w = workers_.find(process_set);
  if (w != workers_.end()) return w->second;
  auto known = set_ranks_.find(process_set);
  if (known == set_ranks_.end()) {
    throw InvalidArgument(
        Subject(op, name) + ": Process set provided does not exist, or has not been registered" +
        (process_set >= 0 ? " (id " + std::to_string(process_set) + ")" : std::string()) +
        "; it was never added, or it was removed. Register it with hvd.add_process_set or "
        "hvd.init(process_sets=...) and pass the registered ProcessSet.");
  }
  throw InvalidArgument(Subject(op, name) + ": rank " + std::to_string(job().rank) +
                        " is not a member of " + DescribeSet(process_set, known->second) +
                        ". Only its members may call collectives on it; skip the call on the "
                        "other ranks.");
}

std::pair<int, int> Runtime::MemberRankSize(const std::string& op, const std::string& name,
                                            int process_set) const {
  auto worker = MemberWorker(op, name, process_set);
  return {worker->rank(), worker->size()};
}

int Runtime::ReserveHandle(const ProcessSetWorker& worker, const Request& q) {
  int handle = handles_.Create(worker.id(), q.name);
  if (handle == HandleTable::kNameTaken) {
    throw InvalidArgument(
        Subject(OpTypeName(q.op), q.name) + ": an operation with this name is still in flight" +
        (worker.id() ? " in process set " + std::to_string(worker.id()) : std::string()) +
        " (its handle has not been synchronized). Requested to allreduce, allgather, or "
        "broadcast a tensor with the same name as another tensor that is currently being "
        "processed. Wait for the first one (hvd.synchronize) or use a different name.");
  }
  return handle;
}

int Runtime::Enqueue(EnqueueArgs args) {
  auto entry = std::make_unique<TensorEntry>();
  entry->request = DescribeRequest(args);
  Request& q = entry->request;
  std::shared_ptr<ProcessSetWorker> worker =
      MemberWorker(OpTypeName(args.op), args.name, args.process_set);
  if (args.op == OpType::kBroadcast) q.root = SetRoot(*worker, args);
  if (args.op == OpType::kAlltoall) ResolveSplits(*worker, &args);
  const int handle = ReserveHandle(*worker, q);
  entry->handle = handle;
  try {
    if (q.device != kCpuDevice) {
      entry->ready = gpu_->PrepareEnqueue(std::string(OpTypeName(args.op)) + " '" + q.name + "'",
                                          q.device, args.stream);
      // Ranks negotiate the kind of device, not its index: each rank drives
      // its own GPU (its index stays in the buffers), and a cached response
      // must serve every rank.
      q.device = 0;
    }
    entry->inputs = std::move(args.inputs);
    entry->outputs = std::move(args.outputs);
    entry->splits = std::move(args.splits);
    worker->Enqueue(std::move(entry));
  } catch (...) {
    handles_.Discard(handle);
    throw;
  }
  return handle;
}

void Runtime::CheckNewSet(const std::string& subject, std::vector<int>* ranks,
                          const std::map<int, std::vector<int>>& known) const {
  std::sort(ranks->begin(), ranks->end());
  for (size_t i = 0; i < ranks->size(); ++i) {
    int r = (*ranks)[i];
    const bool repeated = i && r == (*ranks)[i - 1];
    if (r < 0 || r >= job().size || repeated) {
      throw InvalidArgument(subject + ": process set " + RankListString(*ranks) + ": rank " +
                            std::to_string(r) + (repeated ? " is listed twice" : " is out of range") +
                            "; ranks must be distinct global ranks in [0, " +
                            std::to_string(job().size) + ")");
    }
  }
  if (ranks->empty()) {
    throw InvalidArgument(subject + ": a process set needs at least one rank");
  }
  for (const auto& kv : known) {
    if (kv.second == *ranks) {
      throw InvalidArgument(subject + ": Attempted to add a duplicate process set: ranks " +
                            RankListString(*ranks) + " are already " +
                            DescribeSet(kv.first, kv.second) +
                            ". Register each set of ranks once and reuse it (the global set "
                            "always exists, as hvd.global_process_set).");
    }
  }
}

void Runtime::ThrowShutDown(const std::string& call, bool by_peer) const {
  throw InvalidArgument(call + ": hvdcompat has been shut down (" +
                        (by_peer ? std::string("another rank") : std::string("this rank")) +
                        " called hvd.shutdown() while rank " + std::to_string(job().rank) +
                        " was changing process sets); call hvd.init() on every rank first.");
}

Runtime::Round Runtime::AgreeLocked(uint64_t digest, bool closing) {
  // MIN over {digest, ~digest, open}: equal digests everywhere leave both
  // words intact; one closing rank zeroes `open` for all.
  uint64_t words[3] = {digest, ~digest, closing ? 0u : 1u};
  job_->AllreduceMin(words, 3);
  return Round{words[0] == digest && ~words[1] == digest, words[2] == 0};
}

int Runtime::RegisterLocked(std::vector<int> ranks, int wanted_id, const std::string& caller) {
  const std::string call = caller + "(" + RankListString(ranks) + ")";
  // Shut down here: this rank's closing round (CloseControl) stands for this
  // change in its peers' count, so skipping the round keeps them matched.
  if (control_closed_) ThrowShutDown(call, false);
  // A mistake of this caller is raised after the round, never before it: a
  // peer that found none is already in the round and would wait forever.
  std::string mistake;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    if (stopped_) ThrowShutDown(call, false);
    try {
      CheckNewSet(caller + " on rank " + std::to_string(job().rank), &ranks, set_ranks_);
    } catch (const InvalidArgument& e) {
      mistake = e.what();
    }
  }
  // Every rank must be registering the same set: compare a digest. A rank
  // that refuses the set passes one that no accepting rank can match.
  uint64_t digest = 1469598103934665603ull;
  for (int r : ranks) digest = (digest ^ static_cast<uint64_t>(r + 1)) * 1099511628211ull;
  if (!mistake.empty()) digest = ~digest;
  const Round round = AgreeLocked(digest, false);
  if (round.closing) {
    control_closed_ = true;
    ThrowShutDown(call, true);
  }
  if (!mistake.empty()) throw InvalidArgument(mistake);
  if (!round.same) {
    throw InvalidArgument(caller + " on rank " + std::to_string(job().rank) + ": process set " +
                          RankListString(ranks) + ": ranks passed different process sets, or "
                          "another rank refused this one (its own error says why). Every rank "
                          "of the job must register the same ranks, in the same order.");
  }
  // Every rank is here for this set: the communicator's creation completes.
  MPI_Comm set_comm = MPI_COMM_NULL;
  std::shared_ptr<gloo::Context> set_context;
  const int generation = set_rounds_++;
  if (gloo_) {
    // Only the members connect, under keys of this registration's own.
    if (std::binary_search(ranks.begin(), ranks.end(), job().rank)) {
      set_context = gloo_->SubsetContext(ranks, "set/" + std::to_string(generation) + "/");
    }
  } else {
    MPI_Comm comm = mpi_->comm();
    MPI_Group world_group, group;
    HVD_MPI_CHECK(comm, MPI_Comm_group(comm, &world_group));
    HVD_MPI_CHECK(comm, MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(),
                                       &group));
    HVD_MPI_CHECK(comm, MPI_Comm_create(comm, group, &set_comm));
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
  }
  std::lock_guard<std::mutex> lock(sets_mu_);
  if (stopped_) {
    // Shut down on this rank meanwhile: the peers learn it at their next round.
    if (set_comm != MPI_COMM_NULL) MPI_Comm_free(&set_comm);
    ThrowShutDown(call, false);
  }
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
  } else if (set_context) {
    WorkerComm comm(std::move(set_context), &gloo_->watch());
    workers_[id] = std::make_shared<ProcessSetWorker>(id, std::move(comm), ranks,
                                                      config_, &handles_, nullptr, &stats_,
                                                      &timeline_, gpu_.get());
  }
  return id;
}

void Runtime::RequireDynamic(const std::string& call) const {
  if (dynamic_) return;
  throw InvalidArgument(call + " on rank " + std::to_string(job().rank) +
                        ": process sets can only be added or removed after hvd.init() in dynamic "
                        "mode. Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding process sets "
                        "after Horovod initialization (or call hvd.init(process_sets='dynamic')) "
                        "on every rank.");
}

int Runtime::AddProcessSet(std::vector<int> ranks) {
  RequireDynamic("hvd.add_process_set(" + RankListString(ranks) + ")");
  std::lock_guard<std::mutex> control(control_mu_);
  return RegisterLocked(std::move(ranks), -1, "hvd.add_process_set");
}

bool Runtime::RemoveProcessSet(int id) {
  const std::string call = "hvd.remove_process_set(" + std::to_string(id) + ")";
  RequireDynamic(call);
  // The global set is never removed; every rank answers alike, so no round.
  if (id == 0) return false;
  std::lock_guard<std::mutex> control(control_mu_);
  if (control_closed_) ThrowShutDown(call, false);  // as in RegisterLocked
  bool known;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    if (stopped_) ThrowShutDown(call, false);
    known = set_ranks_.count(id) > 0;
  }
  // Every rank makes the round, an unknown id too (a peer may know it), and
  // removes the set only once all agree on it: removed everywhere or nowhere.
  const Round round =
      AgreeLocked((static_cast<uint64_t>(static_cast<uint32_t>(id)) << 1) | (known ? 1u : 0u), false);
  if (round.closing) {
    control_closed_ = true;
    ThrowShutDown(call, true);
  }
  if (!round.same) {
    throw InvalidArgument(
        call + " on rank " + std::to_string(job().rank) + ": the ranks did not all remove the "
        "same registered process set (id " + std::to_string(id) + " is " +
        (known ? "registered" : "not registered") + " on this rank); nothing was removed. Every "
        "rank of the job must remove the same set, in the same order as its other process-set "
        "changes.");
  }
  if (!known) return false;
  std::shared_ptr<ProcessSetWorker> worker;
  bool stopped;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    stopped = stopped_;
    set_ranks_.erase(id);
    auto it = workers_.find(id);
    if (it != workers_.end()) {
      worker = it->second;
      workers_.erase(it);
    }
    free_ids_.push_back(id);
  }
  if (worker) worker->Shutdown();
  // Its id may be given to a new set: the failed ops' names must not block it.
  handles_.ReleaseNames(id);
  // Shut down on this rank meanwhile: the peers learn it at their next round.
  if (stopped) ThrowShutDown(call, false);
  return true;
}

void Runtime::CloseControl() {
  std::lock_guard<std::mutex> control(control_mu_);
  if (control_closed_) return;
  control_closed_ = true;
  try {
    AgreeLocked(0, true);
  } catch (const std::exception& e) {
    HVD_LOG(kWarning) << "shutdown: the closing round on the control communicator failed: "
                      << e.what();
  }
}

std::optional<ProcessSetInfo> Runtime::GetProcessSet(int id) const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  auto it = set_ranks_.find(id);
  if (it == set_ranks_.end()) return std::nullopt;
  ProcessSetInfo info{id, it->second, false, -1};
  auto pos = std::find(it->second.begin(), it->second.end(), job().rank);
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
