// The Gloo controller's connections (Note [Gloo controller]): a TCP device,
// a job-wide context built through the launch's key-value store, and the
// contexts the workers run on. Used by the API thread only; every worker
// gets its own context.
//
// Note [Gloo controller]
// Under a launch without MPI (torchrun, hvdcompatrun --gloo) the ranks meet
// through the launch's store: each rank announces itself under "join/<rank>"
// (with its world size), waits for every other rank (so a rank that never
// came, or that runs another size or the MPI controller, is named in one
// error within the timeout), then Gloo connects a full mesh of TCP pairs
// through the store ("mesh/" keys). That job-wide context carries hvd.init's
// agreement and the process-set rounds; each process set's worker runs on a
// context of its own (the global set's built through the job context, with
// no store; a sub-set's through the store under "set/<id>/<n>/"), so two
// sets' traffic never shares a Gloo slot. Waiting on a peer that is alive
// but elsewhere is not an error (negotiation waits as under MPI); a peer
// that dies closes its sockets, which fails the pending call at once.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "transport/gloo_watch.h"
#include "transport/job_comm.h"
#include "transport/key_value_store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace hvdcompat {

struct GlooOptions {
  std::shared_ptr<KeyValueStore> store;
  int rank = -1, size = -1;                   // required
  int local_rank = -1, local_size = -1;       // -1: derived from host names
  int cross_rank = -1, cross_size = -1;
  std::string hostname;    // this rank's host for topology; "" = gethostname()
  std::string iface;       // network interface for the TCP device
  std::string bind_host;   // address/host to bind to when no interface is named
  double timeout_s = 30.0;
  // A peer silent this long is lost (Note [Silent peers on Gloo]); 0: never;
  // negative: HVDCOMPAT_GLOO_PEER_TIMEOUT_SECONDS.
  double peer_timeout_s = -1;
  // Before every key of this job's (Note [Elastic reset on Gloo]): "" at
  // init, "reset/<generation>/" for the world an elastic reset builds.
  std::string key_prefix;
  int generation = 0;  // elastic resets before this world
  // Not empty: this worker joins a running elastic job (its name for the
  // launcher; Note [Growing in place on Gloo], engine/gloo_reset.h).
  std::string join;
  // This process's name for the launcher: its join name, else its rank at
  // its first hvd.init() (hvdcompatrun --gloo numbers its workers so). Set by
  // init; an elastic reset keeps it.
  std::string worker;
};

// Returns what a gloo/std exception says, prefixed by `what`, as a
// CommunicationError; used around every Gloo call.
[[noreturn]] void ThrowGlooError(const std::string& what, const std::exception& e);

// How long control-plane waits on a live peer may last (effectively none).
std::chrono::milliseconds GlooIdleTimeout();

class GlooJob : public JobComm {
 public:
  explicit GlooJob(const GlooOptions& options);
  ~GlooJob() override;

  const char* controller() const override { return "gloo"; }
  const JobTopology& topology() const override { return topo_; }
  void AllgatherFixed(const void* mine, size_t bytes, void* all) override;
  std::vector<std::string> AllgatherStrings(const std::string& mine) override;
  void AllreduceMin(uint64_t* words, int n) override;

  // A new context over every rank of the job. Collective over the job.
  std::shared_ptr<gloo::Context> NewContext();
  // A context over `ranks` (sorted global ranks; this rank among them)
  // through the store under `prefix`. Collective over `ranks` only.
  std::shared_ptr<gloo::Context> SubsetContext(const std::vector<int>& ranks,
                                               const std::string& prefix);
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Watches every context above and the job's own (Note [Lost peers on Gloo]).
  GlooWatch& watch() { return *watch_; }
  const GlooOptions& options() const { return options_; }

 private:
  void Join();

  GlooOptions options_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> job_;
  JobTopology topo_;
  std::string address_;  // what the device bound to, for messages
  std::unique_ptr<GlooWatch> watch_;  // last: stops before the contexts go
};

}  // namespace hvdcompat
