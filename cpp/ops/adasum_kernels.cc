#include "ops/adasum_kernels.h"

namespace hvdcompat {

namespace {

// Four independent accumulators per sum: the loop then vectorises without
// reassociating a single running sum (which the compiler may not do).
template <typename T>
__attribute__((target_clones("avx2", "default")))
AdasumDots Dots(const T* __restrict__ a, const T* __restrict__ b, int64_t n) {
  double dot[4] = {0, 0, 0, 0}, aa[4] = {0, 0, 0, 0}, bb[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) {
      const double x = static_cast<double>(a[i + k]);
      const double y = static_cast<double>(b[i + k]);
      dot[k] += x * y;
      aa[k] += x * x;
      bb[k] += y * y;
    }
  }
  for (; i < n; ++i) {
    const double x = static_cast<double>(a[i]);
    const double y = static_cast<double>(b[i]);
    dot[0] += x * y;
    aa[0] += x * x;
    bb[0] += y * y;
  }
  AdasumDots d;
  d.dot = (dot[0] + dot[1]) + (dot[2] + dot[3]);
  d.a_sq = (aa[0] + aa[1]) + (aa[2] + aa[3]);
  d.b_sq = (bb[0] + bb[1]) + (bb[2] + bb[3]);
  return d;
}

// No __restrict__: `out` aliases one of the inputs.
template <typename T>
__attribute__((target_clones("avx2", "default")))
void ScaledAdd(T* out, const T* a, double ca, const T* b, double cb, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<T>(ca * static_cast<double>(a[i]) + cb * static_cast<double>(b[i]));
  }
}

}  // namespace

AdasumDots AdasumPartialDots(const void* a, const void* b, int64_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return Dots(static_cast<const float*>(a), static_cast<const float*>(b), count);
    case DataType::kFloat64:
      return Dots(static_cast<const double*>(a), static_cast<const double*>(b), count);
    default: HVD_ENFORCE(false, "Adasum kernel on " << DataTypeName(dtype));
  }
  return {};
}

void AdasumCoefficients(const AdasumDots& d, int wa, int wb, double* ca, double* cb) {
  // Exact for equal weights (0.5), so powers of two keep their bits.
  const double share_a = static_cast<double>(wa) / (wa + wb);
  const double share_b = static_cast<double>(wb) / (wa + wb);
  *ca = d.a_sq >= kAdasumMinNormSq ? 1.0 - d.dot / d.a_sq * share_a : 1.0;
  *cb = d.b_sq >= kAdasumMinNormSq ? 1.0 - d.dot / d.b_sq * share_b : 1.0;
}

void AdasumScaledAdd(void* out, const void* a, double ca, const void* b, double cb, int64_t count,
                     DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return ScaledAdd(static_cast<float*>(out), static_cast<const float*>(a), ca,
                       static_cast<const float*>(b), cb, count);
    case DataType::kFloat64:
      return ScaledAdd(static_cast<double*>(out), static_cast<const double*>(a), ca,
                       static_cast<const double*>(b), cb, count);
    default: HVD_ENFORCE(false, "Adasum kernel on " << DataTypeName(dtype));
  }
}

}  // namespace hvdcompat
