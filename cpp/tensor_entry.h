// What one submitted op carries from the API thread to the worker, and what
// it hands back through its handle.
#pragma once

#include <chrono>
#include <cstdlib>
#include <memory>
#include <vector>

#include "common.h"
#include "message.h"

namespace hvdcompat {

// Host memory the core allocated for an output whose size is known only
// after negotiation (allgather, alltoall). Ownership moves to Python through
// DLPack.
class OwnedBuffer {
 public:
  OwnedBuffer() = default;
  static OwnedBuffer Allocate(DataType dtype, Shape shape);
  OwnedBuffer(OwnedBuffer&& o) noexcept { *this = std::move(o); }
  OwnedBuffer& operator=(OwnedBuffer&& o) noexcept;
  ~OwnedBuffer() { std::free(data_); }

  void* data() const { return data_; }
  const BufferDesc& desc() const { return desc_; }
  // Gives up ownership (the caller frees with std::free).
  void* Release();

 private:
  void* data_ = nullptr;
  BufferDesc desc_;
};

struct HandleResult {
  Status status;
  std::vector<OwnedBuffer> outputs;                 // core-allocated outputs
  std::vector<std::vector<int64_t>> received_splits;  // alltoall
  int join_last_rank = -1;                          // join: global rank
};

struct TensorEntry {
  int handle = -1;
  Request request;                  // root is a process-set rank here
  std::vector<BufferDesc> inputs;   // one per tensor
  std::vector<BufferDesc> outputs;  // caller-provided; empty when the core allocates
  std::vector<std::vector<int64_t>> splits;  // alltoall: rows sent to each rank
  HandleResult result;
  std::chrono::steady_clock::time_point enqueued;   // handed to the worker
  std::chrono::steady_clock::time_point submitted;  // taken into negotiation
};

}  // namespace hvdcompat
