#include "engine/handle_table.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

#include "core/logging.h"

namespace hvdcompat {

int HandleTable::Create(int process_set, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  NameKey key(process_set, name);
  if (names_.count(key)) return kNameTaken;
  int h = next_++;
  if (next_ < 0) next_ = 0;  // wrap-around after 2^31 handles
  auto state = std::make_shared<State>();
  state->name = key;
  states_[h] = std::move(state);
  names_[std::move(key)] = h;
  return h;
}

void HandleTable::ReleaseNameLocked(int handle, const State& state) {
  auto it = names_.find(state.name);
  if (it != names_.end() && it->second == handle) names_.erase(it);
}

void HandleTable::ReleaseNames(int process_set) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = names_.begin(); it != names_.end();) {
    it = it->first.first == process_set ? names_.erase(it) : std::next(it);
  }
}

std::shared_ptr<HandleTable::State> HandleTable::Find(int handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(handle);
  return it == states_.end() ? nullptr : it->second;
}

void HandleTable::Complete(int handle, HandleResult result) {
  auto s = Find(handle);
  if (!s) return;
  s->result = std::move(result);
  size_t warn = 0;
  {
    // Publish under the lock so a waiter cannot miss the notification.
    std::lock_guard<std::mutex> lock(mu_);
    s->done.store(true, std::memory_order_release);
    if (!s->waited && ++unsynchronized_ >= warn_at_) {
      warn = unsynchronized_;
      warn_at_ *= 2;
    }
  }
  cv_.notify_all();
  if (warn) {
    std::vector<std::string> names;
    Unsynchronized(&names, 3);
    std::string listed;
    for (const auto& n : names) listed += (listed.empty() ? "'" : ", '") + n + "'";
    HVD_LOG(kWarning) << warn << " finished operations have never been synchronized (for example "
                      << listed << "); each keeps its output until hvd.shutdown(). Call "
                      << "hvd.synchronize() on every handle an *_async call returns.";
  }
}

size_t HandleTable::Unsynchronized(std::vector<std::string>* names, size_t max_names) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (names) {
    std::vector<std::pair<int, std::string>> found;  // (handle, name): handles grow with age
    for (const auto& [h, s] : states_) {
      if (!s->waited && s->done.load(std::memory_order_acquire)) found.emplace_back(h, s->name.second);
    }
    std::sort(found.begin(), found.end());
    for (size_t i = 0; i < found.size() && i < max_names; ++i) names->push_back(found[i].second);
  }
  return unsynchronized_;
}

bool HandleTable::Poll(int handle) {
  auto s = Find(handle);
  if (!s) throw InvalidArgument("poll: handle " + std::to_string(handle) +
                                " is unknown (never created, or already synchronized)");
  if (!s->done.load(std::memory_order_acquire)) return false;
  // Device ops are done once their device work is (or failed).
  std::shared_ptr<DeviceCompletion> device_done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    device_done = s->result.device_done;
  }
  if (device_done && !device_done->Done()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseNameLocked(handle, *s);
  return true;
}

HandleResult HandleTable::Wait(int handle) {
  auto s = Find(handle);
  if (!s) throw InvalidArgument("synchronize: handle " + std::to_string(handle) +
                                " is unknown (never created, or already synchronized)");
  // A short spin catches fast collectives without a sleep/wake round trip.
  auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(wait_spin_micros_);
  while (!s->done.load(std::memory_order_acquire) &&
         std::chrono::steady_clock::now() < spin_until) {
    sched_yield();
  }
  HandleResult result;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (s->waited) {
      throw InvalidArgument("synchronize: handle " + std::to_string(handle) + " ('" +
                            s->name.second + "') is already being synchronized by another "
                            "thread; its result goes to that thread. Synchronize each handle "
                            "once, from one thread.");
    }
    s->waited = true;
    if (s->done.load(std::memory_order_acquire)) --unsynchronized_;
    cv_.wait(lock, [&] { return s->done.load(std::memory_order_acquire); });
    states_.erase(handle);
    ReleaseNameLocked(handle, *s);
    // Under the lock: Poll may be reading the result's device completion.
    result = std::move(s->result);
  }
  return result;
}

void HandleTable::Discard(int handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(handle);
  if (it == states_.end()) return;
  ReleaseNameLocked(handle, *it->second);
  if (!it->second->waited && it->second->done.load(std::memory_order_acquire)) --unsynchronized_;
  states_.erase(it);
}

}  // namespace hvdcompat
