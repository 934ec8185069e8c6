// Waiting for the engine's own data collectives (Note [Engine-owned waiting]).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>

#include "core/env.h"

namespace hvdcompat {

// Note [Engine-owned waiting]
// The worker never blocks inside MPI. Every collective it issues is
// nonblocking and completed by WaitRequest, whose policy is ours whatever
// MPI was told at startup: a blocking MPI call spins at full speed unless
// the library was configured to yield before MPI_Init (Open MPI's
// mpi_yield_when_idle, which is lost when mpi4py or the user started MPI
// first), and a spinning engine thread takes the core the training thread of
// the same or a peer rank needs. MPI_Test is the only progress call and it
// runs on the worker thread alone, so no MPI thread level beyond the one the
// engine already uses is needed (portable across Open MPI and MPICH).
// Policy: test back to back with sched_yield in between for `yield_micros`
// (a data collective runs once every rank has agreed to it, so it usually
// completes within this window, and a multi-round algorithm needs frequent
// tests to advance), then sleep with a back-off growing from 5 us to
// `max_sleep_micros`, testing a few times after each sleep.
struct WaitPolicy {
  int64_t yield_micros;
  int64_t max_sleep_micros;
  // Set (by the worker) to end a wait that would never complete; may be null.
  const std::atomic<bool>* abort = nullptr;

  static WaitPolicy ForData(const Config& config) {
    return {config.poll_data_yield_micros, config.poll_max_sleep_micros, nullptr};
  }
};

// Note [Ending a stuck wait]
// A data collective starts only once every rank has agreed to it, so it
// normally completes at once; it waits forever only when a peer stopped
// while alive (SIGSTOP, a hung device, a debugger). Then hvd.shutdown()
// and the exit handler would wait forever too. Once its bound has passed
// (HVDCOMPAT_SHUTDOWN_TIMEOUT_SECONDS), Shutdown sets the worker's two abort
// flags: the negotiation's (Poller; the stall shutdown,
// HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, sets that one alone) and the data
// collectives' (WaitRequest). Each wait checks its flag at every back-off
// sleep and throws CommunicationError. The posted call stays in MPI (MPI cannot cancel a
// collective), so its buffers and communicator are abandoned, never freed
// (Note [Abandoned requests], mpi_transport.h), and MPI_Finalize, which
// would wait for the stopped peer, is skipped at exit.

// Open MPI's nonblocking allreduce (libnbc) picks a binomial tree below 4
// ranks, which sends the whole buffer twice and runs several times slower
// than its ring at 1 MiB and up; asks for the ring through the MPI tool
// interface unless the user chose (OMPI_MCA_coll_libnbc_iallreduce_algorithm).
// A no-op where the variable does not exist (MPICH, other builds). Once per
// process; every rank makes the same choice.
void PreferRingNonblockingAllreduce();

// Completes `request` (throws CommunicationError naming `what` when MPI
// reports an error on `comm`).
void WaitRequest(MPI_Request* request, MPI_Comm comm, const WaitPolicy& policy, const char* what);

}  // namespace hvdcompat
