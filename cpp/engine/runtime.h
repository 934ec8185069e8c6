// The one object that owns a running engine: MPI context, handle table,
// statistics and a worker per process set this rank belongs to. Created by
// hvd.init(), destroyed by hvd.shutdown(); a new one can be created after.
// Thread-safety: Enqueue/handle calls may come from any API thread; process
// set changes are collective and must be made in the same order on every
// rank (they are serialised by an internal lock). Note [Control rounds]:
// each process-set change is one round on the control communicator, and so
// is the close of hvd.shutdown() (CloseControl). Every round is an allreduce
// of the same shape, so rounds match across ranks whatever each rank is
// doing; a round in which some rank is closing closes the control
// communicator on every rank (its change fails with the shutdown error), so
// every rank makes the same number of rounds and none waits for a round that
// a peer which shut down will never make. So a change makes its round
// whatever this rank finds locally: a caller's mistake (a duplicate set, an
// id this rank does not know) is raised after the round, which tells the
// peers that the ranks disagree; only a rank that is shut down skips it (its
// closing round stands in). A removal takes effect only after the round.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/engine_stats.h"
#include "core/env.h"
#include "gpu/gpu_context.h"
#include "engine/handle_table.h"
#include "engine/init_agreement.h"
#include "transport/gloo_context.h"
#include "transport/mpi_context.h"
#include "engine/process_set_worker.h"
#include "engine/timeline.h"

namespace hvdcompat {

struct InitOptions {
  std::string controller = "mpi";            // "mpi" or "gloo" (Note [Gloo controller])
  GlooOptions gloo;                          // controller "gloo": the launch's store and ranks
  std::optional<MPI_Comm> comm;              // from mpi4py, duplicated
  // hvd.init's comm is compared with the peers' first (Note [Agreeing on
  // init's comm]); `universe` is the launch's world, comm's text how the
  // user wrote it, comm_refused why it is invalid on this rank.
  bool agree_on_comm = false;
  MPI_Comm universe = MPI_COMM_WORLD;
  std::string comm_text = "None", comm_refused;
  std::vector<int> ranks;                    // hvd.init(comm=[...])
  std::vector<std::vector<int>> process_sets;  // static sets, registered as ids 1..n
  std::vector<int> process_set_ids;  // when not empty: the id of each of process_sets (a reset)
  // hvd.init(process_sets=[...]) as this rank was given it, registered after
  // process_sets once every rank agrees (Note [Agreeing on init's sets]).
  std::vector<RequestedSet> requested_sets;
  std::string refused;  // not empty: this rank refused its process_sets argument, and why
  bool dynamic_process_sets = false;
  // A re-init or elastic reset of the same job: HOROVOD_TIMELINE's trace is
  // continued, not truncated (Note [Timeline continues across runtimes]).
  bool continue_timeline = false;
};

// What the caller asks for; the Python layer fills it from torch tensors.
struct EnqueueArgs {
  OpType op = OpType::kAllreduce;
  std::string name;  // full name, e.g. "allreduce.fc1.weight"
  bool auto_named = false;
  int process_set = 0;
  ReduceOp reduce_op = ReduceOp::kSum;
  int root = -1;  // global rank
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<BufferDesc> inputs;
  std::vector<BufferDesc> outputs;
  std::vector<std::vector<int64_t>> splits;  // alltoall: rows per rank; empty: equal
  void* stream = nullptr;  // CUDA inputs: their producer's stream (a cudaStream_t)
};

struct ProcessSetInfo {
  int id;
  std::vector<int> ranks;  // global ranks, sorted
  bool included;
  int rank;  // this rank's index in the set, -1 when not included
};

class Runtime {
 public:
  explicit Runtime(const InitOptions& options);
  // Stop()s, then frees the communicators.
  ~Runtime();
  // Shuts every process set down (pending ops fail, waiters wake up).
  // Idempotent; the object stays valid for threads still holding it.
  void Stop();
  // After Stop: a worker ended a wait on a stopped peer (Note [Ending a stuck
  // wait]); MPI still holds that call, so MPI_Finalize must not run.
  bool waits_abandoned() const { return waits_abandoned_.load(); }
  // Before a Stop for an elastic reset: aborts what waits on peers that may
  // be dead (NCCL communicators), in every process set. Any thread.
  void Abandon(const std::string& why);
  // The last control round of hvd.shutdown(), after Stop(): a peer's
  // process-set change racing this rank's shutdown fails instead of waiting
  // forever. Collective (it matches any peer's round); errors are logged.
  void CloseControl();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The MPI context; only on the MPI controller (on_gloo() false).
  const MpiContext& mpi() const { return *mpi_; }
  bool on_gloo() const { return gloo_ != nullptr; }
  // The Gloo job; only on the Gloo controller (on_gloo() true).
  GlooJob& gloo() const { return *gloo_; }
  // Rank, size and topology, on either controller.
  const JobTopology& job() const { return job_->topology(); }
  const Config& config() const { return config_; }
  HandleTable& handles() { return handles_; }
  EngineStats& stats() { return stats_; }
  GpuContext& gpu() { return *gpu_; }
  bool dynamic_process_sets() const { return dynamic_; }

  // Timeline written by rank 0 (other ranks record nothing). StartTimeline
  // throws InvalidArgument unless HOROVOD_TIMELINE=DYNAMIC was set at init.
  void StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline();

  // Validates, registers a handle and hands the op to its process set.
  // Throws InvalidArgument for the caller's mistakes (nothing is enqueued):
  // the engine's rules (process set and membership, root, splits, scalars,
  // what each op reduces, names in flight) are checked here and nowhere else
  // (engine/request_rules.cc).
  int Enqueue(EnqueueArgs args);

  // What a reduction may reduce: Adasum on the global set and floating
  // dtypes only (NotSupported, UnsupportedDtype), bool with Min or Max only
  // (UnsupportedDtype). Enqueue runs it; DistributedOptimizer runs it before
  // any tensor exists (`dtype` empty).
  void CheckReduction(const std::string& op, const std::string& name, int process_set,
                      ReduceOp reduce_op, std::optional<DataType> dtype) const;

  // (this rank's index, size) in `process_set`, for callers that shape
  // buffers by it; throws Enqueue's InvalidArgument for a set that is
  // unknown or that this rank is not a member of. `op` and `name` label the
  // message.
  std::pair<int, int> MemberRankSize(const std::string& op, const std::string& name,
                                     int process_set) const;

  // Collective over the whole job; dynamic mode only. Returns the new id.
  int AddProcessSet(std::vector<int> ranks);
  // Collective over the whole job; dynamic mode only. False for the global
  // set (never removed) and when `id` is unknown on every rank;
  // InvalidArgument (nothing removed) when some rank knows it and some do not.
  bool RemoveProcessSet(int id);
  std::optional<ProcessSetInfo> GetProcessSet(int id) const;
  std::vector<int> ProcessSetIds() const;

 private:
  // At init: rank 0 opens HOROVOD_TIMELINE's file; throws InvalidArgument on
  // every rank when it cannot (collective over the job).
  void StartInitTimeline(bool continue_trace);
  // Enqueue's steps. The worker of a set this rank is a member of.
  std::shared_ptr<ProcessSetWorker> MemberWorker(const std::string& op, const std::string& name,
                                                 int process_set) const;
  // The request from the buffers (one device and dtype for all inputs).
  Request DescribeRequest(const EnqueueArgs& args) const;
  // Broadcast: the global root's index in the set.
  int SetRoot(const ProcessSetWorker& worker, const EnqueueArgs& args) const;
  // Alltoall: checks the splits against the set and the rows, or fills in
  // equal splits when none were given.
  void ResolveSplits(const ProcessSetWorker& worker, EnqueueArgs* args) const;
  // InvalidArgument unless process sets may change after init (`call` labels it).
  void RequireDynamic(const std::string& call) const;
  // A handle holding the op's name (refused while another op holds it).
  int ReserveHandle(const ProcessSetWorker& worker, const Request& q);

  // Error text: "allreduce 'name' on rank 3", and a set with its ranks.
  std::string Subject(const std::string& op, const std::string& name) const;
  std::string DescribeSet(int id, const std::vector<int>& ranks) const;
  // Sorts `ranks` and checks them as a new set next to the `known` ones
  // (in range, distinct, not a duplicate). `subject` starts the message
  // ("hvd.add_process_set on rank 3").
  void CheckNewSet(const std::string& subject, std::vector<int>* ranks,
                   const std::map<int, std::vector<int>>& known) const;
  struct Round {
    bool same;     // every rank passed the same digest
    bool closing;  // some rank is shutting down: the control communicator is closed
  };
  // One control round (control_mu_ held).
  Round AgreeLocked(uint64_t digest, bool closing);
  // Validates, agrees and registers a set (control_mu_ held). `id` < 0: the
  // next free id. `caller` labels the messages.
  int RegisterLocked(std::vector<int> ranks, int id, const std::string& caller);
  // InvalidArgument for a process-set change on a runtime that was shut down.
  [[noreturn]] void ThrowShutDown(const std::string& call, bool by_peer) const;

  Config config_;
  std::unique_ptr<MpiContext> mpi_;  // one of mpi_ and gloo_ is set; job_ is that one
  std::unique_ptr<GlooJob> gloo_;
  JobComm* job_ = nullptr;
  int set_rounds_ = 0;  // process-set registrations so far (the Gloo store keys' generation)
  HandleTable handles_;
  EngineStats stats_;
  Timeline timeline_;  // outlives the workers (declared before them)
  bool dynamic_;
  std::unique_ptr<GpuContext> gpu_;  // outlives the workers that use it

  // Orders StartTimeline against Stop(); taken before sets_mu_, never while
  // holding it.
  std::mutex timeline_mu_;
  // Serialises control rounds; taken before sets_mu_, never while holding it.
  std::mutex control_mu_;
  bool control_closed_ = false;  // guarded by control_mu_
  mutable std::mutex sets_mu_;
  bool stopped_ = false;  // guarded by sets_mu_
  std::atomic<bool> waits_abandoned_{false};
  std::map<int, std::vector<int>> set_ranks_;                     // every registered set
  std::map<int, std::shared_ptr<ProcessSetWorker>> workers_;      // sets this rank is in
  std::deque<int> free_ids_;
  int next_id_ = 1;
};

}  // namespace hvdcompat
