// CUDA events and device selection for the GPU data plane: a device guard,
// a pool of events, the producer-side ReadyEvent and the consumer-side
// DeviceCompletion (cpp/core/device_sync.h).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/device_sync.h"
#include "gpu/gpu_library.h"

namespace hvdcompat {

// Note [GPU stream order]
// Nothing on the hot path synchronises a whole device.
//  1. Enqueue (API thread): the Python layer passes the producer's current
//     stream with each CUDA buffer; the core records a pooled event on it
//     (ReadyEvent).
//  2. Execute (worker): the engine's stream (one per lane, see
//     HOROVOD_NUM_NCCL_STREAMS) waits on that event, then packs, runs the
//     collective and unpacks on its own stream, then records a completion
//     event. The worker does not wait for the device; it completes the
//     handle with the completion attached and moves on to the next cycle.
//  3. synchronize() (API thread): by default the host waits for the
//     completion event while polling the communicators for asynchronous
//     errors (a failure aborts the communicator, so kernels stuck on a dead
//     peer are released, and raises HorovodInternalError). Then, or at once
//     with HOROVOD_ENABLE_ASYNC_COMPLETION, the caller's current stream is
//     made to wait on the completion event, so the consumer reads outputs
//     in order even when the host did not wait. With async completion no
//     host thread waits, so a watchdog (cpp/gpu/gpu_watchdog.h) polls the
//     completions in flight and aborts a failed or stalled communicator,
//     which releases the consumer's stream and fails the pending handles.
//  Every event record, stream wait and free runs with the tensors' device
//  current (DeviceGuard): the calling thread's current device may be
//  another, and stream 0 (torch's default stream) means the legacy stream
//  of the current device.
//  4. Outputs the core allocated (allgather, alltoall) come from the
//     stream-ordered allocator on the engine's stream and are freed, when the
//     consumer drops them, in the order of the stream that synchronize()
//     ordered after the op (the consumer's stream), as torch's own caching
//     allocator does with a tensor's allocation stream; an output never
//     bound to a consumer (a failed op) is freed on the engine stream that
//     wrote it (see DeviceFree).
// Inputs stay alive until synchronize() returns (the Python handle table
// holds them); with async completion they are then protected by the
// consumer's stream order, as in torch's own collectives.

// Sets the calling thread's current device for its lifetime and restores the
// previous one. Throws LibraryError.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

// Reusable timing-free events of one device. Thread-safe. Shared by the
// objects that hold events, so it outlives the runtime when they do.
class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  int device() const { return device_; }
  // An event of this pool's device (created when none is free).
  cudaEvent_t Acquire();
  // Returns an event; it may be re-recorded at once, since stream waits
  // already enqueued keep the state they captured.
  void Release(cudaEvent_t event);

 private:
  const int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

// Something whose asynchronous failure must end a wait (an NCCL
// communicator). Thread-safe.
class AsyncErrorSource {
 public:
  virtual ~AsyncErrorSource() = default;
  // Empty while healthy. On failure: the error text, after aborting the
  // source so device work stuck on it is released.
  virtual std::string PollAndAbortOnError() = 0;
  // Aborts with `why` (no progress within the stall timeout).
  virtual void Abort(const std::string& why) = 0;
  // The error text once aborted, else empty. Cheap; asks the library nothing.
  virtual std::string ErrorIfAborted() = 0;
};

// A non-blocking stream of the current device for engine work, at the
// highest priority the device offers (when the runtime can say).
cudaStream_t CreateEngineStream();

// Producer event recorded on `stream` of the pool's device.
std::unique_ptr<ReadyEvent> RecordReadyEvent(const std::shared_ptr<EventPool>& pool,
                                             cudaStream_t stream);

// Records a completion event on `stream` (the engine's); `what` names the op
// for error messages; `sources` are polled while waiting.
std::shared_ptr<DeviceCompletion> RecordCompletion(
    const std::shared_ptr<EventPool>& pool, cudaStream_t stream, std::string what,
    std::vector<std::shared_ptr<AsyncErrorSource>> sources);

// Blocks until everything issued to `stream` so far finished, polling
// `sources` like a completion does. Throws LibraryError on failure.
void DrainStream(const std::shared_ptr<EventPool>& pool, cudaStream_t stream,
                 const std::vector<std::shared_ptr<AsyncErrorSource>>& sources,
                 const std::string& what);

}  // namespace hvdcompat
