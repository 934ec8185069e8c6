#include "transport/poller.h"

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "transport/mpi_util.h"

namespace hvdcompat {

void Poller::Wait(MPI_Request* request, MPI_Comm comm, const char* what) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto spin_end = start + std::chrono::microseconds(spin_micros_);
  auto next_tick = start + std::chrono::milliseconds(100);
  int64_t sleep_us = 10;
  int flag = 0;
  while (true) {
    HVD_MPI_CHECK(comm, MPI_Test(request, &flag, MPI_STATUS_IGNORE));
    if (flag) return;
    auto now = Clock::now();
    if (now < spin_end) continue;  // back to back, never yielding (Note [Engine-owned waiting])
    if (abort_ && abort_->load(std::memory_order_relaxed)) {
      throw CommunicationError(std::string("aborted while waiting for ") + what);
    }
    if (now >= next_tick) {
      next_tick = now + std::chrono::milliseconds(100);
      // Note [A known failure ends every wait] (request_wait.h), for negotiation too.
      std::vector<int> lost = KnownFailures(comm);
      if (!lost.empty()) {
        throw CommunicationError(std::string("a process of the job failed while this rank "
                                             "waited for ") + what,
                                 std::move(lost));
      }
      if (tick_) tick_(std::chrono::duration<double>(now - start).count());
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    // Waiting long means a peer is busy elsewhere: sleep longer, up to the
    // cap; after a second, up to 10x the cap (cheap when idle for minutes).
    int64_t cap = (now - start) > std::chrono::seconds(1) ? 10 * max_sleep_micros_ : max_sleep_micros_;
    sleep_us = std::min<int64_t>(sleep_us * 2, std::max<int64_t>(cap, 1));
    // A few probes after each sleep let multi-round algorithms advance.
    for (int i = 0; i < 4; ++i) {
      HVD_MPI_CHECK(comm, MPI_Test(request, &flag, MPI_STATUS_IGNORE));
      if (flag) return;
    }
  }
}

}  // namespace hvdcompat
