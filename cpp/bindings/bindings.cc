// pybind11 bindings of the core: thin, dtype-generic, typed (the option
// structs are bound classes), GIL released around anything that may wait.
// The module-level Core object is the only mutable global: it owns the
// Runtime between hvd.init() and hvd.shutdown(); calls hold it through a
// RuntimeLease (Note [Runtime lease], bindings/runtime_lease.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <condition_variable>
#include <mutex>

#include "bindings/dlpack_export.h"
#include "bindings/py_convert.h"
#include "bindings/py_store.h"
#include "bindings/runtime_lease.h"
#include "autotune/parameter_manager.h"
#include "engine/elastic_reset.h"
#include "engine/gloo_reset.h"
#include "core/checked_math.h"
#include "core/env.h"
#include "core/logging.h"
#include "ops/collective_layout.h"
#include "engine/runtime.h"

namespace py = pybind11;

namespace hvdcompat {

void RegisterGpuBindings(py::module_& m);
void RegisterKnobBindings(py::module_& m);

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

BufferDesc MakeBuffer(uintptr_t data, int dtype, std::vector<int64_t> shape, int device) {
  if (dtype < 0 || dtype >= kNumDataTypes) {
    throw py::value_error("Buffer: unknown dtype code " + std::to_string(dtype) +
                          "; use a value of hvdcompat._core.DTYPES");
  }
  for (int64_t d : shape) {
    if (d < 0) {
      throw py::value_error("Buffer: shape " + ShapeString(shape) +
                            " has a negative dimension; pass a tensor's own shape");
    }
  }
  // Throws ValueError (InvalidArgument) when the element count overflows.
  CheckedMul(ShapeElements(shape), static_cast<int64_t>(DataTypeSize(static_cast<DataType>(dtype))),
             "Buffer: bytes of a tensor");
  BufferDesc b;
  b.data = reinterpret_cast<void*>(data);
  b.dtype = static_cast<DataType>(dtype);
  b.shape = std::move(shape);
  b.device = device;
  return b;
}

OpType ToOp(int op) {
  if (op < 0 || op > static_cast<int>(OpType::kJoin)) {
    throw py::value_error("EnqueueArgs: unknown op code " + std::to_string(op) +
                          "; use a value of hvdcompat._core.OPS");
  }
  return static_cast<OpType>(op);
}

ReduceOp ToReduceOp(int op) {
  if (op < 0 || op > static_cast<int>(ReduceOp::kProduct)) {
    throw py::value_error("EnqueueArgs: unknown reduce op code " + std::to_string(op) +
                          "; use a value of hvdcompat._core.REDUCE_OPS");
  }
  return static_cast<ReduceOp>(op);
}

void Init(InitOptions opts) {
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
  auto rt = std::make_shared<Runtime>(opts);
  core.started_before = true;
  std::lock_guard<std::mutex> lock(core.mu);
  core.runtime = std::move(rt);
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

void Shutdown() {
  std::lock_guard<std::mutex> life(TheCore().lifecycle);
  ShutdownLocked();
}

// Note [Elastic reset] (cpp/engine/elastic_reset.h). Returns the survivors' ranks
// in the old world, in new-rank order.
std::vector<int> ElasticReset() {
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
    GlooResetResult r;
    try {
      r = RebuildGlooFromSurvivors(old);
    } catch (...) {
      std::lock_guard<std::mutex> lock(core.mu);
      if (core.runtime == old) core.runtime.reset();
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(core.mu);
      core.runtime = std::move(r.runtime);
    }
    old.reset();
    return r.survivors;
  }
  // Another thread's call meanwhile meets the stopped old runtime and fails.
  ResetResult r;
  try {
    r = RebuildFromSurvivors(old);
  } catch (...) {
    // The old runtime is stopped whatever failed: left installed, it would
    // make the next hvd.init() a no-op and every op say "shut down".
    std::lock_guard<std::mutex> lock(core.mu);
    if (core.runtime == old) core.runtime.reset();
    throw;
  }
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

void Finalize() {
  Core& core = TheCore();
  std::lock_guard<std::mutex> life(core.lifecycle);
  ShutdownLocked();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // Note [No MPI_Finalize under ULFM] (engine/elastic_reset.h); Note [Ending
  // a stuck wait] (transport/request_wait.h): finalize would wait on the peer.
  if (core.waits_abandoned) {
    HVD_LOG(kWarning) << "exit: MPI_Finalize skipped, since a collective was abandoned on a "
                         "stopped peer (the earlier error says which); the launcher may report "
                         "that this process ended without finalizing.";
    return;
  }
  if (core.mpi_owned && initialized && !finalized && !FaultToleranceEnabled()) MPI_Finalize();
}

bool IsInitialized() {
  Core& core = TheCore();
  std::lock_guard<std::mutex> lock(core.mu);
  return static_cast<bool>(core.runtime);
}

int Enqueue(EnqueueArgs args) {
  RuntimeLease rt;
  return rt->Enqueue(std::move(args));
}

// `stream`: for device ops, the caller's current cudaStream_t, ordered after
// the op's device work (Note [GPU stream order], cpp/gpu/gpu_events.h).
py::tuple Wait(int handle, py::object stream) {
  HandleResult r;
  const bool has_stream = !stream.is_none();
  const uintptr_t consumer = has_stream ? stream.cast<uintptr_t>() : 0;
  {
    py::gil_scoped_release release;
    RuntimeLease rt;
    r = rt->handles().Wait(handle);
    if (r.device_done) {
      Status s;
      // Without a stream to order, only the host wait makes outputs safe.
      if (!rt->config().async_completion || !has_stream) s = r.device_done->Wait();
      if (s.ok() && has_stream) s = r.device_done->MakeStreamWait(consumer, &r.outputs);
      if (!s.ok() && r.status.ok()) r.status = s;
      r.device_done.reset();
    }
  }
  py::list outs;
  for (auto& b : r.outputs) outs.append(py::reinterpret_steal<py::object>(ToDLPackCapsule(std::move(b))));
  return py::make_tuple(static_cast<int>(r.status.code), r.status.message, outs, r.received_splits,
                        r.join_last_rank);
}

py::dict Stats() {
  RuntimeLease rt;
  EngineStats& s = rt->stats();
  py::dict d;
  d["cycles"] = s.cycles.load();
  d["slow_path_cycles"] = s.slow_path_cycles.load();
  d["negotiation_ns"] = s.negotiation_ns.load();
  d["flag_bytes"] = s.flag_bytes.load();
  d["coordinator_in_bytes"] = s.coordinator_in_bytes.load();
  d["coordinator_out_bytes"] = s.coordinator_out_bytes.load();
  d["coordinator_ns"] = s.coordinator_ns.load();
  d["cache_hits"] = s.cache_hits.load();
  d["cache_misses"] = s.cache_misses.load();
  d["collectives"] = s.collectives.load();
  d["tensors"] = s.tensors.load();
  d["fused_collectives"] = s.fused_collectives.load();
  d["fused_tensors"] = s.fused_tensors.load();
  d["bytes"] = s.bytes.load();
  d["errors"] = s.errors.load();
  // The tunables in effect now (the autotuner may have changed them).
  const TunedParams t = s.tuning.current();
  d["fusion_threshold_bytes"] = t.fusion_threshold_bytes;
  d["cycle_time_ms"] = t.cycle_time_ms;
  d["fusion_chunk_bytes"] = t.fusion_chunk_bytes;
  d["max_call_bytes"] = t.max_call_bytes;
  d["hierarchical_allreduce"] = t.hierarchical_allreduce;
  d["autotune_active"] = t.active;
  d["autotune_changes"] = s.tuning.changes();
  d["hierarchical_allreduces"] = s.hierarchical_allreduces.load();
  d["hierarchical_allgathers"] = s.hierarchical_allgathers.load();
  d["network_allreduces"] = s.network_allreduces.load();
  d["network_bytes"] = s.network_bytes.load();
  return d;
}

py::list AutotuneHistory() {
  py::list out;
  RuntimeLease rt;
  for (const auto& c : rt->stats().tuning.history()) {
    py::dict d = TunedParamsDict(c.params);
    d["cycle"] = c.cycle;
    out.append(d);
  }
  return out;
}

py::dict ConfigDict() {
  RuntimeLease rt;
  const Config& c = rt->config();
  py::dict d;
  d["fusion_threshold_bytes"] = c.fusion_threshold_bytes;
  d["cycle_time_ms"] = c.cycle_time_ms;
  d["cache_capacity"] = c.cache_capacity;
  d["stall_check_seconds"] = c.stall_check_seconds;
  d["stall_shutdown_seconds"] = c.stall_shutdown_seconds;
  d["timeline"] = c.timeline_path;
  d["fusion_chunk_bytes"] = c.fusion_chunk_bytes;
  d["inplace_min_bytes"] = c.inplace_min_bytes;
  d["max_call_bytes"] = c.max_call_bytes;
  d["link_plan"] = c.link_plan;
  d["network_segment_bytes"] = c.network_segment_bytes;
  d["network_pipeline_depth"] = c.network_pipeline_depth;
  d["network_16bit_wire"] = c.network_16bit_wire;
  d["num_nccl_streams"] = c.num_nccl_streams;
  d["hierarchical_allreduce"] = c.hierarchical_allreduce;
  d["hierarchical_allgather"] = c.hierarchical_allgather;
  d["gpu_operations"] = c.gpu_operations_mpi ? "MPI" : "NCCL";
  d["async_completion"] = c.async_completion;
  return d;
}

py::dict BuildInfo() {
  py::dict d;
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string lib(version, len);
  while (!lib.empty() && (lib.back() == '\0' || std::isspace(static_cast<unsigned char>(lib.back())))) {
    lib.pop_back();
  }
  d["mpi_library"] = lib;
  d["mpi_compiler"] = HVDCOMPAT_MPI_C_COMPILER;
  d["mpi_from_wheel"] = static_cast<bool>(HVDCOMPAT_MPI_FROM_WHEEL);
  d["mpi_wheel"] = std::string(HVDCOMPAT_MPI_WHEEL);
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  d["mpi_standard"] = std::to_string(major) + "." + std::to_string(minor);
  return d;
}

void BindOptions(py::module_& m) {
  py::class_<BufferDesc>(m, "Buffer", "One tensor's memory as the core reads or writes it.")
      .def(py::init(&MakeBuffer), py::arg("data"), py::arg("dtype"), py::arg("shape"),
           py::arg("device") = kCpuDevice)
      .def_property_readonly("data",
                             [](const BufferDesc& b) { return reinterpret_cast<uintptr_t>(b.data); })
      .def_property_readonly("dtype", [](const BufferDesc& b) { return static_cast<int>(b.dtype); })
      .def_readonly("shape", &BufferDesc::shape)
      .def_readonly("device", &BufferDesc::device);

  py::class_<EnqueueArgs>(m, "EnqueueArgs", "One op handed to the core by enqueue().")
      .def(py::init([](int op, std::string name, bool auto_named, int process_set, int reduce_op,
                       int root, double prescale, double postscale, std::vector<BufferDesc> inputs,
                       std::vector<BufferDesc> outputs, std::vector<std::vector<int64_t>> splits,
                       std::optional<uintptr_t> stream) {
             EnqueueArgs a;
             a.op = ToOp(op);
             a.name = std::move(name);
             a.auto_named = auto_named;
             a.process_set = process_set;
             a.reduce_op = ToReduceOp(reduce_op);
             a.root = root;
             a.prescale = prescale;
             a.postscale = postscale;
             a.inputs = std::move(inputs);
             a.outputs = std::move(outputs);
             a.splits = std::move(splits);
             a.stream = stream ? reinterpret_cast<void*>(*stream) : nullptr;
             return a;
           }),
           py::arg("op"), py::arg("name"), py::arg("auto_named") = false,
           py::arg("process_set") = 0, py::arg("reduce_op") = static_cast<int>(ReduceOp::kSum),
           py::arg("root") = -1, py::arg("prescale") = 1.0, py::arg("postscale") = 1.0,
           py::arg("inputs") = std::vector<BufferDesc>(),
           py::arg("outputs") = std::vector<BufferDesc>(),
           py::arg("splits") = std::vector<std::vector<int64_t>>(), py::arg("stream") = py::none())
      .def_property_readonly("op", [](const EnqueueArgs& a) { return static_cast<int>(a.op); })
      .def_readonly("name", &EnqueueArgs::name)
      .def_readonly("auto_named", &EnqueueArgs::auto_named)
      .def_readonly("process_set", &EnqueueArgs::process_set)
      .def_property_readonly("reduce_op",
                             [](const EnqueueArgs& a) { return static_cast<int>(a.reduce_op); })
      .def_readonly("root", &EnqueueArgs::root)
      .def_readonly("prescale", &EnqueueArgs::prescale)
      .def_readonly("postscale", &EnqueueArgs::postscale)
      .def_readonly("inputs", &EnqueueArgs::inputs)
      .def_readonly("outputs", &EnqueueArgs::outputs)
      .def_readonly("splits", &EnqueueArgs::splits)
      .def_property_readonly("stream", [](const EnqueueArgs& a) -> std::optional<uintptr_t> {
        if (!a.stream) return std::nullopt;
        return reinterpret_cast<uintptr_t>(a.stream);
      });

  py::class_<InitOptions>(m, "InitOptions", "What hvd.init() asks of the core.")
      .def(py::init([](std::optional<int64_t> comm_handle, std::vector<int> ranks,
                       std::vector<std::vector<int>> process_sets,
                       std::vector<std::pair<bool, std::optional<std::vector<int>>>> requested_sets,
                       std::string refused, bool dynamic_process_sets, std::string controller,
                       py::object store, int rank, int size, int local_rank, int local_size,
                       int cross_rank, int cross_size, std::string hostname,
                       std::string gloo_iface, std::string gloo_hostname, double gloo_timeout_s,
                       std::optional<std::string> comm_text, std::string comm_refused) {
             InitOptions o;
             // Note [Agreeing on init's comm]: hvd.init passes how its comm reads.
             o.agree_on_comm = comm_text.has_value();
             o.comm_text = comm_text.value_or("None");
             o.comm_refused = std::move(comm_refused);
             if (controller != "mpi" && controller != "gloo") {
               throw py::value_error("InitOptions: controller must be 'mpi' or 'gloo', not '" +
                                     controller + "'");
             }
             o.controller = std::move(controller);
             o.gloo = GlooOptions{WrapPythonStore(std::move(store)), rank, size, local_rank,
                                  local_size, cross_rank, cross_size, std::move(hostname),
                                  std::move(gloo_iface), std::move(gloo_hostname), gloo_timeout_s};
             // A Fortran handle (mpi4py's Comm.py2f()): the one form of a
             // communicator that every MPI defines as an integer. MPI_Comm
             // itself is a pointer in Open MPI and an int in the MPICH family.
             if (comm_handle) o.comm = MPI_Comm_f2c(static_cast<MPI_Fint>(*comm_handle));
             o.ranks = std::move(ranks);
             o.process_sets = std::move(process_sets);
             // (from an mpi4py communicator, its ranks: this rank's group, None
             // when this rank's communicator is COMM_NULL)
             for (auto& [from_comm, set_ranks] : requested_sets) {
               o.requested_sets.push_back(
                   {from_comm, set_ranks.has_value(), set_ranks.value_or(std::vector<int>())});
             }
             o.refused = std::move(refused);
             o.dynamic_process_sets = dynamic_process_sets;
             return o;
           }),
           py::kw_only(), py::arg("comm_handle") = py::none(),
           py::arg("ranks") = std::vector<int>(),
           py::arg("process_sets") = std::vector<std::vector<int>>(),
           py::arg("requested_sets") =
               std::vector<std::pair<bool, std::optional<std::vector<int>>>>(),
           py::arg("refused") = std::string(), py::arg("dynamic_process_sets") = false,
           py::arg("controller") = "mpi", py::arg("store") = py::none(), py::arg("rank") = -1,
           py::arg("size") = -1, py::arg("local_rank") = -1, py::arg("local_size") = -1,
           py::arg("cross_rank") = -1, py::arg("cross_size") = -1, py::arg("hostname") = "",
           py::arg("gloo_iface") = "", py::arg("gloo_hostname") = "",
           py::arg("gloo_timeout_s") = 30.0, py::arg("comm_text") = py::none(),
           py::arg("comm_refused") = std::string())
      .def_readonly("controller", &InitOptions::controller)
      .def_property_readonly("gloo_timeout_s",
                             [](const InitOptions& o) { return o.gloo.timeout_s; })
      .def_property_readonly("comm_handle",
                             [](const InitOptions& o) -> std::optional<int64_t> {
                               if (!o.comm) return std::nullopt;
                               return static_cast<int64_t>(MPI_Comm_c2f(*o.comm));
                             })
      .def_readonly("ranks", &InitOptions::ranks)
      .def_readonly("process_sets", &InitOptions::process_sets)
      .def_property_readonly(
          "requested_sets",
          [](const InitOptions& o) {
            std::vector<std::pair<bool, std::optional<std::vector<int>>>> v;
            for (const auto& s : o.requested_sets) {
              v.emplace_back(s.from_comm, s.member ? std::optional<std::vector<int>>(s.ranks)
                                                   : std::nullopt);
            }
            return v;
          })
      .def_readonly("refused", &InitOptions::refused)
      .def_readonly("dynamic_process_sets", &InitOptions::dynamic_process_sets);
}

// The core's error classes, as Horovod's users catch them: each is a
// ValueError too (InvalidArgument is one).
void BindErrors(py::module_& m) {
  // Never freed: the translator may run until the interpreter's teardown.
  static PyObject* unsupported_dtype = PyErr_NewException(
      "hvdcompat._core.UnsupportedDtypeError",
      py::make_tuple(py::handle(PyExc_TypeError), py::handle(PyExc_ValueError)).ptr(), nullptr);
  static PyObject* not_supported = PyErr_NewException(
      "hvdcompat._core.NotSupportedError",
      py::make_tuple(py::handle(PyExc_NotImplementedError), py::handle(PyExc_ValueError)).ptr(),
      nullptr);
  if (!unsupported_dtype || !not_supported) throw py::error_already_set();
  m.attr("UnsupportedDtypeError") = py::handle(unsupported_dtype);
  m.attr("NotSupportedError") = py::handle(not_supported);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UnsupportedDtype& e) {
      PyErr_SetString(unsupported_dtype, e.what());
    } catch (const NotSupported& e) {
      PyErr_SetString(not_supported, e.what());
    }
  });
}

}  // namespace

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

PYBIND11_MODULE(_core, m) {
  using namespace hvdcompat;
  using Release = py::call_guard<py::gil_scoped_release>;
  m.doc() = "hvdcompat native core (framework-agnostic; no PyTorch inside)";

  BindOptions(m);
  BindErrors(m);
  // Everything that may wait (on MPI, on peers, on a lease) runs without the GIL.
  m.def("init", &Init, py::arg("options"), Release());
  m.def("shutdown", &Shutdown, Release(),
        "Stops the runtime; calls still inside it fail with its shutdown error first.");
  m.def("elastic_reset", &ElasticReset, Release(),
        "Rebuilds the runtime from the surviving ranks, in place (collective over survivors).");
  m.def("fault_tolerance_enabled", [] { return FaultToleranceEnabled(); },
        "Whether MPI runs with ULFM enabled (mpirun --with-ft ulfm).");
  m.def("abort", [](int code) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) std::_Exit(code);  // the Gloo controller: this process only
    MPI_Abort(MPI_COMM_WORLD, code);
  }, py::arg("code"),
        "Aborts every rank of the job (used by the test harness on a failure).");
  m.def("finalize", &Finalize, Release(),
        "Shut down and, if hvdcompat initialised MPI and it runs without ULFM, finalize it.");
  m.def("is_initialized", &IsInitialized);
  m.def("rank", [] { return RuntimeLease()->job().rank; });
  m.def("size", [] { return RuntimeLease()->job().size; });
  m.def("local_rank", [] { return RuntimeLease()->job().local_rank; });
  m.def("local_size", [] { return RuntimeLease()->job().local_size; });
  m.def("cross_rank", [] { return RuntimeLease()->job().cross_rank; });
  m.def("cross_size", [] { return RuntimeLease()->job().cross_size; });
  m.def("is_homogeneous", [] { return RuntimeLease()->job().homogeneous; });
  m.def("mpi_threads_supported", [] { return RuntimeLease()->job().threads_supported; });
  m.def("dynamic_process_sets", [] { return RuntimeLease()->dynamic_process_sets(); });
  // `args` is copied out of its Python object while the GIL is held.
  m.def("enqueue", &Enqueue, py::arg("args"), Release(), "Hands one op to the core; its handle.");
  m.def(
      "start_timeline",
      [](const std::string& path, bool mark_cycles) { RuntimeLease()->StartTimeline(path, mark_cycles); },
      py::arg("path"), py::arg("mark_cycles"), Release());
  m.def("stop_timeline", [] { RuntimeLease()->StopTimeline(); }, Release());
  m.def("poll", [](int h) { return RuntimeLease()->handles().Poll(h); }, py::arg("handle"));
  m.def("wait", &Wait, py::arg("handle"), py::arg("stream") = py::none());
  m.def(
      "add_process_set",
      [](std::vector<int> ranks) { return RuntimeLease()->AddProcessSet(std::move(ranks)); },
      py::arg("ranks"), Release(), "Collective over the job; the new set's id.");
  m.def(
      "remove_process_set", [](int id) { return RuntimeLease()->RemoveProcessSet(id); },
      py::arg("process_set_id"), Release(), "Collective over the job; False for an unknown id.");
  m.def(
      "process_set_info",
      [](int id) -> py::object {
        auto info = RuntimeLease()->GetProcessSet(id);
        if (!info) return py::none();
        return py::make_tuple(info->ranks, info->included, info->rank);
      },
      py::arg("process_set_id"));
  m.def("process_set_ids", [] { return RuntimeLease()->ProcessSetIds(); });
  m.def(
      "process_set_member",
      [](int id, const std::string& op, const std::string& name) {
        return RuntimeLease()->MemberRankSize(op, name, id);
      },
      py::arg("process_set_id"), py::arg("op"), py::arg("name"),
      "(this rank's index, size) in a process set; ValueError, from the same rule as "
      "enqueue, when the set is unknown or this rank is not a member.");
  m.def(
      "check_reduction",
      [](const std::string& op, const std::string& name, int process_set, int reduce_op,
         std::optional<int> dtype) {
        std::optional<DataType> dt;
        if (dtype) dt = MakeBuffer(0, *dtype, {}, kCpuDevice).dtype;
        RuntimeLease()->CheckReduction(op, name, process_set, ToReduceOp(reduce_op), dt);
      },
      py::arg("op"), py::arg("name"), py::arg("process_set"), py::arg("reduce_op"),
      py::arg("dtype") = py::none(),
      "Enqueue's rule on what a reduction may reduce (Adasum's process set and dtypes, bool with "
      "Min/Max only), for a caller that has no tensor yet.");
  m.def("engine_stats", &Stats);
  m.def("reset_engine_stats", [] { RuntimeLease()->stats().Reset(); });
  m.def("autotune_history", &AutotuneHistory);
  m.def("config", &ConfigDict);
  m.def("build_info", &BuildInfo);
  m.def("reducescatter_rows", &ReducescatterRows, py::arg("rows"), py::arg("size"), py::arg("rank"),
        "Rows of dimension 0 that set rank `rank` receives from reducescatter.");

  // Codes shared with Python (one source of truth).
  py::dict dtypes;
  for (int i = 0; i < kNumDataTypes; ++i) dtypes[DataTypeName(static_cast<DataType>(i))] = i;
  m.attr("DTYPES") = dtypes;
  py::dict ops;
  for (OpType op : {OpType::kAllreduce, OpType::kAllgather, OpType::kBroadcast, OpType::kAlltoall,
                    OpType::kReducescatter, OpType::kBarrier, OpType::kJoin}) {
    ops[OpTypeName(op)] = static_cast<int>(op);
  }
  m.attr("OPS") = ops;
  py::dict reduce_ops;
  for (ReduceOp op : {ReduceOp::kAverage, ReduceOp::kSum, ReduceOp::kAdasum, ReduceOp::kMin,
                      ReduceOp::kMax, ReduceOp::kProduct}) {
    reduce_ops[ReduceOpName(op)] = static_cast<int>(op);
  }
  m.attr("REDUCE_OPS") = reduce_ops;
  py::dict status;
  status["ok"] = static_cast<int>(StatusCode::kOk);
  status["invalid_argument"] = static_cast<int>(StatusCode::kInvalidArgument);
  status["precondition"] = static_cast<int>(StatusCode::kPrecondition);
  status["aborted"] = static_cast<int>(StatusCode::kAborted);
  status["internal"] = static_cast<int>(StatusCode::kInternal);
  m.attr("STATUS") = status;
  // The first line of the autotuner's log (HOROVOD_AUTOTUNE_LOG).
  m.attr("AUTOTUNE_LOG_HEADER") = ParameterManager::kLogHeader;

  RegisterGpuBindings(m);
  RegisterKnobBindings(m);
  RegisterGlooBindings(m);
}
