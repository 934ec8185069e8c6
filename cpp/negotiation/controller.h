// Negotiation for one process set, backend-neutral: decides, in one
// collective cycle, which submitted tensors are ready on every rank and in
// which order all ranks execute them. Steady state uses the response cache
// (one combined word vector, no names); new or changed tensors go through the
// coordinator (gather requests to set rank 0, broadcast its responses).
//
// Note [Cycle words]: each cycle combines one vector across ranks:
//   word 0 (OR):  kNeedSlowPath | kShutdown | kSomeJoined
//   word 1 (AND): kAllJoined
//   word 2 (MAX): bytes of the largest uncached request list (gather size)
//   W words (OR): cache bits to invalidate everywhere
//   W words (AND): cache bits ready on every rank
// W is the same on every rank because caches evolve identically.
//
// Note [Tuned params in negotiation]: when the autotuner (set rank 0) picks
// new values, the next cycle carries them: rank 0 sets kParamsUpdate (and
// kNeedSlowPath) in word 0, every rank therefore takes the slow path, and the
// coordinator's response broadcast starts with the encoded TunedParams.
// Every rank gets them in the Outcome of that same cycle and applies them
// before executing its responses, so fusion plans and backend settings never
// differ between ranks. Only rank 0 can set the bit.
//
// Thread: owned and called only by the set's worker thread.
#pragma once

#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tuned_params.h"
#include "transport/control_transport.h"
#include "negotiation/coordinator.h"
#include "core/engine_stats.h"
#include "core/message.h"
#include "negotiation/response_cache.h"

namespace hvdcompat {

class Controller {
 public:
  // `stats` (shared with other sets) must outlive the controller.
  Controller(ControlTransport* transport, size_t cache_capacity, std::vector<int> global_ranks,
             int process_set_id, EngineStats* stats);

  // A request submitted on this rank, in submission order.
  void Submit(const Request& request, Clock::time_point now);
  bool HasPending() const { return !pending_.empty(); }

  struct Outcome {
    std::vector<Response> responses;  // unfused, in execution order
    bool peer_shutdown = false;       // some rank asked to shut down
    std::optional<TunedParams> params;  // apply before executing `responses`
  };
  // One collective cycle. `stall_seconds` > 0 lets requests cached-but-not-
  // ready that long go through the coordinator so the stall can be reported.
  Outcome RunCycle(bool want_shutdown, Clock::time_point now, double stall_seconds);

  const ResponseCache& cache() const { return cache_; }
  // Only on set rank 0.
  Coordinator* coordinator() { return coordinator_.get(); }
  // Set rank 0 only: sends `params` to every rank in the next cycle (Note
  // [Tuned params in negotiation]); a later call before then replaces it.
  void AnnounceParams(const TunedParams& params);
  // Cycles run so far (the same on every rank of the set).
  uint64_t cycles() const { return cycles_; }

 private:
  enum class State { kUnsent, kSent, kCached };
  struct Local {
    Request request;
    State state = State::kUnsent;
    uint32_t bit = 0;
    bool bypass_cache = false;
    Clock::time_point submitted;
  };
  using LocalList = std::list<Local>;

  // RunCycle without the timing.
  Outcome Cycle(bool want_shutdown, Clock::time_point now, double stall_seconds);
  // The steps of RunCycle, in order. `w` is the cache's word count for the
  // cycle; `invalid` and `ready` are the cycle words' bit vectors.
  // Looks up unsent requests in the cache and marks this rank's bits; returns
  // whether this rank has joined. Requests the cache cannot serve go to `to_send`.
  bool MarkLocal(Clock::time_point now, double stall_seconds, size_t w, uint64_t* invalid,
                 uint64_t* ready, std::vector<Request>* to_send);
  // Evicts the entries some rank invalidated (the same on every rank).
  void ApplyInvalidations(size_t w, const uint64_t* invalid);
  // Cached responses ready on every rank, in bit order (the fast path).
  void TakeCachedReady(size_t w, const uint64_t* invalid, const uint64_t* ready, bool some_joined,
                       std::vector<Response>* responses);
  // Gathers new requests to set rank 0, broadcasts its decisions (and any
  // announced parameters), and appends them to `out`.
  void RunSlowPath(const std::string& blob, size_t max_blob, bool params_update, Outcome* out);
  // Set rank 0: the coordinator's reply to this cycle's gathered requests.
  std::string Coordinate(const std::vector<std::string>& blobs);
  // Caches a decided response and retires the local requests it answers.
  void AcceptDecided(const Response& p);
  void Demote(uint32_t bit, bool bypass_cache);
  void Forget(const std::string& name);

  ControlTransport* transport_;
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coordinator_;
  LocalList pending_;
  std::unordered_map<std::string, LocalList::iterator> by_name_;
  EngineStats* stats_;
  std::optional<TunedParams> announce_;
  uint64_t cycles_ = 0;
};

}  // namespace hvdcompat
