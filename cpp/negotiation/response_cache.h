// Response cache: remembers the response negotiated for a tensor name so that
// in steady state ranks exchange only one "ready" bit per tensor.
//
// Contract: every rank of a process set calls Put/Touch/Erase in the same
// order with the same arguments (they act on the same ordered response
// lists), so bit positions agree across ranks without ever being exchanged.
// Not thread-safe: owned and used by one process set's worker thread.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/message.h"

namespace hvdcompat {

class ResponseCache {
 public:
  enum class State { kMiss, kHit, kInvalid };

  explicit ResponseCache(size_t capacity);

  bool enabled() const { return capacity_ > 0; }
  // 64-bit words needed to hold every bit ever used.
  size_t NumWords() const { return (high_water_ + 63) / 64; }
  size_t size() const { return by_name_.size(); }

  // kHit: the cached response serves `request` (bit set); kInvalid: the name
  // is cached with other parameters (bit set: the entry to evict everywhere).
  State Lookup(const Request& request, uint32_t* bit) const;

  // Inserts the (single-unit, non-error) response; evicts the least recently
  // used entry when full. Appends evicted bits to `evicted`.
  uint32_t Put(const Response& response, std::vector<uint32_t>* evicted);
  bool Has(uint32_t bit) const { return bit < slots_.size() && slots_[bit].used; }
  const Response& Get(uint32_t bit) const { return slots_[bit].response; }
  void Touch(uint32_t bit);
  void Erase(uint32_t bit);

  // Whether a request may be served from the cache at all.
  static bool Cacheable(const Request& request);
  static bool Cacheable(const Response& response);

 private:
  struct Slot {
    bool used = false;
    Response response;
    std::list<uint32_t>::iterator lru_pos;
  };
  size_t capacity_;
  size_t high_water_ = 0;
  std::vector<Slot> slots_;
  std::list<uint32_t> lru_;  // front: least recently used
  std::unordered_map<std::string, uint32_t> by_name_;
};

// Whether `request` is served by `response` (shape rules per op: allgather and
// alltoall may differ in dim 0 between ranks and between steps).
bool ResponseServes(const Response& response, const Request& request);

}  // namespace hvdcompat
