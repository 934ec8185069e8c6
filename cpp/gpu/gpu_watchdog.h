// Watches the device completions in flight when no host thread waits for
// them (HOROVOD_ENABLE_ASYNC_COMPLETION=1): see Note [GPU stream order].
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/device_sync.h"
#include "gpu/gpu_events.h"

namespace hvdcompat {

// A thread polling each watched completion until it finishes: a completion's
// poll asks its communicators for asynchronous errors and aborts a failed one
// (releasing device work stuck on a dead peer, failing the handle). One that
// makes no progress for `stall_seconds` (> 0) gets its communicators aborted
// too. Thread-safe.
class CompletionWatchdog {
 public:
  // `stall_seconds` <= 0: no stall limit (errors are still acted on).
  explicit CompletionWatchdog(double stall_seconds);
  // Stops and joins the thread; what is still in flight is the owner's to drain.
  ~CompletionWatchdog();
  CompletionWatchdog(const CompletionWatchdog&) = delete;
  CompletionWatchdog& operator=(const CompletionWatchdog&) = delete;

  // Polls `done` (describing `what`) until it finishes; `sources` are
  // aborted when it stalls.
  void Watch(const std::shared_ptr<DeviceCompletion>& done, std::string what,
             std::vector<std::shared_ptr<AsyncErrorSource>> sources);

 private:
  struct Item {
    // Held: the handle (and its completion) may be gone long before the
    // device work is, and that work is what must be released on failure.
    std::shared_ptr<DeviceCompletion> done;
    std::string what;
    std::vector<std::shared_ptr<AsyncErrorSource>> sources;
    std::chrono::steady_clock::time_point since;
  };
  void Run();

  const double stall_seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Item> items_;  // guarded by mu_
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hvdcompat
