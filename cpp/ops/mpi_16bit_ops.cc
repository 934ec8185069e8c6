#include "ops/mpi_16bit_ops.h"

#include <array>

#include "ops/host_reduce.h"
#include "transport/mpi_util.h"

namespace hvdcompat {

namespace {

// MPI's user-function shape around the host reduction (ops/host_reduce.h):
// inout = inout (op) in, widened and rounded once per element.
template <DataType D, ReduceOp O>
void Combine(void* in, void* inout, int* len, MPI_Datatype*) {
  static const HostReduceFn reduce = HostReduceFor(D, O);
  reduce(inout, inout, in, static_cast<size_t>(*len));
}

// The ops' order in each dtype's four: Sum (also Average's), Min, Max, Product.
int OpIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return 1;
    case ReduceOp::kMax: return 2;
    case ReduceOp::kProduct: return 3;
    default: return 0;
  }
}

template <DataType D>
void CreateFor(MPI_Op* out) {
  MPI_User_function* fns[4] = {&Combine<D, ReduceOp::kSum>, &Combine<D, ReduceOp::kMin>,
                               &Combine<D, ReduceOp::kMax>, &Combine<D, ReduceOp::kProduct>};
  for (int i = 0; i < 4; ++i) HVD_MPI_CHECK(MPI_COMM_NULL, MPI_Op_create(fns[i], 1, &out[i]));
}

}  // namespace

bool Has16BitOp(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

MPI_Op Reduce16BitOp(DataType dtype, ReduceOp op) {
  // [0..3]: float16, [4..7]: bfloat16; function-local static: created once,
  // by whichever worker needs them first.
  static const std::array<MPI_Op, 8> ops = [] {
    std::array<MPI_Op, 8> o{};
    CreateFor<DataType::kFloat16>(o.data());
    CreateFor<DataType::kBFloat16>(o.data() + 4);
    return o;
  }();
  if (!Has16BitOp(dtype)) throw InternalError("no 16-bit MPI op for this dtype");
  return ops[static_cast<size_t>((dtype == DataType::kBFloat16 ? 4 : 0) + OpIndex(op))];
}

}  // namespace hvdcompat
