// How a reduction is expressed in NCCL: the datatype, and a built-in
// operator or a PreMulSum that folds every scale factor into one launch.
// See Note [NCCL lanes] (cpp/ops/nccl_ops.h) for what falls back to the host.
#pragma once

#include "core/common.h"
#include "core/message.h"
#include "nccl/nccl_min.h"

namespace hvdcompat {

constexpr int kNcclVersionAvgBf16 = 21003;  // 2.10.3: ncclAvg, ncclBfloat16
constexpr int kNcclVersionPreMulSum = 21100;  // 2.11.0

struct NcclReducePlan {
  bool supported = false;
  bool premul = false;       // PreMulSum with `scalar`
  double scalar = 1.0;
  ncclRedOp_t op = ncclSum;  // the built-in operator when !premul
};

// The NCCL type of `dtype` for reductions; false when NCCL has none.
bool NcclReduceType(DataType dtype, int nccl_version, ncclDataType_t* out);

// Pure: decides from the response, the set size and NCCL's capabilities.
// `hierarchical`: the first step runs on a node's communicator, so ncclAvg
// (which divides by that communicator's size) is not an option there.
NcclReducePlan PlanNcclReduction(const Response& r, int size, int nccl_version, bool has_premul,
                                 bool hierarchical);

// The operator for launches on one communicator: built in, or a PreMulSum
// created for them and destroyed afterwards (NCCL allows destroying it as
// soon as the launching call has returned). Throws LibraryError.
class ScopedRedOp {
 public:
  ScopedRedOp(const NcclReducePlan& plan, DataType dtype, ncclComm_t comm);
  ~ScopedRedOp();
  ScopedRedOp(const ScopedRedOp&) = delete;
  ScopedRedOp& operator=(const ScopedRedOp&) = delete;
  ncclRedOp_t get() const { return op_; }

 private:
  ncclComm_t comm_;
  ncclRedOp_t op_;
  bool created_ = false;
};

}  // namespace hvdcompat
