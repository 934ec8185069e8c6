#include "ops/cpu_kernels.h"

#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <limits>

#include "core/half.h"

namespace hvdcompat {

namespace {

// float32 scaled in double and rounded once: a float32 Average over 3 ranks
// then equals torch's sum / 3 (a float32 1/3 mismatches 20-50% of elements).
// AVX2 keeps it within ~10% of the float32 multiply.
__attribute__((target_clones("avx2", "default")))
void ScaleFloat32InDouble(float* dst, const float* src, int64_t n, double factor) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(static_cast<double>(src[i]) * factor);
}

template <typename T>
void ScaleTyped(T* dst, const T* src, int64_t n, double factor, bool in_double) {
  if constexpr (std::is_same<T, float>::value) {
    if (in_double) return ScaleFloat32InDouble(dst, src, n, factor);
  }
  if constexpr (std::is_floating_point<T>::value) {
    const T f = static_cast<T>(factor);
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * f;
  } else {
    if (in_double && factor > 0.0 && factor <= 1.0) {
      // Integer Average (factor 1/size): the sum divided by size exactly,
      // truncating toward zero, the rule of NCCL's ncclAvg. A double
      // reciprocal is off by one at some sizes (49 * (1.0 / 49) < 1).
      const double k = std::nearbyint(1.0 / factor);
      if (k >= 1.0 && k < 9.0e18 && 1.0 / k == factor) {
        const int64_t divisor = static_cast<int64_t>(k);
        for (int64_t i = 0; i < n; ++i) {
          dst[i] = static_cast<T>(static_cast<int64_t>(src[i]) / divisor);
        }
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<double>(src[i]) * factor);
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Scale16(uint16_t* dst, const uint16_t* src, int64_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (int64_t i = 0; i < n; ++i) dst[i] = FromF(ToF(src[i]) * f);
}

template <typename T>
void Fill(void* dst, int64_t n, T v) {
  T* p = static_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) p[i] = v;
}

template <typename T>
void FillTyped(void* dst, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: Fill<T>(dst, n, std::numeric_limits<T>::has_infinity
                                             ? std::numeric_limits<T>::infinity()
                                             : std::numeric_limits<T>::max()); break;
    case ReduceOp::kMax: Fill<T>(dst, n, std::numeric_limits<T>::has_infinity
                                             ? -std::numeric_limits<T>::infinity()
                                             : std::numeric_limits<T>::lowest()); break;
    case ReduceOp::kProduct: Fill<T>(dst, n, T(1)); break;
    default: std::memset(dst, 0, static_cast<size_t>(n) * sizeof(T)); break;
  }
}

}  // namespace

void ScaleCopy(void* dst, const void* src, int64_t n, DataType dtype, double factor,
               bool in_double) {
  if (factor == 1.0) {
    if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * DataTypeSize(dtype));
    return;
  }
  switch (dtype) {
    case DataType::kUInt8: ScaleTyped(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, factor, in_double); break;
    case DataType::kInt8: ScaleTyped(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n, factor, in_double); break;
    case DataType::kInt16: ScaleTyped(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), n, factor, in_double); break;
    case DataType::kInt32: ScaleTyped(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, factor, in_double); break;
    case DataType::kInt64: ScaleTyped(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, factor, in_double); break;
    case DataType::kFloat32: ScaleTyped(static_cast<float*>(dst), static_cast<const float*>(src), n, factor, in_double); break;
    case DataType::kFloat64: ScaleTyped(static_cast<double*>(dst), static_cast<const double*>(src), n, factor, in_double); break;
    case DataType::kFloat16:
      Scale16<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, factor);
      break;
    case DataType::kBFloat16:
      Scale16<BFloat16ToFloat, FloatToBFloat16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, factor);
      break;
    case DataType::kBool:
      // Scaling a bool is meaningless; the Python layer rejects it. Copy.
      if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n));
      break;
  }
}

void FillIdentity(void* dst, int64_t n, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8: FillTyped<uint8_t>(dst, n, op); break;
    case DataType::kBool:
      Fill<uint8_t>(dst, n, op == ReduceOp::kMin || op == ReduceOp::kProduct ? 1 : 0);
      break;
    case DataType::kInt8: FillTyped<int8_t>(dst, n, op); break;
    case DataType::kInt16: FillTyped<int16_t>(dst, n, op); break;
    case DataType::kInt32: FillTyped<int32_t>(dst, n, op); break;
    case DataType::kInt64: FillTyped<int64_t>(dst, n, op); break;
    case DataType::kFloat32: FillTyped<float>(dst, n, op); break;
    case DataType::kFloat64: FillTyped<double>(dst, n, op); break;
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      bool bf = dtype == DataType::kBFloat16;
      float v = op == ReduceOp::kMin ? std::numeric_limits<float>::infinity()
              : op == ReduceOp::kMax ? -std::numeric_limits<float>::infinity()
              : op == ReduceOp::kProduct ? 1.0f : 0.0f;
      Fill<uint16_t>(dst, n, bf ? FloatToBFloat16(v) : FloatToHalf(v));
      break;
    }
  }
}

DataType HostReduceType(DataType dtype) {
  return (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) ? DataType::kFloat32 : dtype;
}

namespace {

// Note [16-bit conversions]: widening/narrowing runs on every element of a
// float16/bfloat16 reduction, so it must stream at memory speed. bfloat16 is
// plain bit shifting, written branch-free so the compiler vectorises it;
// float16 uses the F16C instructions when the CPU has them (nearly every
// x86-64 since 2012), with the scalar conversion as fallback.

__attribute__((target_clones("avx2", "default")))
void WidenBf16(float* d, const uint16_t* s, int64_t n, float f) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(s[i]) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    d[i] = v * f;
  }
}

__attribute__((target_clones("avx2", "default")))
void NarrowBf16(uint16_t* d, const float* s, int64_t n, float f) {
  for (int64_t i = 0; i < n; ++i) {
    float v = s[i] * f;
    uint32_t x;
    std::memcpy(&x, &v, 4);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // nearest even
    uint32_t quiet_nan = (x >> 16) | 0x40u;
    d[i] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

#if defined(__x86_64__)
bool HasF16c() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}

__attribute__((target("avx,f16c")))
void WidenF16c(float* d, const uint16_t* s, int64_t n, float f) {
  const __m256 scale = _mm256_set1_ps(f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm256_storeu_ps(d + i, _mm256_mul_ps(_mm256_cvtph_ps(h), scale));
  }
  for (; i < n; ++i) d[i] = HalfToFloat(s[i]) * f;
}

__attribute__((target("avx,f16c")))
void NarrowF16c(uint16_t* d, const float* s, int64_t n, float f) {
  const __m256 scale = _mm256_set1_ps(f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + i), scale);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) d[i] = FloatToHalf(s[i] * f);
}
#else
bool HasF16c() { return false; }
void WidenF16c(float*, const uint16_t*, int64_t, float) {}
void NarrowF16c(uint16_t*, const float*, int64_t, float) {}
#endif

}  // namespace

void ConvertScale(void* dst, DataType dst_type, const void* src, DataType src_type, int64_t n,
                  double factor, bool in_double) {
  if (dst_type == src_type) return ScaleCopy(dst, src, n, dst_type, factor, in_double);
  const float f = static_cast<float>(factor);
  if (dst_type == DataType::kFloat32) {
    float* d = static_cast<float*>(dst);
    const uint16_t* s = static_cast<const uint16_t*>(src);
    if (src_type == DataType::kBFloat16) return WidenBf16(d, s, n, f);
    HVD_ENFORCE(src_type == DataType::kFloat16, "unsupported conversion");
    if (HasF16c()) return WidenF16c(d, s, n, f);
    for (int64_t i = 0; i < n; ++i) d[i] = HalfToFloat(s[i]) * f;
    return;
  }
  HVD_ENFORCE(src_type == DataType::kFloat32, "unsupported conversion");
  uint16_t* d = static_cast<uint16_t*>(dst);
  const float* s = static_cast<const float*>(src);
  if (dst_type == DataType::kBFloat16) return NarrowBf16(d, s, n, f);
  HVD_ENFORCE(dst_type == DataType::kFloat16, "unsupported conversion");
  if (HasF16c()) return NarrowF16c(d, s, n, f);
  for (int64_t i = 0; i < n; ++i) d[i] = FloatToHalf(s[i] * f);
}

}  // namespace hvdcompat
