// Noticing lost peers on the Gloo controller, and ending waits that would
// never complete (Note [Lost peers on Gloo]).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace gloo {
class Context;
}

namespace hvdcompat {

// Note [Lost peers on Gloo]
// Gloo has no failure notice of its own: a peer that dies closes its TCP
// sockets, and only the calls waiting on that peer's pair fail ("Connection
// reset by peer", naming an address). A rank waiting on a live peer that
// itself failed would wait forever. So every context the engine connects is
// watched (one thread per job, a look every kLookInterval): the first look
// that finds closed pairs records those peers as lost, and after a grace
// (kAbortGrace) every pair of that context is failed on purpose, which ends
// this rank's pending waits and closes its sockets, so the peers that wait on
// this rank fail too (MPI's revoke, done with sockets). The grace keeps the
// record right: a peer closing its sockets on purpose does so only a grace
// after the loss, by when every survivor has seen the dead peer alone, since
// the dead peer's sockets close on every survivor at once. Errors then name
// the lost ranks (the worker asks Lost()), not an address. A context is
// forgotten before it is shut down on purpose (a removed process set, the
// end of the job), so the peers closing theirs is no loss. Abort() also ends
// waits on a peer that is alive but stopped (hvd.shutdown's bound).
class GlooWatch {
 public:
  static constexpr std::chrono::milliseconds kLookInterval{100};
  static constexpr std::chrono::milliseconds kAbortGrace{800};

  GlooWatch();
  ~GlooWatch();
  GlooWatch(const GlooWatch&) = delete;
  GlooWatch& operator=(const GlooWatch&) = delete;

  // Watches `ctx`, whose member i is global rank ranks[i]; `what` names it in
  // messages ("process set 2").
  void Watch(const std::shared_ptr<gloo::Context>& ctx, std::vector<int> ranks,
             std::string what);
  // Stops watching `ctx` (it is about to be shut down on purpose).
  void Forget(const gloo::Context* ctx);
  // The members of `ctx` (indices into its ranks) first found lost; looks now
  // when nothing was recorded yet. A call that found nothing still fails the
  // context's pairs after the grace: the caller's collective failed, and its
  // peers must not wait on this rank forever.
  std::vector<int> Lost(const std::shared_ptr<gloo::Context>& ctx);
  // Every global rank found lost on any context so far, sorted.
  std::vector<int> LostRanks();
  // Every member whose pair is closed now (indices), without recording.
  static std::vector<int> ClosedPeers(gloo::Context& ctx);
  // Fails every pair of `ctx` with `why`: its pending and later calls throw.
  static void Abort(gloo::Context& ctx, const std::string& why);
  // Ends the thread (idempotent); contexts are left as they are.
  void Stop();

 private:
  struct Entry {
    std::weak_ptr<gloo::Context> ctx;
    const gloo::Context* key;
    std::vector<int> ranks;
    std::string what;
    std::vector<int> lost;       // members first found lost
    bool doomed = false;         // abort at `abort_at`
    std::chrono::steady_clock::time_point abort_at;
    bool aborted = false;
  };
  void Loop();
  // Records what `e` finds (mu_ held); true when it found lost members.
  bool Look(Entry* e, gloo::Context& ctx);
  static std::string AbortMessage(const Entry& e);

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Entry> entries_;
  std::set<int> lost_ranks_;  // global ranks, every context's
  std::thread thread_;
};

}  // namespace hvdcompat
