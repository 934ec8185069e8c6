// What the engine's tunables are now, and every change the autotuner made,
// with the global set's negotiation cycle it took effect in. Written by the
// global set's worker; read by any thread (hvd.engine_stats()).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "core/tuned_params.h"

namespace hvdcompat {

class TuningRecord {
 public:
  struct Change {
    uint64_t cycle;  // the global set's cycle, counted from 1 on every rank
    TunedParams params;
  };
  // Enough for any search (warm-up keeps the values; each scored point is
  // one change); later changes are counted but not kept.
  static constexpr size_t kMaxHistory = 4096;

  // The configuration at init (no change recorded).
  void Start(const TunedParams& p) {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = p;
    history_.clear();
    changes_ = 0;
  }
  void Apply(uint64_t cycle, const TunedParams& p) {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = p;
    ++changes_;
    if (history_.size() < kMaxHistory) history_.push_back({cycle, p});
  }
  TunedParams current() const {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }
  uint64_t changes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return changes_;
  }
  std::vector<Change> history() const {
    std::lock_guard<std::mutex> lock(mu_);
    return history_;
  }

 private:
  mutable std::mutex mu_;
  TunedParams current_;
  uint64_t changes_ = 0;
  std::vector<Change> history_;
};

}  // namespace hvdcompat
