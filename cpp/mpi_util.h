// MPI error checking and the mapping from our types to MPI's.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "common.h"
#include "control_transport.h"

namespace hvdcompat {

// Throws CommunicationError naming the call, MPI's own error string and
// file:line. Failed peers (ULFM) are named when the library can tell.
[[noreturn]] void ThrowMpiError(int rc, const char* call, MPI_Comm comm, const char* file,
                                int line);

// Ranks of `comm` that a fault-tolerant MPI (ULFM) reports as failed after
// `error_code`; revokes the communicator when there are any. Empty without
// ULFM support or when the error is not a process failure.
std::vector<int> FailedRanks(MPI_Comm comm, int error_code);

#define HVD_MPI_CHECK(comm, call)                                             \
  do {                                                                        \
    int hvd_rc_ = (call);                                                     \
    if (hvd_rc_ != MPI_SUCCESS) {                                             \
      ::hvdcompat::ThrowMpiError(hvd_rc_, #call, (comm), __FILE__, __LINE__); \
    }                                                                         \
  } while (0)

// Our MPI op (the cycle-word combiner) and the type/op mapping. 16-bit
// floats never reach MPI reductions (they are reduced in float32).
// Created after MPI_Init, freed before the owner goes away.
class MpiOps {
 public:
  MpiOps();
  ~MpiOps();
  MpiOps(const MpiOps&) = delete;
  MpiOps& operator=(const MpiOps&) = delete;

  MPI_Datatype Type(DataType dtype) const;
  // The op that reduces with `op` (Average reduces as Sum).
  MPI_Op Op(ReduceOp op) const;
  MPI_Op flag_combine() const { return flag_combine_; }

 private:
  MPI_Op flag_combine_;
};

}  // namespace hvdcompat
