#include "transport/mpi_comm_agreement.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "core/common.h"
#include "transport/mpi_util.h"

namespace hvdcompat {

namespace {

// Note [Agreeing on init's comm]. Below MPI's guaranteed MPI_TAG_UB (32767).
constexpr int kTag = 32719;
constexpr double kLingerSeconds = 5.0;
constexpr const char* kCaller = "hvd.init(comm=...)";
constexpr const char* kWhatToDo =
    "Pass the same comm on every process that joins the job: None on every process, the same "
    "list of ranks (distinct, in [0, N) for the N processes of the launch), or mpi4py "
    "communicators with the same members in the same order; processes outside the list or "
    "communicator do not call hvd.init. Then call hvd.init again.";

using Clock = std::chrono::steady_clock;

// One attempt number per process: answers name the attempt they answer.
int g_attempts = 0;

struct Description {
  int kind = InitCommRequest::kAll;
  std::vector<int> members;
  std::string text, refused;
  bool Same(const Description& o) const {
    return kind != InitCommRequest::kRefused && kind == o.kind && members == o.members;
  }
};

// A message: "<type> <attempt> <echo> <kind> <n> <members...>\n<text>\n<refused>".
struct Message {
  char type = 'R';  // R: description, A: answer, C: confirm, F: failed
  int attempt = 0, echo = -1;
  Description d;
};

std::string Encode(const Message& m) {
  std::ostringstream os;
  os << m.type << ' ' << m.attempt << ' ' << m.echo << ' ' << m.d.kind << ' '
     << m.d.members.size();
  for (int r : m.d.members) os << ' ' << r;
  os << '\n' << m.d.text << '\n' << m.d.refused;
  return os.str();
}

bool Decode(const std::string& s, Message* m) {
  const size_t a = s.find('\n');
  if (a == std::string::npos) return false;
  const size_t b = s.find('\n', a + 1);
  if (b == std::string::npos) return false;
  std::istringstream is(s.substr(0, a));
  size_t n = 0;
  is >> m->type >> m->attempt >> m->echo >> m->d.kind >> n;
  if (!is || n > (1u << 24)) return false;
  m->d.members.resize(n);
  for (auto& r : m->d.members) is >> r;
  m->d.text = s.substr(a + 1, b - a - 1);
  m->d.refused = s.substr(b + 1);
  return !is.fail();
}

std::string Passed(const Description& d) {
  std::string s = "comm=" + d.text;
  if (d.kind == InitCommRequest::kRefused) s += " (invalid there: " + d.refused + ")";
  return s;
}

// "rank 0 passed comm=[0, 1]; ranks 1 and 2 passed comm=None".
std::string WhoPassedWhat(const std::map<int, Description>& known) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const auto& [rank, d] : known) {
    const std::string p = Passed(d);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == p; });
    if (it == groups.end()) {
      groups.push_back({p, {rank}});
    } else {
      it->second.push_back(rank);
    }
  }
  std::string s;
  for (const auto& [p, ranks] : groups) s += (s.empty() ? "" : "; ") + RanksPhrase(ranks) + " passed " + p;
  return s;
}

class Attempt {
 public:
  Attempt(MPI_Comm universe, const InitCommRequest& request, double timeout_s)
      : universe_(universe), timeout_s_(timeout_s), attempt_(++g_attempts) {
    MPI_Comm_rank(universe, &rank_);
    MPI_Comm_size(universe, &size_);
    mine_.kind = request.kind;
    mine_.members = request.members;
    mine_.text = request.text;
    mine_.refused = request.refused;
    if (request.kind == InitCommRequest::kAll) {
      mine_.members.resize(size_);
      for (int r = 0; r < size_; ++r) mine_.members[r] = r;
    }
    if (request.kind == InitCommRequest::kRefused) {
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) targets_.push_back(r);
      }
    } else {
      for (int r : mine_.members) {
        if (r != rank_) targets_.push_back(r);
      }
    }
  }

  ~Attempt() {
    // Sends still in flight keep their buffers (a peer that never receives
    // them holds nothing of ours but these few bytes).
    for (auto& p : pending_) {
      int done = 0;
      MPI_Test(&p.first, &done, MPI_STATUS_IGNORE);
      if (!done) Leaked().push_back(std::move(p));
    }
  }

  void Run() {
    const auto start = Clock::now();
    for (int r : targets_) Send(r, Message{'R', attempt_, -1, mine_});
    std::string failure;
    if (mine_.kind == InitCommRequest::kRefused) {
      failure = "rank " + std::to_string(rank_) + " passed " + Passed(mine_);
    }
    bool confirming = false;
    while (failure.empty()) {
      Drain();
      if (!failed_by_.empty()) {
        failure = failed_by_;
        break;
      }
      std::map<int, Description> known{{rank_, mine_}};
      bool all_answered = true, differ = false;
      for (int m : targets_) {
        auto it = answers_.find(m);
        if (it == answers_.end()) {
          all_answered = false;
          continue;
        }
        known[m] = it->second.d;
        differ = differ || !it->second.d.Same(mine_);
      }
      for (const auto& [r, d] : differed_) known[r] = d;
      differ = differ || !differed_.empty();
      if (differ) {
        for (const auto& [r, rec] : records_) known.emplace(r, rec.d);
        failure = "the processes that would form the job passed different comm arguments: " +
                  WhoPassedWhat(known);
        break;
      }
      if (all_answered) {
        // Confirm each member's current attempt (again when it changed).
        for (int m : targets_) {
          const int theirs = answers_[m].attempt;
          if (confirmed_to_[m] != theirs) {
            Send(m, Message{'C', attempt_, theirs, Description()});
            confirmed_to_[m] = theirs;
          }
        }
        confirming = true;
        bool all_confirmed = true;
        for (int m : targets_) {
          auto it = confirms_.find(m);
          all_confirmed = all_confirmed && it != confirms_.end() &&
                          it->second == answers_[m].attempt;
        }
        if (all_confirmed) return;
      }
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      if (timeout_s_ > 0 && waited > timeout_s_) {
        std::vector<int> missing;
        for (int m : targets_) {
          if (!answers_.count(m) || (confirming && !confirms_.count(m))) missing.push_back(m);
        }
        std::ostringstream os;
        os << "rank " << rank_ << " passed " << Passed(mine_) << " and waited " << timeout_s_
           << " s for " << RanksPhrase(missing)
           << ", which did not answer: they did not call hvd.init, or called it with a comm that "
              "leaves rank "
           << rank_ << " out, or started a job without it (set HVDCOMPAT_INIT_TIMEOUT_SECONDS "
                       "to wait longer for processes that are slow to start)";
        failure = os.str();
        break;
      }
      Pause();
    }
    Fail(failure);
  }

 private:
  struct Known {
    int attempt = -1;
    Description d;
  };

  static std::vector<std::pair<MPI_Request, std::string>>& Leaked() {
    static std::vector<std::pair<MPI_Request, std::string>> leaked;
    return leaked;
  }

  void Send(int to, const Message& m) {
    pending_.emplace_back(MPI_REQUEST_NULL, Encode(m));
    auto& p = pending_.back();
    HVD_MPI_CHECK(universe_, MPI_Isend(p.second.data(), static_cast<int>(p.second.size()),
                                       MPI_CHAR, to, kTag, universe_, &p.first));
  }

  void Pause() {
    for (auto& p : pending_) {
      int done = 0;
      if (p.first != MPI_REQUEST_NULL) MPI_Test(&p.first, &done, MPI_STATUS_IGNORE);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }

  // Messages a failed attempt kept for the next one (a peer's next attempt).
  static std::deque<std::pair<int, std::string>>& Deferred() {
    static std::deque<std::pair<int, std::string>> deferred;
    return deferred;
  }

  // Receives what has arrived; answers every description. `lingering`: this
  // attempt has failed; a description of a peer's later attempt than the one
  // already seen (it has moved on) is kept for this process's next attempt,
  // so that this failure is never taken for an answer to it.
  void Drain(bool lingering = false) {
    if (!lingering) {
      std::deque<std::pair<int, std::string>> kept;
      kept.swap(Deferred());
      for (auto& [from, buf] : kept) Handle(from, buf, false);
    }
    for (;;) {
      int flag = 0;
      MPI_Status status;
      HVD_MPI_CHECK(universe_, MPI_Iprobe(MPI_ANY_SOURCE, kTag, universe_, &flag, &status));
      if (!flag) return;
      int count = 0;
      MPI_Get_count(&status, MPI_CHAR, &count);
      std::string buf(static_cast<size_t>(count), '\0');
      HVD_MPI_CHECK(universe_, MPI_Recv(&buf[0], count, MPI_CHAR, status.MPI_SOURCE, kTag,
                                        universe_, MPI_STATUS_IGNORE));
      Handle(status.MPI_SOURCE, buf, lingering);
    }
  }

  // A member's description for this attempt. One in an answer (A) that
  // differed fails the attempt for good: that member failed it too, even if
  // it has moved on to a new attempt (R) since.
  void Answered(int from, const Message& m, bool answer) {
    if (std::find(targets_.begin(), targets_.end(), from) == targets_.end()) return;
    answers_[from] = {m.attempt, m.d};
    if (answer && !m.d.Same(mine_)) differed_.emplace(from, m.d);
  }

  void Handle(int from, const std::string& buf, bool lingering) {
    Message m;
    if (!Decode(buf, &m)) return;
    const bool failed = lingering || !failed_by_.empty();
    if (failed && m.type == 'R' && records_.count(from) && m.attempt > records_[from].attempt) {
      Deferred().emplace_back(from, buf);
      return;
    }
    switch (m.type) {
      case 'R':
        // A description is also the sender's answer for its attempt: one
        // that moved on to a new attempt confirms against that one.
        records_[from] = {m.attempt, m.d};
        if (answers_.count(from) && m.attempt > answers_[from].attempt) Answered(from, m, false);
        if (!failed || !waiting_.count(from)) waiting_[from] = m.attempt;
        Send(from, Message{'A', attempt_, m.attempt, mine_});
        break;
      case 'A':
        if (m.echo == attempt_) Answered(from, m, true);
        break;
      case 'C':
        if (m.echo == attempt_) confirms_[from] = m.attempt;
        break;
      case 'F':
        // Only a member's failure ends this attempt; a process that counted
        // this one in its job without being in it fails alone.
        if (m.echo == attempt_ && failed_by_.empty() &&
            std::find(targets_.begin(), targets_.end(), from) != targets_.end()) {
          failed_by_ = m.d.refused + " (as rank " + std::to_string(from) + " found)";
        }
        break;
      default:
        break;
    }
  }

  // Tells every process known to wait on this attempt, answers late arrivals
  // for a while, then throws.
  [[noreturn]] void Fail(const std::string& why) {
    const std::string message = std::string(kCaller) + " failed on rank " +
                                std::to_string(rank_) + ": " + why + ". " + kWhatToDo;
    Description reason;
    reason.refused = why;
    std::set<int> told;
    auto tell_waiting = [&]() {
      for (const auto& [r, theirs] : waiting_) {
        if (told.insert(r).second) Send(r, Message{'F', attempt_, theirs, reason});
      }
    };
    tell_waiting();
    const auto until = Clock::now() + std::chrono::duration<double>(kLingerSeconds);
    while (Clock::now() < until) {
      bool all = true;
      for (int r : targets_) all = all && answers_.count(r);
      if (all) break;
      Pause();
      Drain(true);
      tell_waiting();
    }
    throw InvalidArgument(message);
  }

  MPI_Comm universe_;
  double timeout_s_;
  int attempt_;
  int rank_ = 0, size_ = 1;
  Description mine_;
  std::vector<int> targets_;
  std::map<int, Known> records_, answers_;
  std::map<int, Description> differed_;
  std::map<int, int> confirms_, confirmed_to_, waiting_;
  std::string failed_by_;
  std::vector<std::pair<MPI_Request, std::string>> pending_;
};

}  // namespace

void AgreeOnInitComm(MPI_Comm universe, const InitCommRequest& request, double timeout_s) {
  if (request.kind == InitCommRequest::kComm && request.members.empty()) return;
  Attempt attempt(universe, request, timeout_s);
  attempt.Run();
}

InitCommRequest DescribeInitComm(MPI_Comm universe, MPI_Comm comm, const std::vector<int>& ranks,
                                 const std::string& text, const std::string& refused) {
  InitCommRequest request;
  request.text = text;
  int rank = 0, size = 0;
  MPI_Comm_rank(universe, &rank);
  MPI_Comm_size(universe, &size);
  auto refuse = [&](const std::string& why) {
    request.kind = InitCommRequest::kRefused;
    request.members.clear();
    request.refused = why;
    return request;
  };
  if (!refused.empty()) return refuse(refused);
  if (comm != MPI_COMM_NULL) {
    request.kind = InitCommRequest::kComm;
    int inter = 0;
    MPI_Comm_test_inter(comm, &inter);
    if (inter) return refuse("an intercommunicator; pass an intracommunicator");
    MPI_Group theirs, world;
    MPI_Comm_group(comm, &theirs);
    MPI_Comm_group(universe, &world);
    int n = 0;
    MPI_Group_size(theirs, &n);
    std::vector<int> in(n), out(n);
    for (int i = 0; i < n; ++i) in[i] = i;
    MPI_Group_translate_ranks(theirs, n, in.data(), world, out.data());
    MPI_Group_free(&theirs);
    MPI_Group_free(&world);
    // Members outside the launch's world (a spawned job): nothing to compare with.
    if (std::find(out.begin(), out.end(), MPI_UNDEFINED) != out.end()) return request;
    request.members = out;
    request.text += " of launch ranks " + RankListString(out);
    return request;
  }
  if (ranks.empty()) return request;  // kAll
  std::vector<int> sorted(ranks);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= size) {
      return refuse("rank " + std::to_string(sorted[i]) + " is not in [0, " +
                    std::to_string(size) + ")");
    }
    if (i && sorted[i] == sorted[i - 1]) {
      return refuse("rank " + std::to_string(sorted[i]) + " is listed twice");
    }
  }
  if (!std::binary_search(sorted.begin(), sorted.end(), rank)) {
    return refuse("this process (rank " + std::to_string(rank) +
                  " of the launch) is not in the list; only listed processes call hvd.init "
                  "with it");
  }
  request.kind = static_cast<int>(sorted.size()) == size ? InitCommRequest::kAll
                                                          : InitCommRequest::kList;
  request.members = sorted;
  return request;
}

}  // namespace hvdcompat
