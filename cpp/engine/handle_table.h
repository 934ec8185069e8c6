// Handles of in-flight ops, and the names they hold. Thread-safe: the API
// thread creates, polls and waits; workers complete. Completion never runs
// user code under the lock.
//
// A name (per process set) stays taken from Create until the caller has seen
// the op finish: Wait, or Poll returning true. The engine may finish an op
// between two API calls, and whether a repeated name is refused must not
// depend on that timing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor_entry.h"

namespace hvdcompat {

class HandleTable {
 public:
  explicit HandleTable(int64_t wait_spin_micros) : wait_spin_micros_(wait_spin_micros) {}

  // Returned by Create when another handle holds the name.
  static constexpr int kNameTaken = -1;

  // A new handle holding `name` on `process_set`, or kNameTaken.
  int Create(int process_set, const std::string& name);
  // Frees the names held on a removed set (its id may be given to a new
  // set); their handles stay valid.
  void ReleaseNames(int process_set);
  // Marks the handle done with `result`; wakes waiters. Unknown handles are
  // ignored (already released).
  void Complete(int handle, HandleResult result);
  // Never blocks. True frees the handle's name.
  bool Poll(int handle);
  // Blocks until done, then removes the handle and returns its result. The
  // caller must not hold the GIL. Throws InvalidArgument for unknown handles
  // and for a handle another thread is already waiting on (one waiter per
  // handle: the result is moved out once).
  HandleResult Wait(int handle);
  // Forgets a handle (and frees its name) whose op was never enqueued.
  void Discard(int handle);

  // Handles whose op finished but that nobody has waited on: they keep
  // their results (outputs) until the runtime goes. `names` gets up to
  // `max_names` of them, oldest first.
  size_t Unsynchronized(std::vector<std::string>* names, size_t max_names) const;

  // Complete logs a warning each time the unsynchronized count reaches this,
  // then twice as many, and so on.
  static constexpr size_t kUnsynchronizedWarning = 10000;

 private:
  using NameKey = std::pair<int, std::string>;  // (process set, full name)
  struct State {
    std::atomic<bool> done{false};
    bool waited = false;  // under mu_: a thread is in (or past) Wait
    HandleResult result;
    NameKey name;
  };
  std::shared_ptr<State> Find(int handle) const;
  // Under mu_: frees `state`'s name unless another handle took it since.
  void ReleaseNameLocked(int handle, const State& state);

  int64_t wait_spin_micros_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<int, std::shared_ptr<State>> states_;
  std::map<NameKey, int> names_;  // name -> the handle holding it
  int next_ = 0;
  // Under mu_: done handles not yet waited on, and the count that warns next.
  size_t unsynchronized_ = 0;
  size_t warn_at_ = kUnsynchronizedWarning;
};

}  // namespace hvdcompat
