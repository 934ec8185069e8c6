// Element-wise reduction of two host vectors, for the transports that reduce
// themselves (Gloo's collectives take such a function; the Gloo ring
// reduce-scatter and the hierarchical steps on Gloo call it directly).
#pragma once

#include <cstddef>

#include "core/common.h"

namespace hvdcompat {

// out[i] = a[i] (op) b[i] for n elements; `out` may be `a` or `b`. Gloo's
// reduce-function signature.
using HostReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// The function for `dtype` and `op` (Sum and Average both add: Average is
// scaled afterwards; bool reduces as uint8, as MPI_UINT8_T on the MPI path).
// For float16/bfloat16, each call widens both operands to float32 and rounds
// the result back (Note [16-bit wire], ops/mpi_16bit_ops.h): the paths that
// round once widen their buffers to HostReduceType and reduce in float32.
HostReduceFn HostReduceFor(DataType dtype, ReduceOp op);

}  // namespace hvdcompat
