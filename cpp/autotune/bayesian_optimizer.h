// Bayesian optimisation over the unit cube [0, 1]^d: a Gaussian-process
// surrogate of the observed scores (Note [Autotune surrogate]) and the next
// point chosen where the expected improvement is largest. Maximises.
//
// Scores are standardised (mean 0, standard deviation 1 over the samples so
// far) before fitting, so the noise knob and the hyperparameter grid do not
// depend on the scores' unit. Proposals are deterministic for a given seed
// and sample history.
//
// Thread: used by one thread (the coordinator's worker).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "autotune/gaussian_process.h"

namespace hvdcompat {

class BayesianOptimizer {
 public:
  // `noise`: observation noise standard deviation in standardised score
  // units (HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE). `xi`: EI margin.
  BayesianOptimizer(size_t dims, double noise, uint64_t seed, double xi = 0.01);

  size_t dims() const { return dims_; }
  size_t num_samples() const { return x_.size(); }
  // `x` in [0, 1]^dims (clamped).
  void AddSample(Point x, double y);
  // The point of largest expected improvement (the cube's centre before any
  // sample). Refits the model.
  Point NextSample();

  // The model as of the last Fit (NextSample or Fit): for tests and logs.
  void Fit();
  double ExpectedImprovementAt(const Point& x) const;
  const GaussianProcess& model() const { return gp_; }
  // Scores standardised as the model sees them, and the incumbent (largest
  // posterior mean over the samples) EI is measured against.
  const std::vector<double>& standardized() const { return ys_; }
  double incumbent() const { return incumbent_; }
  // Index of the sample with the largest posterior mean (the incumbent):
  // with noisy scores, a better pick than the largest score. Fits first.
  size_t BestSample();
  double xi() const { return xi_; }

 private:
  size_t dims_;
  double noise_var_;
  double xi_;
  std::mt19937_64 rng_;
  std::vector<Point> x_;
  std::vector<double> y_;
  std::vector<double> ys_;
  GaussianProcess gp_;
  double incumbent_ = 0;
  size_t incumbent_index_ = 0;
};

}  // namespace hvdcompat
