// The module's lifecycle: the one Runtime it owns between hvd.init() and
// hvd.shutdown(), elastic reset, MPI's finalize, and the leases calls hold
// on the runtime (Note [Runtime lease], bindings/runtime_lease.h).
#include "bindings/core_lifecycle.h"

#include <pybind11/pybind11.h>

#include <condition_variable>
#include <mutex>

#include "bindings/runtime_lease.h"
#include "core/logging.h"
#include "engine/elastic_reset.h"
#include "engine/gloo_reset.h"

namespace py = pybind11;

namespace hvdcompat {

namespace {

constexpr const char* kNotInitialized = "Horovod has not been initialized; use hvd.init().";

// The module's one mutable global: it owns the Runtime between hvd.init()
// and hvd.shutdown() (Note [Runtime lease], bindings/runtime_lease.h).
struct Core {
  // Guards `runtime`, `world` and the leases' release; held only for a
  // pointer copy or swap, never while waiting for the GIL or for MPI.
  std::mutex mu;
  std::condition_variable lease_dropped;
  std::shared_ptr<Runtime> runtime;
  // Serialises init, shutdown, elastic reset and finalize; taken with the
  // GIL released (they wait on MPI).
  std::mutex lifecycle;
  bool mpi_owned = false;  // we called MPI_Init, so we finalize at exit (under `lifecycle`)
  bool started_before = false;  // a runtime ran in this process (under `lifecycle`)
  // A stopped runtime ended a wait on a stopped peer: skip MPI_Finalize
  // (Note [Ending a stuck wait]). Under `lifecycle`.
  bool waits_abandoned = false;
  // After an elastic reset: the survivors' communicator, which a later
  // hvd.init() without `comm` runs on instead of MPI_COMM_WORLD.
  MPI_Comm world = MPI_COMM_NULL;
};

Core& TheCore() {
  static Core* core = new Core();  // never destroyed: outlives interpreter teardown
  return *core;
}

// Swaps the runtime out (under `lifecycle`): new calls find none.
std::shared_ptr<Runtime> TakeRuntime() {
  Core& core = TheCore();
  std::lock_guard<std::mutex> lock(core.mu);
  return std::move(core.runtime);
}

// Returns once `rt` is the last reference: no call holds a lease on it.
void WaitForLeases(std::shared_ptr<Runtime>& rt) {
  Core& core = TheCore();
  std::unique_lock<std::mutex> lock(core.mu);
  core.lease_dropped.wait(lock, [&] { return rt.use_count() == 1; });
}

// Handles an *_async call returned and nobody synchronized: a leak in the
// caller's loop (each kept its tensors until now), worth a line at shutdown.
void ReportUnsynchronized(Runtime& rt) {
  std::vector<std::string> names;
  const size_t n = rt.handles().Unsynchronized(&names, 5);
  if (n == 0) return;
  std::string listed;
  for (const auto& name : names) listed += (listed.empty() ? "'" : ", '") + name + "'";
  HVD_LOG(kWarning) << "hvd.shutdown() on rank " << rt.job().rank << ": " << n
                    << " operation(s) finished but were never synchronized (" << listed
                    << (n > names.size() ? ", ..." : "")
                    << "); their outputs were kept until now. Call hvd.synchronize() on every "
                       "handle an *_async call returns.";
}

void ShutdownLocked() {
  std::shared_ptr<Runtime> rt = TakeRuntime();
  if (!rt) return;
  rt->Stop();  // pending ops and waiters fail
  // A peer's racing process-set change fails too; not after a wait on a
  // stopped peer was ended: the closing round would wait on it as well.
  if (!rt->waits_abandoned()) rt->CloseControl();
  WaitForLeases(rt);   // calls still inside it return (with its shutdown error)
  ReportUnsynchronized(*rt);
  if (rt->waits_abandoned()) TheCore().waits_abandoned = true;
  rt.reset();
}

}  // namespace

void CoreInit(InitOptions opts) {
  Core& core = TheCore();
  std::lock_guard<std::mutex> life(core.lifecycle);
  {
    std::lock_guard<std::mutex> lock(core.mu);
    if (core.runtime) return;  // a second init is harmless
    if (core.world != MPI_COMM_NULL) opts.universe = core.world;
    if (!opts.comm && core.world != MPI_COMM_NULL) opts.comm = core.world;
  }
  int provided = 0;
  // Note [Gloo controller]: MPI is never initialised on Gloo.
  if (opts.controller != "gloo" && MpiContext::EnsureInitialized(&provided)) core.mpi_owned = true;
  opts.continue_timeline = core.started_before;
  // Note [Growing in place on Gloo] (engine/gloo_reset.h): a worker added to a
  // running elastic job waits to be taken in at its next reset.
  if (opts.controller == "gloo") {
    opts.gloo.worker = opts.gloo.join.empty() ? std::to_string(opts.gloo.rank) : opts.gloo.join;
    if (!opts.gloo.join.empty()) AwaitGlooJoin(&opts);
  }
  auto rt = std::make_shared<Runtime>(opts);
  core.started_before = true;
  std::lock_guard<std::mutex> lock(core.mu);
  core.runtime = std::move(rt);
}

void CoreShutdown() {
  std::lock_guard<std::mutex> life(TheCore().lifecycle);
  ShutdownLocked();
}

namespace {

// What `rebuild` returns; when it throws, the stopped old runtime is taken out
// first: left installed, it would make the next hvd.init() a no-op and every
// op say "shut down".
template <typename Rebuild>
auto RebuiltOrRemoved(Core& core, const std::shared_ptr<Runtime>& old, Rebuild rebuild)
    -> decltype(rebuild()) {
  try {
    return rebuild();
  } catch (...) {
    std::lock_guard<std::mutex> lock(core.mu);
    if (core.runtime == old) core.runtime.reset();
    throw;
  }
}

}  // namespace

// Note [Elastic reset] (cpp/engine/elastic_reset.h). Returns the survivors' ranks
// in the old world, in new-rank order.
std::vector<int> CoreElasticReset() {
  Core& core = TheCore();
  std::lock_guard<std::mutex> life(core.lifecycle);
  std::shared_ptr<Runtime> old;
  {
    std::lock_guard<std::mutex> lock(core.mu);
    if (!core.runtime) throw py::value_error(kNotInitialized);
    old = core.runtime;
  }
  if (old->on_gloo()) {
    // Note [Elastic reset on Gloo] (engine/gloo_reset.h).
    GlooResetResult r =
        RebuiltOrRemoved(core, old, [&] { return RebuildGlooFromSurvivors(old); });
    {
      std::lock_guard<std::mutex> lock(core.mu);
      core.runtime = std::move(r.runtime);
    }
    old.reset();
    return r.survivors;
  }
  // Another thread's call meanwhile meets the stopped old runtime and fails.
  ResetResult r = RebuiltOrRemoved(core, old, [&] { return RebuildFromSurvivors(old); });
  {
    std::lock_guard<std::mutex> lock(core.mu);
    core.runtime = std::move(r.runtime);
    if (core.world != MPI_COMM_NULL) MPI_Comm_free(&core.world);
    core.world = r.world;
  }
  // The old runtime is freed with its last reference: here, or by a call
  // still using it (it does not wait for them: they fail, as it is stopped).
  old.reset();
  return r.survivors;
}

void CoreElasticLeave() {
  Core& core = TheCore();
  std::lock_guard<std::mutex> life(core.lifecycle);
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(core.mu);
    rt = core.runtime;
  }
  // Under MPI the survivors' shrink finds out by itself.
  if (rt && rt->on_gloo()) LeaveGlooJob(*rt);
}

void CoreFinalize() {
  Core& core = TheCore();
  std::lock_guard<std::mutex> life(core.lifecycle);
  ShutdownLocked();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // Note [No MPI_Finalize under ULFM] (engine/elastic_reset.h); Note [Ending
  // a stuck wait] (transport/request_wait.h): finalize would wait on the peer.
  if (core.waits_abandoned) {
    // Nothing to say where MPI is not running (the Gloo controller never starts it).
    if (!initialized || finalized) return;
    HVD_LOG(kWarning) << "exit: MPI_Finalize skipped, since a collective was abandoned on a "
                         "stopped peer (the earlier error says which); the launcher may report "
                         "that this process ended without finalizing.";
    return;
  }
  if (core.mpi_owned && initialized && !finalized && !FaultToleranceEnabled()) MPI_Finalize();
}

bool CoreIsInitialized() {
  Core& core = TheCore();
  std::lock_guard<std::mutex> lock(core.mu);
  return static_cast<bool>(core.runtime);
}

RuntimeLease::RuntimeLease() {
  Core& core = TheCore();
  std::lock_guard<std::mutex> lock(core.mu);
  if (!core.runtime) throw py::value_error(kNotInitialized);
  rt_ = core.runtime;
}

RuntimeLease::~RuntimeLease() {
  Core& core = TheCore();
  std::shared_ptr<Runtime> mine;
  {
    std::lock_guard<std::mutex> lock(core.mu);
    mine.swap(rt_);
  }
  // Normally shutdown() holds the last reference; after an elastic reset the
  // last lease on the old runtime may, and frees it here, outside the lock.
  mine.reset();
  // Taking the lock once more orders the release before a waiter's next look
  // at the count (no wakeup lost between its look and its sleep).
  { std::lock_guard<std::mutex> lock(core.mu); }
  core.lease_dropped.notify_all();
}

}  // namespace hvdcompat
