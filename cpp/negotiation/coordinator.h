// The coordinator's side of negotiation (rank 0 of a process set): collects
// requests from every rank, decides which names are ready everywhere, checks
// that the ranks agree (dtype, shape rules, op, root, scale factors, device)
// and keeps the join bookkeeping. Pure logic, no communication; owned by one
// worker thread.
#pragma once

#include <chrono>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/message.h"

namespace hvdcompat {

using Clock = std::chrono::steady_clock;

// One name's requests, one per submitting set rank, kept compactly (Note
// [Coordinator rows] in coordinator.cc): the first request to arrive, and only
// the requests that differ from it in a field the checks compare.
struct CoordinatorRow {
  Request first;
  std::unordered_map<int, Request> differing;  // by set rank
  std::vector<bool> have;                     // indexed by set rank
  int count = 0;
  int lowest = -1;  // the lowest set rank that submitted
  Clock::time_point first_seen;

  const Request& at(int set_rank) const {
    auto it = differing.find(set_rank);
    return it == differing.end() ? first : it->second;
  }
};

class Coordinator {
 public:
  // `global_ranks[i]` is the global rank of set rank i (used in messages).
  Coordinator(int size, std::vector<int> global_ranks, int process_set_id);

  void Add(Request request, Clock::time_point now);

  // Responses ready on every rank, in order of first arrival; a join
  // response last once every rank has joined. While some rank is joined, a
  // non-allreduce request is answered (with an error) as soon as it arrives.
  std::vector<Response> TakeReady();

  struct Stalled {
    std::string name;
    OpType op;
    double waited_seconds;
    std::vector<int> submitted;  // global ranks
    std::vector<int> missing;    // global ranks
  };
  // Names submitted by some ranks but not all for at least `seconds`.
  std::vector<Stalled> FindStalled(double seconds, Clock::time_point now) const;

  int joined_count() const { return joined_count_; }
  bool empty() const { return rows_.empty(); }

 private:
  using Row = CoordinatorRow;

  bool Ready(const Row& row) const;
  Response Validate(const std::string& name, const Row& row) const;
  std::string RankList(const std::vector<int>& set_ranks) const;

  int size_;
  std::vector<int> global_ranks_;
  int process_set_id_;
  std::unordered_map<std::string, Row> rows_;
  std::vector<std::string> order_;  // names by first arrival
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
};

}  // namespace hvdcompat
