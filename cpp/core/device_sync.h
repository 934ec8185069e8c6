// How ops on device (CUDA) buffers are ordered against the caller's streams,
// seen from the backend-neutral core: two small interfaces whose only
// implementations live in cpp/gpu/. Streams travel as opaque pointers, so
// nothing here needs CUDA types. See Note [GPU stream order] in
// cpp/gpu/gpu_events.h.
#pragma once

#include <cstdint>
#include <vector>

#include "core/common.h"

namespace hvdcompat {

class OwnedBuffer;

// Recorded at enqueue on the stream that produced an op's inputs. The engine
// makes its own stream wait on it before reading them.
// Thread-safety: created on the API thread, used and destroyed on the worker.
class ReadyEvent {
 public:
  virtual ~ReadyEvent() = default;
  // Enqueues a wait on `stream` (a cudaStream_t); never blocks the host.
  // Throws LibraryError.
  virtual void MakeStreamWait(void* stream) = 0;
};

// The end of one executed op's device work, attached to its handle's result.
// The handle reports done when the engine has issued the work; synchronize()
// then either waits here on the host (the default) or only orders the
// caller's stream after the work (HOROVOD_ENABLE_ASYNC_COMPLETION).
// Thread-safety: every method may be called from any API thread.
class DeviceCompletion {
 public:
  virtual ~DeviceCompletion() = default;
  // True when the work finished or failed. Never blocks.
  virtual bool Done() = 0;
  // Blocks until the work finished (OK) or failed (the library's error,
  // after aborting the communicator so no kernel stays stuck on it).
  virtual Status Wait() = 0;
  // Makes `stream` (a cudaStream_t as an integer) wait for the work without
  // blocking the host, and hands the op's core-allocated device outputs to
  // that stream: they are freed in its order once the consumer drops them.
  // Returns the failure when the work is known to have failed (the stream is
  // then left alone, so it cannot wait forever on a dead communicator).
  virtual Status MakeStreamWait(uintptr_t stream, std::vector<OwnedBuffer>* outputs) = 0;
};

}  // namespace hvdcompat
