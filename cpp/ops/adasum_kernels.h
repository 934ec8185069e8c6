// The element-wise half of Adasum: dot products, squared norms and the
// scaled sum of two vectors. Host memory, float32 or float64 (float16 and
// bfloat16 are widened to float32 before they get here). The communication
// half is in ops/adasum.h; Note [Adasum] there says how they fit.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "core/common.h"

namespace hvdcompat {

// a.b, |a|^2 and |b|^2 of (part of) one tensor. Sums of parts are the
// quantities of the whole tensor, which is how ranks that each hold a slice
// combine them.
struct AdasumDots {
  double dot = 0.0;
  double a_sq = 0.0;
  double b_sq = 0.0;
};

// Below this squared norm a vector counts as zero and keeps coefficient 1
// (no division by a vanishing norm). sqrt(DBL_MIN) is still far below any
// norm a float16 or float32 vector can have without being all zero.
inline const double kAdasumMinNormSq = std::sqrt(DBL_MIN);

// Products and sums in double, whatever `dtype` (float32 or float64).
AdasumDots AdasumPartialDots(const void* a, const void* b, int64_t count, DataType dtype);

// The coefficients of a and b for the whole tensor's dots, where a stands
// for `wa` ranks and b for `wb` (Note [Adasum weights], ops/adasum.h):
// ca = 1 - wa/(wa+wb) * a.b / |a|^2, cb = 1 - wb/(wa+wb) * a.b / |b|^2
// (1 for a zero vector). With wa == wb, Horovod's 1 - a.b / (2 |a|^2), to the bit.
void AdasumCoefficients(const AdasumDots& d, int wa, int wb, double* ca, double* cb);

// out[i] = ca * a[i] + cb * b[i], computed in double and rounded once to
// `dtype`. `out` may be `a` or `b`.
void AdasumScaledAdd(void* out, const void* a, double ca, const void* b, double cb, int64_t count,
                     DataType dtype);

}  // namespace hvdcompat
