#include "gpu/gpu_check.h"

#include <dlfcn.h>

#include <sstream>

#include "gpu/gpu_library.h"

namespace hvdcompat {

void ThrowDlError(const char* what, const char* file, int line) {
  const char* err = dlerror();
  std::ostringstream os;
  os << what << ": " << (err ? err : "unknown dynamic loader error") << " (" << file << ":"
     << line << ")";
  throw LibraryError(os.str());
}

std::string CudaErrorText(cudaError_t code) {
  const GpuLibraries& g = Gpu();
  if (g.cuda_ok() && g.cuda.GetErrorString) {
    const char* s = g.cuda.GetErrorString(code);
    if (s) return s;
  }
  return "CUDA error " + std::to_string(static_cast<int>(code));
}

std::string NcclErrorText(ncclResult_t code, ncclComm_t comm) {
  const GpuLibraries& g = Gpu();
  std::string text = "NCCL error " + std::to_string(static_cast<int>(code));
  if (g.nccl_ok() && g.nccl.GetErrorString) {
    if (const char* s = g.nccl.GetErrorString(code)) text = s;
  }
  // The last-error text names the failing peer or system call when NCCL knows.
  if (g.nccl_ok() && g.nccl.GetLastError && comm) {
    const char* last = g.nccl.GetLastError(comm);
    if (last && *last) text += std::string(" (") + last + ")";
  }
  return text;
}

void ThrowCudaError(cudaError_t code, const char* call, const char* file, int line) {
  std::ostringstream os;
  os << "CUDA call " << call << " failed: " << CudaErrorText(code) << " (error code "
     << static_cast<int>(code) << ", " << file << ":" << line << ")";
  throw LibraryError(os.str());
}

void ThrowNcclError(ncclResult_t code, const char* call, ncclComm_t comm, const char* file,
                    int line) {
  std::ostringstream os;
  os << "NCCL call " << call << " failed: " << NcclErrorText(code, comm) << " (error code "
     << static_cast<int>(code) << ", " << file << ":" << line
     << "). Set NCCL_DEBUG=WARN for NCCL's own diagnostics.";
  throw LibraryError(os.str());
}

}  // namespace hvdcompat
