// Waits for a nonblocking MPI request without burning a core: polls back to
// back for a short window (peers usually arrive together; never yielding,
// Note [Engine-owned waiting] in request_wait.h), then sleeps with a growing
// back-off, probing a few times after each sleep so multi-round collectives
// keep progressing. While waiting it checks an abort flag and, about every
// 100 ms, whether MPI knows a member of the communicator to have failed (Note
// [A known failure ends every wait], request_wait.h) and calls a tick hook
// (stall reporting).
#pragma once

#include <mpi.h>

#include <atomic>
#include <functional>

namespace hvdcompat {

class Poller {
 public:
  Poller(int64_t spin_micros, int64_t max_sleep_micros, const std::atomic<bool>* abort)
      : spin_micros_(spin_micros), max_sleep_micros_(max_sleep_micros), abort_(abort) {}

  // Called on the waiting thread about every 100 ms while a wait lasts, with
  // the seconds waited so far.
  void set_tick(std::function<void(double)> tick) { tick_ = std::move(tick); }

  // Throws CommunicationError on MPI failure or when the abort flag is set.
  void Wait(MPI_Request* request, MPI_Comm comm, const char* what);

 private:
  int64_t spin_micros_;
  int64_t max_sleep_micros_;
  const std::atomic<bool>* abort_;
  std::function<void(double)> tick_;
};

}  // namespace hvdcompat
