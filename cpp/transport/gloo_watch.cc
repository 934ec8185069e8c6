#include "transport/gloo_watch.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "core/common.h"
#include "core/logging.h"
#include "gloo/context.h"
#include "transport/gloo_pair_socket.h"

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

GlooWatch::~GlooWatch() {
  Stop();
  std::vector<Closing> closing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : entries_) Release(&e);
    entries_.clear();
    closing.swap(closing_);
  }
  // Note [Who closed first]: the connections of a context with a loss end no
  // sooner than its abort time, also when the job is freed before it (a
  // failed job's shutdown, a fast elastic reset). This waits at most
  // kAbortGrace; a thread left to wait would die with a process that exits.
  std::sort(closing.begin(), closing.end(),
            [](const Closing& a, const Closing& b) { return a.at < b.at; });
  for (const auto& c : closing) {
    std::this_thread::sleep_until(c.at);
    for (int fd : c.socks) EndConnection(fd);
  }
}

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
  e.socks.assign(ctx->size, -1);
  for (int i = 0; i < ctx->size; ++i) {
    if (i != ctx->rank) e.socks[i] = DuplicatePairSocket(ctx->getPair(i).get());
  }
  entries_.push_back(std::move(e));
}

void GlooWatch::Release(Entry* e) {
  if (e->doomed && !e->aborted) {
    closing_.push_back({e->abort_at, std::move(e->socks)});
  } else {
    // Gloo's own socket holds the connection (or it ended already).
    for (int fd : e->socks) {
      if (fd >= 0) close(fd);
    }
  }
  e->socks.clear();
}

void GlooWatch::Forget(const gloo::Context* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->key == ctx) {
      Release(&*it);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
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

void GlooWatch::KeepAlive(gloo::Context& ctx) const {
  const int idle = static_cast<int>(KeepaliveIdle(peer_timeout_).count());
  const int interval = static_cast<int>(kProbeInterval.count());
  // The kernel's own end of a connection that never answers comes long after
  // ours (Note [Silent peers on Gloo]); 127 is the most it takes.
  const int count = 127;
  for (int i = 0; i < ctx.size; ++i) {
    if (i == ctx.rank) continue;
    if (!KeepPairAlive(ctx.getPair(i).get(), idle, interval, count)) {
      HVD_LOG(kWarning) << "Gloo: could not turn on TCP keepalives toward member " << i
                        << " (" << std::strerror(errno) << "); a silent peer there is not "
                        << "noticed (HVDCOMPAT_GLOO_PEER_TIMEOUT_SECONDS)";
    }
  }
}

std::vector<int64_t> GlooWatch::Silences(gloo::Context& ctx) {
  std::vector<int64_t> out(ctx.size, -1);
  for (int i = 0; i < ctx.size; ++i) {
    if (i != ctx.rank) out[i] = PairSilenceMs(ctx.getPair(i).get());
  }
  return out;
}

void GlooWatch::Abort(gloo::Context& ctx, const std::string& why) {
  for (int i = 0; i < ctx.size; ++i) {
    if (i != ctx.rank) FailPair(ctx.getPair(i).get(), why);
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
    e->lost = FirstClosed(*e, ctx);
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

std::vector<int> GlooWatch::FirstClosed(const Entry& e, gloo::Context& ctx) const {
  // Cheap first: Gloo's pair states (its loop has read an end).
  if (ClosedPeers(ctx).empty()) return {};
  struct Closed {
    int member;
    int64_t ago_ms;  // since the peer's FIN arrived; -1: unknown
  };
  std::vector<Closed> closed;
  int64_t first = -1;
  for (int i = 0; i < ctx.size; ++i) {
    if (i == ctx.rank) continue;
    // The kernel's view first: Gloo's loop may not have read every end yet.
    const int sock = i < static_cast<int>(e.socks.size()) ? e.socks[i] : -1;
    const bool by_peer = sock >= 0 && PeerClosedSocket(sock);
    auto& pair = ctx.getPair(i);
    if (!by_peer && !(pair && !pair->isConnected())) continue;
    const int64_t ago = by_peer ? SocketSilenceMs(sock) : -1;
    closed.push_back({i, ago});
    first = std::max(first, ago);
  }
  std::vector<int> out;
  std::vector<int> later;
  for (const auto& c : closed) {
    if (c.ago_ms < 0 || c.ago_ms + kRevokeLag.count() >= first) {
      out.push_back(c.member);
    } else {
      later.push_back(c.member);
    }
  }
  if (!later.empty()) {
    std::vector<int> ranks;
    for (int i : later) ranks.push_back(i < static_cast<int>(e.ranks.size()) ? e.ranks[i] : i);
    HVD_LOG(kDebug) << "Gloo: rank(s) " << JoinInts(ranks) << " of " << e.what
                    << " closed their connections more than " << kRevokeLag.count()
                    << " ms after the first (survivors ending their waits); not taken for lost";
  }
  return out;
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
    struct Revoke {
      std::shared_ptr<gloo::Context> ctx;
      std::string why;
      std::vector<int> socks;
    };
    std::vector<Revoke> to_abort;
    std::vector<int> to_end;
    for (auto it = closing_.begin(); it != closing_.end();) {
      if (it->at > now) {
        ++it;
        continue;
      }
      to_end.insert(to_end.end(), it->socks.begin(), it->socks.end());
      it = closing_.erase(it);
    }
    for (auto it = entries_.begin(); it != entries_.end();) {
      std::shared_ptr<gloo::Context> ctx = it->ctx.lock();
      if (!ctx) {
        Release(&*it);
        it = entries_.erase(it);
        continue;
      }
      if (!it->aborted) {
        Look(&*it, *ctx);
        if (it->doomed && now >= it->abort_at) {
          it->aborted = true;
          to_abort.push_back({ctx, AbortMessage(*it), std::move(it->socks)});
          it->socks.clear();
        }
      }
      ++it;
    }
    if (to_abort.empty() && to_end.empty()) continue;
    lock.unlock();
    for (auto& r : to_abort) {
      HVD_LOG(kDebug) << "Gloo: " << r.why;
      Abort(*r.ctx, r.why);
      // Gloo closed its sockets; the connections end with ours.
      for (int fd : r.socks) EndConnection(fd);
    }
    for (int fd : to_end) EndConnection(fd);
    to_abort.clear();  // the contexts' last references may go here, outside mu_
    lock.lock();
  }
}

}  // namespace hvdcompat
