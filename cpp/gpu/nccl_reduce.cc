#include "gpu/nccl_reduce.h"

#include "gpu/gpu_check.h"
#include "gpu/gpu_library.h"
#include "core/half.h"

namespace hvdcompat {

bool NcclReduceType(DataType dtype, int nccl_version, ncclDataType_t* out) {
  switch (dtype) {
    case DataType::kUInt8: *out = ncclUint8; return true;
    case DataType::kBool: *out = ncclUint8; return true;  // Min/Max only: and/or
    case DataType::kInt8: *out = ncclInt8; return true;
    case DataType::kInt16: return false;
    case DataType::kInt32: *out = ncclInt32; return true;
    case DataType::kInt64: *out = ncclInt64; return true;
    case DataType::kFloat16: *out = ncclFloat16; return true;
    case DataType::kBFloat16:
      *out = ncclBfloat16;
      return nccl_version >= kNcclVersionAvgBf16;
    case DataType::kFloat32: *out = ncclFloat32; return true;
    case DataType::kFloat64: *out = ncclFloat64; return true;
  }
  return false;
}

NcclReducePlan PlanNcclReduction(const Response& r, int size, int version, bool has_premul,
                                 bool hierarchical) {
  NcclReducePlan p;
  ncclDataType_t type;
  if (!NcclReduceType(r.dtype, version, &type)) return p;
  const bool unscaled = r.prescale == 1.0 && r.postscale == 1.0;
  switch (r.reduce_op) {
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kProduct:
      if (!unscaled) return p;
      p.op = r.reduce_op == ReduceOp::kMin   ? ncclMin
             : r.reduce_op == ReduceOp::kMax ? ncclMax
                                             : ncclProd;
      p.supported = true;
      return p;
    case ReduceOp::kSum:
    case ReduceOp::kAverage: {
      const bool average = r.reduce_op == ReduceOp::kAverage;
      // Linear: every factor can be applied once, before the sum.
      const double factor = r.prescale * r.postscale / (average ? size : 1);
      if (factor == 1.0) {
        p.op = ncclSum;
        p.supported = true;
      } else if (average && unscaled && version >= kNcclVersionAvgBf16 && !hierarchical) {
        p.op = ncclAvg;
        p.supported = true;
      } else if (IsFloatingPoint(r.dtype) && has_premul) {
        p.premul = true;
        p.scalar = factor;
        p.supported = true;
      }
      return p;
    }
    case ReduceOp::kAdasum:
      return p;
  }
  return p;
}

ScopedRedOp::ScopedRedOp(const NcclReducePlan& plan, DataType dtype, ncclComm_t comm)
    : comm_(comm), op_(plan.op) {
  if (!plan.premul) return;
  const NcclApi& nccl = Nccl();
  HVD_ENFORCE(nccl.RedOpCreatePreMulSum && nccl.RedOpDestroy, "PreMulSum planned without it");
  ncclDataType_t type;
  HVD_ENFORCE(NcclReduceType(dtype, nccl.version, &type), "PreMulSum on an unsupported dtype");
  // The scalar has the tensor's type and is read before the call returns.
  union {
    uint16_t u16;
    float f32;
    double f64;
  } scalar{};
  switch (dtype) {
    case DataType::kFloat16: scalar.u16 = FloatToHalf(static_cast<float>(plan.scalar)); break;
    case DataType::kBFloat16: scalar.u16 = FloatToBFloat16(static_cast<float>(plan.scalar)); break;
    case DataType::kFloat32: scalar.f32 = static_cast<float>(plan.scalar); break;
    case DataType::kFloat64: scalar.f64 = plan.scalar; break;
    default: HVD_ENFORCE(false, "PreMulSum planned for " << DataTypeName(dtype));
  }
  HVD_NCCL_CHECK(comm, nccl.RedOpCreatePreMulSum(&op_, &scalar, type, ncclScalarHostImmediate,
                                                 comm));
  created_ = true;
}

ScopedRedOp::~ScopedRedOp() {
  if (created_) Nccl().RedOpDestroy(op_, comm_);
}

}  // namespace hvdcompat
