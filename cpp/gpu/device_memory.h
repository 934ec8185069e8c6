// Device and page-locked host memory of the GPU data plane: growable
// scratch buffers (the device fusion buffer, the staging buffer) and the
// device outputs handed to Python. See Note [GPU memory without device syncs].
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/common.h"
#include "cuda/cuda_runtime_min.h"
#include "core/message.h"

namespace hvdcompat {

class OwnedBuffer;

// Note [GPU memory without device syncs]
// cudaFree and cudaFreeHost synchronise the whole device: on the hot path they
// would wait for every stream, including another process set's NCCL kernel
// (and deadlock against it when that kernel waits for a peer that is itself
// waiting for us). So nothing freed while the engine runs goes through them:
//  - where the device has the stream-ordered allocator
//    (cudaDevAttrMemoryPoolsSupported), device memory comes from the default
//    pool (cudaMallocAsync) and is freed in the order of the stream that last
//    used it (cudaFreeAsync); the pool's release threshold is raised to
//    kPoolKeepBytes once, so steady-state outputs are not unmapped and mapped
//    again at every synchronisation;
//  - otherwise (and always for page-locked host memory) a buffer replaced by
//    a larger one is retired, and retired buffers are freed at the owner's
//    shutdown, after its streams drained. Growth at least doubles, so the
//    retired memory stays below the live buffer's size.
// Outputs handed to Python without a pool use cudaMalloc/cudaFree, as
// torch's own caching allocator does underneath.

// Bytes of freed memory the default pool keeps mapped (its release threshold).
constexpr uint64_t kPoolKeepBytes = uint64_t{1} << 30;

// Whether `device` allocates through the stream-ordered allocator: the runtime
// has it and the device supports memory pools. The first positive answer per
// device raises the default pool's release threshold. Cached; thread-safe.
bool UseMemoryPool(int device);

// Growable device buffer used in the order of one stream. Keeps its memory
// between collectives. Worker thread only.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  // Frees what Release did not (at shutdown only: may synchronise the device).
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  // At least `bytes` on `device`, in the order of `stream` (the only user);
  // contents are not preserved on growth. Never synchronises the device.
  char* Reserve(size_t bytes, int device, cudaStream_t stream);

  // Frees everything in the order of the last stream; call before that
  // stream is destroyed, after its work drained. Never throws.
  void Release();

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
  int device_ = -1;
  bool pooled_ = false;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> retired_;  // not pooled: freed by Release
};

// Growable page-locked host buffer (fast, asynchronous copies to and from
// the device). Worker thread only.
class PinnedScratch {
 public:
  PinnedScratch() = default;
  ~PinnedScratch();
  PinnedScratch(const PinnedScratch&) = delete;
  PinnedScratch& operator=(const PinnedScratch&) = delete;

  // The caller guarantees no copy still uses the old memory; it is retired
  // (freed at destruction), never freed here.
  char* Reserve(size_t bytes);

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
  std::vector<void*> retired_;
};

// An engine stream as the frees of device outputs see it: still there, or
// destroyed (after its work drained). Thread-safe.
struct StreamLife {
  explicit StreamLife(cudaStream_t s) : stream(s) {}
  std::mutex mu;
  cudaStream_t stream;
  bool alive = true;
  // Marks the stream gone; the owner destroys it afterwards.
  void End() {
    std::lock_guard<std::mutex> lock(mu);
    alive = false;
  }
};

// How a device output is freed: in the order of the consumer's stream once
// synchronize() bound it to one; before that (error paths, or no consumer
// stream) in the order of the engine stream that wrote it, or, once that
// stream is gone (its work drained), of the device's legacy stream.
// Never throws.
struct DeviceFree {
  int device = 0;
  bool stream_ordered = false;  // came from cudaMallocAsync
  bool bound = false;
  void* stream = nullptr;       // consumer stream, when bound
  std::shared_ptr<StreamLife> engine;  // the stream it was allocated on
  void operator()(void* data) const;
};

// A device output of `shape` on `device`, allocated in the order of the
// engine's stream `engine` when the device has a memory pool.
OwnedBuffer AllocateDeviceOutput(DataType dtype, const Shape& shape, int device,
                                 const std::shared_ptr<StreamLife>& engine);

// Orders a device output's free after `stream` (no-op for host buffers).
void BindFreeStream(OwnedBuffer* buffer, void* stream);

}  // namespace hvdcompat
