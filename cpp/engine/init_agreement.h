// Agreement on hvd.init's process sets: every rank compares what it was
// given before anything is registered. See Note [Agreeing on init's sets].
//
// Thread: called once per runtime, from the constructor, before any worker
// exists; collective over the job's communicator.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "transport/job_comm.h"

namespace hvdcompat {

// Note [Agreeing on init's sets]
// hvd.init(process_sets=...) must register the same sets, in the same order,
// on every rank. A rank that refused its argument and raised on its own
// would leave its peers waiting forever in the registration rounds, so every
// rank describes what it was given (the mode, each set, and, when it refused
// the argument, why) and the ranks compare the descriptions before anything
// is registered:
//  1. One Allgather of a fixed-size record per rank: a digest of the
//     description (without the per-rank groups of communicator-defined
//     sets), whether the rank refused its argument, whether it has
//     communicator-defined sets, and the description's length. When every
//     digest is equal and nothing else is set, that is the whole cost.
//  2. Otherwise every rank (each sees the same records, so all decide alike)
//     gathers every description with one Allgatherv: the groups of the
//     communicator-defined sets, or what to put in the error.
// Validation is a pure function of a description and the job's size, so
// every rank checks every rank's description itself and all raise the same
// InvalidArgument, naming the ranks that refused or passed invalid sets, or
// the ranks that passed different ones. A rank that refused its argument
// locally still makes both collectives. Nothing has been registered when it
// fails, so hvd.init can be called again.

// One entry of process_sets as this rank was given it.
struct RequestedSet {
  bool from_comm = false;  // defined by an mpi4py communicator: `ranks` is this rank's group
  bool member = true;      // from_comm: false when this rank's communicator is MPI_COMM_NULL
  std::vector<int> ranks;  // global ranks of the job
};

// hvd.init's process_sets argument on this rank.
struct InitSetsRequest {
  bool dynamic = false;             // dynamic process sets on (argument or environment)
  std::vector<RequestedSet> sets;   // in the order given
  std::string refused;              // not empty: this rank's argument is invalid, and why
};

// Checks rank lists as the sets to register as ids 1..n; returns the first
// mistake's message (starting with `subject`), or "" when they are valid.
using InitSetsValidator =
    std::function<std::string(const std::string& subject,
                              const std::vector<std::vector<int>>& sets)>;

// Returns the rank lists to register as ids 1..n, the same on every rank,
// after every rank agreed on them; throws InvalidArgument, with the same
// text on every rank, when some rank refused its argument, passed invalid
// sets, or passed other sets than the rest. Collective over the job.
std::vector<std::vector<int>> AgreeOnInitSets(JobComm& job,
                                              const InitSetsRequest& request,
                                              const InitSetsValidator& validate);

}  // namespace hvdcompat
