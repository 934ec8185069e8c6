#include "gpu/gpu_events.h"

#include <sched.h>

#include <chrono>
#include <thread>

#include "gpu/device_memory.h"
#include "gpu/gpu_check.h"
#include "core/tensor_entry.h"

namespace hvdcompat {

namespace {

using Clock = std::chrono::steady_clock;

// Waits with a short spin, then sleeps growing to 200 us: a collective that
// is about to finish is seen quickly, a long one costs little CPU and is
// noticed within a fraction of a millisecond.
class Backoff {
 public:
  void Pause() {
    if (Clock::now() - start_ < std::chrono::microseconds(50)) {
      sched_yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    sleep_us_ = std::min<int64_t>(sleep_us_ * 2, 200);
  }

 private:
  Clock::time_point start_ = Clock::now();
  int64_t sleep_us_ = 10;
};

enum class Progress { kPending, kDone, kFailed };

// One look at `event`: finished, still running, or failed (a CUDA error, or
// an asynchronous error of a source, which is then aborted).
Progress Look(cudaEvent_t event, const std::vector<std::shared_ptr<AsyncErrorSource>>& sources,
              std::string* error) {
  cudaError_t rc = Cuda().EventQuery(event);
  if (rc == cudaSuccess) {
    // An aborted communicator lets its kernels end early: their output is
    // garbage even though the event completed.
    for (const auto& s : sources) {
      std::string e = s->ErrorIfAborted();
      if (!e.empty()) {
        *error = e;
        return Progress::kFailed;
      }
    }
    return Progress::kDone;
  }
  if (rc != cudaErrorNotReady) {
    *error = "the device reported " + CudaErrorText(rc) + " (error code " +
             std::to_string(static_cast<int>(rc)) + ")";
    return Progress::kFailed;
  }
  for (const auto& s : sources) {
    std::string e = s->PollAndAbortOnError();
    if (!e.empty()) {
      *error = e;
      return Progress::kFailed;
    }
  }
  return Progress::kPending;
}

class PooledReadyEvent : public ReadyEvent {
 public:
  PooledReadyEvent(std::shared_ptr<EventPool> pool, cudaEvent_t event)
      : pool_(std::move(pool)), event_(event) {}
  ~PooledReadyEvent() override { pool_->Release(event_); }

  void MakeStreamWait(void* stream) override {
    DeviceGuard guard(pool_->device());  // stream 0: this device's legacy stream
    HVD_CUDA_CHECK(Cuda().StreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0));
  }

 private:
  std::shared_ptr<EventPool> pool_;
  cudaEvent_t event_;
};

class EventCompletion : public DeviceCompletion {
 public:
  EventCompletion(std::shared_ptr<EventPool> pool, cudaEvent_t event, std::string what,
                  std::vector<std::shared_ptr<AsyncErrorSource>> sources)
      : pool_(std::move(pool)),
        event_(event),
        what_(std::move(what)),
        sources_(std::move(sources)) {}
  ~EventCompletion() override { pool_->Release(event_); }

  bool Done() override {
    std::lock_guard<std::mutex> lock(mu_);
    return AdvanceLocked() != Progress::kPending;
  }

  Status Wait() override {
    Backoff backoff;
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        Progress p = AdvanceLocked();
        if (p == Progress::kDone) return Status::OK();
        if (p == Progress::kFailed) return FailureLocked();
      }
      backoff.Pause();
    }
  }

  Status MakeStreamWait(uintptr_t stream, std::vector<OwnedBuffer>* outputs) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (AdvanceLocked() == Progress::kFailed) return FailureLocked();
    }
    cudaError_t rc;
    {
      // The caller's thread may have another current device; stream 0 means
      // the legacy stream of the tensors' device.
      DeviceGuard guard(pool_->device());
      rc = Cuda().StreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), event_, 0);
    }
    if (rc != cudaSuccess) {
      return Status::Error(StatusCode::kInternal,
                           what_ + ": could not order the caller's CUDA stream after it: " +
                               CudaErrorText(rc));
    }
    if (outputs) {
      for (auto& b : *outputs) BindFreeStream(&b, reinterpret_cast<void*>(stream));
    }
    return Status::OK();
  }

 private:
  Progress AdvanceLocked() {
    if (state_ == Progress::kPending) state_ = Look(event_, sources_, &error_);
    return state_;
  }

  Status FailureLocked() const {
    return Status::Error(StatusCode::kInternal,
                         what_ + " failed on the device: " + error_ +
                             ". Its outputs are undefined. Look for the first error on any "
                             "rank (a lost rank, a CUDA fault, an NCCL network error).");
  }

  std::shared_ptr<EventPool> pool_;
  cudaEvent_t event_;
  const std::string what_;
  const std::vector<std::shared_ptr<AsyncErrorSource>> sources_;
  std::mutex mu_;
  Progress state_ = Progress::kPending;
  std::string error_;
};

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  const CudaApi& cuda = Cuda();
  HVD_CUDA_CHECK(cuda.GetDevice(&previous_));
  if (previous_ != device) {
    HVD_CUDA_CHECK(cuda.SetDevice(device));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  // Best effort: a destructor must not throw, and the device was valid.
  if (changed_) Cuda().SetDevice(previous_);
}

EventPool::~EventPool() {
  const GpuLibraries& g = Gpu();
  if (!g.cuda_ok()) return;
  // At process exit the runtime may already be unloading; errors are moot.
  for (cudaEvent_t e : free_) g.cuda.EventDestroy(e);
}

cudaEvent_t EventPool::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  DeviceGuard guard(device_);
  cudaEvent_t e = nullptr;
  HVD_CUDA_CHECK(Cuda().EventCreateWithFlags(&e, HVD_CUDA_EVENT_DISABLE_TIMING));
  return e;
}

void EventPool::Release(cudaEvent_t event) {
  if (!event) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(event);
}

cudaStream_t CreateEngineStream() {
  const CudaApi& cuda = Cuda();
  cudaStream_t stream = nullptr;
  int least = 0, greatest = 0;
  if (cuda.StreamCreateWithPriority && cuda.DeviceGetStreamPriorityRange &&
      cuda.DeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess) {
    HVD_CUDA_CHECK(
        cuda.StreamCreateWithPriority(&stream, HVD_CUDA_STREAM_NON_BLOCKING, greatest));
  } else {
    HVD_CUDA_CHECK(cuda.StreamCreateWithFlags(&stream, HVD_CUDA_STREAM_NON_BLOCKING));
  }
  return stream;
}

std::unique_ptr<ReadyEvent> RecordReadyEvent(const std::shared_ptr<EventPool>& pool,
                                             cudaStream_t stream) {
  // The API thread's current device need not be the tensor's; stream 0 (torch's
  // default stream) is the legacy stream of the current device.
  DeviceGuard guard(pool->device());
  cudaEvent_t e = pool->Acquire();
  cudaError_t rc = Cuda().EventRecord(e, stream);
  if (rc != cudaSuccess) {
    pool->Release(e);
    ThrowCudaError(rc, "cudaEventRecord(event, producer stream)", __FILE__, __LINE__);
  }
  return std::make_unique<PooledReadyEvent>(pool, e);
}

std::shared_ptr<DeviceCompletion> RecordCompletion(
    const std::shared_ptr<EventPool>& pool, cudaStream_t stream, std::string what,
    std::vector<std::shared_ptr<AsyncErrorSource>> sources) {
  DeviceGuard guard(pool->device());
  cudaEvent_t e = pool->Acquire();
  cudaError_t rc = Cuda().EventRecord(e, stream);
  if (rc != cudaSuccess) {
    pool->Release(e);
    ThrowCudaError(rc, "cudaEventRecord(event, engine stream)", __FILE__, __LINE__);
  }
  return std::make_shared<EventCompletion>(pool, e, std::move(what), std::move(sources));
}

void DrainStream(const std::shared_ptr<EventPool>& pool, cudaStream_t stream,
                 const std::vector<std::shared_ptr<AsyncErrorSource>>& sources,
                 const std::string& what) {
  auto done = RecordCompletion(pool, stream, what, sources);
  Status s = done->Wait();
  if (!s.ok()) throw LibraryError(s.message);
}

}  // namespace hvdcompat
