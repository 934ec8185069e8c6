// MPI error checking and the mapping from our types to MPI's.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "core/common.h"
#include "transport/control_transport.h"

namespace hvdcompat {

// Throws CommunicationError naming the call, MPI's own error string and
// file:line. Failed peers (ULFM) are named when the library can tell.
[[noreturn]] void ThrowMpiError(int rc, const char* call, MPI_Comm comm, const char* file,
                                int line);

// Ranks of `comm` that a fault-tolerant MPI (ULFM) reports as failed after
// `error_code`; revokes the communicator when there are any. Empty without
// ULFM support or when the error is not a process failure.
std::vector<int> FailedRanks(MPI_Comm comm, int error_code);

// Ranks of `comm` a fault-tolerant MPI (ULFM) already knows to have failed,
// with no call having failed (a local query); revokes the communicator when
// there are any. Empty without ULFM support (Note [A known failure ends
// every wait], request_wait.h).
std::vector<int> KnownFailures(MPI_Comm comm);

struct WaitPolicy;

// Alltoall of row counts: `send_rows[j]` rows go to rank j; returns the rows
// received from each rank (collective over `comm`). With `wait`, nonblocking
// and completed by WaitRequest under that policy (Note [Engine-owned waiting]).
std::vector<int64_t> ExchangeAlltoallRows(MPI_Comm comm, const std::vector<int64_t>& send_rows);
std::vector<int64_t> ExchangeAlltoallRows(MPI_Comm comm, const std::vector<int64_t>& send_rows,
                                          const WaitPolicy& wait);

#define HVD_MPI_CHECK(comm, call)                                             \
  do {                                                                        \
    int hvd_rc_ = (call);                                                     \
    if (hvd_rc_ != MPI_SUCCESS) {                                             \
      ::hvdcompat::ThrowMpiError(hvd_rc_, #call, (comm), __FILE__, __LINE__); \
    }                                                                         \
  } while (0)

// Our MPI op (the cycle-word combiner) and the type/op mapping. 16-bit
// floats never reach MPI reductions (they are reduced in float32).
// One instance per process, made after MPI_Init and never freed: an
// abandoned negotiation (Note [Abandoned requests]) may still run the
// combiner after the runtime that posted it is gone. Immutable.
class MpiOps {
 public:
  static const MpiOps& Get();
  MpiOps(const MpiOps&) = delete;
  MpiOps& operator=(const MpiOps&) = delete;

  MPI_Datatype Type(DataType dtype) const;
  // The op that reduces with `op` (Average reduces as Sum).
  MPI_Op Op(ReduceOp op) const;
  MPI_Op flag_combine() const { return flag_combine_; }

 private:
  MpiOps();
  MPI_Op flag_combine_;
};

}  // namespace hvdcompat
