#include "gpu/gpu_watchdog.h"

#include <sstream>

#include "core/logging.h"

namespace hvdcompat {

namespace {

// How often in-flight work is polled: a dead peer is noticed within this,
// and one event query per op per period costs next to nothing.
constexpr auto kPollPeriod = std::chrono::milliseconds(2);

}  // namespace

CompletionWatchdog::CompletionWatchdog(double stall_seconds)
    : stall_seconds_(stall_seconds), thread_([this] { Run(); }) {}

CompletionWatchdog::~CompletionWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CompletionWatchdog::Watch(const std::shared_ptr<DeviceCompletion>& done, std::string what,
                               std::vector<std::shared_ptr<AsyncErrorSource>> sources) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back({done, std::move(what), std::move(sources),
                      std::chrono::steady_clock::now()});
  }
  cv_.notify_all();
}

void CompletionWatchdog::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (items_.empty()) {
      cv_.wait(lock, [this] { return stop_ || !items_.empty(); });
      continue;
    }
    std::vector<Item> items = std::move(items_);
    items_.clear();
    lock.unlock();
    std::vector<Item> pending;
    const auto now = std::chrono::steady_clock::now();
    for (auto& item : items) {
      // Done() polls the sources and aborts a failed one; the completion
      // then reports the failure to whoever waits on it later.
      if (item.done->Done()) continue;
      const double waited = std::chrono::duration<double>(now - item.since).count();
      if (stall_seconds_ > 0 && waited > stall_seconds_) {
        std::ostringstream why;
        why << item.what << " made no progress on the device for " << static_cast<int>(waited)
            << " s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=" << stall_seconds_
            << "); a rank is probably stuck or gone";
        for (auto& s : item.sources) s->Abort(why.str());
        continue;  // the next look at it sees the abort
      }
      pending.push_back(std::move(item));
    }
    lock.lock();
    for (auto& item : pending) items_.push_back(std::move(item));
    if (!items_.empty()) cv_.wait_for(lock, kPollPeriod, [this] { return stop_; });
  }
}

}  // namespace hvdcompat
