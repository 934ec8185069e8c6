// The autotuner (HOROVOD_AUTOTUNE=1): runs on the coordinator (rank 0 of
// the global process set), scores the engine's throughput over samples of
// training steps, and searches the tunable knobs for the best score.
//
// Note [Autotune search]
// Score: payload bytes of the collectives executed per microsecond of wall
// time (Horovod's unit), over one sample of `steps_per_sample` steps; a step
// ends when a named tensor comes round again. Each configuration is scored
// by the median of kSamplesPerScore samples. The first `warmup_samples`
// scores of the starting configuration are discarded (caches, allocators
// and MPI connections settle first).
// Search: fusion threshold, cycle time, fusion chunk size and large-call
// split, jointly, by Bayesian optimisation (Note [Autotune surrogate]) over
// the unit cube that maps onto the ranges below. The starting configuration
// is the first point scored, then three space-filling points, then the
// points of largest expected improvement, `bayes_opt_max_samples` points in
// all. Then, where a backend can switch them per cycle, the hierarchical
// flags are tried one at a time on top of the best point. The best point of
// the joint search is the one the model rates highest (largest posterior
// mean), not the luckiest score: on a busy machine one sample of a
// configuration can beat its true speed by more than the knobs matter. For
// the same reason, when that point is not the starting configuration, both
// are scored once more, back to back, and the starting one is kept unless
// the other beats it there: a point chosen for one lucky score must win a
// fresh comparison before it replaces the defaults.
// Knobs the user set (in the environment or by hvdcompatrun flags) keep
// their value and leave the search. The best configuration is kept when the
// search ends.
// Every change is announced in negotiation, so all ranks switch together
// (Note [Tuned params in negotiation], controller.h).
//
// Thread: the coordinator's worker thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "autotune/bayesian_optimizer.h"
#include "core/tuned_params.h"
#include "core/env.h"

namespace hvdcompat {

struct AutotuneOptions {
  std::string log_path;              // HOROVOD_AUTOTUNE_LOG; empty: no log file
  int64_t warmup_samples = 3;        // scores discarded before the search
  int64_t steps_per_sample = 10;     // steps in one sample
  int64_t bayes_opt_max_samples = 20;  // configurations scored in the joint search
  double gaussian_process_noise = 0.8; // noise sd, in units of the scores' sd
  // Knobs the user set: they keep their starting value.
  bool fixed_fusion_threshold = false;
  bool fixed_cycle_time = false;
  bool fixed_fusion_chunk = false;
  bool fixed_max_call = false;
  // Set only where a backend can switch these at a cycle boundary
  // (CollectiveBackend::TunesHierarchical); the user's setting also fixes them.
  bool tune_hierarchical_allreduce = false;
  bool tune_hierarchical_allgather = false;
  bool cache_enabled = true;  // reported in the log's cache_enabled column
  uint64_t seed = 2018;       // proposals are reproducible for a given history

  // From the HOROVOD_AUTOTUNE_* knobs of `config` (validated there), and
  // which tunables the environment sets explicitly.
  static AutotuneOptions FromConfig(const Config& config);
};

class ParameterManager {
 public:
  static constexpr int kSamplesPerScore = 5;
  // Horovod's columns, in Horovod's order, then this engine's own knobs.
  static const char* const kLogHeader;

  using Clock = std::chrono::steady_clock;

  // `initial`: the configuration the engine starts with. Opens (truncates)
  // the log file; a log that cannot be opened is reported and skipped.
  ParameterManager(const AutotuneOptions& options, const TunedParams& initial,
                   Clock::time_point now);

  // Whether anything is left to tune (false from the start when the user
  // fixed every tunable knob).
  bool active() const { return active_; }
  size_t num_tuned_knobs() const { return dims_.size(); }

  // The collectives one cycle executed: the names of the named tensors
  // (steps are counted by them) and the payload bytes of all of them.
  // Returns the configuration to announce when a scoring round completes and
  // the configuration changes (with active = false once the search is over).
  std::optional<TunedParams> Update(const std::vector<std::string>& names, int64_t bytes,
                                    Clock::time_point now);
  // The announced configuration took effect (every rank, this cycle): the
  // next sample starts now. Updates in between are ignored.
  void Applied(Clock::time_point now);

  const TunedParams& current() const { return current_; }
  const TunedParams& best() const { return best_; }
  double best_score() const { return best_score_; }

  // Maps between a configuration and the search cube, for tests.
  Point ToCube(const TunedParams& p) const;
  TunedParams FromCube(const Point& x) const;

 private:
  enum class Stage { kJoint, kConfirmStart, kConfirmBest, kHierAllreduce, kHierAllgather, kDone };
  enum class Dim { kFusionThreshold, kCycleTime, kFusionChunk, kMaxCall };

  std::optional<TunedParams> Score(double score);
  std::optional<TunedParams> NextStage();
  void StartSample(Clock::time_point now);
  void WriteRow(const TunedParams& p, double score);

  AutotuneOptions options_;
  TunedParams initial_;
  std::vector<Dim> dims_;
  BayesianOptimizer bo_;
  std::vector<Point> design_;  // the space-filling points after the start

  bool active_ = true;
  bool awaiting_apply_ = false;
  int64_t warmup_left_;
  Stage stage_ = Stage::kJoint;
  int64_t evaluated_ = 0;  // configurations scored in the joint stage
  std::vector<std::pair<TunedParams, double>> joint_;  // those and their scores
  double confirm_start_score_ = 0;  // the starting configuration, scored again
  TunedParams current_;
  TunedParams best_;
  double best_score_ = -1;

  // The sample being measured.
  std::unordered_map<std::string, int64_t> counts_;
  int sample_ = 0;
  double scores_[kSamplesPerScore] = {};
  int64_t bytes_ = 0;
  Clock::time_point sample_start_;

  std::ofstream log_;
};

}  // namespace hvdcompat
