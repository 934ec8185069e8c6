// Fusion planning and the persistent host scratch the data path packs into.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/message.h"

namespace hvdcompat {

// Whether `b` may run in the same collective as `a` (same op, dtype, device,
// reduce op, root and scale factors; never errors, joins, barriers or
// alltoalls).
bool Fusable(const Response& a, const Response& b);

// Merges runs of consecutive fusable responses while the fused payload stays
// within `threshold_bytes` (0 disables fusion). Deterministic: every rank
// computes the same plan from the same list.
std::vector<Response> FuseResponses(std::vector<Response> responses, int64_t threshold_bytes);

// Growable, 64-byte aligned host buffer that keeps its memory between
// collectives (allocation is the slow part of a fresh buffer).
class HostScratch {
 public:
  HostScratch() = default;
  HostScratch(const HostScratch&) = delete;
  HostScratch& operator=(const HostScratch&) = delete;
  ~HostScratch() { std::free(data_); }
  // At least `bytes` of memory; contents are not preserved on growth.
  char* Reserve(size_t bytes);

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace hvdcompat
