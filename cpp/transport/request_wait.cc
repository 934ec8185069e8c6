#include "transport/request_wait.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "transport/mpi_util.h"

namespace hvdcompat {

namespace {

// How often a long wait asks MPI whether a member of its communicator failed.
constexpr int kFailureCheckMs = 50;

void Test(MPI_Request* request, MPI_Comm comm, const char* what, int* flag) {
  int rc = MPI_Test(request, flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    ThrowMpiError(rc, (std::string("MPI_Test (") + what + ")").c_str(), comm, __FILE__, __LINE__);
  }
}

}  // namespace

void PreferRingNonblockingAllreduce() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm")) return;
    // Ask the tool interface for the thread level MPI already runs at: Open
    // MPI 5 records the level MPI_T_init_thread was given as the process's,
    // so asking for less would make MPI_Query_thread (and the engine's next
    // init) report MPI_THREAD_SINGLE for an MPI started with MULTIPLE.
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    int provided = 0;
    // Each failure below means the tool interface or the variable is not
    // there: keep the library's default.
    if (MPI_T_init_thread(level, &provided) != MPI_SUCCESS) return;
    int index = -1;
    if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) == MPI_SUCCESS) {
      MPI_T_cvar_handle handle;
      int count = 0;
      if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
        const int kRing = 1;  // libnbc's enumeration: 0 automatic, 1 ring, 2 binomial, ...
        if (count == 1) MPI_T_cvar_write(handle, &kRing);
        MPI_T_cvar_handle_free(&handle);
      }
    }
    MPI_T_finalize();
  });
}

void WaitRequest(MPI_Request* request, MPI_Comm comm, const WaitPolicy& policy, const char* what) {
  using Clock = std::chrono::steady_clock;
  int flag = 0;
  Test(request, comm, what, &flag);
  if (flag) return;
  // Back to back, never yielding (Note [Engine-owned waiting]).
  const auto spin_end = Clock::now() + std::chrono::microseconds(policy.spin_micros);
  while (Clock::now() < spin_end) {
    Test(request, comm, what, &flag);
    if (flag) return;
  }
  int64_t sleep_us = 5;
  const int64_t cap = std::max<int64_t>(policy.max_sleep_micros, 1);
  auto next_failure_check = Clock::now();
  while (true) {
    if (Clock::now() >= next_failure_check) {
      next_failure_check = Clock::now() + std::chrono::milliseconds(kFailureCheckMs);
      std::vector<int> lost = KnownFailures(comm);
      if (!lost.empty()) {
        // Note [A known failure ends every wait]: as if the call had failed.
        throw CommunicationError(std::string("a process of the job failed while this rank "
                                             "waited for ") + what,
                                 std::move(lost));
      }
    }
    if (policy.abort && policy.abort->load(std::memory_order_relaxed)) {
      // Note [Ending a stuck wait]: the call stays posted; the caller's
      // owner abandons its buffers.
      throw CommunicationError(std::string("aborted while waiting for ") + what +
                               " (a data collective every rank had agreed to; a peer stopped "
                               "taking part in it)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min<int64_t>(sleep_us * 2, cap);
    for (int i = 0; i < 4; ++i) {
      Test(request, comm, what, &flag);
      if (flag) return;
    }
  }
}

}  // namespace hvdcompat
