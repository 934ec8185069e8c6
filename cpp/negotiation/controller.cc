#include "negotiation/controller.h"

#include "core/logging.h"

namespace hvdcompat {

namespace {
constexpr uint64_t kNeedSlowPath = 1u << 0;
constexpr uint64_t kShutdown = 1u << 1;
constexpr uint64_t kSomeJoined = 1u << 2;
constexpr uint64_t kParamsUpdate = 1u << 3;
constexpr uint64_t kAllJoined = 1u << 0;

bool TestBit(const uint64_t* words, uint32_t bit) { return (words[bit / 64] >> (bit % 64)) & 1; }
void SetBit(uint64_t* words, uint32_t bit) { words[bit / 64] |= uint64_t{1} << (bit % 64); }
}  // namespace

Controller::Controller(ControlTransport* transport, size_t cache_capacity,
                       std::vector<int> global_ranks, int process_set_id, EngineStats* stats)
    : transport_(transport), cache_(cache_capacity), stats_(stats) {
  if (transport_->rank() == 0) {
    coordinator_ = std::make_unique<Coordinator>(transport_->size(), std::move(global_ranks),
                                                 process_set_id);
  }
}

void Controller::Submit(const Request& request, Clock::time_point now) {
  HVD_ENFORCE(!by_name_.count(request.name), "duplicate pending name " << request.name);
  Local l;
  l.request = request;
  l.request.rank = transport_->rank();
  l.submitted = now;
  pending_.push_back(std::move(l));
  by_name_[request.name] = std::prev(pending_.end());
}

void Controller::AnnounceParams(const TunedParams& params) {
  HVD_ENFORCE(coordinator_, "only set rank 0 announces tuned parameters");
  announce_ = params;
}

void Controller::Demote(uint32_t bit, bool bypass_cache) {
  for (auto& l : pending_) {
    if (l.state == State::kCached && l.bit == bit) {
      l.state = State::kUnsent;
      l.bypass_cache = l.bypass_cache || bypass_cache;
    }
  }
}

void Controller::Forget(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return;
  pending_.erase(it->second);
  by_name_.erase(it);
}

Controller::Outcome Controller::RunCycle(bool want_shutdown, Clock::time_point now,
                                         double stall_seconds) {
  const auto start = Clock::now();
  Outcome out = Cycle(want_shutdown, now, stall_seconds);
  stats_->negotiation_ns +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  return out;
}

Controller::Outcome Controller::Cycle(bool want_shutdown, Clock::time_point now,
                                      double stall_seconds) {
  ++stats_->cycles;
  ++cycles_;
  // Note [Cycle words].
  const size_t w = cache_.NumWords();
  std::vector<uint64_t> words(FlagWords::Size(w), 0);
  uint64_t* invalid = words.data() + FlagWords::kHeader;
  uint64_t* ready = invalid + w;

  std::vector<Request> to_send;
  const bool joined = MarkLocal(now, stall_seconds, w, invalid, ready, &to_send);
  const std::string blob = to_send.empty() ? std::string() : EncodeRequests(to_send);
  words[FlagWords::kOr] = (to_send.empty() ? 0 : kNeedSlowPath) | (want_shutdown ? kShutdown : 0) |
                          (joined ? kSomeJoined : 0) |
                          (announce_ ? kParamsUpdate | kNeedSlowPath : 0);
  words[FlagWords::kAnd] = joined ? kAllJoined : 0;
  words[FlagWords::kMax] = blob.size();

  stats_->flag_bytes += words.size() * sizeof(uint64_t);
  transport_->CombineFlags(words);

  Outcome out;
  out.peer_shutdown = (words[FlagWords::kOr] & kShutdown) != 0;
  const bool some_joined = (words[FlagWords::kOr] & kSomeJoined) != 0;
  const bool all_joined = (words[FlagWords::kAnd] & kAllJoined) != 0;

  // Invalidations first: every rank evicts the same entries.
  ApplyInvalidations(w, invalid);
  if (!all_joined) TakeCachedReady(w, invalid, ready, some_joined, &out.responses);
  if (words[FlagWords::kOr] & kNeedSlowPath) {
    RunSlowPath(blob, words[FlagWords::kMax], (words[FlagWords::kOr] & kParamsUpdate) != 0, &out);
  }
  return out;
}

bool Controller::MarkLocal(Clock::time_point now, double stall_seconds, size_t w,
                           uint64_t* invalid, uint64_t* ready, std::vector<Request>* to_send) {
  bool joined = false;
  for (auto& l : pending_) {
    if (l.state == State::kUnsent) {
      uint32_t bit = 0;
      auto st = (l.bypass_cache || !ResponseCache::Cacheable(l.request))
                    ? ResponseCache::State::kMiss
                    : cache_.Lookup(l.request, &bit);
      if (st == ResponseCache::State::kHit) {
        l.state = State::kCached;
        l.bit = bit;
      } else {
        if (st == ResponseCache::State::kInvalid) SetBit(invalid, bit);
        if (ResponseCache::Cacheable(l.request)) ++stats_->cache_misses;
        l.state = State::kSent;
        to_send->push_back(l.request);
      }
    }
    if (l.state == State::kCached) {
      double waited = std::chrono::duration<double>(now - l.submitted).count();
      if (stall_seconds > 0 && waited >= stall_seconds) {
        // Route it through the coordinator, which can name the missing ranks.
        SetBit(invalid, l.bit);
      } else {
        SetBit(ready, l.bit);
      }
    }
    if (l.request.op == OpType::kJoin && l.state == State::kSent) joined = true;
  }
  if (joined) {
    // A joined rank is ready for every cached entry: allreduces run with its
    // zeros, and any other op, once ready on the others, is sent below to the
    // coordinator, which fails it ("not supported while joined"). Marking
    // only allreduces left cached allgathers/broadcasts/... waiting forever.
    for (uint32_t bit = 0; bit < w * 64; ++bit) {
      if (cache_.Has(bit)) SetBit(ready, bit);
    }
  }
  return joined;
}

void Controller::ApplyInvalidations(size_t w, const uint64_t* invalid) {
  for (uint32_t bit = 0; bit < w * 64; ++bit) {
    if (TestBit(invalid, bit) && cache_.Has(bit)) {
      cache_.Erase(bit);
      Demote(bit, false);
    }
  }
}

void Controller::TakeCachedReady(size_t w, const uint64_t* invalid, const uint64_t* ready,
                                 bool some_joined, std::vector<Response>* responses) {
  for (uint32_t bit = 0; bit < w * 64; ++bit) {
    if (!TestBit(ready, bit) || TestBit(invalid, bit) || !cache_.Has(bit)) continue;
    const Response& cached = cache_.Get(bit);
    if (some_joined && cached.op != OpType::kAllreduce) {
      // Not allowed during join: let the coordinator produce the error.
      Demote(bit, true);
      continue;
    }
    responses->push_back(cached);
    cache_.Touch(bit);
    ++stats_->cache_hits;
    auto it = by_name_.find(cached.units[0].name);
    if (it != by_name_.end() && it->second->state == State::kCached) Forget(cached.units[0].name);
  }
}

// Note [Negotiation cost]: a cycle costs every rank one combine of
// FlagWords::Size(W) words (W = cache words, a bit per cached tensor), whatever
// the number of ranks. Only a cycle with new or changed requests (the first
// iteration, a cache miss, a stall report) also gathers request lists on set
// rank 0, which decodes, checks and answers them: work and bytes there grow
// with ranks x requests, once. The counters in EngineStats measure both
// (docs/scaling.md); bytes are payload (the MPI transport pads every rank's
// slot of the gather to the longest list).
void Controller::RunSlowPath(const std::string& blob, size_t max_blob, bool params_update,
                             Outcome* out) {
  ++stats_->slow_path_cycles;
  std::vector<std::string> all;
  transport_->GatherBlobs(blob, max_blob, &all);
  std::string reply;
  if (coordinator_) {
    const auto start = Clock::now();
    reply = Coordinate(all);
    stats_->coordinator_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
        Clock::now() - start).count();
    for (const auto& b : all) stats_->coordinator_in_bytes += b.size();
    stats_->coordinator_out_bytes += reply.size();
  }
  transport_->BroadcastBlob(&reply);
  size_t skip = 0;
  if (params_update) {
    out->params = DecodeTunedParams(reply.data(), reply.size());
    skip = kTunedParamsBytes;
  }
  for (auto& p : DecodeResponses(reply.data() + skip, reply.size() - skip)) {
    AcceptDecided(p);
    out->responses.push_back(std::move(p));
  }
}

std::string Controller::Coordinate(const std::vector<std::string>& blobs) {
  // The cycle's `now` is when it started; the combine may have waited long
  // for late ranks, and the stall clock of a request starts when it reaches
  // the coordinator, not before.
  const Clock::time_point arrived = Clock::now();
  for (const auto& b : blobs) {
    if (b.empty()) continue;
    for (auto& q : DecodeRequests(b.data(), b.size())) coordinator_->Add(std::move(q), arrived);
  }
  std::string reply = EncodeResponses(coordinator_->TakeReady());
  if (announce_) {
    reply = EncodeTunedParams(*announce_) + reply;
    announce_.reset();
  }
  return reply;
}

void Controller::AcceptDecided(const Response& p) {
  if (cache_.enabled() && ResponseCache::Cacheable(p)) {
    std::vector<uint32_t> evicted;
    cache_.Put(p, &evicted);
    for (uint32_t bit : evicted) Demote(bit, false);
  }
  if (p.op == OpType::kJoin) {
    // Each rank's join request is pending under its own name.
    for (const auto& l : pending_) {
      if (l.request.op == OpType::kJoin) {
        Forget(l.request.name);
        break;
      }
    }
    return;
  }
  for (const auto& u : p.units) {
    auto it = by_name_.find(u.name);
    if (it != by_name_.end() && it->second->state == State::kSent) Forget(u.name);
  }
}

}  // namespace hvdcompat
