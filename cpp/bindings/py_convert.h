// Python views of core values shared by the production module (_core) and
// the test-only module (_core_testing): one function per value, so both
// modules describe it the same way.
#pragma once

#include <pybind11/pybind11.h>

#include "core/tuned_params.h"
#include "gpu/gpu_library.h"

namespace hvdcompat {

// The tunables as a dict: {fusion_threshold_bytes, cycle_time_ms,
// fusion_chunk_bytes, max_call_bytes, hierarchical_allreduce,
// hierarchical_allgather, active}.
inline pybind11::dict TunedParamsDict(const TunedParams& t) {
  pybind11::dict d;
  d["fusion_threshold_bytes"] = t.fusion_threshold_bytes;
  d["cycle_time_ms"] = t.cycle_time_ms;
  d["fusion_chunk_bytes"] = t.fusion_chunk_bytes;
  d["max_call_bytes"] = t.max_call_bytes;
  d["hierarchical_allreduce"] = t.hierarchical_allreduce;
  d["hierarchical_allgather"] = t.hierarchical_allgather;
  d["active"] = t.active;
  return d;
}

// What a load of the CUDA runtime and NCCL found.
inline pybind11::dict GpuLibrariesDict(const GpuLibraries& g) {
  pybind11::dict d;
  d["cuda_loaded"] = g.cuda_ok();
  d["cuda_error"] = g.cuda_error;
  d["cuda_path"] = g.cuda.path;
  d["cuda_runtime_version"] = g.cuda.runtime_version;
  d["nccl_loaded"] = g.nccl_ok();
  d["nccl_error"] = g.nccl_error;
  d["nccl_path"] = g.nccl.path;
  d["nccl_version"] = g.nccl_ok() ? g.nccl.version : 0;
  d["nccl_version_string"] = NcclVersionString(g.nccl_ok() ? g.nccl.version : 0);
  return d;
}

}  // namespace hvdcompat
