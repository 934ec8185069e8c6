// What one submitted op carries from the API thread to the worker, and what
// it hands back through its handle.
#pragma once

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/common.h"
#include "core/device_sync.h"
#include "core/message.h"

namespace hvdcompat {

// Memory the core allocated for an output whose size is known only after
// negotiation (allgather, alltoall). Ownership moves to Python through
// DLPack. Host memory by default; device memory carries its own deleter.
class OwnedBuffer {
 public:
  // Frees `data`; empty means std::free (host memory from Allocate).
  using Deleter = std::function<void(void* data)>;

  OwnedBuffer() = default;
  static OwnedBuffer Allocate(DataType dtype, Shape shape);
  // Takes ownership of memory allocated elsewhere (desc.data == data).
  static OwnedBuffer Adopt(void* data, BufferDesc desc, Deleter deleter);
  OwnedBuffer(OwnedBuffer&& o) noexcept { *this = std::move(o); }
  OwnedBuffer& operator=(OwnedBuffer&& o) noexcept;
  ~OwnedBuffer() { Reset(); }

  void* data() const { return data_; }
  const BufferDesc& desc() const { return desc_; }
  // Gives up ownership of any memory; the caller frees with the deleter
  // (std::free when it is empty).
  std::pair<void*, Deleter> ReleaseWithDeleter();
  // The deleter's callable when it is a `T` (lets its owner adjust it).
  template <typename T>
  T* deleter_target() { return deleter_ ? deleter_.target<T>() : nullptr; }

 private:
  void Reset();

  void* data_ = nullptr;
  BufferDesc desc_;
  Deleter deleter_;
};

struct HandleResult {
  Status status;
  std::vector<OwnedBuffer> outputs;                 // core-allocated outputs
  std::vector<std::vector<int64_t>> received_splits;  // alltoall
  int join_last_rank = -1;                          // join: global rank
  std::shared_ptr<DeviceCompletion> device_done;    // device ops: end of the device work
};

struct TensorEntry {
  int handle = -1;
  Request request;                  // root is a process-set rank here
  std::vector<BufferDesc> inputs;   // one per tensor
  std::vector<BufferDesc> outputs;  // caller-provided; empty when the core allocates
  std::vector<std::vector<int64_t>> splits;  // alltoall: rows sent to each rank
  std::unique_ptr<ReadyEvent> ready;         // device ops: inputs' producer event
  HandleResult result;
  std::chrono::steady_clock::time_point enqueued;   // handed to the worker
  std::chrono::steady_clock::time_point submitted;  // taken into negotiation
};

}  // namespace hvdcompat
