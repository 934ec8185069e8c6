#include "ops/adasum_mpi.h"

#include <algorithm>

#include "transport/mpi_util.h"

namespace hvdcompat {

namespace {

// Adasum's messages are matched by order on the set's communicator; the tag
// only keeps them apart from anything else that might ever use it.
constexpr int kAdasumTag = 0x4ada;
// Bytes per MPI call (MPI counts are int).
constexpr int64_t kMaxCallBytes = int64_t{1} << 30;

}  // namespace

MpiAdasumPeers::MpiAdasumPeers(MPI_Comm comm, MPI_Comm dots_comm)
    : comm_(comm), dots_comm_(dots_comm) {
  HVD_MPI_CHECK(comm_, MPI_Comm_rank(comm_, &rank_));
  HVD_MPI_CHECK(comm_, MPI_Comm_size(comm_, &size_));
}

void MpiAdasumPeers::Exchange(const void* send, int64_t send_bytes, void* recv,
                              int64_t recv_bytes, int peer) {
  // The partner runs the mirror image (its send is our receive), so both
  // sides make the same number of calls.
  static char empty[1];
  int64_t sent = 0, received = 0;
  do {
    const int sn = static_cast<int>(std::min(kMaxCallBytes, send_bytes - sent));
    const int rn = static_cast<int>(std::min(kMaxCallBytes, recv_bytes - received));
    const char* s = sn > 0 ? static_cast<const char*>(send) + sent : empty;
    char* r = rn > 0 ? static_cast<char*>(recv) + received : empty;
    HVD_MPI_CHECK(comm_, MPI_Sendrecv(s, sn, MPI_BYTE, peer, kAdasumTag, r, rn, MPI_BYTE, peer,
                                      kAdasumTag, comm_, MPI_STATUS_IGNORE));
    sent += sn;
    received += rn;
  } while (sent < send_bytes || received < recv_bytes);
}

void MpiAdasumPeers::SumOverShards(double* values, int n) {
  HVD_MPI_CHECK(dots_comm_,
                MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, dots_comm_));
}

}  // namespace hvdcompat
