// Element-wise host kernels used around collectives: scaled copies (pre/post
// scale fused with pack/unpack), float16/bfloat16 <-> float32 conversions
// (16-bit floats are reduced in float32 on the host), identity fills for
// joined ranks.
#pragma once

#include <cstdint>

#include "core/common.h"

namespace hvdcompat {

// dst[i] = src[i] * factor, computed in float for 16-bit floats, in double and
// truncated toward zero for integers, in the tensor's own type for float32 and
// float64 (Horovod's rounding of pre/postscale factors) unless `in_double`:
// then float32 is scaled in double and rounded once (Average's 1/size, so a
// float32 average equals torch's sum / size); for integers with `in_double` and
// factor == 1/k (Average's 1/size), the exact quotient v / k truncated toward
// zero, as NCCL's ncclAvg computes it, so CPU and GPU averages agree.
// dst may equal src. factor == 1 copies.
void ScaleCopy(void* dst, const void* src, int64_t count, DataType dtype, double factor,
               bool in_double = false);

// Fills with the identity of `op` (0 for Sum/Average, 1 for Product, the
// largest value for Min, the lowest for Max): what a joined rank contributes.
void FillIdentity(void* dst, int64_t count, DataType dtype, ReduceOp op);

// The type collectives reduce `dtype` in on the host: float32 for float16
// and bfloat16 (one rounding at the end, no overflow of partial sums),
// otherwise `dtype` itself.
DataType HostReduceType(DataType dtype);

// dst[i] = src[i] * factor with a conversion between float16/bfloat16 and
// float32 when the types differ (otherwise ScaleCopy, with `in_double`).
void ConvertScale(void* dst, DataType dst_type, const void* src, DataType src_type,
                  int64_t count, double factor, bool in_double = false);

}  // namespace hvdcompat
