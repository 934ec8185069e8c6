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
// Policy: test back to back for `spin_micros` (a data collective runs once
// every rank has agreed to it, so a short one completes within this window),
// then sleep with a back-off growing from 5 us to `max_sleep_micros`,
// testing a few times after each sleep (a multi-round algorithm advances
// only when tested). The negotiation's waits (Poller) and the worker's watch
// for new work follow the same rule.
// Never sched_yield: under Linux's EEVDF scheduler (6.6 and later) a yield
// moves the caller's deadline one slice back, so while a training thread is
// runnable on the same core a yielding waiter runs about once per slice
// (milliseconds) instead of once per test, and MPI's progress, which only
// this thread drives, stalls while the peer waits for it. Measured with a
// thread sharing a core with a busy one (Linux 6.18, other jobs running):
// yielding in a loop it ran 700 times in 3 s (12 ms apart at the 90th
// percentile), sleeping 5 us at a time 20,000 times (60 us apart at the
// median). A sleeping waiter
// leaves the run queue and its timer wakes it; with a short slice (Note
// [Engine thread slice], core/env.h) it then preempts the training thread.
struct WaitPolicy {
  int64_t spin_micros;
  int64_t max_sleep_micros;
  // Set (by the worker) to end a wait that would never complete; may be null.
  const std::atomic<bool>* abort = nullptr;

  static WaitPolicy ForData(const Config& config) {
    return {config.poll_data_spin_micros, config.poll_max_sleep_micros, nullptr};
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

// Note [A known failure ends every wait]
// Under a fault-tolerant MPI (ULFM) a collective fails once MPI knows one of
// its own participants failed, or its communicator is revoked. A wait on a
// communicator derived from the job's (the cross-host communicator of the
// hierarchical and network plans) may involve only peers that are cut off
// but not yet suspected: with two hosts of two ranks, rank 0 waits on rank 2
// across hosts while rank 1 waits on rank 3. ULFM's detector suspects the
// two lost ranks one detector timeout apart (the observer of one of them is
// the other), so once rank 3 is declared failed, rank 1's op fails and
// revokes the job's communicator, but rank 0's op on {0, 2} would wait for
// the second timeout. So a wait that has gone on past its yield window also
// asks, every kFailureCheckMs, whether MPI knows a member of `comm` (the
// process set's communicator the caller passes, whatever communicator the
// request is on) to have failed, and then fails like a failed call: naming
// the failed ranks and revoking `comm`. Any failure in the job ends its
// pending collectives: the elastic reset has to run on every survivor anyway.

// Open MPI's nonblocking allreduce (libnbc) picks a binomial tree below 4
// ranks, which sends the whole buffer twice and runs several times slower
// than its ring at 1 MiB and up; asks for the ring through the MPI tool
// interface unless the user chose (OMPI_MCA_coll_libnbc_iallreduce_algorithm).
// A no-op where the variable does not exist (MPICH, other builds). Once per
// process; every rank makes the same choice.
void PreferRingNonblockingAllreduce();

// Completes `request` (throws CommunicationError naming `what` when MPI
// reports an error on `comm`, or knows a member of `comm` to have failed:
// Note [A known failure ends every wait]).
void WaitRequest(MPI_Request* request, MPI_Comm comm, const WaitPolicy& policy, const char* what);

}  // namespace hvdcompat
