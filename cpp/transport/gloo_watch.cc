#include "transport/gloo_watch.h"

#include <algorithm>

#include "core/common.h"
#include "core/logging.h"
#include "gloo/context.h"
#include "gloo/transport/tcp/pair.h"

namespace hvdcompat {

GlooWatch::GlooWatch() : thread_([this] { Loop(); }) {}

GlooWatch::~GlooWatch() { Stop(); }

void GlooWatch::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void GlooWatch::Watch(const std::shared_ptr<gloo::Context>& ctx, std::vector<int> ranks,
                      std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry e;
  e.ctx = ctx;
  e.key = ctx.get();
  e.ranks = std::move(ranks);
  e.what = std::move(what);
  entries_.push_back(std::move(e));
}

void GlooWatch::Forget(const gloo::Context* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const Entry& e) { return e.key == ctx; }),
                 entries_.end());
}

std::vector<int> GlooWatch::ClosedPeers(gloo::Context& ctx) {
  std::vector<int> closed;
  for (int i = 0; i < ctx.size; ++i) {
    if (i == ctx.rank) continue;
    auto& pair = ctx.getPair(i);
    if (pair && !pair->isConnected()) closed.push_back(i);
  }
  return closed;
}

namespace {

// Pair::signalExceptionExternal (what Gloo itself calls when a wait times
// out) is protected; a member pointer named through a derived class reaches it.
struct PairAccess : gloo::transport::tcp::Pair {
  static constexpr auto kSignal = &PairAccess::signalExceptionExternal;
};

}  // namespace

void GlooWatch::Abort(gloo::Context& ctx, const std::string& why) {
  for (int i = 0; i < ctx.size; ++i) {
    if (i == ctx.rank) continue;
    auto& pair = ctx.getPair(i);
    auto* tcp = pair ? dynamic_cast<gloo::transport::tcp::Pair*>(pair.get()) : nullptr;
    // Keeps the first exception where the pair already failed.
    if (tcp) (tcp->*PairAccess::kSignal)(why);
  }
}

bool GlooWatch::Look(Entry* e, gloo::Context& ctx) {
  if (!e->lost.empty()) return true;
  e->lost = ClosedPeers(ctx);
  if (e->lost.empty()) return false;
  for (int i : e->lost) {
    if (i < static_cast<int>(e->ranks.size())) lost_ranks_.insert(e->ranks[i]);
  }
  if (!e->doomed) {
    e->doomed = true;
    e->abort_at = std::chrono::steady_clock::now() + kAbortGrace;
  }
  return true;
}

std::string GlooWatch::AbortMessage(const Entry& e) {
  std::vector<int> lost;
  for (int i : e.lost) lost.push_back(i < static_cast<int>(e.ranks.size()) ? e.ranks[i] : i);
  if (lost.empty()) {
    return "hvdcompat ended this rank's waits on " + e.what +
           " after a collective failed on it (its peers would wait forever)";
  }
  return "rank(s) " + JoinInts(lost) + " of " + e.what +
         " were lost (their connections closed: the process exited or was killed, or its host "
         "went away); hvdcompat ended the waits on them";
}

std::vector<int> GlooWatch::Lost(const std::shared_ptr<gloo::Context>& ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& e : entries_) {
    if (e.key != ctx.get()) continue;
    if (!e.aborted) Look(&e, *ctx);
    if (!e.doomed) {
      e.doomed = true;
      e.abort_at = std::chrono::steady_clock::now() + kAbortGrace;
    }
    cv_.notify_all();
    return e.lost;
  }
  return ClosedPeers(*ctx);
}

std::vector<int> GlooWatch::LostRanks() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<int>(lost_ranks_.begin(), lost_ranks_.end());
}

void GlooWatch::Loop() {
  pthread_setname_np(pthread_self(), "hvd-gloo-watch");
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, kLookInterval, [&] { return stop_; });
    if (stop_) break;
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::pair<std::shared_ptr<gloo::Context>, std::string>> to_abort;
    for (auto it = entries_.begin(); it != entries_.end();) {
      std::shared_ptr<gloo::Context> ctx = it->ctx.lock();
      if (!ctx) {
        it = entries_.erase(it);
        continue;
      }
      if (!it->aborted) {
        Look(&*it, *ctx);
        if (it->doomed && now >= it->abort_at) {
          it->aborted = true;
          to_abort.emplace_back(ctx, AbortMessage(*it));
        }
      }
      ++it;
    }
    if (to_abort.empty()) continue;
    lock.unlock();
    for (auto& [ctx, why] : to_abort) {
      HVD_LOG(kDebug) << "Gloo: " << why;
      Abort(*ctx, why);
    }
    to_abort.clear();  // the contexts' last references may go here, outside mu_
    lock.lock();
  }
}

}  // namespace hvdcompat
