// The host side of a (possibly fused) allgather, shared by the host backends
// (MPI, Gloo): which tensors a response carries and their gathered outputs.
// The layout itself is collective_layout.h's PlanAllgather.
#pragma once

#include <cstdint>
#include <vector>

#include "core/common.h"
#include "ops/backend.h"
#include "ops/collective_layout.h"

namespace hvdcompat {

struct GatherTensors {
  std::vector<TensorEntry*> entries;       // the entry of each tensor
  std::vector<const BufferDesc*> inputs;   // every unit's inputs, in response order
  std::vector<int64_t> rows;               // this rank's first dimension of each
};

// The inputs of every unit, in order (a joined rank has none to gather: an
// internal error).
GatherTensors CollectAllgather(std::vector<ExecUnit>& units);

// Allocates each gathered tensor's host output (its first dimension from
// `g`) in its entry's result; returns where each output starts.
std::vector<char*> AllocateGatherOutputs(const GatherTensors& t, const GatherLayout& g,
                                         DataType dtype);

// Fused (byte layout): this rank's part of every tensor, back to back, into `dst`.
void PackOwnBlock(char* dst, const GatherTensors& t, const GatherLayout& g, int rank);

// Fused (byte layout): every rank's block of the gathered payload `src`, in
// rank order, into the outputs.
void UnpackGathered(const char* src, const GatherLayout& g, const std::vector<char*>& outs);

}  // namespace hvdcompat
