// pybind11 bindings of the GPU data plane's queries: which CUDA runtime and
// NCCL this process can use (before init too) and explicit device binding.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/py_convert.h"
#include "bindings/runtime_lease.h"
#include "gpu/gpu_context.h"
#include "gpu/gpu_library.h"
#include "engine/runtime.h"

namespace py = pybind11;

namespace hvdcompat {

namespace {

GpuSearchPaths Paths(std::vector<std::string> cudart, std::vector<std::string> nccl) {
  GpuSearchPaths p;
  p.cudart = std::move(cudart);
  p.nccl = std::move(nccl);
  return p;
}

}  // namespace

void RegisterGpuBindings(py::module_& m) {
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
        return GpuLibrariesDict(*g);
      },
      "Loads the CUDA runtime and NCCL on first use and says what was found.");
  m.def(
      "gpu_unavailable_reason",
      [](bool gpu_operations_mpi) { return GpuUnavailableReason(gpu_operations_mpi); },
      py::arg("gpu_operations_mpi"), py::call_guard<py::gil_scoped_release>(),
      "Why CUDA tensors cannot run here ('' when they can), for HOROVOD_GPU_OPERATIONS=MPI or "
      "NCCL.");
  m.def(
      "bind_cuda_device",
      [](int device) { RuntimeLease()->gpu().BindDevice("join", device); }, py::arg("device"),
      py::call_guard<py::gil_scoped_release>(), "Makes `device` this rank's GPU (as its first CUDA op would).");
}

}  // namespace hvdcompat
