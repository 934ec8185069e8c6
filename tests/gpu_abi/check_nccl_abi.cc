// Compiled (never run) by tests/unit/test_gpu_abi.py against NCCL's nccl.h
// (e.g. from the nvidia-nccl-cu12 wheel), when one is available.
#include <cuda_runtime_api.h>
#include <nccl.h>

#define HVDCOMPAT_ABI_CHECK 1
namespace ours {
#include "cuda/cuda_runtime_min.h"
#include "nccl/nccl_min.h"
}
#include "abi_check.h"

// ncclUniqueId is passed by value: our struct must be the vendor's, byte for byte.
template <>
struct Canon<ours::ncclUniqueId, void> {
  using type = ::ncclUniqueId;
};
static_assert(sizeof(ours::ncclUniqueId) == sizeof(::ncclUniqueId), "ncclUniqueId size");
static_assert(alignof(ours::ncclUniqueId) == alignof(::ncclUniqueId), "ncclUniqueId alignment");
static_assert(HVD_NCCL_UNIQUE_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "NCCL_UNIQUE_ID_BYTES");
static_assert(std::is_same<ours::ncclComm_t, ::ncclComm_t>::value, "ncclComm_t");
static_assert(sizeof(ours::ncclResult_t) == sizeof(::ncclResult_t), "ncclResult_t size");
static_assert(sizeof(ours::ncclRedOp_t) == sizeof(::ncclRedOp_t), "ncclRedOp_t size");
static_assert(sizeof(ours::ncclDataType_t) == sizeof(::ncclDataType_t), "ncclDataType_t size");

HVD_SAME_VALUE(ours::ncclSuccess, ::ncclSuccess);
HVD_SAME_VALUE(ours::ncclUnhandledCudaError, ::ncclUnhandledCudaError);
HVD_SAME_VALUE(ours::ncclSystemError, ::ncclSystemError);
HVD_SAME_VALUE(ours::ncclInternalError, ::ncclInternalError);
HVD_SAME_VALUE(ours::ncclInvalidArgument, ::ncclInvalidArgument);
HVD_SAME_VALUE(ours::ncclInvalidUsage, ::ncclInvalidUsage);
HVD_SAME_VALUE(ours::ncclRemoteError, ::ncclRemoteError);
HVD_SAME_VALUE(ours::ncclInProgress, ::ncclInProgress);
HVD_SAME_VALUE(ours::ncclInt8, ::ncclInt8);
HVD_SAME_VALUE(ours::ncclUint8, ::ncclUint8);
HVD_SAME_VALUE(ours::ncclInt32, ::ncclInt32);
HVD_SAME_VALUE(ours::ncclUint32, ::ncclUint32);
HVD_SAME_VALUE(ours::ncclInt64, ::ncclInt64);
HVD_SAME_VALUE(ours::ncclUint64, ::ncclUint64);
HVD_SAME_VALUE(ours::ncclFloat16, ::ncclFloat16);
HVD_SAME_VALUE(ours::ncclFloat32, ::ncclFloat32);
HVD_SAME_VALUE(ours::ncclFloat64, ::ncclFloat64);
HVD_SAME_VALUE(ours::ncclBfloat16, ::ncclBfloat16);
HVD_SAME_VALUE(ours::ncclSum, ::ncclSum);
HVD_SAME_VALUE(ours::ncclProd, ::ncclProd);
HVD_SAME_VALUE(ours::ncclMax, ::ncclMax);
HVD_SAME_VALUE(ours::ncclMin, ::ncclMin);
HVD_SAME_VALUE(ours::ncclAvg, ::ncclAvg);
HVD_SAME_VALUE(ours::ncclNumOps, ::ncclNumOps);
HVD_SAME_VALUE(ours::ncclScalarDevice, ::ncclScalarDevice);
HVD_SAME_VALUE(ours::ncclScalarHostImmediate, ::ncclScalarHostImmediate);

HVD_SAME_SIG(ours::ncclGetVersion_fn, ncclGetVersion);
HVD_SAME_SIG(ours::ncclGetErrorString_fn, ncclGetErrorString);
HVD_SAME_SIG(ours::ncclGetLastError_fn, ncclGetLastError);
HVD_SAME_SIG(ours::ncclGetUniqueId_fn, ncclGetUniqueId);
HVD_SAME_SIG(ours::ncclCommInitRank_fn, ncclCommInitRank);
HVD_SAME_SIG(ours::ncclCommDestroy_fn, ncclCommDestroy);
HVD_SAME_SIG(ours::ncclCommAbort_fn, ncclCommAbort);
HVD_SAME_SIG(ours::ncclCommGetAsyncError_fn, ncclCommGetAsyncError);
HVD_SAME_SIG(ours::ncclAllReduce_fn, ncclAllReduce);
HVD_SAME_SIG(ours::ncclBroadcast_fn, ncclBroadcast);
HVD_SAME_SIG(ours::ncclAllGather_fn, ncclAllGather);
HVD_SAME_SIG(ours::ncclReduceScatter_fn, ncclReduceScatter);
HVD_SAME_SIG(ours::ncclSend_fn, ncclSend);
HVD_SAME_SIG(ours::ncclRecv_fn, ncclRecv);
HVD_SAME_SIG(ours::ncclGroupStart_fn, ncclGroupStart);
HVD_SAME_SIG(ours::ncclGroupEnd_fn, ncclGroupEnd);
HVD_SAME_SIG(ours::ncclRedOpCreatePreMulSum_fn, ncclRedOpCreatePreMulSum);
HVD_SAME_SIG(ours::ncclRedOpDestroy_fn, ncclRedOpDestroy);
