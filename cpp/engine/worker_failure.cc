// How a process set's worker names a failure: the lost ranks and their
// hosts, what to do, the ops pending on this rank, and the report of the lost
// ranks to the launcher (Note [Report channel], hvdcompat/runner/rank_supervisor.py).

#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "core/common.h"
#include "core/env.h"
#include "engine/process_set_worker.h"
#include "transport/control_transport.h"

namespace hvdcompat {

namespace {

// " on host h2 (which also runs rank(s) 3)" for lost global ranks: a host that
// drops out usually takes all of its ranks with it, and MPI may name only the
// first one it noticed. The other ranks are not listed for this rank's own host
// (`self`: this rank), which is evidently still up.
std::string DescribeHosts(const std::vector<int>& lost, const std::vector<std::string>& hosts,
                          int self) {
  std::vector<std::string> names;
  for (int r : lost) {
    if (r < 0 || r >= static_cast<int>(hosts.size())) return std::string();
    if (std::find(names.begin(), names.end(), hosts[r]) == names.end()) names.push_back(hosts[r]);
  }
  if (names.empty()) return std::string();
  bool mine = self >= 0 && self < static_cast<int>(hosts.size()) &&
              std::find(names.begin(), names.end(), hosts[self]) != names.end();
  std::vector<int> others;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    if (std::find(names.begin(), names.end(), hosts[r]) != names.end() &&
        std::find(lost.begin(), lost.end(), r) == lost.end()) {
      others.push_back(r);
    }
  }
  std::ostringstream os;
  os << (names.size() == 1 ? " on host " : " on hosts ");
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << names[i];
  if (!others.empty() && !mine) os << " (which also runs rank(s) " << JoinInts(others) << ")";
  return os.str();
}

}  // namespace

std::vector<int> ProcessSetWorker::GlobalRanks(const std::vector<int>& set_ranks) const {
  std::vector<int> out;
  for (int r : set_ranks) {
    out.push_back(r >= 0 && r < static_cast<int>(global_ranks_.size()) ? global_ranks_[r] : r);
  }
  return out;
}

void ProcessSetWorker::ReportLostRanks(const std::vector<int>& set_ranks) const {
  // Note [Report channel] (hvdcompat/runner/rank_supervisor.py): the launcher
  // learns which ranks and hosts this rank lost from a line on the
  // supervisor's pipe, never from the job's output, which the ranks write too.
  const int fd = static_cast<int>(KnobInt(Knob::kReportFd));
  if (fd <= 0) return;
  auto quoted = [](const std::string& text) {
    std::string q = "\"";
    for (char c : text) {
      if (c == '"' || c == '\\') q += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) q += c;
    }
    return q + "\"";
  };
  std::string ranks, hosts;
  for (int g : GlobalRanks(set_ranks)) {
    ranks += (ranks.empty() ? "" : ",") + std::to_string(g);
    if (g >= 0 && g < static_cast<int>(config_.rank_hosts.size())) {
      hosts += (hosts.empty() ? "" : ",") + quoted(config_.rank_hosts[g]);
    }
  }
  const std::string line = "{\"ranks\": [" + ranks + "], \"hosts\": [" + hosts + "]}\n";
  // One write of a short line: atomic on a pipe; a closed pipe is ignored.
  if (::write(fd, line.data(), line.size()) < 0) return;
}

std::string ProcessSetWorker::DescribeFailure(const std::exception& e) const {
  std::ostringstream os;
  if (!stall_failure_.empty()) return stall_failure_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shutdown_failure_.empty()) return shutdown_failure_ + " [" + e.what() + "]";
  }
  const auto* ce = dynamic_cast<const CommunicationError*>(&e);
  if (ce && !ce->failed_ranks().empty()) {
    const std::vector<int> lost = GlobalRanks(ce->failed_ranks());
    os << "rank(s) " << JoinInts(lost)
       << DescribeHosts(lost, config_.rank_hosts, global_ranks_[rank_])
       << " failed (the process exited or was killed, or its host stopped answering)"
       << (id_ ? " in process set " + std::to_string(id_) : std::string())
       << "; collectives cannot complete without it. Look for that rank's own error first; "
       << (gloo_ ? "restart the job, or run training in hvd.elastic.run under hvdcompatrun "
                   "--gloo --min-np N to continue with the survivors from the last commit."
                 : "restart the job, or run training in hvd.elastic.run under hvdcompatrun "
                   "--fault-tolerant to continue with the survivors from the last commit.");
  } else {
    os << "hvdcompat background worker"
       << (id_ ? " of process set " + std::to_string(id_) : std::string()) << " on rank "
       << global_ranks_[rank_] << " failed.";
  }
  std::vector<std::string> names;
  for (const auto& kv : entries_) names.push_back(kv.first);
  std::sort(names.begin(), names.end());
  if (!names.empty()) {
    os << " Pending on this rank:";
    for (size_t i = 0; i < names.size() && i < 8; ++i) os << " '" << names[i] << "'";
    if (names.size() > 8) os << " and " << names.size() - 8 << " more";
    os << ".";
  }
  os << " [" << e.what() << "]";
  return os.str();
}

}  // namespace hvdcompat
