// MPI reduction ops for float16 and bfloat16 elements, which MPI has no
// arithmetic for: what lets a 16-bit tensor cross a network link at its own
// size (Note [16-bit wire]).
#pragma once

#include <mpi.h>

#include "core/common.h"

namespace hvdcompat {

// Note [16-bit wire]: the host paths reduce float16/bfloat16 in float32
// (HostReduceType), so a sum of any number of ranks is rounded once; across a
// network that doubles the bytes on the link, which is what fp16 compression
// was meant to halve. The network plan therefore sends 16-bit elements as
// MPI_UINT16_T with these ops: every combine widens both operands to float32,
// applies the op and rounds back, so each reduction step rounds once (Horovod's
// float16 sum does the same). HVDCOMPAT_NETWORK_16BIT_WIRE=0 keeps the float32
// wire and its single rounding.

// True for the dtypes these ops exist for.
bool Has16BitOp(DataType dtype);

// The commutative MPI_Op reducing `dtype` (float16 or bfloat16) elements of
// type MPI_UINT16_T with `op` (Average reduces as Sum). Created on first use
// (MPI must be initialised) and never freed, like MpiOps'.
MPI_Op Reduce16BitOp(DataType dtype, ReduceOp op);

}  // namespace hvdcompat
