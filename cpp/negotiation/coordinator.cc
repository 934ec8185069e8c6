#include "negotiation/coordinator.h"

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>

namespace hvdcompat {

namespace {

std::string Fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// "rank 0: float32; ranks 1, 2: int64" from one value per submitting rank.
std::string ByRank(const std::vector<std::pair<int, std::string>>& values) {
  std::map<std::string, std::vector<int>> groups;
  std::vector<std::string> order;
  for (const auto& [rank, value] : values) {
    if (!groups.count(value)) order.push_back(value);
    groups[value].push_back(rank);
  }
  std::ostringstream os;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& ranks = groups[order[i]];
    if (i) os << "; ";
    os << (ranks.size() == 1 ? "rank " : "ranks ");
    for (size_t j = 0; j < ranks.size(); ++j) os << (j ? ", " : "") << ranks[j];
    os << ": " << order[i];
  }
  return os.str();
}

std::string ShapesString(const std::vector<Shape>& shapes) {
  if (shapes.size() == 1) return ShapeString(shapes[0]);
  std::string s = "(";
  for (size_t i = 0; i < shapes.size(); ++i) s += (i ? ", " : "") + ShapeString(shapes[i]);
  return s + ")";
}

std::string TrailingDims(const std::vector<Shape>& shapes) {
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (i) s += ", ";
    if (shapes[i].empty()) {
      s += "scalar";
      continue;
    }
    s += "[*";
    for (size_t d = 1; d < shapes[i].size(); ++d) s += ", " + std::to_string(shapes[i][d]);
    s += "]";
  }
  return s;
}

}  // namespace

Coordinator::Coordinator(int size, std::vector<int> global_ranks, int process_set_id)
    : size_(size),
      global_ranks_(std::move(global_ranks)),
      process_set_id_(process_set_id),
      joined_(size, false) {}

void Coordinator::Add(const Request& q, Clock::time_point now) {
  HVD_ENFORCE(q.rank >= 0 && q.rank < size_, "request from rank " << q.rank << " of " << size_);
  if (q.op == OpType::kJoin) {
    if (!joined_[q.rank]) {
      joined_[q.rank] = true;
      ++joined_count_;
    }
    last_joined_ = q.rank;
    return;
  }
  auto it = rows_.find(q.name);
  if (it == rows_.end()) {
    Row row;
    row.requests.resize(size_);
    row.have.assign(size_, false);
    row.first_seen = now;
    it = rows_.emplace(q.name, std::move(row)).first;
    order_.push_back(q.name);
  }
  Row& row = it->second;
  if (!row.have[q.rank]) {
    row.have[q.rank] = true;
    ++row.count;
  }
  row.requests[q.rank] = q;
}

bool Coordinator::Ready(const Row& row) const {
  if (joined_count_ > 0) {
    // Only allreduce may run while ranks are joined, so anything else is an
    // error however many ranks submit it: answer the first submitter now.
    // Waiting for the rest could hang, since ranks that joined at different
    // times have issued different numbers of unnamed ops and name them apart.
    for (int r = 0; r < size_; ++r) {
      if (row.have[r] && row.requests[r].op != OpType::kAllreduce) return true;
    }
  }
  for (int r = 0; r < size_; ++r) {
    if (!row.have[r] && !joined_[r]) return false;
  }
  return true;
}

std::string Coordinator::RankList(const std::vector<int>& set_ranks) const {
  std::string s;
  for (size_t i = 0; i < set_ranks.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(global_ranks_[set_ranks[i]]);
  }
  return s;
}

Response Coordinator::Validate(const std::string& name, const Row& row) const {
  std::vector<int> who;
  for (int r = 0; r < size_; ++r) {
    if (row.have[r]) who.push_back(r);
  }
  const Request& first = row.requests[who[0]];
  Response p;
  p.op = first.op;
  p.dtype = first.dtype;
  p.reduce_op = first.reduce_op;
  p.root = first.root;
  p.device = first.device;
  p.prescale = first.prescale;
  p.postscale = first.postscale;
  p.auto_named = first.auto_named;
  p.units.push_back({name, first.shapes});

  const char* op = OpTypeName(first.op);
  std::string where = process_set_id_ == 0
                          ? std::string()
                          : " in process set " + std::to_string(process_set_id_);
  auto fail = [&](const std::string& what, const std::string& detail, const std::string& advice) {
    p.error = std::string(op) + " '" + name + "'" + where + ": ranks disagree on " + what + ": " +
              detail + ". " + advice;
    p.error_code = StatusCode::kPrecondition;
    return p;
  };
  auto values = [&](const std::function<std::string(const Request&)>& f) {
    std::vector<std::pair<int, std::string>> v;
    for (int r : who) v.emplace_back(global_ranks_[r], f(row.requests[r]));
    return ByRank(v);
  };
  auto differ = [&](const std::function<bool(const Request&, const Request&)>& same) {
    for (int r : who) {
      if (!same(first, row.requests[r])) return true;
    }
    return false;
  };
  const std::string same_call =
      "Every rank must call the same operation for a given name, with the same dtype and "
      "compatible shapes.";

  if (differ([](const Request& a, const Request& b) { return a.op == b.op; })) {
    p.error = std::string("tensor '") + name + "'" + where +
              ": ranks submitted different operations under one name: " +
              values([](const Request& q) { return std::string(OpTypeName(q.op)); }) +
              ". Give each collective its own name, and call them in the same order on every "
              "rank.";
    p.error_code = StatusCode::kPrecondition;
    return p;
  }
  if (joined_count_ > 0 && first.op != OpType::kAllreduce) {
    std::vector<int> joined;
    for (int r = 0; r < size_; ++r) {
      if (joined_[r]) joined.push_back(r);
    }
    p.error = std::string(op) + " '" + name + "'" + where + " is not supported while rank(s) " +
              RankList(joined) +
              " have called hvd.join(); only allreduce can run while ranks are joined (joined "
              "ranks contribute zeros). Finish " + op + " calls before joining.";
    p.error_code = StatusCode::kPrecondition;
    return p;
  }
  if (first.op == OpType::kBarrier) return p;
  if (differ([](const Request& a, const Request& b) { return a.dtype == b.dtype; })) {
    return fail("dtype", values([](const Request& q) { return std::string(DataTypeName(q.dtype)); }),
                same_call);
  }
  if (differ([](const Request& a, const Request& b) { return a.device == b.device; })) {
    return fail("device",
                values([](const Request& q) {
                  return std::string(q.device == kCpuDevice ? "cpu" : "cuda");
                }),
                "Place the tensor on the same kind of device on every rank.");
  }
  if (first.op == OpType::kAllreduce || first.op == OpType::kReducescatter) {
    if (differ([](const Request& a, const Request& b) { return a.reduce_op == b.reduce_op; })) {
      return fail("the reduce op",
                  values([](const Request& q) { return std::string(ReduceOpName(q.reduce_op)); }),
                  "Pass the same op= on every rank.");
    }
    if (differ([](const Request& a, const Request& b) {
          return a.prescale == b.prescale && a.postscale == b.postscale;
        })) {
      return fail("scale factors",
                  values([](const Request& q) {
                    return "prescale " + Fmt(q.prescale) + ", postscale " + Fmt(q.postscale);
                  }),
                  "Pass the same prescale_factor and postscale_factor on every rank.");
    }
  }
  if (first.op == OpType::kBroadcast &&
      differ([](const Request& a, const Request& b) { return a.root == b.root; })) {
    return fail("the root rank",
                values([&](const Request& q) { return std::to_string(global_ranks_[q.root]); }),
                "Pass the same root_rank on every rank.");
  }
  if (differ([](const Request& a, const Request& b) { return a.shapes.size() == b.shapes.size(); })) {
    return fail("the number of tensors in the group",
                values([](const Request& q) { return std::to_string(q.shapes.size()); }),
                "Grouped operations need the same list length on every rank.");
  }
  bool dim0_may_differ = first.op == OpType::kAllgather || first.op == OpType::kAlltoall;
  if (dim0_may_differ) {
    bool bad = differ([](const Request& a, const Request& b) {
      for (size_t i = 0; i < a.shapes.size(); ++i) {
        if (a.shapes[i].size() != b.shapes[i].size()) return false;
        if (a.shapes[i].empty()) return false;  // scalars cannot be concatenated
        for (size_t d = 1; d < a.shapes[i].size(); ++d) {
          if (a.shapes[i][d] != b.shapes[i][d]) return false;
        }
      }
      return true;
    });
    if (bad || first.shapes.empty() || first.shapes[0].empty()) {
      return fail("tensor shape (all dimensions but the first must match)",
                  values([](const Request& q) { return TrailingDims(q.shapes) + " from " + ShapesString(q.shapes); }),
                  std::string(op) + " concatenates along dimension 0; the other dimensions "
                  "must be equal on every rank.");
    }
  } else if (differ([](const Request& a, const Request& b) { return a.shapes == b.shapes; })) {
    return fail("tensor shape", values([](const Request& q) { return ShapesString(q.shapes); }),
                same_call);
  }
  return p;
}

std::vector<Response> Coordinator::TakeReady() {
  std::vector<Response> out;
  std::vector<std::string> keep;
  for (const auto& name : order_) {
    auto it = rows_.find(name);
    if (it == rows_.end()) continue;
    if (Ready(it->second)) {
      out.push_back(Validate(name, it->second));
      rows_.erase(it);
    } else {
      keep.push_back(name);
    }
  }
  order_.swap(keep);
  if (joined_count_ == size_) {
    Response join;
    join.op = OpType::kJoin;
    join.units.push_back({"join", {}});
    join.last_joined = last_joined_;
    out.push_back(join);
    joined_.assign(size_, false);
    joined_count_ = 0;
    last_joined_ = -1;
  }
  return out;
}

std::vector<Coordinator::Stalled> Coordinator::FindStalled(double seconds,
                                                          Clock::time_point now) const {
  std::vector<Stalled> out;
  for (const auto& name : order_) {
    auto it = rows_.find(name);
    if (it == rows_.end()) continue;
    const Row& row = it->second;
    double waited = std::chrono::duration<double>(now - row.first_seen).count();
    if (waited < seconds) continue;
    Stalled s;
    s.name = name;
    for (int r = 0; r < size_; ++r) {
      if (row.have[r]) {
        s.op = row.requests[r].op;
        s.submitted.push_back(global_ranks_[r]);
      } else if (!joined_[r]) {
        s.missing.push_back(global_ranks_[r]);
      }
    }
    s.waited_seconds = waited;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace hvdcompat
