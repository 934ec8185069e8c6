#include "ops/gather_blocks.h"

#include <cstring>

namespace hvdcompat {

GatherTensors CollectAllgather(std::vector<ExecUnit>& units) {
  GatherTensors t;
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "allgather on a joined rank");
    for (size_t i = 0; i < u.unit->shapes.size(); ++i) {
      const BufferDesc& in = u.entry->inputs[i];
      t.entries.push_back(u.entry);
      t.inputs.push_back(&in);
      t.rows.push_back(in.shape[0]);
    }
  }
  return t;
}

std::vector<char*> AllocateGatherOutputs(const GatherTensors& t, const GatherLayout& g,
                                         DataType dtype) {
  std::vector<char*> outs(t.inputs.size());
  for (size_t i = 0; i < t.inputs.size(); ++i) {
    Shape shape = t.inputs[i]->shape;
    shape[0] = g.out_rows[i];
    auto& results = t.entries[i]->result.outputs;
    results.push_back(OwnedBuffer::Allocate(dtype, shape));
    outs[i] = static_cast<char*>(results.back().data());
  }
  return outs;
}

void PackOwnBlock(char* dst, const GatherTensors& t, const GatherLayout& g, int rank) {
  int64_t at = 0;
  for (size_t i = 0; i < t.inputs.size(); ++i) {
    std::memcpy(dst + at, t.inputs[i]->data, g.Count(rank, i));
    at += g.Count(rank, i);
  }
}

void UnpackGathered(const char* src, const GatherLayout& g, const std::vector<char*>& outs) {
  std::vector<int64_t> out_at(outs.size(), 0);
  int64_t at = 0;
  for (int rk = 0; rk < g.size; ++rk) {
    for (size_t i = 0; i < outs.size(); ++i) {
      std::memcpy(outs[i] + out_at[i], src + at, g.Count(rk, i));
      out_at[i] += g.Count(rk, i);
      at += g.Count(rk, i);
    }
  }
}

}  // namespace hvdcompat
