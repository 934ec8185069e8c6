// The CUDA runtime and NCCL, loaded with dlopen at first use so that the
// extension builds, imports and runs on machines without either. See
// Note [Finding the GPU libraries].
//
// Thread-safety: Gpu() loads once (std::call_once) and the tables it returns
// are immutable afterwards, so any thread may call through them.
#pragma once

#include <string>
#include <vector>

#include "cuda/cuda_runtime_min.h"
#include "nccl/nccl_min.h"

namespace hvdcompat {

// Note [Finding the GPU libraries]
// Each library is looked for in this order, the first that loads wins:
//  1. HVDCOMPAT_CUDART_LIB / HVDCOMPAT_NCCL_LIB: an explicit path (or
//     soname). When set, nothing else is tried, so a wrong value is reported
//     instead of silently falling back to another copy.
//  2. A copy already loaded into the process (dlopen with RTLD_NOLOAD):
//     `import torch` of a CUDA build loads both, and using torch's copy keeps
//     one NCCL and one CUDA runtime in the process.
//  3. Candidates from the Python layer: the libraries PyTorch's CUDA wheels
//     install (site-packages/nvidia/{cuda_runtime,nccl}/lib; CUDA 13's runtime
//     in site-packages/nvidia/cu13/lib; torch/lib).
//  4. The plain sonames, through the system loader (LD_LIBRARY_PATH, ldconfig).
// A library that loads but lacks a required symbol is rejected with the
// symbol named. Loaded libraries are never closed.

// Entry points of the CUDA runtime. Required unless marked optional.
struct CudaApi {
  std::string path;         // what was loaded
  int runtime_version = 0;  // e.g. 12040
  cudaGetErrorString_fn GetErrorString = nullptr;
  cudaGetLastError_fn GetLastError = nullptr;
  cudaRuntimeGetVersion_fn RuntimeGetVersion = nullptr;
  cudaGetDeviceCount_fn GetDeviceCount = nullptr;
  cudaGetDevice_fn GetDevice = nullptr;
  cudaSetDevice_fn SetDevice = nullptr;
  cudaDeviceGetPCIBusId_fn DeviceGetPCIBusId = nullptr;
  cudaStreamCreateWithFlags_fn StreamCreateWithFlags = nullptr;
  cudaStreamDestroy_fn StreamDestroy = nullptr;
  cudaStreamSynchronize_fn StreamSynchronize = nullptr;
  cudaStreamWaitEvent_fn StreamWaitEvent = nullptr;
  cudaEventCreateWithFlags_fn EventCreateWithFlags = nullptr;
  cudaEventDestroy_fn EventDestroy = nullptr;
  cudaEventRecord_fn EventRecord = nullptr;
  cudaEventQuery_fn EventQuery = nullptr;
  cudaEventSynchronize_fn EventSynchronize = nullptr;
  cudaMalloc_fn Malloc = nullptr;
  cudaFree_fn Free = nullptr;
  cudaHostAlloc_fn HostAlloc = nullptr;
  cudaFreeHost_fn FreeHost = nullptr;
  cudaMemcpyAsync_fn MemcpyAsync = nullptr;
  cudaMemcpy2DAsync_fn Memcpy2DAsync = nullptr;
  cudaMemsetAsync_fn MemsetAsync = nullptr;
  // Optional: high-priority engine streams, so collectives are not queued
  // behind compute kernels.
  cudaStreamCreateWithPriority_fn StreamCreateWithPriority = nullptr;
  cudaDeviceGetStreamPriorityRange_fn DeviceGetStreamPriorityRange = nullptr;
  // Optional (CUDA 11.2+): stream-ordered allocation of outputs.
  cudaMallocAsync_fn MallocAsync = nullptr;
  cudaFreeAsync_fn FreeAsync = nullptr;
  // Optional: whether a device has memory pools, and the default pool's
  // release threshold (see Note [GPU memory without device syncs]).
  cudaDeviceGetAttribute_fn DeviceGetAttribute = nullptr;
  cudaDeviceGetDefaultMemPool_fn DeviceGetDefaultMemPool = nullptr;
  cudaMemPoolSetAttribute_fn MemPoolSetAttribute = nullptr;
  cudaMemPoolGetAttribute_fn MemPoolGetAttribute = nullptr;

  bool HasStreamOrderedAlloc() const { return MallocAsync && FreeAsync; }
};

// Entry points of NCCL. Required unless marked optional.
struct NcclApi {
  std::string path;
  int version = 0;  // ncclGetVersion's code, e.g. 21805
  ncclGetVersion_fn GetVersion = nullptr;
  ncclGetErrorString_fn GetErrorString = nullptr;
  ncclGetUniqueId_fn GetUniqueId = nullptr;
  ncclCommInitRank_fn CommInitRank = nullptr;
  ncclCommDestroy_fn CommDestroy = nullptr;
  ncclCommAbort_fn CommAbort = nullptr;
  ncclCommGetAsyncError_fn CommGetAsyncError = nullptr;
  ncclAllReduce_fn AllReduce = nullptr;
  ncclBroadcast_fn Broadcast = nullptr;
  ncclAllGather_fn AllGather = nullptr;
  ncclReduceScatter_fn ReduceScatter = nullptr;
  ncclSend_fn Send = nullptr;
  ncclRecv_fn Recv = nullptr;
  ncclGroupStart_fn GroupStart = nullptr;
  ncclGroupEnd_fn GroupEnd = nullptr;
  // Optional (2.11+ / 2.13+).
  ncclRedOpCreatePreMulSum_fn RedOpCreatePreMulSum = nullptr;
  ncclRedOpDestroy_fn RedOpDestroy = nullptr;
  ncclGetLastError_fn GetLastError = nullptr;
};

// Where to look besides the environment (step 3 of the note).
struct GpuSearchPaths {
  std::vector<std::string> cudart;
  std::vector<std::string> nccl;
};

// The outcome of one load attempt. `*_error` is empty when that library
// loaded; otherwise it says what was tried and how to point at the library.
struct GpuLibraries {
  CudaApi cuda;
  std::string cuda_error;
  NcclApi nccl;
  std::string nccl_error;

  bool cuda_ok() const { return cuda_error.empty(); }
  bool nccl_ok() const { return cuda_ok() && nccl_error.empty(); }
};

// One uncached attempt with the current environment (tests use it for the
// error paths). Never throws.
GpuLibraries LoadGpuLibraries(const GpuSearchPaths& extra);

// Candidates for the process-wide load; effective only before Gpu() first
// runs (the Python layer passes them when it first asks about CUDA).
void SetGpuSearchPaths(GpuSearchPaths paths);

// The process-wide libraries, loaded on the first call.
const GpuLibraries& Gpu();

// Shorthands that throw LibraryError with the load error when missing.
const CudaApi& Cuda();
const NcclApi& Nccl();

// "2.18.5" from 21805 (and "2.8.4" from the older 2804 encoding).
std::string NcclVersionString(int code);

}  // namespace hvdcompat
