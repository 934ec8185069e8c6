// pybind11 bindings of the core: thin, dtype-generic, GIL released around
// anything that may wait. The module-level Core object is the only mutable
// global: it owns the Runtime between hvd.init() and hvd.shutdown().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <mutex>

#include "bindings/dlpack_export.h"
#include "engine/elastic_reset.h"
#include "core/env.h"
#include "ops/mpi_ops.h"
#include "engine/runtime.h"

namespace py = pybind11;

namespace hvdcompat {

void RegisterTestingBindings(py::module_& m);
class Runtime;
void RegisterGpuBindings(py::module_& m, py::module_& testing, Runtime& (*runtime)());

namespace {

constexpr const char* kNotInitialized = "Horovod has not been initialized; use hvd.init().";

struct Core {
  std::mutex mu;
  // Shared so a thread blocked in wait() keeps the runtime alive while
  // another thread shuts it down (shutdown fails the op; the waiter returns).
  std::shared_ptr<Runtime> runtime;
  bool mpi_owned = false;  // we called MPI_Init, so we finalize at exit
  // After an elastic reset: the survivors' communicator, which a later
  // hvd.init() without `comm` runs on instead of MPI_COMM_WORLD.
  MPI_Comm world = MPI_COMM_NULL;
};

Core& TheCore() {
  static Core* core = new Core();  // never destroyed: outlives interpreter teardown
  return *core;
}

std::shared_ptr<Runtime> RtShared() {
  Core& core = TheCore();
  std::lock_guard<std::mutex> lock(core.mu);
  if (!core.runtime) throw py::value_error(kNotInitialized);
  return core.runtime;
}

Runtime& Rt() {
  Runtime* rt = TheCore().runtime.get();
  if (!rt) throw py::value_error(kNotInitialized);
  return *rt;
}

BufferDesc ToBuffer(const py::handle& t, void** stream = nullptr) {
  // (data_ptr, dtype code, shape, device[, producer cudaStream_t])
  auto tup = t.cast<py::tuple>();
  if (stream && tup.size() > 4 && !tup[4].is_none()) {
    *stream = reinterpret_cast<void*>(tup[4].cast<uintptr_t>());
  }
  BufferDesc b;
  b.data = reinterpret_cast<void*>(tup[0].cast<uintptr_t>());
  int code = tup[1].cast<int>();
  if (code < 0 || code >= kNumDataTypes) throw py::value_error("unknown dtype code");
  b.dtype = static_cast<DataType>(code);
  b.shape = tup[2].cast<std::vector<int64_t>>();
  b.device = tup[3].cast<int>();
  return b;
}

void Init(py::object comm_handle, std::vector<int> ranks,
          std::vector<std::vector<int>> process_sets, bool dynamic) {
  Core& core = TheCore();
  std::lock_guard<std::mutex> lock(core.mu);
  if (core.runtime) return;  // a second init is harmless
  InitOptions opts;
  if (!comm_handle.is_none()) {
    // A Fortran handle (mpi4py's Comm.py2f()): the one form of a communicator
    // that every MPI defines as an integer. MPI_Comm itself is a pointer in
    // Open MPI and an int in the MPICH family.
    opts.comm = MPI_Comm_f2c(static_cast<MPI_Fint>(comm_handle.cast<int64_t>()));
  } else if (core.world != MPI_COMM_NULL) {
    opts.comm = core.world;
  }
  opts.ranks = std::move(ranks);
  opts.process_sets = std::move(process_sets);
  opts.dynamic_process_sets = dynamic;
  {
    py::gil_scoped_release release;
    int provided = 0;
    if (MpiContext::EnsureInitialized(&provided)) core.mpi_owned = true;
    core.runtime = std::make_shared<Runtime>(opts);
  }
}

void Shutdown() {
  Core& core = TheCore();
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(core.mu);
    rt = std::move(core.runtime);
  }
  py::gil_scoped_release release;
  if (rt) rt->Stop();
  rt.reset();
}

// Note [Elastic reset] (cpp/engine/elastic_reset.h). Returns the survivors' ranks
// in the old world, in new-rank order.
std::vector<int> ElasticReset() {
  Core& core = TheCore();
  std::shared_ptr<Runtime> old;
  {
    std::lock_guard<std::mutex> lock(core.mu);
    if (!core.runtime) throw py::value_error(kNotInitialized);
    old = core.runtime;
  }
  // Not under core.mu: the rebuild is collective and may take a while, and
  // another thread's call must not hold the GIL while waiting for the lock.
  // Such a call meanwhile meets the stopped old runtime and fails.
  ResetResult r;
  {
    py::gil_scoped_release release;
    r = RebuildFromSurvivors(old);
  }
  {
    std::lock_guard<std::mutex> lock(core.mu);
    core.runtime = std::move(r.runtime);
    if (core.world != MPI_COMM_NULL) MPI_Comm_free(&core.world);
    core.world = r.world;
  }
  py::gil_scoped_release release;
  old.reset();  // frees the old communicators (unless another thread still holds it)
  return r.survivors;
}

void Finalize() {
  Shutdown();
  Core& core = TheCore();
  std::lock_guard<std::mutex> lock(core.mu);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (core.mpi_owned && initialized && !finalized) {
    py::gil_scoped_release release;
    MPI_Finalize();
  }
}

int Enqueue(int op, std::string name, bool auto_named, int process_set, int reduce_op, int root,
            double prescale, double postscale, const py::list& inputs, const py::list& outputs,
            std::vector<std::vector<int64_t>> splits) {
  EnqueueArgs a;
  a.op = static_cast<OpType>(op);
  a.name = std::move(name);
  a.auto_named = auto_named;
  a.process_set = process_set;
  a.reduce_op = static_cast<ReduceOp>(reduce_op);
  a.root = root;
  a.prescale = prescale;
  a.postscale = postscale;
  a.inputs.reserve(inputs.size());
  for (const auto& t : inputs) a.inputs.push_back(ToBuffer(t, a.inputs.empty() ? &a.stream : nullptr));
  a.outputs.reserve(outputs.size());
  for (const auto& t : outputs) a.outputs.push_back(ToBuffer(t));
  a.splits = std::move(splits);
  std::shared_ptr<Runtime> rt = RtShared();
  py::gil_scoped_release release;
  return rt->Enqueue(std::move(a));
}

// `stream`: for device ops, the caller's current cudaStream_t, ordered after
// the op's device work (Note [GPU stream order], cpp/gpu/gpu_events.h).
py::tuple Wait(int handle, py::object stream) {
  std::shared_ptr<Runtime> rt = RtShared();
  HandleResult r;
  const bool has_stream = !stream.is_none();
  const uintptr_t consumer = has_stream ? stream.cast<uintptr_t>() : 0;
  {
    py::gil_scoped_release release;
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
  EngineStats& s = Rt().stats();
  py::dict d;
  d["cycles"] = s.cycles.load();
  d["slow_path_cycles"] = s.slow_path_cycles.load();
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
  return d;
}

py::dict TunedDict(const TunedParams& t) {
  py::dict d;
  d["fusion_threshold_bytes"] = t.fusion_threshold_bytes;
  d["cycle_time_ms"] = t.cycle_time_ms;
  d["fusion_chunk_bytes"] = t.fusion_chunk_bytes;
  d["max_call_bytes"] = t.max_call_bytes;
  d["hierarchical_allreduce"] = t.hierarchical_allreduce;
  d["hierarchical_allgather"] = t.hierarchical_allgather;
  d["active"] = t.active;
  return d;
}

py::list AutotuneHistory() {
  py::list out;
  for (const auto& c : Rt().stats().tuning.history()) {
    py::dict d = TunedDict(c.params);
    d["cycle"] = c.cycle;
    out.append(d);
  }
  return out;
}

py::dict ConfigDict() {
  const Config& c = Rt().config();
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
  d["num_nccl_streams"] = c.num_nccl_streams;
  d["hierarchical_allreduce"] = c.hierarchical_allreduce;
  d["hierarchical_allgather"] = c.hierarchical_allgather;
  d["gpu_operations"] = c.gpu_operations_mpi ? "MPI" : "NCCL";
  d["async_completion"] = c.async_completion;
  return d;
}

py::list Knobs() {
  py::list out;
  for (const auto& k : AllKnobs()) {
    py::dict d;
    d["name"] = std::string("HVDCOMPAT_") + k.suffix;
    d["horovod_name"] = k.horovod_alias ? py::object(py::str(std::string("HOROVOD_") + k.suffix))
                                        : py::object(py::none());
    d["default"] = k.default_value;
    d["unit"] = k.unit;
    d["help"] = k.help;
    out.append(d);
  }
  return out;
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

}  // namespace

}  // namespace hvdcompat

PYBIND11_MODULE(_core, m) {
  using namespace hvdcompat;
  m.doc() = "hvdcompat native core (framework-agnostic; no PyTorch inside)";

  m.def("init", &Init, py::arg("comm_handle"), py::arg("ranks"), py::arg("process_sets"),
        py::arg("dynamic"));
  m.def("shutdown", &Shutdown);
  m.def("elastic_reset", &ElasticReset,
        "Rebuilds the runtime from the surviving ranks, in place (collective over survivors).");
  m.def("fault_tolerance_enabled", [] { return FaultToleranceEnabled(); },
        "Whether MPI runs with ULFM enabled (mpirun --with-ft ulfm).");
  m.def("abort", [](int code) { MPI_Abort(MPI_COMM_WORLD, code); },
        "Aborts every rank of the job (used by the test harness on a failure).");
  m.def("finalize", &Finalize, "Shut down and, if hvdcompat initialised MPI, finalize it.");
  m.def("is_initialized", [] { return static_cast<bool>(TheCore().runtime); });
  m.def("rank", [] { return Rt().mpi().rank(); });
  m.def("size", [] { return Rt().mpi().size(); });
  m.def("local_rank", [] { return Rt().mpi().local_rank(); });
  m.def("local_size", [] { return Rt().mpi().local_size(); });
  m.def("cross_rank", [] { return Rt().mpi().cross_rank(); });
  m.def("cross_size", [] { return Rt().mpi().cross_size(); });
  m.def("is_homogeneous", [] { return Rt().mpi().homogeneous(); });
  m.def("mpi_threads_supported", [] { return Rt().mpi().threads_supported(); });
  m.def("dynamic_process_sets", [] { return Rt().dynamic_process_sets(); });
  m.def("enqueue", &Enqueue);
  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    Runtime& rt = Rt();
    py::gil_scoped_release release;
    rt.StartTimeline(path, mark_cycles);
  });
  m.def("stop_timeline", [] {
    Runtime& rt = Rt();
    py::gil_scoped_release release;
    rt.StopTimeline();
  });
  m.def("poll", [](int h) { return Rt().handles().Poll(h); });
  m.def("wait", &Wait, py::arg("handle"), py::arg("stream") = py::none());
  m.def("add_process_set", [](std::vector<int> ranks) {
    Runtime& rt = Rt();
    py::gil_scoped_release release;
    return rt.AddProcessSet(std::move(ranks));
  });
  m.def("remove_process_set", [](int id) {
    Runtime& rt = Rt();
    py::gil_scoped_release release;
    return rt.RemoveProcessSet(id);
  });
  m.def("process_set_info", [](int id) -> py::object {
    auto info = Rt().GetProcessSet(id);
    if (!info) return py::none();
    return py::make_tuple(info->ranks, info->included, info->rank);
  });
  m.def("process_set_ids", [] { return Rt().ProcessSetIds(); });
  m.def("process_set_member", [](int id, const std::string& op, const std::string& name) {
    return RtShared()->MemberRankSize(op, name, id);
  }, py::arg("process_set_id"), py::arg("op"), py::arg("name"),
        "(this rank's index, size) in a process set; ValueError, from the same rule as "
        "enqueue, when the set is unknown or this rank is not a member.");
  m.def("engine_stats", &Stats);
  m.def("reset_engine_stats", [] { Rt().stats().Reset(); });
  m.def("autotune_history", &AutotuneHistory);
  m.def("config", &ConfigDict);
  m.def("knobs", &Knobs);
  m.def("knob", [](const std::string& suffix) {
    for (const auto& k : AllKnobs()) {
      if (suffix == k.suffix) return KnobString(k.knob);
    }
    throw py::key_error("no knob HVDCOMPAT_" + suffix);
  }, "A knob's value (HVDCOMPAT_ first, then HOROVOD_, then its default).");
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

  py::module_ testing = m.def_submodule("testing", "Hooks for unit tests of the core logic");
  RegisterTestingBindings(testing);
  RegisterGpuBindings(m, testing, &Rt);
}
