#include "negotiation/response_cache.h"

namespace hvdcompat {

namespace {
bool SameShapesExceptDim0(const std::vector<Shape>& a, const std::vector<Shape>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    for (size_t d = 1; d < a[i].size(); ++d) {
      if (a[i][d] != b[i][d]) return false;
    }
  }
  return true;
}
}  // namespace

bool ResponseServes(const Response& p, const Request& q) {
  if (p.units.size() != 1 || p.units[0].name != q.name) return false;
  if (p.op != q.op || p.dtype != q.dtype || p.reduce_op != q.reduce_op || p.root != q.root ||
      p.device != q.device || p.prescale != q.prescale || p.postscale != q.postscale) {
    return false;
  }
  if (q.op == OpType::kAllgather || q.op == OpType::kAlltoall) {
    return SameShapesExceptDim0(p.units[0].shapes, q.shapes);
  }
  return p.units[0].shapes == q.shapes;
}

ResponseCache::ResponseCache(size_t capacity) : capacity_(capacity), slots_(capacity) {}

bool ResponseCache::Cacheable(const Request& q) {
  // Unnamed ops get a fresh name every call: caching them would only evict
  // the entries that steady-state training reuses.
  return q.op != OpType::kJoin && q.op != OpType::kBarrier && !q.auto_named;
}

bool ResponseCache::Cacheable(const Response& p) {
  return !p.is_error() && p.units.size() == 1 && p.op != OpType::kJoin &&
         p.op != OpType::kBarrier && !p.auto_named;
}

ResponseCache::State ResponseCache::Lookup(const Request& q, uint32_t* bit) const {
  if (!enabled()) return State::kMiss;
  auto it = by_name_.find(q.name);
  if (it == by_name_.end()) return State::kMiss;
  *bit = it->second;
  return ResponseServes(slots_[it->second].response, q) ? State::kHit : State::kInvalid;
}

uint32_t ResponseCache::Put(const Response& response, std::vector<uint32_t>* evicted) {
  HVD_ENFORCE(enabled() && Cacheable(response), "caching an uncacheable response");
  const std::string& name = response.units[0].name;
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {
    slots_[it->second].response = response;
    Touch(it->second);
    return it->second;
  }
  uint32_t bit;
  if (by_name_.size() == capacity_) {
    bit = lru_.front();
    Erase(bit);
    evicted->push_back(bit);
  } else {
    // Lowest free slot: deterministic given the same history on every rank.
    bit = 0;
    while (slots_[bit].used) ++bit;
  }
  Slot& s = slots_[bit];
  s.used = true;
  s.response = response;
  lru_.push_back(bit);
  s.lru_pos = std::prev(lru_.end());
  by_name_[name] = bit;
  if (bit + 1 > high_water_) high_water_ = bit + 1;
  return bit;
}

void ResponseCache::Touch(uint32_t bit) {
  Slot& s = slots_[bit];
  lru_.splice(lru_.end(), lru_, s.lru_pos);
}

void ResponseCache::Erase(uint32_t bit) {
  Slot& s = slots_[bit];
  if (!s.used) return;
  by_name_.erase(s.response.units[0].name);
  lru_.erase(s.lru_pos);
  s.used = false;
  s.response = Response();
}

}  // namespace hvdcompat
