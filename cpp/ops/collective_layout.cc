#include "ops/collective_layout.h"

#include <algorithm>

#include "core/checked_math.h"
#include "core/common.h"

namespace hvdcompat {

int64_t EqualCallElements(int64_t count, int64_t max_bytes, size_t esize) {
  const int64_t limit = std::max<int64_t>(1, max_bytes / static_cast<int64_t>(esize));
  const int64_t calls = (count + limit - 1) / limit;
  return calls > 0 ? (count + calls - 1) / calls : 1;
}

namespace {

bool AllEqual(const std::vector<int64_t>& v) {
  return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v[0]; });
}

}  // namespace

int64_t ReducescatterRows(int64_t rows, int size, int rank) {
  return rows / size + (rank < rows % size ? 1 : 0);
}

GatherLayout PlanAllgather(const std::vector<int64_t>& rows, const std::vector<int64_t>& row_sizes,
                           int size) {
  HVD_ENFORCE_EQ(rows.size(), row_sizes.size() * static_cast<size_t>(size),
                 "allgather layout: first dimensions of every tensor on every rank");
  GatherLayout g;
  g.size = size;
  g.tensors = row_sizes.size();
  g.counts.resize(rows.size());
  g.rank_counts.assign(size, 0);
  g.rank_displs.assign(size, 0);
  g.out_rows.assign(g.tensors, 0);
  g.uniform = true;
  for (int rk = 0; rk < size; ++rk) {
    for (size_t i = 0; i < g.tensors; ++i) {
      const size_t k = rk * g.tensors + i;
      g.counts[k] = CheckedMul(rows[k], row_sizes[i], "allgather: elements of a rank's part");
      g.rank_counts[rk] = CheckedAdd(g.rank_counts[rk], g.counts[k], "allgather: a rank's block");
      g.out_rows[i] = CheckedAdd(g.out_rows[i], rows[k], "allgather: rows gathered");
      if (rows[k] != rows[i]) g.uniform = false;
    }
    g.rank_displs[rk] = g.total;
    g.total = CheckedAdd(g.total, g.rank_counts[rk], "allgather: elements gathered");
  }
  g.largest = size > 0 ? *std::max_element(g.rank_counts.begin(), g.rank_counts.end()) : 0;
  g.even = size > 0 && AllEqual(g.rank_counts);
  return g;
}

ScatterLayout PlanReducescatter(const std::vector<int64_t>& rows,
                                const std::vector<int64_t>& row_sizes, int size) {
  HVD_ENFORCE_EQ(rows.size(), row_sizes.size(), "reducescatter layout: rows per tensor");
  ScatterLayout s;
  s.size = size;
  s.tensors = rows.size();
  s.counts.resize(s.tensors * size);
  s.offsets.resize(s.tensors * size);
  s.rank_counts.assign(size, 0);
  std::vector<int64_t> next_row(s.tensors, 0);
  for (int rk = 0; rk < size; ++rk) {
    for (size_t i = 0; i < s.tensors; ++i) {
      const size_t k = rk * s.tensors + i;
      const int64_t part = ReducescatterRows(rows[i], size, rk);
      s.offsets[k] = CheckedMul(next_row[i], row_sizes[i], "reducescatter: offset of a part");
      s.counts[k] = CheckedMul(part, row_sizes[i], "reducescatter: elements of a part");
      next_row[i] += part;
      s.rank_counts[rk] = CheckedAdd(s.rank_counts[rk], s.counts[k], "reducescatter: a block");
    }
    s.total = CheckedAdd(s.total, s.rank_counts[rk], "reducescatter: elements scattered");
  }
  s.largest = size > 0 ? *std::max_element(s.rank_counts.begin(), s.rank_counts.end()) : 0;
  s.even = size > 0 && AllEqual(s.rank_counts);
  return s;
}

AlltoallCounts PlanAlltoall(const std::vector<int64_t>& send_rows,
                            const std::vector<int64_t>& recv_rows, int64_t row) {
  HVD_ENFORCE_EQ(send_rows.size(), recv_rows.size(), "alltoall layout: one entry per rank");
  const size_t n = send_rows.size();
  AlltoallCounts c;
  c.send_counts.resize(n);
  c.send_displs.resize(n);
  c.recv_counts.resize(n);
  c.recv_displs.resize(n);
  int64_t s_at = 0, r_at = 0;
  for (size_t rk = 0; rk < n; ++rk) {
    c.send_counts[rk] = CheckedMul(send_rows[rk], row, "alltoall: elements sent to a rank");
    c.recv_counts[rk] = CheckedMul(recv_rows[rk], row, "alltoall: elements received from a rank");
    c.send_displs[rk] = s_at;
    c.recv_displs[rk] = r_at;
    s_at = CheckedAdd(s_at, c.send_counts[rk], "alltoall: elements sent");
    r_at = CheckedAdd(r_at, c.recv_counts[rk], "alltoall: elements received");
  }
  return c;
}

}  // namespace hvdcompat
