// pybind11 bindings of the core: thin, dtype-generic, typed (bound enums and
// option classes, bindings/bind_types.cc), GIL released around anything that
// may wait. The module owns one Runtime between hvd.init() and hvd.shutdown()
// (bindings/core_lifecycle.cc); calls hold it through a RuntimeLease
// (Note [Runtime lease], bindings/runtime_lease.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>

#include "bindings/bind_types.h"
#include "bindings/core_lifecycle.h"
#include "bindings/dlpack_export.h"
#include "bindings/py_convert.h"
#include "bindings/py_store.h"
#include "bindings/runtime_lease.h"
#include "autotune/parameter_manager.h"
#include "engine/elastic_reset.h"
#include "core/env.h"
#include "ops/collective_layout.h"
#include "engine/runtime.h"

namespace py = pybind11;

namespace hvdcompat {

void RegisterGpuBindings(py::module_& m);
void RegisterKnobBindings(py::module_& m);

namespace {

int Enqueue(EnqueueArgs args) {
  RuntimeLease rt;
  return rt->Enqueue(std::move(args));
}

// `stream`: for device ops, the caller's current cudaStream_t, ordered after
// the op's device work (Note [GPU stream order], cpp/gpu/gpu_events.h).
WaitResult Wait(int handle, py::object stream) {
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
  WaitResult out;
  out.status = r.status.code;
  out.message = std::move(r.status.message);
  for (auto& b : r.outputs) {
    out.outputs.append(py::reinterpret_steal<py::object>(ToDLPackCapsule(std::move(b))));
  }
  out.received_splits = std::move(r.received_splits);
  out.join_last_rank = r.join_last_rank;
  return out;
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
  d["gloo_segment_bytes"] = c.gloo_segment_bytes;
  d["gloo_pipeline_depth"] = c.gloo_pipeline_depth;
  d["gloo_exchange_max_bytes"] = c.gloo_exchange_max_bytes;
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

}  // namespace

}  // namespace hvdcompat

PYBIND11_MODULE(_core, m) {
  using namespace hvdcompat;
  using Release = py::call_guard<py::gil_scoped_release>;
  m.doc() = "hvdcompat native core (framework-agnostic; no PyTorch inside)";

  BindTypes(m);
  // Everything that may wait (on MPI, on peers, on a lease) runs without the GIL.
  m.def("init", &CoreInit, py::arg("options"), Release());
  m.def("shutdown", &CoreShutdown, Release(),
        "Stops the runtime; calls still inside it fail with its shutdown error first.");
  m.def("elastic_reset", &CoreElasticReset, Release(),
        "Rebuilds the runtime from the surviving ranks, in place (collective over survivors).");
  m.def("elastic_leave", &CoreElasticLeave, Release(),
        "Leaves the elastic job (host removed): the others' next reset does not wait for it.");
  m.def("fault_tolerance_enabled", [] { return FaultToleranceEnabled(); },
        "Whether MPI runs with ULFM enabled (mpirun --with-ft ulfm).");
  m.def("abort", [](int code) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) std::_Exit(code);  // the Gloo controller: this process only
    MPI_Abort(MPI_COMM_WORLD, code);
  }, py::arg("code"),
        "Aborts every rank of the job (used by the test harness on a failure).");
  m.def("finalize", &CoreFinalize, Release(),
        "Shut down and, if hvdcompat initialised MPI and it runs without ULFM, finalize it.");
  m.def("is_initialized", &CoreIsInitialized);
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
      [](const std::string& op, const std::string& name, int process_set, ReduceOp reduce_op,
         std::optional<DataType> dtype) {
        RuntimeLease()->CheckReduction(op, name, process_set, CheckedReduceOp(reduce_op), dtype);
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

  // The first line of the autotuner's log (HOROVOD_AUTOTUNE_LOG).
  m.attr("AUTOTUNE_LOG_HEADER") = ParameterManager::kLogHeader;

  RegisterGpuBindings(m);
  RegisterKnobBindings(m);
  RegisterGlooBindings(m);
}
