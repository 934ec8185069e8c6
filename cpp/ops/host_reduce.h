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
// 16-bit floats have none: they are widened to float32 first (InternalError).
HostReduceFn HostReduceFor(DataType dtype, ReduceOp op);

}  // namespace hvdcompat
