/*
 * The slice of NCCL's C API that hvdcompat's core calls, declared here from
 * the published NCCL user guide so that the core builds without NCCL:
 * the communicator and unique-id types, result/datatype/reduction enums and
 * one function-pointer type per entry point. The core resolves the symbols
 * with dlsym at run time (cpp/gpu/gpu_library.cc); entry points newer than
 * NCCL 2.7 are optional and checked for before use.
 *
 * Version codes (ncclGetVersion): major*10000 + minor*100 + patch from 2.9
 * on (2.18.5 -> 21805); major*1000 + minor*100 + patch before that.
 * Availability: ncclSend/ncclRecv 2.7; ncclAvg and ncclBfloat16 2.10.3;
 * ncclRedOpCreatePreMulSum/ncclRedOpDestroy 2.11; ncclGetLastError 2.13.
 */
#ifndef HVDCOMPAT_THIRD_PARTY_NCCL_MIN_H_
#define HVDCOMPAT_THIRD_PARTY_NCCL_MIN_H_

#if defined(NCCL_H_) && !defined(HVDCOMPAT_ABI_CHECK)
#error "nccl_min.h must not be mixed with NCCL's own nccl.h"
#endif

#include <stddef.h>

#include "cuda/cuda_runtime_min.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm* ncclComm_t;

/* Passed by value to ncclCommInitRank: the layout must be exactly this. */
#define HVD_NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[HVD_NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclResultHvdRangeEnd = 0x7fffffff, /* widens the range: later codes may appear */
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;

/* Built-in operators; values at or above ncclNumOps are operators created by
 * ncclRedOpCreatePreMulSum. Declared with a large enumerator so the enum is
 * int-sized like NCCL's own. */
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff,
} ncclRedOp_t;

typedef enum {
  ncclScalarDevice = 0,
  ncclScalarHostImmediate = 1,
} ncclScalarResidence_t;

typedef ncclResult_t (*ncclGetVersion_fn)(int* version);
typedef const char* (*ncclGetErrorString_fn)(ncclResult_t result);
typedef const char* (*ncclGetLastError_fn)(ncclComm_t comm);
typedef ncclResult_t (*ncclGetUniqueId_fn)(ncclUniqueId* unique_id);
typedef ncclResult_t (*ncclCommInitRank_fn)(ncclComm_t* comm, int nranks, ncclUniqueId comm_id,
                                            int rank);
typedef ncclResult_t (*ncclCommDestroy_fn)(ncclComm_t comm);
typedef ncclResult_t (*ncclCommAbort_fn)(ncclComm_t comm);
typedef ncclResult_t (*ncclCommGetAsyncError_fn)(ncclComm_t comm, ncclResult_t* async_error);

typedef ncclResult_t (*ncclAllReduce_fn)(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op,
                                         ncclComm_t comm, cudaStream_t stream);
typedef ncclResult_t (*ncclBroadcast_fn)(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, int root, ncclComm_t comm,
                                         cudaStream_t stream);
typedef ncclResult_t (*ncclAllGather_fn)(const void* sendbuff, void* recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm,
                                         cudaStream_t stream);
typedef ncclResult_t (*ncclReduceScatter_fn)(const void* sendbuff, void* recvbuff,
                                             size_t recvcount, ncclDataType_t datatype,
                                             ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream);
typedef ncclResult_t (*ncclSend_fn)(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                    int peer, ncclComm_t comm, cudaStream_t stream);
typedef ncclResult_t (*ncclRecv_fn)(void* recvbuff, size_t count, ncclDataType_t datatype,
                                    int peer, ncclComm_t comm, cudaStream_t stream);
typedef ncclResult_t (*ncclGroupStart_fn)(void);
typedef ncclResult_t (*ncclGroupEnd_fn)(void);
typedef ncclResult_t (*ncclRedOpCreatePreMulSum_fn)(ncclRedOp_t* op, void* scalar,
                                                    ncclDataType_t datatype,
                                                    ncclScalarResidence_t residence,
                                                    ncclComm_t comm);
typedef ncclResult_t (*ncclRedOpDestroy_fn)(ncclRedOp_t op, ncclComm_t comm);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* HVDCOMPAT_THIRD_PARTY_NCCL_MIN_H_ */
