// Requests (what one rank wants to run) and responses (what every rank of a
// process set will run, in order), and their compact binary encoding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/common.h"

namespace hvdcompat {

using Shape = std::vector<int64_t>;

// One named unit of work submitted by one rank. Grouped ops carry several
// tensors in one request so they are negotiated and fused as one unit.
struct Request {
  int32_t rank = 0;  // requester's rank within the process set
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root = -1;  // process-set rank of the broadcast root
  int32_t device = kCpuDevice;  // kCpuDevice, or 0 for CUDA (whatever this rank's index)
  double prescale = 1.0;
  double postscale = 1.0;
  std::string name;
  // Named by the library ("allreduce.noname.<k>"): never cached, since the
  // name is new on every call.
  bool auto_named = false;
  std::vector<Shape> shapes;  // one per tensor

  int64_t TotalBytes() const;
};

struct ResponseUnit {
  std::string name;
  std::vector<Shape> shapes;  // as submitted by the lowest non-joined rank
};

// What to execute. Before fusion a response has one unit; fusion merges
// consecutive compatible responses into one with several units.
struct Response {
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root = -1;
  int32_t device = kCpuDevice;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<ResponseUnit> units;
  bool auto_named = false;
  // Non-empty: an error response; every rank fails the named unit with it.
  std::string error;
  StatusCode error_code = StatusCode::kOk;
  int32_t last_joined = -1;  // join responses: set rank of the last rank to join

  bool is_error() const { return !error.empty(); }
  int64_t TotalElements() const;
  int64_t TotalBytes() const { return TotalElements() * static_cast<int64_t>(DataTypeSize(dtype)); }
};

std::string EncodeRequests(const std::vector<Request>& requests);
std::vector<Request> DecodeRequests(const char* data, size_t size);
std::string EncodeResponses(const std::vector<Response>& responses);
std::vector<Response> DecodeResponses(const char* data, size_t size);

}  // namespace hvdcompat
