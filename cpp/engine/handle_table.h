// Handles of in-flight ops. Thread-safe: the API thread creates, polls and
// waits; workers complete. Completion never runs user code under the lock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/tensor_entry.h"

namespace hvdcompat {

class HandleTable {
 public:
  explicit HandleTable(int64_t wait_spin_micros) : wait_spin_micros_(wait_spin_micros) {}

  int Create();
  // Marks the handle done with `result`; wakes waiters. Unknown handles are
  // ignored (already released).
  void Complete(int handle, HandleResult result);
  // Never blocks.
  bool Poll(int handle) const;
  // Blocks until done, then removes the handle and returns its result. The
  // caller must not hold the GIL. Throws InvalidArgument for unknown handles.
  HandleResult Wait(int handle);
  // Forgets a handle whose op was never enqueued.
  void Discard(int handle);

 private:
  struct State {
    std::atomic<bool> done{false};
    HandleResult result;
  };
  std::shared_ptr<State> Find(int handle) const;

  int64_t wait_spin_micros_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<int, std::shared_ptr<State>> states_;
  int next_ = 0;
};

}  // namespace hvdcompat
