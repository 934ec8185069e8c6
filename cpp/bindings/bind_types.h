#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/common.h"

namespace hvdcompat {

// What wait() hands back for a finished op, by name.
struct WaitResult {
  StatusCode status = StatusCode::kOk;
  std::string message;
  pybind11::list outputs;  // DLPack capsules of the outputs
  std::vector<std::vector<int64_t>> received_splits;  // alltoall
  int join_last_rank = -1;  // join: the last rank to join (global)
};

// Binds the enums, the error classes, the argument classes and WaitResult.
void BindTypes(pybind11::module_& m);
// A reduce op made from an out-of-range int is refused (ValueError).
ReduceOp CheckedReduceOp(ReduceOp op);

}  // namespace hvdcompat
