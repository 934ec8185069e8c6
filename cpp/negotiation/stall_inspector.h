// Explains stalls: which tensors have waited too long, which ranks have
// submitted them and which have not (Horovod's stall warning, but able to
// name the missing ranks even while they never enter a negotiation).
//
// Every rank with old pending work sends its list of pending names to set
// rank 0 over a dedicated communicator (MPI controller only) (point-to-point, nonblocking, rate
// limited). Set rank 0 merges those reports with its own pending work and
// its coordinator table and logs one warning per stalled tensor per period.
// Owned and called only by the set's worker thread.
#pragma once

#include <mpi.h>

#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "negotiation/coordinator.h"

namespace hvdcompat {

class StallInspector {
 public:
  struct Pending {
    std::string name;
    OpType op;
    double waited_seconds;
  };

  // Takes ownership of `comm`. `check_seconds` <= 0 disables everything.
  // Without a communicator (MPI_COMM_NULL: the Gloo controller) no reports
  // are sent: set rank `rank` 0 warns from its own pending work and its
  // coordinator table alone, as Horovod's stall check does.
  StallInspector(MPI_Comm comm, int rank, std::vector<int> global_ranks, int process_set_id,
                 double check_seconds);
  ~StallInspector();
  StallInspector(const StallInspector&) = delete;
  StallInspector& operator=(const StallInspector&) = delete;

  bool enabled() const { return check_seconds_ > 0; }

  // Called from the worker loop and while it waits for peers: sends this
  // rank's report when due, and on set rank 0 reads reports and warns.
  void Tick(const std::vector<Pending>& mine, Coordinator* coordinator, Clock::time_point now);

  // The stall warning text for what set rank 0 knows now (empty if nothing
  // has waited `check_seconds`). Exposed for tests and error messages.
  std::string Describe(const std::vector<Pending>& mine, Coordinator* coordinator,
                       Clock::time_point now, double min_seconds) const;

 private:
  void SendReport(const std::vector<Pending>& mine, Clock::time_point now);
  void ReadReports(Clock::time_point now);

  struct Report {
    Clock::time_point received;
    std::vector<Pending> pending;
  };

  MPI_Comm comm_;
  std::vector<int> global_ranks_;
  int process_set_id_;
  double check_seconds_;
  int rank_ = 0;
  Clock::duration report_interval_;
  Clock::time_point next_report_;
  Clock::time_point next_warning_;
  std::deque<std::pair<MPI_Request, std::string>> sends_;
  std::map<int, Report> reports_;  // by set rank (rank 0 only)
};

}  // namespace hvdcompat
