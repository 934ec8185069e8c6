// Compiled (never run) by tests/unit/test_gpu_abi.py against the CUDA
// toolkit's cuda_runtime_api.h, when one is available.
#include <cuda_runtime_api.h>

#define HVDCOMPAT_ABI_CHECK 1
namespace ours {
#include "cuda/cuda_runtime_min.h"
}
#include "abi_check.h"

// The handle types resolve to the vendor's own (same struct names).
static_assert(std::is_same<ours::cudaStream_t, ::cudaStream_t>::value, "cudaStream_t");
static_assert(std::is_same<ours::cudaEvent_t, ::cudaEvent_t>::value, "cudaEvent_t");
static_assert(std::is_same<ours::cudaMemPool_t, ::cudaMemPool_t>::value, "cudaMemPool_t");
static_assert(sizeof(ours::cudaDeviceAttr) == sizeof(::cudaDeviceAttr), "cudaDeviceAttr size");
static_assert(sizeof(ours::cudaMemPoolAttr) == sizeof(::cudaMemPoolAttr), "cudaMemPoolAttr size");
HVD_SAME_VALUE(ours::cudaDevAttrMemoryPoolsSupported, ::cudaDevAttrMemoryPoolsSupported);
HVD_SAME_VALUE(ours::cudaMemPoolAttrReleaseThreshold, ::cudaMemPoolAttrReleaseThreshold);
HVD_SAME_SIG(ours::cudaDeviceGetAttribute_fn, cudaDeviceGetAttribute);
HVD_SAME_SIG(ours::cudaDeviceGetDefaultMemPool_fn, cudaDeviceGetDefaultMemPool);
HVD_SAME_SIG(ours::cudaMemPoolSetAttribute_fn, cudaMemPoolSetAttribute);
HVD_SAME_SIG(ours::cudaMemPoolGetAttribute_fn, cudaMemPoolGetAttribute);
static_assert(sizeof(ours::cudaError_t) == sizeof(::cudaError_t), "cudaError_t size");
static_assert(sizeof(ours::cudaMemcpyKind) == sizeof(::cudaMemcpyKind), "cudaMemcpyKind size");

HVD_SAME_VALUE(ours::cudaSuccess, ::cudaSuccess);
HVD_SAME_VALUE(ours::cudaErrorCudartUnloading, ::cudaErrorCudartUnloading);
HVD_SAME_VALUE(ours::cudaErrorNotReady, ::cudaErrorNotReady);
HVD_SAME_VALUE(ours::cudaMemcpyHostToHost, ::cudaMemcpyHostToHost);
HVD_SAME_VALUE(ours::cudaMemcpyHostToDevice, ::cudaMemcpyHostToDevice);
HVD_SAME_VALUE(ours::cudaMemcpyDeviceToHost, ::cudaMemcpyDeviceToHost);
HVD_SAME_VALUE(ours::cudaMemcpyDeviceToDevice, ::cudaMemcpyDeviceToDevice);
HVD_SAME_VALUE(ours::cudaMemcpyDefault, ::cudaMemcpyDefault);
HVD_SAME_VALUE(HVD_CUDA_STREAM_NON_BLOCKING, cudaStreamNonBlocking);
HVD_SAME_VALUE(HVD_CUDA_EVENT_DISABLE_TIMING, cudaEventDisableTiming);
HVD_SAME_VALUE(HVD_CUDA_HOST_ALLOC_DEFAULT, cudaHostAllocDefault);

HVD_SAME_SIG(ours::cudaGetErrorString_fn, cudaGetErrorString);
HVD_SAME_SIG(ours::cudaGetLastError_fn, cudaGetLastError);
HVD_SAME_SIG(ours::cudaRuntimeGetVersion_fn, cudaRuntimeGetVersion);
HVD_SAME_SIG(ours::cudaDriverGetVersion_fn, cudaDriverGetVersion);
HVD_SAME_SIG(ours::cudaGetDeviceCount_fn, cudaGetDeviceCount);
HVD_SAME_SIG(ours::cudaGetDevice_fn, cudaGetDevice);
HVD_SAME_SIG(ours::cudaSetDevice_fn, cudaSetDevice);
HVD_SAME_SIG(ours::cudaDeviceGetPCIBusId_fn, cudaDeviceGetPCIBusId);
HVD_SAME_SIG(ours::cudaStreamCreateWithFlags_fn, cudaStreamCreateWithFlags);
HVD_SAME_SIG(ours::cudaStreamCreateWithPriority_fn, cudaStreamCreateWithPriority);
HVD_SAME_SIG(ours::cudaDeviceGetStreamPriorityRange_fn, cudaDeviceGetStreamPriorityRange);
HVD_SAME_SIG(ours::cudaStreamDestroy_fn, cudaStreamDestroy);
HVD_SAME_SIG(ours::cudaStreamSynchronize_fn, cudaStreamSynchronize);
HVD_SAME_SIG(ours::cudaStreamWaitEvent_fn, cudaStreamWaitEvent);
HVD_SAME_SIG(ours::cudaEventCreateWithFlags_fn, cudaEventCreateWithFlags);
HVD_SAME_SIG(ours::cudaEventDestroy_fn, cudaEventDestroy);
HVD_SAME_SIG(ours::cudaEventRecord_fn, cudaEventRecord);
HVD_SAME_SIG(ours::cudaEventQuery_fn, cudaEventQuery);
HVD_SAME_SIG(ours::cudaEventSynchronize_fn, cudaEventSynchronize);
HVD_SAME_SIG(ours::cudaMalloc_fn, cudaMalloc);
HVD_SAME_SIG(ours::cudaFree_fn, cudaFree);
HVD_SAME_SIG(ours::cudaMallocAsync_fn, cudaMallocAsync);
HVD_SAME_SIG(ours::cudaFreeAsync_fn, cudaFreeAsync);
HVD_SAME_SIG(ours::cudaHostAlloc_fn, cudaHostAlloc);
HVD_SAME_SIG(ours::cudaFreeHost_fn, cudaFreeHost);
HVD_SAME_SIG(ours::cudaMemcpyAsync_fn, cudaMemcpyAsync);
HVD_SAME_SIG(ours::cudaMemcpy2DAsync_fn, cudaMemcpy2DAsync);
HVD_SAME_SIG(ours::cudaMemsetAsync_fn, cudaMemsetAsync);
