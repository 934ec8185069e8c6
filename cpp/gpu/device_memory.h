// Device and page-locked host memory of the GPU data plane: growable
// scratch buffers (the device fusion buffer, the staging buffer) and the
// device outputs handed to Python.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.h"
#include "cuda/cuda_runtime_min.h"
#include "message.h"

namespace hvdcompat {

class OwnedBuffer;

// Growable device buffer used in the order of one stream. Keeps its memory
// between collectives. Worker thread only.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  // At least `bytes` on `device`; contents are not preserved on growth.
  // Growing first drains `stream` (the only user), so in-flight work never
  // sees its buffer freed.
  char* Reserve(size_t bytes, int device, cudaStream_t stream);
  size_t capacity() const { return capacity_; }

 private:
  void Free();

  char* data_ = nullptr;
  size_t capacity_ = 0;
  int device_ = -1;
};

// Growable page-locked host buffer (fast, asynchronous copies to and from
// the device). Worker thread only.
class PinnedScratch {
 public:
  PinnedScratch() = default;
  ~PinnedScratch();
  PinnedScratch(const PinnedScratch&) = delete;
  PinnedScratch& operator=(const PinnedScratch&) = delete;

  // The caller guarantees no copy still uses the old memory.
  char* Reserve(size_t bytes);

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

// How a device output is freed. Until it is bound to a consumer stream (at
// synchronize) it is freed synchronously, which is only reached once the
// engine's work on it is over (shutdown drained the streams). Never throws.
struct DeviceFree {
  int device = 0;
  bool stream_ordered = false;  // came from cudaMallocAsync
  bool bound = false;
  void* stream = nullptr;       // consumer stream, when bound
  void operator()(void* data) const;
};

// A device output of `shape` on `device`, allocated in the order of `stream`
// (the engine's) when the runtime has a stream-ordered allocator.
OwnedBuffer AllocateDeviceOutput(DataType dtype, const Shape& shape, int device,
                                 cudaStream_t stream);

// Orders a device output's free after `stream` (no-op for host buffers).
void BindFreeStream(OwnedBuffer* buffer, void* stream);

}  // namespace hvdcompat
