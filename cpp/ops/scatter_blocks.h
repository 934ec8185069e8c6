// The host side of a (possibly fused) reducescatter, shared by the host
// backends (MPI, Gloo): which tensors a response carries, their rank-major
// layout (collective_layout.h), and the copies into and out of that layout.
#pragma once

#include <cstdint>
#include <vector>

#include "core/common.h"
#include "ops/backend.h"
#include "ops/collective_layout.h"

namespace hvdcompat {

struct ScatterTensors {
  std::vector<const BufferDesc*> inputs;
  std::vector<const BufferDesc*> outputs;
  ScatterLayout layout;  // rank-major: the block each rank keeps is contiguous
};

// The inputs and outputs of every unit, in order, and their layout over `size` ranks.
ScatterTensors CollectReducescatter(std::vector<ExecUnit>& units, int size);

// Where rank `rank`'s block starts in the rank-major buffer (elements).
int64_t BlockStart(const ScatterLayout& s, int rank);

// Writes every rank's block of every input into `dst`, rank-major, as `wire`
// elements scaled by `pre`.
void PackRankMajor(char* dst, DataType wire, const ScatterTensors& s, DataType dtype, double pre);

// Copies rank `rank`'s block, read from `src` (`wire` elements), into the
// outputs as `dtype` scaled by `post`.
void UnpackBlock(const char* src, DataType wire, const ScatterTensors& s, int rank,
                 DataType dtype, double post, bool post_in_double);

}  // namespace hvdcompat
