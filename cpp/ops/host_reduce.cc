#include "ops/host_reduce.h"

#include <cstdint>

namespace hvdcompat {

namespace {

template <typename T, ReduceOp O>
void Combine(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (O == ReduceOp::kMin) {
      out[i] = y[i] < x[i] ? y[i] : x[i];
    } else if constexpr (O == ReduceOp::kMax) {
      out[i] = y[i] > x[i] ? y[i] : x[i];
    } else if constexpr (O == ReduceOp::kProduct) {
      out[i] = static_cast<T>(x[i] * y[i]);
    } else {
      out[i] = static_cast<T>(x[i] + y[i]);
    }
  }
}

template <typename T>
HostReduceFn ForOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return &Combine<T, ReduceOp::kMin>;
    case ReduceOp::kMax: return &Combine<T, ReduceOp::kMax>;
    case ReduceOp::kProduct: return &Combine<T, ReduceOp::kProduct>;
    default: return &Combine<T, ReduceOp::kSum>;  // Sum and Average (scaled after)
  }
}

}  // namespace

HostReduceFn HostReduceFor(DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kBool: return ForOp<uint8_t>(op);  // as MPI_UINT8_T on the MPI path
    case DataType::kInt8: return ForOp<int8_t>(op);
    case DataType::kInt16: return ForOp<int16_t>(op);
    case DataType::kInt32: return ForOp<int32_t>(op);
    case DataType::kInt64: return ForOp<int64_t>(op);
    case DataType::kFloat32: return ForOp<float>(op);
    case DataType::kFloat64: return ForOp<double>(op);
    default: throw InternalError("host reduction of a 16-bit float (widen it first)");
  }
}

}  // namespace hvdcompat
