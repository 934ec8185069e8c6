// pybind11 bindings of the GPU data plane's queries: which CUDA runtime and
// NCCL this process can use (before init too), explicit device binding, and
// an uncached load for tests of the loader's error paths.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "gpu/gpu_context.h"
#include "gpu/gpu_library.h"
#include "engine/runtime.h"

namespace py = pybind11;

namespace hvdcompat {

namespace {

py::dict Describe(const GpuLibraries& g) {
  py::dict d;
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

GpuSearchPaths Paths(std::vector<std::string> cudart, std::vector<std::string> nccl) {
  GpuSearchPaths p;
  p.cudart = std::move(cudart);
  p.nccl = std::move(nccl);
  return p;
}

}  // namespace

void RegisterGpuBindings(py::module_& m, py::module_& testing, Runtime& (*runtime)()) {
  m.def(
      "set_gpu_search_paths",
      [](std::vector<std::string> cudart, std::vector<std::string> nccl) {
        SetGpuSearchPaths(Paths(std::move(cudart), std::move(nccl)));
      },
      py::arg("cudart"), py::arg("nccl"),
      "Candidate library files for the first GPU library load (no effect after it).");
  m.def(
      "gpu_info",
      [] {
        const GpuLibraries* g;
        {
          py::gil_scoped_release release;  // the first call dlopens
          g = &Gpu();
        }
        return Describe(*g);
      },
      "Loads the CUDA runtime and NCCL on first use and says what was found.");
  m.def(
      "gpu_unavailable_reason",
      [](bool gpu_operations_mpi) {
        py::gil_scoped_release release;
        return GpuUnavailableReason(gpu_operations_mpi);
      },
      py::arg("gpu_operations_mpi"),
      "Why CUDA tensors cannot run here ('' when they can), for HOROVOD_GPU_OPERATIONS=MPI or "
      "NCCL.");
  m.def(
      "bind_cuda_device",
      [runtime](int device) {
        Runtime& rt = runtime();
        py::gil_scoped_release release;
        rt.gpu().BindDevice("join", device);
      },
      py::arg("device"), "Makes `device` this rank's GPU (as its first CUDA op would).");
  testing.def(
      "load_gpu_libraries",
      [](std::vector<std::string> cudart, std::vector<std::string> nccl) {
        GpuLibraries g;
        {
          py::gil_scoped_release release;
          g = LoadGpuLibraries(Paths(std::move(cudart), std::move(nccl)));
        }
        return Describe(g);
      },
      py::arg("cudart") = std::vector<std::string>(), py::arg("nccl") = std::vector<std::string>(),
      "One uncached load attempt with the current environment (loader error paths).");
}

}  // namespace hvdcompat
