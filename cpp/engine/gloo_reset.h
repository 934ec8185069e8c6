// Elastic reset on the Gloo controller: the survivors of a lost rank meet
// again through the launch's store and continue as a smaller world, in place.
// See Note [Elastic reset on Gloo].
//
// Thread: as RebuildFromSurvivors (engine/elastic_reset.h): the one API
// thread running hvd.elastic's reset, GIL released; collective over every
// surviving process of the old world.
#pragma once

#include <memory>
#include <vector>

#include "engine/runtime.h"

namespace hvdcompat {

// Note [Elastic reset on Gloo]
// Gloo has no shrink: the survivors agree through the store the job already
// rendezvoused on, under keys of the new world's own ("reset/<generation>/",
// the generation counting resets, the same on every survivor):
//  1. Stop the old runtime (as under MPI); its pending ops have failed
//     already (Note [Lost peers on Gloo]).
//  2. Every survivor writes alive/<old rank> and settled/<old rank>; a
//     rank that leaves on purpose (its host was removed, LeaveGlooJob)
//     writes only settled/<old rank>. The first survivor to add 1 to
//     "decider" decides: it waits up to the Gloo timeout for the settled
//     keys of the ranks its watch did not find lost, then writes "world",
//     the old ranks whose alive key is there, ascending (so the oldest
//     survivor becomes rank 0 and relative order is kept, as
//     MPIX_Comm_shrink does). A rank its watch missed costs one timeout;
//     one it found lost that has arrived by then is in the world too (it is
//     alive). The watch's finding only spares the wait for the dead (Note
//     [Who closed first] makes it right; step 4 makes a wrong one harmless).
//  3. Every survivor reads "world" and, when it is in it, joins a new Gloo
//     job of that size under the new prefix (join/, mesh/ keys as at init;
//     local and cross ranks from the host names) with the process sets'
//     surviving members (same ids).
//  4. A rank that arrived after the decision (stopped or starved for longer
//     than the Gloo timeout, or found lost by the decider and later than
//     the others) is alive and is not dropped: under hvdcompatrun --gloo
//     (HVDCOMPAT_ELASTIC_DIR set) it waits to be taken in as a worker on an
//     added host does (Note [Growing in place on Gloo], under its worker
//     name), hvdcompatrun sees it wait and tells rank 0, and the job's next
//     commit takes it back; the state is synced to it from rank 0. Without
//     that launcher nothing would tell the job, so its reset fails there and
//     it leaves the job. A short wait for the ranks found lost at step 2 was
//     the other way: every reset after a real death (the common case) would
//     pay it, and a rank later than the wait would still need step 4.
// Without a lost rank the world keeps its size (a reset after
// HostsUpdatedInterrupt with only removed hosts' ranks gone takes the same
// path: they have left by then). Workers waiting to join are taken in at
// step 2 (Note [Growing in place on Gloo]).

// Note [Growing in place on Gloo]
// A worker that hvdcompatrun starts on a host added to a running elastic job
// (GlooOptions::join set) does not form a world of its own at hvd.init():
//  1. It counts itself in "grow/count" (its index i is the count before),
//     writes "grow/<i>" (its worker name and host) and waits for
//     "grow/<i>/world", as long as the store answers. The launcher sees the
//     count and, once every worker it started there is waiting, tells rank 0
//     that hosts were added; at the next commit every rank raises
//     HostsUpdatedInterrupt and resets.
//  2. The decider of a reset (step 2 above), after the survivors, takes the
//     workers counted since the last reset ("grow/taken" .. "grow/count"):
//     they get the ranks after the survivors, in the order they came, so the
//     oldest survivor stays rank 0 and the state is synced from a running
//     worker, never from a new one. "world" says "<old ranks>|<new
//     workers>"; each new worker's "grow/<i>/world" gives the new world's
//     generation, its rank and size, and the process sets every rank
//     registers (the survivors' sets, renumbered; ids kept).
//  3. Survivors and new workers build the new world's Gloo job under
//     "reset/<generation>/" together, as a reset does.
// The keys live under the store prefix of the job's first hvd.init(), which
// a new worker's first hvd.init() uses too. A worker counted but gone before
// it wrote "grow/<i>" is left out after the Gloo timeout; one that
// hvdcompatrun stops while it waits (its host was removed) is marked
// "grow/<i>/gone" first and left out.

struct GlooResetResult {
  std::shared_ptr<Runtime> runtime;
  std::vector<int> survivors;  // old ranks, in new-rank order
  int joined = 0;              // new workers, ranks survivors.size() and up
};

// Throws LibraryError when the store fails or this rank is not among the
// survivors the decider saw.
GlooResetResult RebuildGlooFromSurvivors(const std::shared_ptr<Runtime>& old);

// Step 1 of Note [Growing in place on Gloo]: blocks until a reset of the
// running job takes this worker in, then fills `opts` (the Gloo rank, size,
// key prefix and generation; the process sets) for the new world's Runtime.
// Throws LibraryError when the store stops answering.
// `who` names the process in messages (default: a worker on an added host).
void AwaitGlooJoin(InitOptions* opts, const std::string& who = std::string());

// A rank that leaves the job at the next reset (its host was removed) stops
// its runtime as the survivors stop theirs (step 1), writes its settled key
// of that reset, so the decider does not wait the Gloo timeout for it, and
// waits until the others have agreed on their world (they have stopped their
// runtimes then, so its closing sockets are no loss to them). Never throws:
// the rank leaves either way.
void LeaveGlooJob(Runtime& rt);

}  // namespace hvdcompat
