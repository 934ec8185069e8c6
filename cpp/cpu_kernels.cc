#include "cpu_kernels.h"

#include <cstring>
#include <limits>

#include "half.h"

namespace hvdcompat {

namespace {

template <typename T>
void ScaleTyped(T* dst, const T* src, int64_t n, double factor) {
  if constexpr (std::is_floating_point<T>::value) {
    const T f = static_cast<T>(factor);
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * f;
  } else {
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

void ScaleCopy(void* dst, const void* src, int64_t n, DataType dtype, double factor) {
  if (factor == 1.0) {
    if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * DataTypeSize(dtype));
    return;
  }
  switch (dtype) {
    case DataType::kUInt8: ScaleTyped(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, factor); break;
    case DataType::kInt8: ScaleTyped(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n, factor); break;
    case DataType::kInt16: ScaleTyped(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), n, factor); break;
    case DataType::kInt32: ScaleTyped(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, factor); break;
    case DataType::kInt64: ScaleTyped(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, factor); break;
    case DataType::kFloat32: ScaleTyped(static_cast<float*>(dst), static_cast<const float*>(src), n, factor); break;
    case DataType::kFloat64: ScaleTyped(static_cast<double*>(dst), static_cast<const double*>(src), n, factor); break;
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

void ConvertScale(void* dst, DataType dst_type, const void* src, DataType src_type, int64_t n,
                  double factor) {
  if (dst_type == src_type) return ScaleCopy(dst, src, n, dst_type, factor);
  const float f = static_cast<float>(factor);
  if (dst_type == DataType::kFloat32) {
    float* d = static_cast<float*>(dst);
    const uint16_t* s = static_cast<const uint16_t*>(src);
    if (src_type == DataType::kBFloat16) {
      for (int64_t i = 0; i < n; ++i) d[i] = BFloat16ToFloat(s[i]) * f;
    } else {
      HVD_ENFORCE(src_type == DataType::kFloat16, "unsupported conversion");
      for (int64_t i = 0; i < n; ++i) d[i] = HalfToFloat(s[i]) * f;
    }
    return;
  }
  HVD_ENFORCE(src_type == DataType::kFloat32, "unsupported conversion");
  uint16_t* d = static_cast<uint16_t*>(dst);
  const float* s = static_cast<const float*>(src);
  if (dst_type == DataType::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) d[i] = FloatToBFloat16(s[i] * f);
  } else {
    HVD_ENFORCE(dst_type == DataType::kFloat16, "unsupported conversion");
    for (int64_t i = 0; i < n; ++i) d[i] = FloatToHalf(s[i] * f);
  }
}

}  // namespace hvdcompat
