// Where each rank's part of an allgather, alltoall or reducescatter payload sits: the
// one layout rule every backend follows (the MPI and NCCL backends plan with
// it; the staged GPU backend runs the MPI backend's code on host copies).
//
// Layouts are rank-major: rank 0's block (its part of every tensor, in
// response order, back to back), then rank 1's, and so on. Sizes are in the
// caller's unit: rows are multiplied by `row_sizes`, which may be elements
// (one tensor, one typed call) or bytes (fused tensors, one byte call).
//
// Every size is computed with overflow checks (core/checked_math.h): the
// plans throw InvalidArgument rather than return a wrapped count.
//
// Thread: pure functions, callable from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hvdcompat {

// Elements per call when `count` elements of `esize` bytes go as equal calls
// of at most `max_bytes` each: 24 MiB under a 16 MiB limit goes as two 12 MiB
// calls, not 16 + 8 (a short tail call costs a full call's latency for little
// data). At least 1.
int64_t EqualCallElements(int64_t count, int64_t max_bytes, size_t esize);

// Allgather: rank rk contributes rows[rk * tensors + i] rows of tensor i.
struct GatherLayout {
  int size = 0;
  size_t tensors = 0;
  std::vector<int64_t> counts;       // [rk * tensors + i]: rank rk's part of tensor i
  std::vector<int64_t> rank_counts;  // rank rk's whole block
  std::vector<int64_t> rank_displs;  // where rank rk's block starts in the gathered payload
  std::vector<int64_t> out_rows;     // first dimension of each gathered tensor
  int64_t total = 0;                 // every block together
  int64_t largest = 0;               // the largest block
  bool even = false;                 // every block has the same size
  bool uniform = false;              // every tensor has the same rows on every rank

  int64_t Count(int rank, size_t tensor) const { return counts[rank * tensors + tensor]; }
};

// `rows` holds size * row_sizes.size() first dimensions, rank-major.
GatherLayout PlanAllgather(const std::vector<int64_t>& rows, const std::vector<int64_t>& row_sizes,
                           int size);

// Reducescatter: tensor i (rows[i] rows of row_sizes[i]) is split along its
// first dimension, the first rows[i] % size ranks receiving one extra row.
struct ScatterLayout {
  int size = 0;
  size_t tensors = 0;
  std::vector<int64_t> counts;       // [rk * tensors + i]: the part of tensor i rank rk receives
  std::vector<int64_t> offsets;      // [rk * tensors + i]: where that part starts in tensor i
  std::vector<int64_t> rank_counts;  // rank rk's whole block
  int64_t total = 0;                 // every block together (the inputs' size)
  int64_t largest = 0;               // the largest block
  bool even = false;                 // every block has the same size

  int64_t Count(int rank, size_t tensor) const { return counts[rank * tensors + tensor]; }
  int64_t Offset(int rank, size_t tensor) const { return offsets[rank * tensors + tensor]; }
};

ScatterLayout PlanReducescatter(const std::vector<int64_t>& rows,
                                const std::vector<int64_t>& row_sizes, int size);

// Alltoall: rank rk is sent send_rows[rk] rows and sends back recv_rows[rk],
// each row `row` units long; blocks sit back to back in rank order.
struct AlltoallCounts {
  std::vector<int64_t> send_counts, send_displs;
  std::vector<int64_t> recv_counts, recv_displs;
};

AlltoallCounts PlanAlltoall(const std::vector<int64_t>& send_rows,
                            const std::vector<int64_t>& recv_rows, int64_t row);

// Rows of dim 0 that set rank `rank` receives when `rows` are scattered over
// `size` ranks: the first rows % size ranks get one extra row.
int64_t ReducescatterRows(int64_t rows, int size, int rank);

}  // namespace hvdcompat
