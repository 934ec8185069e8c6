#include "ops/host_reduce.h"

#include <algorithm>
#include <cstdint>

#include "ops/cpu_kernels.h"

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

// 16-bit floats (Note [16-bit wire], ops/mpi_16bit_ops.h): both operands
// widened to float32 a block at a time, combined, rounded back once.
template <DataType D, ReduceOp O>
void Combine16(void* c, const void* a, const void* b, size_t n) {
  constexpr size_t kBlock = 1024;  // 8 KiB of float32 on the stack
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  auto* out = static_cast<uint16_t*>(c);
  float wa[kBlock];
  float wb[kBlock];
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t k = std::min(kBlock, n - at);
    ConvertScale(wa, DataType::kFloat32, x + at, D, static_cast<int64_t>(k), 1.0);
    ConvertScale(wb, DataType::kFloat32, y + at, D, static_cast<int64_t>(k), 1.0);
    Combine<float, O>(wa, wa, wb, k);
    ConvertScale(out + at, D, wa, DataType::kFloat32, static_cast<int64_t>(k), 1.0);
  }
}

template <DataType D>
HostReduceFn For16(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return &Combine16<D, ReduceOp::kMin>;
    case ReduceOp::kMax: return &Combine16<D, ReduceOp::kMax>;
    case ReduceOp::kProduct: return &Combine16<D, ReduceOp::kProduct>;
    default: return &Combine16<D, ReduceOp::kSum>;
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
    case DataType::kFloat16: return For16<DataType::kFloat16>(op);
    case DataType::kBFloat16: return For16<DataType::kBFloat16>(op);
    default: throw InternalError("no host reduction for this dtype");
  }
}

}  // namespace hvdcompat
