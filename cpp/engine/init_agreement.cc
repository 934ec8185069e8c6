#include "engine/init_agreement.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>

#include "core/common.h"
#include "transport/job_comm.h"

namespace hvdcompat {

namespace {

constexpr const char* kCaller = "hvd.init(process_sets=...)";
constexpr const char* kWhatToDo =
    "Pass the same process_sets on every rank (the same ProcessSet ranks, in the same order, or "
    "'dynamic' on every rank), with each set's ranks distinct and in [0, hvd.size()); then call "
    "hvd.init again.";

// Words of a rank's record in the first round.
enum RecordWord { kDigest = 0, kRefused, kFromComm, kLength, kRecordWords };

std::vector<int> Sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The wire form: "<dynamic> <n>" then per set "<from_comm> <member> <count> <ranks...>", a
// newline, then the refusal text. Without `views` a communicator-defined set is
// written without this rank's group: what must be equal on every rank.
std::string Serialize(const InitSetsRequest& request, bool views) {
  std::ostringstream os;
  os << (request.dynamic ? 1 : 0) << ' ' << request.sets.size();
  for (const auto& s : request.sets) {
    const bool group = !s.from_comm || views;
    const std::vector<int> ranks = group ? Sorted(s.ranks) : std::vector<int>();
    os << ' ' << (s.from_comm ? 1 : 0) << ' ' << (group && s.member ? 1 : 0) << ' '
       << ranks.size();
    for (int r : ranks) os << ' ' << r;
  }
  os << '\n';
  if (views) os << request.refused;
  return os.str();
}

InitSetsRequest Parse(const std::string& text) {
  InitSetsRequest request;
  const size_t end = text.find('\n');
  HVD_ENFORCE(end != std::string::npos, "init description without its end of line");
  std::istringstream is(text.substr(0, end));
  int dynamic = 0;
  size_t n = 0;
  is >> dynamic >> n;
  request.dynamic = dynamic != 0;
  for (size_t i = 0; i < n && is; ++i) {
    RequestedSet s;
    int from_comm = 0, member = 0;
    size_t count = 0;
    is >> from_comm >> member >> count;
    s.from_comm = from_comm != 0;
    s.member = member != 0;
    s.ranks.resize(count);
    for (auto& r : s.ranks) is >> r;
    request.sets.push_back(std::move(s));
  }
  HVD_ENFORCE(!is.fail() && request.sets.size() == n, "malformed init description: " << text);
  request.refused = text.substr(end + 1);
  return request;
}

// How a rank's argument reads in an error: 'dynamic', None or a list of sets.
std::string Describe(const InitSetsRequest& request) {
  if (request.sets.empty()) return request.dynamic ? "'dynamic'" : "None";
  std::string s = "[";
  for (size_t i = 0; i < request.sets.size(); ++i) {
    const auto& set = request.sets[i];
    s += i ? ", " : "";
    s += set.from_comm ? "ProcessSet(<mpi4py communicator>)"
                       : "ProcessSet(" + RankListString(Sorted(set.ranks)) + ")";
  }
  s += "]";
  if (request.dynamic) s += " (with dynamic process sets on)";
  return s;
}

// The rank-list sets of a request (communicator-defined ones left out).
std::vector<std::vector<int>> ListSets(const InitSetsRequest& request) {
  std::vector<std::vector<int>> lists;
  for (const auto& s : request.sets) {
    if (!s.from_comm) lists.push_back(s.ranks);
  }
  return lists;
}

[[noreturn]] void Refuse(std::string why) {
  while (!why.empty() && why.back() == '.') why.pop_back();
  throw InvalidArgument(std::string(kCaller) +
                        " failed on every rank and registered nothing: " + why + ". " + kWhatToDo);
}

// Every rank's description (the second round).
std::vector<InitSetsRequest> GatherDescriptions(JobComm& job, const std::string& mine) {
  std::vector<InitSetsRequest> given;
  for (const std::string& s : job.AllgatherStrings(mine)) given.push_back(Parse(s));
  return given;
}

}  // namespace

std::vector<std::vector<int>> AgreeOnInitSets(JobComm& job,
                                              const InitSetsRequest& request,
                                              const InitSetsValidator& validate) {
  const int size = job.topology().size;
  bool from_comm = false;
  for (const auto& s : request.sets) from_comm = from_comm || s.from_comm;
  const std::string shape = Serialize(request, false);
  const std::string full = Serialize(request, true);
  // FNV-1a of what must be equal on every rank.
  uint64_t digest = 1469598103934665603ull;
  for (unsigned char c : shape) digest = (digest ^ c) * 1099511628211ull;
  uint64_t mine[kRecordWords] = {digest, request.refused.empty() ? 0u : 1u, from_comm ? 1u : 0u,
                                 static_cast<uint64_t>(full.size())};
  std::vector<uint64_t> records(static_cast<size_t>(size) * kRecordWords);
  job.AllgatherFixed(mine, sizeof(mine), records.data());
  bool second_round = false;
  for (int r = 0; r < size; ++r) {
    const uint64_t* rec = &records[static_cast<size_t>(r) * kRecordWords];
    second_round = second_round || rec[kDigest] != records[kDigest] || rec[kRefused] ||
                   rec[kFromComm];
  }
  if (!second_round) {
    // Every rank holds these very lists, so each finds the same mistake, if any.
    std::vector<std::vector<int>> lists = ListSets(request);
    const std::string mistake = validate("every rank's sets", lists);
    if (!mistake.empty()) Refuse(mistake);
    return lists;
  }

  const std::vector<InitSetsRequest> given = GatherDescriptions(job, full);
  // From here on every rank computes from the same descriptions.
  std::vector<std::string> mistakes;
  for (int r = 0; r < size; ++r) {
    const std::string subject = "rank " + std::to_string(r);
    const std::string sets = subject + "'s sets";
    if (!given[r].refused.empty()) {
      mistakes.push_back(subject + "'s process_sets argument is invalid: " + given[r].refused);
      continue;
    }
    const std::string mistake = validate(sets, ListSets(given[r]));
    if (!mistake.empty()) mistakes.push_back(mistake);
  }
  if (!mistakes.empty()) {
    std::string why;
    for (auto m : mistakes) {
      while (!m.empty() && m.back() == '.') m.pop_back();
      why += (why.empty() ? "" : "; ") + m;
    }
    Refuse(why);
  }
  // Ranks by what they passed, in order of their lowest rank.
  std::map<std::string, std::vector<int>> by_shape;
  std::vector<std::string> order;
  for (int r = 0; r < size; ++r) {
    const std::string key = Serialize(given[r], false);
    if (!by_shape.count(key)) order.push_back(key);
    by_shape[key].push_back(r);
  }
  if (order.size() > 1) {
    std::string why = "the ranks passed different process sets: ";
    for (size_t i = 0; i < order.size(); ++i) {
      const auto& ranks = by_shape[order[i]];
      why += (i ? "; " : "") + RanksPhrase(ranks) + " passed " + Describe(given[ranks[0]]);
    }
    Refuse(why);
  }
  // Equal everywhere: a communicator-defined set registers every rank's
  // group, distinct ones in order of their lowest rank.
  std::vector<std::vector<int>> lists;
  for (size_t i = 0; i < request.sets.size(); ++i) {
    if (!request.sets[i].from_comm) {
      lists.push_back(request.sets[i].ranks);
      continue;
    }
    std::set<std::vector<int>> groups;
    for (const auto& g : given) {
      if (g.sets[i].member) groups.insert(Sorted(g.sets[i].ranks));
    }
    lists.insert(lists.end(), groups.begin(), groups.end());
  }
  const std::string mistake = validate("every rank's sets", lists);
  if (!mistake.empty()) Refuse(mistake);
  return lists;
}

}  // namespace hvdcompat
