/*
 * The slice of the CUDA runtime C API that hvdcompat's core calls, declared
 * here from NVIDIA's published reference so that the core builds without the
 * CUDA toolkit: opaque handle types, the enum values we compare against or
 * pass, and one function-pointer type per entry point. Nothing here is
 * linked; the core resolves each symbol with dlsym from the libcudart it
 * finds at run time (cpp/gpu/gpu_library.cc).
 *
 * ABI notes: every function returns cudaError_t (a C enum, int-sized);
 * handles are pointers to incomplete structs; sizes are size_t. These are
 * the legacy-default-stream entry points (not the _ptsz/_ptds variants).
 */
#ifndef HVDCOMPAT_THIRD_PARTY_CUDA_RUNTIME_MIN_H_
#define HVDCOMPAT_THIRD_PARTY_CUDA_RUNTIME_MIN_H_

#if defined(__CUDA_RUNTIME_API_H__) && !defined(HVDCOMPAT_ABI_CHECK)
#error "cuda_runtime_min.h must not be mixed with the CUDA toolkit's headers"
#endif

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUmemPoolHandle_st* cudaMemPool_t;

/* Only the codes the core tests for by value; any other value is reported
 * through cudaGetErrorString. The last enumerator only widens the enum's
 * range to every int, since the library returns codes not listed here. */
typedef enum {
  cudaSuccess = 0,
  cudaErrorCudartUnloading = 4,
  cudaErrorNotReady = 600,
  cudaErrorHvdRangeEnd = 0x7fffffff,
} cudaError_t;

typedef enum {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
} cudaMemcpyKind;

/* The device attribute and memory-pool attribute the core queries or sets. */
typedef enum {
  cudaDevAttrMemoryPoolsSupported = 115,
  cudaDevAttrHvdRangeEnd = 0x7fffffff,
} cudaDeviceAttr;

typedef enum {
  cudaMemPoolAttrReleaseThreshold = 0x4, /* value: unsigned long long (bytes) */
  cudaMemPoolAttrHvdRangeEnd = 0x7fffffff,
} cudaMemPoolAttr;

/* cudaStreamCreateWithFlags: no implicit synchronisation with the legacy
 * default stream. */
#define HVD_CUDA_STREAM_NON_BLOCKING 0x01u
/* cudaEventCreateWithFlags: no timing data (cheaper record and query). */
#define HVD_CUDA_EVENT_DISABLE_TIMING 0x02u
/* cudaHostAlloc: default page-locked allocation. */
#define HVD_CUDA_HOST_ALLOC_DEFAULT 0x00u

typedef const char* (*cudaGetErrorString_fn)(cudaError_t error);
typedef cudaError_t (*cudaGetLastError_fn)(void);
typedef cudaError_t (*cudaRuntimeGetVersion_fn)(int* runtime_version);
typedef cudaError_t (*cudaDriverGetVersion_fn)(int* driver_version);
typedef cudaError_t (*cudaGetDeviceCount_fn)(int* count);
typedef cudaError_t (*cudaGetDevice_fn)(int* device);
typedef cudaError_t (*cudaSetDevice_fn)(int device);
typedef cudaError_t (*cudaDeviceGetPCIBusId_fn)(char* pci_bus_id, int len, int device);
typedef cudaError_t (*cudaDeviceGetAttribute_fn)(int* value, cudaDeviceAttr attr, int device);

typedef cudaError_t (*cudaStreamCreateWithFlags_fn)(cudaStream_t* stream, unsigned int flags);
typedef cudaError_t (*cudaStreamCreateWithPriority_fn)(cudaStream_t* stream, unsigned int flags,
                                                       int priority);
typedef cudaError_t (*cudaDeviceGetStreamPriorityRange_fn)(int* least_priority,
                                                           int* greatest_priority);
typedef cudaError_t (*cudaStreamDestroy_fn)(cudaStream_t stream);
typedef cudaError_t (*cudaStreamSynchronize_fn)(cudaStream_t stream);
typedef cudaError_t (*cudaStreamWaitEvent_fn)(cudaStream_t stream, cudaEvent_t event,
                                              unsigned int flags);

typedef cudaError_t (*cudaEventCreateWithFlags_fn)(cudaEvent_t* event, unsigned int flags);
typedef cudaError_t (*cudaEventDestroy_fn)(cudaEvent_t event);
typedef cudaError_t (*cudaEventRecord_fn)(cudaEvent_t event, cudaStream_t stream);
typedef cudaError_t (*cudaEventQuery_fn)(cudaEvent_t event);
typedef cudaError_t (*cudaEventSynchronize_fn)(cudaEvent_t event);

typedef cudaError_t (*cudaMalloc_fn)(void** ptr, size_t size);
typedef cudaError_t (*cudaFree_fn)(void* ptr);
/* Stream-ordered allocator (CUDA 11.2+). */
typedef cudaError_t (*cudaMallocAsync_fn)(void** ptr, size_t size, cudaStream_t stream);
typedef cudaError_t (*cudaFreeAsync_fn)(void* ptr, cudaStream_t stream);
typedef cudaError_t (*cudaDeviceGetDefaultMemPool_fn)(cudaMemPool_t* pool, int device);
typedef cudaError_t (*cudaMemPoolSetAttribute_fn)(cudaMemPool_t pool, cudaMemPoolAttr attr,
                                                  void* value);
typedef cudaError_t (*cudaMemPoolGetAttribute_fn)(cudaMemPool_t pool, cudaMemPoolAttr attr,
                                                  void* value);
typedef cudaError_t (*cudaHostAlloc_fn)(void** ptr, size_t size, unsigned int flags);
typedef cudaError_t (*cudaFreeHost_fn)(void* ptr);

typedef cudaError_t (*cudaMemcpyAsync_fn)(void* dst, const void* src, size_t count,
                                          cudaMemcpyKind kind, cudaStream_t stream);
typedef cudaError_t (*cudaMemcpy2DAsync_fn)(void* dst, size_t dpitch, const void* src,
                                            size_t spitch, size_t width, size_t height,
                                            cudaMemcpyKind kind, cudaStream_t stream);
typedef cudaError_t (*cudaMemsetAsync_fn)(void* ptr, int value, size_t count,
                                          cudaStream_t stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* HVDCOMPAT_THIRD_PARTY_CUDA_RUNTIME_MIN_H_ */
