// Noticing lost peers on the Gloo controller, and ending waits that would
// never complete (Note [Lost peers on Gloo], Note [Silent peers on Gloo]).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
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
// that finds closed connections records those peers as lost (Note [Who
// closed first] says which of them), and after a grace (kAbortGrace) every
// pair of that context is failed on purpose, which ends this rank's pending
// waits and closes its connections, so the peers that wait on this rank fail
// too (MPI's revoke, done with sockets). Errors then name the lost ranks (the
// worker asks Lost()), not an address. A context is forgotten before it is
// shut down on purpose (a removed process set, the end of the job), so the
// peers closing theirs is no loss. Abort() also ends waits on a peer that is
// alive but stopped (hvd.shutdown's bound).
//
// Note [Who closed first]
// A survivor that revokes closes its connections too, so a survivor that
// looks late (its watch did not run in time: a loaded machine, a process
// held by SIGSTOP or a debugger) finds the dead rank's connections and the
// revoking survivor's closed, and must not blame the live one (its error
// would name the wrong host; an elastic reset would not wait for it). The
// kernel knows who closed first, so the watch keeps a descriptor of its own
// on every connection (a dup: the connection outlives Gloo's close of its
// socket) and reads TCP_INFO from it: whether the peer closed the connection
// (its FIN or reset came; this does not wait for Gloo's loop to read the end,
// so a look never sees the revoke without the death that caused it) and how
// long ago anything last arrived on it, which for a closed one is the FIN's
// arrival. A dead rank's connections all close at its death. A survivor's
// close no earlier than kAbortGrace after it found the loss, which is no
// earlier than the death: the watch keeps its descriptors of a context in
// which it found a loss open until then, also when the context is forgotten
// or freed sooner (a fast elastic reset; a failed job's shutdown waits for
// it, at most the grace), and ends them with a FIN (unread data dropped
// first: a reset carries no arrival time). So a look that finds
// several closed peers blames those closed within kRevokeLag (half the
// grace) of the first, and takes the later ones for survivors ending their
// waits. Chosen over a message from the revoking rank (it would need bytes
// outside Gloo's stream, or a store the engine calls only from the API
// thread) and over the watch's own clock (the late look is the problem).
// Limits: a closure the kernel cannot time (no descriptor of ours: the dup
// failed, e.g. at the process's descriptor limit) is blamed; a survivor that
// ends without shutting down (os._exit, killed, or a job whose shutdown left
// a wait on a stopped peer, whose contexts are never freed) closes at once;
// a FIN that waited behind data this rank had not read (its receive buffer
// full, the sender's kernel holding the rest) arrives only when the data is
// read, so such a closure looks later than it was and the order may come out
// wrong; a second rank dying more than kRevokeLag after the first
// is not named (the elastic reset waits for it as for a rank not seen lost).
// Whatever the blame, the elastic reset never drops a live rank (Note
// [Elastic reset on Gloo]).
//
// Note [Silent peers on Gloo]
// A host that goes down or drops off the network closes nothing: without
// more, its peers would wait until Gloo's own timeout or forever. So every
// watched connection gets TCP keepalives (first probe after a quarter of the
// peer timeout, then every second), and every kListenInterval the watch reads
// from the kernel (TCP_INFO) how long ago each connection last received
// anything, data or an acknowledgement. A peer's silence is the shortest of those over all its
// connections; a peer silent for longer than the peer timeout
// (HVDCOMPAT_GLOO_PEER_TIMEOUT_SECONDS) is lost on every context at once.
// Liveness is the peer's kernel's, not its process's: a process busy for
// minutes outside collectives, or stopped (SIGSTOP, a debugger), still
// acknowledges, so it is never lost here (a stopped one is hvd.shutdown's
// case, above; one that never submits is the stall inspector's). Survivors
// do not notice at the same moment (each connection's last receipt differs
// by up to the keepalive period), so a survivor that aborts first closes its
// sockets while the others still wait on the silent host; a look that finds
// closed pairs therefore blames the peers already silent for longer than a
// live one can be (kSuspectAfter past the keepalive period) when there are
// any, and the closers only when there are none. Only open connections can
// be silent: one its peer closed counts as closed (so a rank that was itself
// stopped for a while does not take the revoking survivors, whose closed
// connections no longer answer its keepalives, for silent ones).
class GlooWatch {
 public:
  static constexpr std::chrono::milliseconds kLookInterval{100};
  static constexpr std::chrono::milliseconds kAbortGrace{800};
  // Closures this long after the first are survivors' (Note [Who closed first]).
  static constexpr std::chrono::milliseconds kRevokeLag{kAbortGrace / 2};
  // Keepalive probes after the first one go out this often.
  static constexpr std::chrono::seconds kProbeInterval{1};
  // How often the watch reads every connection's silence (a system call each).
  static constexpr std::chrono::milliseconds kListenInterval{500};

  // `peer_timeout`: how long a peer may be silent before it is lost (Note
  // [Silent peers on Gloo]); zero turns the check and the keepalives off.
  explicit GlooWatch(std::chrono::milliseconds peer_timeout = std::chrono::milliseconds(0));
  ~GlooWatch();
  GlooWatch(const GlooWatch&) = delete;
  GlooWatch& operator=(const GlooWatch&) = delete;

  // Watches `ctx`, whose member i is global rank ranks[i]; `what` names it in
  // messages ("process set 2"). Turns on the keepalives of its connections.
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
  // Milliseconds since the connection to each member of `ctx` last received
  // anything (-1 for this rank and closed connections), from the kernel.
  static std::vector<int64_t> Silences(gloo::Context& ctx);
  // Fails every pair of `ctx` with `why`: its pending and later calls throw.
  static void Abort(gloo::Context& ctx, const std::string& why);
  // Ends the thread (idempotent); contexts are left as they are.
  void Stop();

 private:
  using Time = std::chrono::steady_clock::time_point;
  struct Entry {
    std::weak_ptr<gloo::Context> ctx;
    const gloo::Context* key;
    std::vector<int> ranks;
    std::string what;
    std::vector<int> lost;       // members first found lost
    bool silent = false;         // ... because nothing was heard from them
    bool doomed = false;         // abort at `abort_at`
    Time abort_at;
    bool aborted = false;
    // The watch's own descriptor of each member's connection, -1 for none
    // (Note [Who closed first]).
    std::vector<int> socks;
  };
  // Connections to end at a time (Note [Who closed first]).
  struct Closing {
    Time at;
    std::vector<int> socks;
  };
  void Loop();
  // Each peer's silence over every watched connection (mu_ held).
  void Listen();
  // Records what `e` finds (mu_ held); true when it found lost members.
  bool Look(Entry* e, gloo::Context& ctx);
  // The members whose connections closed first (Note [Who closed first]).
  std::vector<int> FirstClosed(const Entry& e, gloo::Context& ctx) const;
  // Lets go of `e`'s descriptors as it is forgotten (mu_ held): at once, or
  // at its abort time when a loss was found in it.
  void Release(Entry* e);
  std::string AbortMessage(const Entry& e) const;
  void KeepAlive(gloo::Context& ctx) const;

  const std::chrono::milliseconds peer_timeout_;
  // A live peer answers a keepalive within its period; longer is suspect.
  const std::chrono::milliseconds suspect_after_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Entry> entries_;
  std::vector<Closing> closing_;
  std::set<int> lost_ranks_;          // global ranks, every context's
  std::map<int, int64_t> silence_ms_;  // global rank -> ms, when last read
  std::chrono::steady_clock::time_point heard_at_;  // when silence_ms_ was read
  std::thread thread_;
};

}  // namespace hvdcompat
