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
//  2. Every survivor writes alive/<old rank>. The first to add 1 to
//     "decider" decides: it waits up to the Gloo timeout for the ranks its
//     watch did not find lost, then writes "world", the old ranks whose
//     alive key is there, ascending (so the oldest survivor becomes rank 0
//     and relative order is kept, as MPIX_Comm_shrink does). A rank its
//     watch missed costs one timeout; one that was wrongly thought lost is
//     still in the world when it arrived in time.
//  3. Every survivor reads "world" and, when it is in it, joins a new Gloo
//     job of that size under the new prefix (join/, mesh/ keys as at init;
//     local and cross ranks from the host names) with the process sets'
//     surviving members (same ids). A rank that arrived after the decision
//     is not in the world: its reset fails and it leaves the job.
// Without a lost rank the world keeps its size (a reset after
// HostsUpdatedInterrupt with only removed hosts' ranks gone takes the same
// path: they have left by then).

struct GlooResetResult {
  std::shared_ptr<Runtime> runtime;
  std::vector<int> survivors;  // old ranks, in new-rank order
};

// Throws LibraryError when the store fails or this rank is not among the
// survivors the decider saw.
GlooResetResult RebuildGlooFromSurvivors(const std::shared_ptr<Runtime>& old);

}  // namespace hvdcompat
