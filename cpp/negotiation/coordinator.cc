#include "negotiation/coordinator.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
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
    s += "[*";
    for (size_t d = 1; d < shapes[i].size(); ++d) s += ", " + std::to_string(shapes[i][d]);
    s += "]";
  }
  return s;
}

// Note [Coordinator rows]: at the first iteration every rank sends every
// name, so the coordinator holds ranks x names requests at once. Nearly all
// are equal field for field to the name's first (an allreduce of one shape
// everywhere), so a row keeps the first request and only those that differ
// in a field some check compares (SameForChecks): memory and the checks of
// an agreeing row are then independent of the number of ranks, and the
// per-rank values are walked only when something differs (to name them).
bool SameForChecks(const Request& a, const Request& b) {
  return a.op == b.op && a.dtype == b.dtype && a.reduce_op == b.reduce_op && a.root == b.root &&
         a.device == b.device && a.prescale == b.prescale && a.postscale == b.postscale &&
         a.auto_named == b.auto_named && a.shapes == b.shapes;
}

// One row's requests as the checks see them: who submitted, whether they
// agree on a field, and each rank's value of it for the message.
class RowView {
 public:
  RowView(const CoordinatorRow& row, const std::vector<int>& global_ranks)
      : row_(row), global_ranks_(global_ranks) {}

  // The lowest submitting rank's request (its shapes go into the response).
  const Request& first() const { return row_.at(row_.lowest); }
  int global_rank(int set_rank) const { return global_ranks_[set_rank]; }

  // Every check compares only fields SameForChecks compares, so a row with
  // no differing request agrees on all of them.
  bool Differ(const std::function<bool(const Request&, const Request&)>& same) const {
    if (row_.differing.empty()) return false;
    const Request& f = first();
    for (size_t r = 0; r < row_.have.size(); ++r) {
      if (row_.have[r] && !same(f, row_.at(static_cast<int>(r)))) return true;
    }
    return false;
  }

  std::string Values(const std::function<std::string(const Request&)>& f) const {
    std::vector<std::pair<int, std::string>> v;
    for (size_t r = 0; r < row_.have.size(); ++r) {
      if (row_.have[r]) v.emplace_back(global_ranks_[r], f(row_.at(static_cast<int>(r))));
    }
    return ByRank(v);
  }

 private:
  const CoordinatorRow& row_;
  const std::vector<int>& global_ranks_;
};

// Ranks that disagree on one property of an op.
struct Disagreement {
  std::string what;    // e.g. "dtype"
  std::string detail;  // each rank's value
  std::string advice;
};

constexpr const char* kSameCall =
    "Every rank must call the same operation for a given name, with the same dtype and "
    "compatible shapes.";

Response FirstResponse(const std::string& name, const Request& first) {
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
  return p;
}

// dtype and device: every op with tensors.
std::optional<Disagreement> BufferMismatch(const RowView& v) {
  if (v.Differ([](const Request& a, const Request& b) { return a.dtype == b.dtype; })) {
    return Disagreement{
        "dtype", v.Values([](const Request& q) { return std::string(DataTypeName(q.dtype)); }),
        kSameCall};
  }
  if (v.Differ([](const Request& a, const Request& b) { return a.device == b.device; })) {
    return Disagreement{"device", v.Values([](const Request& q) {
                          return std::string(q.device == kCpuDevice ? "cpu" : "cuda");
                        }),
                        "Place the tensor on the same kind of device on every rank."};
  }
  return std::nullopt;
}

// The op's own arguments: reduce op and scale factors, or the root.
std::optional<Disagreement> ArgumentMismatch(const RowView& v) {
  const OpType op = v.first().op;
  if (op == OpType::kAllreduce || op == OpType::kReducescatter) {
    if (v.Differ([](const Request& a, const Request& b) { return a.reduce_op == b.reduce_op; })) {
      return Disagreement{
          "the reduce op",
          v.Values([](const Request& q) { return std::string(ReduceOpName(q.reduce_op)); }),
          "Pass the same op= on every rank."};
    }
    if (v.Differ([](const Request& a, const Request& b) {
          return a.prescale == b.prescale && a.postscale == b.postscale;
        })) {
      return Disagreement{"scale factors", v.Values([](const Request& q) {
                            return "prescale " + Fmt(q.prescale) + ", postscale " +
                                   Fmt(q.postscale);
                          }),
                          "Pass the same prescale_factor and postscale_factor on every rank."};
    }
  }
  if (op == OpType::kBroadcast &&
      v.Differ([](const Request& a, const Request& b) { return a.root == b.root; })) {
    return Disagreement{
        "the root rank",
        v.Values([&](const Request& q) { return std::to_string(v.global_rank(q.root)); }),
        "Pass the same root_rank on every rank."};
  }
  return std::nullopt;
}

// The group's length, then its shapes (allgather and alltoall: all but dimension 0).
std::optional<Disagreement> ShapeMismatch(const RowView& v) {
  const Request& first = v.first();
  if (v.Differ([](const Request& a, const Request& b) { return a.shapes.size() == b.shapes.size(); })) {
    return Disagreement{"the number of tensors in the group",
                        v.Values([](const Request& q) { return std::to_string(q.shapes.size()); }),
                        "Grouped operations need the same list length on every rank."};
  }
  if (first.op != OpType::kAllgather && first.op != OpType::kAlltoall) {
    if (v.Differ([](const Request& a, const Request& b) { return a.shapes == b.shapes; })) {
      return Disagreement{"tensor shape",
                          v.Values([](const Request& q) { return ShapesString(q.shapes); }),
                          kSameCall};
    }
    return std::nullopt;
  }
  bool bad = v.Differ([](const Request& a, const Request& b) {
    for (size_t i = 0; i < a.shapes.size(); ++i) {
      if (a.shapes[i].size() != b.shapes[i].size()) return false;
      for (size_t d = 1; d < a.shapes[i].size(); ++d) {
        if (a.shapes[i][d] != b.shapes[i][d]) return false;
      }
    }
    return true;
  });
  // Scalars never get here: Enqueue refuses them (engine/request_rules.cc).
  if (bad || first.shapes.empty()) {
    return Disagreement{
        "tensor shape (all dimensions but the first must match)",
        v.Values([](const Request& q) { return TrailingDims(q.shapes) + " from " + ShapesString(q.shapes); }),
        std::string(OpTypeName(first.op)) + " concatenates along dimension 0; the other "
        "dimensions must be equal on every rank."};
  }
  return std::nullopt;
}

}  // namespace

Coordinator::Coordinator(int size, std::vector<int> global_ranks, int process_set_id)

    : size_(size),
      global_ranks_(std::move(global_ranks)),
      process_set_id_(process_set_id),
      joined_(size, false) {}

void Coordinator::Add(Request q, Clock::time_point now) {
  HVD_ENFORCE(q.rank >= 0 && q.rank < size_, "request from rank " << q.rank << " of " << size_);
  if (q.op == OpType::kJoin) {
    if (!joined_[q.rank]) {
      joined_[q.rank] = true;
      ++joined_count_;
    }
    last_joined_ = q.rank;
    return;
  }
  const int rank = q.rank;
  auto it = rows_.find(q.name);
  if (it == rows_.end()) {
    Row row;
    row.have.assign(size_, false);
    row.have[rank] = true;
    row.count = 1;
    row.lowest = rank;
    row.first_seen = now;
    order_.push_back(q.name);
    std::string name = q.name;
    row.first = std::move(q);
    rows_.emplace(std::move(name), std::move(row));
    return;
  }
  Row& row = it->second;
  if (!row.have[rank]) {
    row.have[rank] = true;
    ++row.count;
    if (rank < row.lowest) row.lowest = rank;
  }
  // Note [Coordinator rows]; a rank that submits again replaces its request.
  if (SameForChecks(row.first, q)) {
    if (!row.differing.empty()) row.differing.erase(rank);
  } else {
    row.differing[rank] = std::move(q);
  }
}

bool Coordinator::Ready(const Row& row) const {
  if (joined_count_ > 0) {
    // Only allreduce may run while ranks are joined, so anything else is an
    // error however many ranks submit it: answer the first submitter now.
    // Waiting for the rest could hang, since ranks that joined at different
    // times have issued different numbers of unnamed ops and name them apart.
    for (int r = 0; r < size_; ++r) {
      if (row.have[r] && row.at(r).op != OpType::kAllreduce) return true;
    }
  } else {
    return row.count == size_;
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
  RowView view(row, global_ranks_);
  Response p = FirstResponse(name, view.first());
  const char* op = OpTypeName(p.op);
  const std::string where = process_set_id_ == 0
                                ? std::string()
                                : " in process set " + std::to_string(process_set_id_);
  auto fail = [&](std::string error) {
    p.error = std::move(error);
    p.error_code = StatusCode::kPrecondition;
    return p;
  };
  if (view.Differ([](const Request& a, const Request& b) { return a.op == b.op; })) {
    return fail("tensor '" + name + "'" + where +
                ": ranks submitted different operations under one name: " +
                view.Values([](const Request& q) { return std::string(OpTypeName(q.op)); }) +
                ". Give each collective its own name, and call them in the same order on every "
                "rank.");
  }
  if (joined_count_ > 0 && p.op != OpType::kAllreduce) {
    std::vector<int> joined;
    for (int r = 0; r < size_; ++r) {
      if (joined_[r]) joined.push_back(r);
    }
    return fail(std::string(op) + " '" + name + "'" + where + " is not supported while rank(s) " +
                RankList(joined) +
                " have called hvd.join(); only allreduce can run while ranks are joined (joined "
                "ranks contribute zeros). Finish " + op + " calls before joining.");
  }
  if (p.op == OpType::kBarrier) return p;
  std::optional<Disagreement> d = BufferMismatch(view);
  if (!d) d = ArgumentMismatch(view);
  if (!d) d = ShapeMismatch(view);
  if (!d) return p;
  return fail(std::string(op) + " '" + name + "'" + where + ": ranks disagree on " + d->what +
              ": " + d->detail + ". " + d->advice);
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
        s.op = row.at(r).op;
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
