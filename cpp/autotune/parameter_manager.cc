#include "autotune/parameter_manager.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <tuple>

#include "core/common.h"
#include "core/logging.h"

namespace hvdcompat {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// The search ranges. Byte sizes are searched by their base-2 logarithm and
// land on powers of two (a 3 MiB chunk is no better than 2 or 4 MiB, and the
// model learns faster on a coarser grid). The fusion threshold is searched
// in MiB, as Horovod does, up to the engine's 128 MiB default so the
// default stays reachable; the cycle time up to 20 ms, since this engine
// negotiates as soon as work arrives and a long window only adds latency.
struct Range {
  double lo, hi;
  bool log2;
};
constexpr Range kFusionMiB{0, 128, false};
constexpr Range kCycleMs{0, 20, false};
constexpr Range kChunkLog2{16, 23, true};    // 64 KiB .. 8 MiB
constexpr Range kMaxCallLog2{20, 26, true};  // 1 MiB .. 64 MiB

double ToUnit(const Range& r, double v) {
  return std::min(1.0, std::max(0.0, (v - r.lo) / (r.hi - r.lo)));
}
double FromUnit(const Range& r, double u) {
  return r.lo + std::min(1.0, std::max(0.0, u)) * (r.hi - r.lo);
}

// Point i (from 1) of the Halton sequence in base b: well-spread, fixed.
double Halton(int i, int b) {
  double f = 1, r = 0;
  while (i > 0) {
    f /= b;
    r += f * (i % b);
    i /= b;
  }
  return r;
}

std::string Csv(double v) {
  std::ostringstream os;
  os << std::setprecision(10) << v;
  return os.str();
}

}  // namespace

const char* const ParameterManager::kLogHeader =
    "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
    "tensor_fusion_threshold,score,fusion_chunk_bytes,max_call_bytes";

AutotuneOptions AutotuneOptions::FromConfig(const Config& c) {
  AutotuneOptions o;
  o.log_path = c.autotune_log;
  o.warmup_samples = c.autotune_warmup_samples;
  o.steps_per_sample = c.autotune_steps_per_sample;
  o.bayes_opt_max_samples = c.autotune_bayes_opt_max_samples;
  o.gaussian_process_noise = c.autotune_gaussian_process_noise;
  o.fixed_fusion_threshold = KnobExplicit(Knob::kFusionThreshold);
  o.fixed_cycle_time = KnobExplicit(Knob::kCycleTimeMs);
  o.fixed_fusion_chunk = KnobExplicit(Knob::kFusionChunkBytes);
  o.fixed_max_call = KnobExplicit(Knob::kMaxCallBytes);
  o.cache_enabled = c.cache_capacity > 0;
  return o;
}

ParameterManager::ParameterManager(const AutotuneOptions& options, const TunedParams& initial,
                                   Clock::time_point now)
    : options_(options),
      initial_(initial),
      dims_([&] {
        std::vector<Dim> d;
        if (!options.fixed_fusion_threshold) d.push_back(Dim::kFusionThreshold);
        if (!options.fixed_cycle_time) d.push_back(Dim::kCycleTime);
        if (!options.fixed_fusion_chunk) d.push_back(Dim::kFusionChunk);
        if (!options.fixed_max_call) d.push_back(Dim::kMaxCall);
        return d;
      }()),
      bo_(dims_.size(), options.gaussian_process_noise, options.seed),
      warmup_left_(options.warmup_samples) {
  initial_.active = true;
  current_ = initial_;
  best_ = initial_;
  static const int kBases[] = {2, 3, 5, 7};
  for (int i = 1; i <= 3; ++i) {
    Point p(dims_.size());
    for (size_t d = 0; d < dims_.size(); ++d) p[d] = Halton(i, kBases[d]);
    design_.push_back(std::move(p));
  }
  active_ = !dims_.empty() || options_.tune_hierarchical_allreduce ||
            options_.tune_hierarchical_allgather;
  if (!active_) current_.active = false;
  StartSample(now);
  if (!options_.log_path.empty()) {
    log_.open(options_.log_path, std::ios::out | std::ios::trunc);
    if (!log_.good()) {
      HVD_LOG(kWarning) << "Autotuner: cannot open HOROVOD_AUTOTUNE_LOG=" << options_.log_path
                        << " for writing (" << std::strerror(errno)
                        << "); tuning continues without a log. Point it at a writable file.";
    } else {
      log_ << kLogHeader << "\n" << std::flush;
    }
  }
  if (!active_) {
    HVD_LOG(kWarning) << "Autotuner: HOROVOD_AUTOTUNE=1, but every tunable knob was set "
                         "explicitly (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, "
                         "HVDCOMPAT_FUSION_CHUNK_BYTES, HVDCOMPAT_MAX_CALL_BYTES); nothing to "
                         "tune. Unset one of them to let the autotuner search it.";
  } else {
    HVD_LOG(kInfo) << "Autotuner: tuning " << dims_.size() << " knob(s) from "
                   << current_.ToString();
  }
}

Point ParameterManager::ToCube(const TunedParams& p) const {
  Point x;
  for (Dim d : dims_) {
    switch (d) {
      case Dim::kFusionThreshold:
        x.push_back(ToUnit(kFusionMiB, p.fusion_threshold_bytes / kMiB));
        break;
      case Dim::kCycleTime:
        x.push_back(ToUnit(kCycleMs, p.cycle_time_ms));
        break;
      case Dim::kFusionChunk:
        x.push_back(ToUnit(kChunkLog2, std::log2(std::max<int64_t>(1, p.fusion_chunk_bytes))));
        break;
      case Dim::kMaxCall:
        x.push_back(ToUnit(kMaxCallLog2, std::log2(std::max<int64_t>(1, p.max_call_bytes))));
        break;
    }
  }
  return x;
}

TunedParams ParameterManager::FromCube(const Point& x) const {
  TunedParams p = initial_;
  for (size_t i = 0; i < dims_.size(); ++i) {
    switch (dims_[i]) {
      case Dim::kFusionThreshold:
        // Whole KiB: the plan only compares payload sizes against it.
        p.fusion_threshold_bytes =
            static_cast<int64_t>(std::llround(FromUnit(kFusionMiB, x[i]) * 1024)) * 1024;
        break;
      case Dim::kCycleTime:
        p.cycle_time_ms = std::round(FromUnit(kCycleMs, x[i]) * 10) / 10;
        break;
      case Dim::kFusionChunk:
        p.fusion_chunk_bytes = int64_t{1} << std::lround(FromUnit(kChunkLog2, x[i]));
        break;
      case Dim::kMaxCall:
        p.max_call_bytes = int64_t{1} << std::lround(FromUnit(kMaxCallLog2, x[i]));
        break;
    }
  }
  return p;
}

void ParameterManager::StartSample(Clock::time_point now) {
  counts_.clear();
  sample_ = 0;
  bytes_ = 0;
  sample_start_ = now;
}

void ParameterManager::Applied(Clock::time_point now) {
  awaiting_apply_ = false;
  StartSample(now);
}

std::optional<TunedParams> ParameterManager::Update(const std::vector<std::string>& names,
                                                    int64_t bytes, Clock::time_point now) {
  if (!active_ || awaiting_apply_) return std::nullopt;
  for (const auto& name : names) {
    const int64_t seen = counts_[name]++;
    if (seen >= (sample_ + 1) * options_.steps_per_sample) {
      // This tensor came round once more than the sample's steps: the
      // sample is complete (this cycle's bytes belong to the next one).
      const double us = std::chrono::duration<double, std::micro>(now - sample_start_).count();
      scores_[sample_++] = us > 0 ? static_cast<double>(bytes_) / us : 0.0;
      bytes_ = 0;
      sample_start_ = now;
      break;
    }
  }
  bytes_ += bytes;
  if (sample_ < kSamplesPerScore) return std::nullopt;
  std::sort(scores_, scores_ + kSamplesPerScore);
  const double median = scores_[kSamplesPerScore / 2];
  StartSample(now);
  std::optional<TunedParams> next = Score(median);
  if (next) awaiting_apply_ = true;
  return next;
}

std::optional<TunedParams> ParameterManager::Score(double score) {
  if (warmup_left_ > 0) {
    --warmup_left_;
    HVD_LOG(kInfo) << "Autotuner: warming up (" << warmup_left_ << " remaining), score " << score;
    return std::nullopt;
  }
  WriteRow(current_, score);
  HVD_LOG(kInfo) << "Autotuner: [" << current_.ToString() << "] score " << score;
  if (stage_ == Stage::kJoint && !dims_.empty()) {
    bo_.AddSample(ToCube(current_), score);
    joint_.emplace_back(current_, score);
    ++evaluated_;
    if (evaluated_ < options_.bayes_opt_max_samples) {
      const size_t k = static_cast<size_t>(evaluated_ - 1);
      current_ = FromCube(k < design_.size() ? design_[k] : bo_.NextSample());
      return current_;
    }
    std::tie(best_, best_score_) = joint_[bo_.BestSample()];
    if (best_ != joint_[0].first) {
      stage_ = Stage::kConfirmStart;
      current_ = joint_[0].first;
      return current_;
    }
  } else if (stage_ == Stage::kConfirmStart) {
    confirm_start_score_ = score;
    stage_ = Stage::kConfirmBest;
    current_ = best_;
    return current_;
  } else if (stage_ == Stage::kConfirmBest) {
    // Scored back to back, under the same load, and neither chosen for a
    // lucky score: the fairest comparison the search has.
    if (confirm_start_score_ >= score) {
      best_ = joint_[0].first;
      best_score_ = confirm_start_score_;
    } else {
      best_score_ = score;
    }
  } else if (score > best_score_) {
    // A flag tried on top of the best point: keep it only if it scored better.
    best_score_ = score;
    best_ = current_;
  }
  return NextStage();
}

std::optional<TunedParams> ParameterManager::NextStage() {
  // Each flag is tried once, flipped, on top of the best point so far.
  while (true) {
    if (stage_ == Stage::kJoint || stage_ == Stage::kConfirmStart ||
        stage_ == Stage::kConfirmBest) {
      stage_ = Stage::kHierAllreduce;
      if (options_.tune_hierarchical_allreduce) {
        current_ = best_;
        current_.hierarchical_allreduce = !best_.hierarchical_allreduce;
        return current_;
      }
    } else if (stage_ == Stage::kHierAllreduce) {
      stage_ = Stage::kHierAllgather;
      if (options_.tune_hierarchical_allgather) {
        current_ = best_;
        current_.hierarchical_allgather = !best_.hierarchical_allgather;
        return current_;
      }
    } else {
      break;
    }
  }
  stage_ = Stage::kDone;
  active_ = false;
  current_ = best_;
  current_.active = false;
  WriteRow(best_, best_score_);
  HVD_LOG(kInfo) << "Autotuner: best [" << best_.ToString() << "] score " << best_score_;
  return current_;
}

void ParameterManager::WriteRow(const TunedParams& p, double score) {
  if (!log_.is_open() || !log_.good()) return;
  log_ << (p.hierarchical_allreduce ? 1 : 0) << "," << (p.hierarchical_allgather ? 1 : 0) << ","
       << 0 << "," << (options_.cache_enabled ? 1 : 0) << "," << Csv(p.cycle_time_ms) << ","
       << Csv(p.fusion_threshold_bytes / kMiB) << "," << Csv(score) << ","
       << p.fusion_chunk_bytes << "," << p.max_call_bytes << "\n"
       << std::flush;
}

}  // namespace hvdcompat
