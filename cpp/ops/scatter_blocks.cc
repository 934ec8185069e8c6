#include "ops/scatter_blocks.h"

#include "core/common.h"
#include "ops/cpu_kernels.h"

namespace hvdcompat {

ScatterTensors CollectReducescatter(std::vector<ExecUnit>& units, int size) {
  ScatterTensors s;
  std::vector<int64_t> rows, row_elems;
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "reducescatter on a joined rank");
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      const BufferDesc& in = u.entry->inputs[t];
      s.inputs.push_back(&in);
      s.outputs.push_back(&u.entry->outputs[t]);
      rows.push_back(in.shape.empty() ? 1 : in.shape[0]);
      row_elems.push_back(in.RowElements());
    }
  }
  s.layout = PlanReducescatter(rows, row_elems, size);
  return s;
}

int64_t BlockStart(const ScatterLayout& s, int rank) {
  int64_t at = 0;
  for (int rk = 0; rk < rank; ++rk) at += s.rank_counts[rk];
  return at;
}

void PackRankMajor(char* dst, DataType wire, const ScatterTensors& s, DataType dtype, double pre) {
  const size_t esize = DataTypeSize(dtype);
  const size_t wsize = DataTypeSize(wire);
  const ScatterLayout& l = s.layout;
  int64_t at = 0;
  for (int rk = 0; rk < l.size; ++rk) {
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      ConvertScale(dst + at * wsize, wire,
                   static_cast<const char*>(s.inputs[i]->data) + l.Offset(rk, i) * esize, dtype,
                   l.Count(rk, i), pre);
      at += l.Count(rk, i);
    }
  }
}

void UnpackBlock(const char* src, DataType wire, const ScatterTensors& s, int rank,
                 DataType dtype, double post, bool post_in_double) {
  const size_t wsize = DataTypeSize(wire);
  int64_t at = 0;
  for (size_t i = 0; i < s.outputs.size(); ++i) {
    ConvertScale(s.outputs[i]->data, dtype, src + at * wsize, wire, s.layout.Count(rank, i), post,
                 post_in_double);
    at += s.layout.Count(rank, i);
  }
}

}  // namespace hvdcompat
