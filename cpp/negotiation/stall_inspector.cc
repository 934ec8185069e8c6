#include "negotiation/stall_inspector.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include "core/logging.h"
#include "transport/mpi_util.h"

namespace hvdcompat {

namespace {

constexpr int kReportTag = 7301;

std::string Ranks(const std::vector<int>& v) { return v.empty() ? "none" : JoinInts(v); }

std::string Encode(const std::vector<StallInspector::Pending>& pending) {
  std::string out;
  auto put = [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  uint32_t n = static_cast<uint32_t>(pending.size());
  put(&n, sizeof(n));
  for (const auto& p : pending) {
    uint32_t len = static_cast<uint32_t>(p.name.size());
    uint8_t op = static_cast<uint8_t>(p.op);
    put(&len, sizeof(len));
    out += p.name;
    put(&op, 1);
    put(&p.waited_seconds, sizeof(double));
  }
  return out;
}

bool Decode(const std::string& in, std::vector<StallInspector::Pending>* out) {
  size_t at = 0;
  auto get = [&](void* p, size_t n) {
    if (at + n > in.size()) return false;
    std::memcpy(p, in.data() + at, n);
    at += n;
    return true;
  };
  uint32_t n = 0;
  if (!get(&n, sizeof(n))) return false;
  for (uint32_t i = 0; i < n; ++i) {
    StallInspector::Pending p;
    uint32_t len = 0;
    uint8_t op = 0;
    if (!get(&len, sizeof(len)) || at + len > in.size()) return false;
    p.name.assign(in.data() + at, len);
    at += len;
    if (!get(&op, 1) || !get(&p.waited_seconds, sizeof(double))) return false;
    p.op = static_cast<OpType>(op);
    out->push_back(std::move(p));
  }
  return true;
}

}  // namespace

StallInspector::StallInspector(MPI_Comm comm, int rank, std::vector<int> global_ranks,
                               int process_set_id, double check_seconds)
    : comm_(comm),
      global_ranks_(std::move(global_ranks)),
      process_set_id_(process_set_id),
      check_seconds_(check_seconds),
      rank_(rank) {
  if (comm_ != MPI_COMM_NULL) HVD_MPI_CHECK(comm_, MPI_Comm_rank(comm_, &rank_));
  // Reports arrive a few times per check period, at most once a second.
  double interval = std::max(1.0, check_seconds_ / 4);
  report_interval_ = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval));
  next_report_ = next_warning_ = Clock::now();
}

StallInspector::~StallInspector() {
  // Checked like every MPI call, but a destructor reports instead of throwing.
  try {
    int finalized = 0;
    HVD_MPI_CHECK(MPI_COMM_NULL, MPI_Finalized(&finalized));
    if (finalized) return;
    if (!sends_.empty()) {
      // Reports nobody will read. Their buffers may still be read by MPI after
      // the cancel, so they are left allocated (Note [Abandoned requests]).
      auto* abandoned = new std::deque<std::pair<MPI_Request, std::string>>(std::move(sends_));
      for (auto& s : *abandoned) {
        HVD_MPI_CHECK(comm_, MPI_Cancel(&s.first));
        HVD_MPI_CHECK(comm_, MPI_Request_free(&s.first));
      }
    }
    if (comm_ != MPI_COMM_NULL) HVD_MPI_CHECK(comm_, MPI_Comm_free(&comm_));
  } catch (const std::exception& e) {
    HVD_LOG(kWarning) << "releasing the stall inspector's communicator failed: " << e.what();
  }
}

void StallInspector::SendReport(const std::vector<Pending>& mine, Clock::time_point now) {
  while (!sends_.empty()) {
    int done = 0;
    HVD_MPI_CHECK(comm_, MPI_Test(&sends_.front().first, &done, MPI_STATUS_IGNORE));
    if (!done) break;
    sends_.pop_front();
  }
  if (now < next_report_ || sends_.size() >= 2) return;
  next_report_ = now + report_interval_;
  sends_.emplace_back(MPI_REQUEST_NULL, Encode(mine));
  auto& s = sends_.back();
  HVD_MPI_CHECK(comm_, MPI_Isend(s.second.data(), static_cast<int>(s.second.size()), MPI_BYTE, 0,
                                 kReportTag, comm_, &s.first));
}

void StallInspector::ReadReports(Clock::time_point now) {
  while (true) {
    int flag = 0;
    MPI_Status status;
    HVD_MPI_CHECK(comm_, MPI_Iprobe(MPI_ANY_SOURCE, kReportTag, comm_, &flag, &status));
    if (!flag) return;
    int count = 0;
    HVD_MPI_CHECK(comm_, MPI_Get_count(&status, MPI_BYTE, &count));
    std::string buf(static_cast<size_t>(count), '\0');
    HVD_MPI_CHECK(comm_, MPI_Recv(buf.data(), count, MPI_BYTE, status.MPI_SOURCE, kReportTag,
                                  comm_, MPI_STATUS_IGNORE));
    Report r;
    r.received = now;
    if (Decode(buf, &r.pending)) reports_[status.MPI_SOURCE] = std::move(r);
  }
}

std::string StallInspector::Describe(const std::vector<Pending>& mine, Coordinator* coordinator,
                                     Clock::time_point now, double min_seconds) const {
  const int size = static_cast<int>(global_ranks_.size());
  // name -> (op, longest wait, set ranks known to have submitted it)
  struct Info {
    OpType op = OpType::kAllreduce;
    double waited = 0;
    std::set<int> have;
  };
  std::map<std::string, Info> names;
  auto note = [&](int rank, const Pending& p) {
    Info& i = names[p.name];
    i.op = p.op;
    i.waited = std::max(i.waited, p.waited_seconds);
    i.have.insert(rank);
  };
  for (const auto& p : mine) note(rank_, p);
  // A report is current if it arrived within two report intervals.
  for (const auto& [rank, report] : reports_) {
    if (now - report.received > 2 * report_interval_ + std::chrono::seconds(1)) continue;
    double age = std::chrono::duration<double>(now - report.received).count();
    for (Pending p : report.pending) {
      p.waited_seconds += age;
      note(rank, p);
    }
  }
  if (coordinator) {
    for (const auto& s : coordinator->FindStalled(0, now)) {
      Info& i = names[s.name];
      i.op = s.op;
      i.waited = std::max(i.waited, s.waited_seconds);
      for (int g : s.submitted) {
        auto it = std::find(global_ranks_.begin(), global_ranks_.end(), g);
        if (it != global_ranks_.end()) i.have.insert(static_cast<int>(it - global_ranks_.begin()));
      }
    }
  }
  std::ostringstream os;
  int count = 0;
  for (const auto& [name, info] : names) {
    if (info.waited < min_seconds || static_cast<int>(info.have.size()) == size) continue;
    std::vector<int> have, missing;
    for (int r = 0; r < size; ++r) {
      (info.have.count(r) ? have : missing).push_back(global_ranks_[r]);
    }
    if (count++ < 32) {
      os << "\n  " << OpTypeName(info.op) << " '" << name << "' waiting "
         << static_cast<int>(info.waited) << " s: submitted by rank(s) " << Ranks(have)
         << "; not submitted by rank(s) " << Ranks(missing);
    }
  }
  if (count == 0) return std::string();
  std::ostringstream head;
  head << "Stalled operations" << (process_set_id_ ? " in process set " + std::to_string(process_set_id_) : "")
       << ": " << count << " tensor(s) were submitted by some ranks and are waiting for the others"
       << (count > 32 ? " (first 32 shown)" : "") << ":" << os.str()
       << "\nUsual causes: ranks call collectives with different names or in a different order "
          "(name them consistently), a rank is still busy or stuck elsewhere, or ranks have "
          "uneven amounts of data (use hvd.join() when a rank runs out). Set "
          "HOROVOD_STALL_CHECK_TIME_SECONDS to change this check, "
          "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS to fail stalled jobs.";
  return head.str();
}

void StallInspector::Tick(const std::vector<Pending>& mine, Coordinator* coordinator,
                          Clock::time_point now) {
  if (!enabled()) return;
  if (rank_ != 0) {
    bool old = std::any_of(mine.begin(), mine.end(), [&](const Pending& p) {
      return p.waited_seconds >= std::min(1.0, check_seconds_ / 2);
    });
    if (old && comm_ != MPI_COMM_NULL) SendReport(mine, now);
    return;
  }
  if (comm_ != MPI_COMM_NULL) ReadReports(now);
  if (now < next_warning_) return;
  std::string text = Describe(mine, coordinator, now, check_seconds_);
  if (text.empty()) return;
  next_warning_ = now + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(check_seconds_));
  HVD_LOG(kWarning) << text;
}

}  // namespace hvdcompat
