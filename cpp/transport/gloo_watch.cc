#include "transport/gloo_watch.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "core/common.h"
#include "core/logging.h"
#include "gloo/context.h"
#include "gloo/transport/tcp/pair.h"

namespace hvdcompat {

namespace {

// The first keepalive probe of a quiet connection: a quarter of the peer
// timeout, in whole seconds (the kernel's unit), at least one.
std::chrono::seconds KeepaliveIdle(std::chrono::milliseconds peer_timeout) {
  return std::max<std::chrono::seconds>(
      std::chrono::seconds(1), std::chrono::duration_cast<std::chrono::seconds>(peer_timeout / 4));
}

std::string Seconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << static_cast<double>(ms.count()) / 1000.0;
  return os.str();
}

std::chrono::milliseconds SuspectAfter(std::chrono::milliseconds peer_timeout) {
  return std::min<std::chrono::milliseconds>(
      peer_timeout, KeepaliveIdle(peer_timeout) + 2 * GlooWatch::kProbeInterval);
}

}  // namespace

GlooWatch::GlooWatch(std::chrono::milliseconds peer_timeout)
    : peer_timeout_(peer_timeout),
      suspect_after_(SuspectAfter(peer_timeout)),
      thread_([this] { Loop(); }) {}

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
  if (peer_timeout_.count() > 0) KeepAlive(*ctx);
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
// out), the pair's lock, state and socket are protected; member pointers
// named through a derived class reach them.
struct PairAccess : gloo::transport::tcp::Pair {
  static constexpr auto kSignal = &PairAccess::signalExceptionExternal;

  // Calls fn(socket) under the pair's lock while it is connected (Gloo closes
  // the socket only under that lock); false when it is not.
  template <typename Fn>
  static bool WithSocket(gloo::transport::Pair* any, Fn&& fn) {
    auto* pair = dynamic_cast<gloo::transport::tcp::Pair*>(any);
    if (pair == nullptr) return false;
    std::lock_guard<std::mutex> lock(pair->*(&PairAccess::m_));
    const int fd = pair->*(&PairAccess::fd_);
    if (pair->*(&PairAccess::state_) != CONNECTED || fd < 0) return false;
    fn(fd);
    return true;
  }
};

}  // namespace

void GlooWatch::KeepAlive(gloo::Context& ctx) const {
  const int idle = static_cast<int>(KeepaliveIdle(peer_timeout_).count());
  const int interval = static_cast<int>(kProbeInterval.count());
  // The kernel's own end of a connection that never answers comes long after
  // ours (Note [Silent peers on Gloo]); 127 is the most it takes.
  const int count = 127;
  const int on = 1;
  for (int i = 0; i < ctx.size; ++i) {
    if (i == ctx.rank) continue;
    PairAccess::WithSocket(ctx.getPair(i).get(), [&](int fd) {
      if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0 ||
          setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
          setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval)) != 0 ||
          setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count)) != 0) {
        HVD_LOG(kWarning) << "Gloo: could not turn on TCP keepalives toward member " << i
                          << " (" << std::strerror(errno) << "); a silent peer there is not "
                          << "noticed (HVDCOMPAT_GLOO_PEER_TIMEOUT_SECONDS)";
      }
    });
  }
}

std::vector<int64_t> GlooWatch::Silences(gloo::Context& ctx) {
  std::vector<int64_t> out(ctx.size, -1);
  for (int i = 0; i < ctx.size; ++i) {
    if (i == ctx.rank) continue;
    PairAccess::WithSocket(ctx.getPair(i).get(), [&](int fd) {
      tcp_info info{};
      socklen_t len = sizeof(info);
      if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return;
      out[i] = std::min(info.tcpi_last_data_recv, info.tcpi_last_ack_recv);
    });
  }
  return out;
}

void GlooWatch::Abort(gloo::Context& ctx, const std::string& why) {
  for (int i = 0; i < ctx.size; ++i) {
    if (i == ctx.rank) continue;
    auto& pair = ctx.getPair(i);
    auto* tcp = pair ? dynamic_cast<gloo::transport::tcp::Pair*>(pair.get()) : nullptr;
    // Keeps the first exception where the pair already failed.
    if (tcp) (tcp->*PairAccess::kSignal)(why);
  }
}

void GlooWatch::Listen() {
  if (peer_timeout_.count() <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - heard_at_ < kListenInterval) return;  // silences read at most that long ago
  heard_at_ = now;
  silence_ms_.clear();
  for (auto& e : entries_) {
    std::shared_ptr<gloo::Context> ctx = e.ctx.lock();
    if (!ctx || e.aborted) continue;
    const std::vector<int64_t> quiet = Silences(*ctx);
    for (int i = 0; i < static_cast<int>(quiet.size()); ++i) {
      if (quiet[i] < 0 || i >= static_cast<int>(e.ranks.size())) continue;
      auto it = silence_ms_.find(e.ranks[i]);
      if (it == silence_ms_.end()) {
        silence_ms_[e.ranks[i]] = quiet[i];
      } else {
        it->second = std::min(it->second, quiet[i]);
      }
    }
  }
}

bool GlooWatch::Look(Entry* e, gloo::Context& ctx) {
  if (!e->lost.empty()) return true;
  // Note [Silent peers on Gloo]: the silent, and the suspects where pairs closed.
  std::vector<int> suspects;
  bool silent = false;
  for (int i = 0; i < static_cast<int>(e->ranks.size()) && i < ctx.size; ++i) {
    auto it = silence_ms_.find(e->ranks[i]);
    if (i == ctx.rank || it == silence_ms_.end()) continue;
    silent = silent || it->second > peer_timeout_.count();
    if (it->second > suspect_after_.count()) suspects.push_back(i);
  }
  if (silent) {
    e->lost = suspects;
    e->silent = true;
  } else {
    e->lost = ClosedPeers(ctx);
    if (!e->lost.empty() && !suspects.empty()) {
      e->lost = suspects;
      e->silent = true;
    }
  }
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

std::string GlooWatch::AbortMessage(const Entry& e) const {
  std::vector<int> lost;
  for (int i : e.lost) lost.push_back(i < static_cast<int>(e.ranks.size()) ? e.ranks[i] : i);
  if (lost.empty()) {
    return "hvdcompat ended this rank's waits on " + e.what +
           " after a collective failed on it (its peers would wait forever)";
  }
  if (e.silent) {
    return "rank(s) " + JoinInts(lost) + " of " + e.what + " were lost (nothing was heard from " +
           "them for " + Seconds(peer_timeout_) + " s, "
           "HVDCOMPAT_GLOO_PEER_TIMEOUT_SECONDS: their host went down or dropped off the "
           "network); hvdcompat ended the waits on them";
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
    Listen();
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
