// Elastic reset: rebuilds a runtime from the processes that survived a
// failure, in place (no process restart). See Note [Elastic reset].
//
// Thread: called by the one API thread that runs hvd.elastic's reset, with
// the GIL released and no other API call using the old runtime's
// communicators; collective over every surviving process of the old world.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/runtime.h"

namespace hvdcompat {

// Note [Elastic reset]
// A lost rank surfaces as a failed MPI call on some survivor's worker, which
// revokes that worker's communicator (FailedRanks), so every other member's
// pending and later calls on it fail too and every survivor sees
// HorovodInternalError. hvd.elastic.run then calls the reset on every
// survivor:
//  1. Stop the old runtime: its NCCL communicators are aborted
//     (ncclCommAbort: destroying them could wait on a dead peer), every
//     worker fails what is still pending and its thread exits (calls on
//     revoked communicators return at once).
//  2. MPIX_Comm_shrink the old world communicator: an agreement among the
//     survivors on who is left. The new communicator keeps the survivors'
//     relative order, so the oldest survivor becomes rank 0.
//  3. Build a new Runtime on it: fresh global/local/cross communicators,
//     workers, response caches; each process set is registered again with
//     its surviving members (same id), and dropped when none survives.
// Without a failure the shrink is a plain agreement and the world keeps its
// size (resets after HostsUpdatedInterrupt take the same path).

// Whether the MPI library was built with ULFM and it is enabled for this run
// (`mpirun --with-ft ulfm`).
bool FaultToleranceEnabled();

// Note [No MPI_Finalize under ULFM]
// With ULFM enabled, hvdcompat never calls MPI_Finalize at exit: the engine is
// shut down, and the process ends with the interpreter's own exit code.
// hvdcompatrun's fault-tolerant flags run ULFM's heartbeat failure detector
// (mpi_ft_detector, in its own thread): the processes of MPI_COMM_WORLD form
// a ring, each watching its predecessor, and MPI_Finalize waits in
// ompi_comm_failure_detector_finalize until the watched process says it
// stops too. In Open MPI 5.0.11 that wait never ends on every rank of a job
// of 2 or 3 ranks on one host that lost no rank (seen in every run, stack
// dumps of both ranks), on jobs across hosts, and on the survivors once a
// process of the world has died. The detector cannot be stopped from
// outside MPI_Finalize, and it is what notices a lost host. Every rank of a
// job sees the same setting, so either all ranks finalize or none does;
// under ULFM a process that ends without finalizing is tolerated (the job's
// exit code stays that of its processes). MPI initialised by another library
// (mpi4py) is finalized by that library, which would hang the same way:
// hvd.init() ends such a process at once with a line that says what to do
// (hvdcompat/basics.py).

struct ResetResult {
  std::shared_ptr<Runtime> runtime;  // the rebuilt runtime
  MPI_Comm world = MPI_COMM_NULL;    // the survivors' communicator (caller owns)
  std::vector<int> survivors;        // their ranks in the old world, in new-rank order
};

// The registered process sets of `rt` other than the global one: (id, global ranks).
std::vector<std::pair<int, std::vector<int>>> RegisteredSets(const Runtime& rt);
// Adds to `options` the sets of `old_sets` with their members among
// `survivors` (old ranks, in new-rank order), renumbered, keeping their ids;
// a set left empty or equal to another (or to the world) is dropped. The new
// world has `world_size` ranks (-1: the survivors alone; more when workers
// join after them, Note [Growing in place on Gloo]).
void KeepSurvivingSets(const std::vector<std::pair<int, std::vector<int>>>& old_sets,
                       const std::vector<int>& survivors, InitOptions* options,
                       int world_size = -1);

// Steps 1-3 of Note [Elastic reset]. `old` is stopped but left alive for
// threads still holding it. Throws CommunicationError when the shrink fails
// and LibraryError when fault tolerance is not enabled while ranks are lost.
ResetResult RebuildFromSurvivors(const std::shared_ptr<Runtime>& old);

}  // namespace hvdcompat
