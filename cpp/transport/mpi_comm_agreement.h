// Agreement on hvd.init's comm argument: before any collective on the job's
// communicator, the processes that would form it compare what they were
// given. See Note [Agreeing on init's comm].
//
// Thread: the API thread, inside hvd.init, before the runtime exists.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace hvdcompat {

// Note [Agreeing on init's comm]
// Making the job's communicator is collective over its members
// (MPI_Comm_dup of the launch's world or of an mpi4py communicator,
// MPI_Comm_create_group for a rank list): a process that refused its comm
// argument, or passed another one than its peers, would leave them waiting
// there forever. Nothing collective can be used to compare the arguments:
// the members are what is in question, and with a rank list the processes
// outside it never call hvd.init. So the comparison is point to point on the
// launch's world (a tag of its own), bounded in time, and decided only on
// messages that answer this very attempt:
//  1. Each process describes what it was given: every rank (None), a rank
//     list, a communicator (its members in the launch's world, in its order),
//     or a refusal (wrong type, ranks out of range or repeated, a
//     communicator this process is not in) with the reason. It sends the
//     description (R) to the other members of its job, or, when it refused,
//     to every process of the launch.
//  2. Whoever receives an R answers (A) with its own description, naming
//     the attempt it answers. Stale messages of earlier attempts are never
//     taken for answers.
//  3. A member whose answer differs (or is a refusal) fails the attempt:
//     the error lists what each process passed. When every member's answer
//     matches, the process confirms (C) to each, and starts once each member
//     has confirmed its attempt: all members then start, or none does.
//  4. A process that failed tells (F) the processes it knows to be waiting,
//     and keeps answering for a few seconds (kLingerSeconds), so that peers
//     arriving a little later learn it too. A member that never answers
//     fails the attempt after HVDCOMPAT_INIT_TIMEOUT_SECONDS.
// A process whose job is a strict subset and that has already started does
// not answer later arrivals: a process expecting it waits for the timeout.

struct InitCommRequest {
  enum Kind { kAll = 0, kList = 1, kComm = 2, kRefused = 3 };
  Kind kind = kAll;
  std::vector<int> members;  // ranks of the launch's world (kList sorted; kComm in its order)
  std::string text;          // the argument as the user wrote it
  std::string refused;       // kRefused: why
};

// Returns when every member of this process's job passed the same argument
// and confirmed it; throws InvalidArgument naming the op, the processes and
// what each passed otherwise (always when `request` is a refusal).
// `universe`: the launch's world (MPI_COMM_WORLD, or the world an elastic
// reset left). `timeout_s` <= 0: wait for absent members forever.
void AgreeOnInitComm(MPI_Comm universe, const InitCommRequest& request, double timeout_s);

// The description of hvd.init's comm: `comm` (an mpi4py communicator, or
// MPI_COMM_NULL), `ranks` (a rank list) or neither (every rank), checked
// against `universe`; a refusal when the argument is invalid here.
InitCommRequest DescribeInitComm(MPI_Comm universe, MPI_Comm comm, const std::vector<int>& ranks,
                                 const std::string& text, const std::string& refused);

}  // namespace hvdcompat
