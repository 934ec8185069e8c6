// Sizes computed from user input (shapes, splits, counts, displacements)
// in int64_t without silent overflow. A wrapped product or sum would pass
// every later range check on a meaningless value (a sum of huge splits that
// wraps to the row count, say), so each step is checked where it is made.
//
// Each function throws InvalidArgument, whose text starts with `what` (the
// caller's subject, e.g. "alltoall 'x' on rank 1: send count"; built only by
// callers off the hot path), and is pure:
// any thread may call it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/common.h"

namespace hvdcompat {

[[noreturn]] inline void ThrowSizeOverflow(const char* what, const char* how, int64_t a,
                                           int64_t b) {
  throw InvalidArgument(std::string(what) + ": " + std::to_string(a) + " " + how + " " + std::to_string(b) +
                        " does not fit in a 64-bit size; the tensor's shape or the splits are "
                        "far beyond any tensor that can exist. Check the values passed.");
}

// a * b, or InvalidArgument when it does not fit in int64_t.
inline int64_t CheckedMul(int64_t a, int64_t b, const char* what) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) ThrowSizeOverflow(what, "x", a, b);
  return out;
}

// a + b, or InvalidArgument when it does not fit in int64_t.
inline int64_t CheckedAdd(int64_t a, int64_t b, const char* what) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) ThrowSizeOverflow(what, "+", a, b);
  return out;
}

// The product of `dims[from:]` (1 for none), checked. The message is only
// formatted on failure: this runs for every tensor of every cycle.
inline int64_t CheckedProduct(const std::vector<int64_t>& dims, size_t from,
                              const char* what) {
  int64_t n = 1;
  for (size_t i = from; i < dims.size(); ++i) n = CheckedMul(n, dims[i], what);
  return n;
}

// The sum of `values`, checked.
inline int64_t CheckedSum(const std::vector<int64_t>& values, const char* what) {
  int64_t n = 0;
  for (int64_t v : values) n = CheckedAdd(n, v, what);
  return n;
}

}  // namespace hvdcompat
