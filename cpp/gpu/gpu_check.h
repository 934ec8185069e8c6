// One check macro per foreign error source of the GPU data plane (dlopen,
// the CUDA runtime, NCCL). Each throws LibraryError with the call's text,
// the library's own error string, and file:line; the worker turns it into
// HorovodInternalError for the affected ops.
#pragma once

#include "core/common.h"
#include "cuda/cuda_runtime_min.h"
#include "nccl/nccl_min.h"

namespace hvdcompat {

[[noreturn]] void ThrowDlError(const char* what, const char* file, int line);
[[noreturn]] void ThrowCudaError(cudaError_t code, const char* call, const char* file, int line);
// `comm` may be null; when set, NCCL's last error text for it is added.
[[noreturn]] void ThrowNcclError(ncclResult_t code, const char* call, ncclComm_t comm,
                                 const char* file, int line);

// Library text for a code (works before and after the library loaded).
std::string CudaErrorText(cudaError_t code);
std::string NcclErrorText(ncclResult_t code, ncclComm_t comm);

// dlopen/dlsym returned null: report dlerror().
#define HVD_DL_CHECK(ptr, what)                                       \
  do {                                                                \
    if ((ptr) == nullptr) ::hvdcompat::ThrowDlError((what), __FILE__, __LINE__); \
  } while (0)

#define HVD_CUDA_CHECK(call)                                                      \
  do {                                                                            \
    cudaError_t hvd_cuda_rc_ = (call);                                            \
    if (hvd_cuda_rc_ != cudaSuccess) {                                            \
      ::hvdcompat::ThrowCudaError(hvd_cuda_rc_, #call, __FILE__, __LINE__);       \
    }                                                                             \
  } while (0)

#define HVD_NCCL_CHECK(comm, call)                                                \
  do {                                                                            \
    ncclResult_t hvd_nccl_rc_ = (call);                                           \
    if (hvd_nccl_rc_ != ncclSuccess) {                                            \
      ::hvdcompat::ThrowNcclError(hvd_nccl_rc_, #call, (comm), __FILE__, __LINE__); \
    }                                                                             \
  } while (0)

}  // namespace hvdcompat
