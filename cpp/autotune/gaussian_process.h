// Gaussian-process regression for the autotuner's surrogate model, and the
// expected-improvement acquisition built on it. Pure math on small dense
// matrices (tens of points, a handful of dimensions); no communication.
//
// Note [Autotune surrogate]: scores are modelled as f(x) + noise with
//   f ~ GP(0, k),  k(a, b) = s2 * exp(-|a - b|^2 / (2 l^2)),
//   noise ~ N(0, n2) independently per observation.
// Given observations X (n points), y: K = k(X, X) + n2 I = L L^T (Cholesky),
// alpha = K^-1 y, and at a query q with k* = k(X, q):
//   mean(q) = k*^T alpha,  var(q) = s2 - |L^-1 k*|^2.
// The log marginal likelihood -y^T alpha / 2 - sum(log L_ii) - n log(2 pi) / 2
// chooses l and s2 (a grid over both; n2 is the user's noise knob). The
// expected improvement over the incumbent `best` with margin xi is, for
// d = mean - best - xi and z = d / sd,
//   EI = d Phi(z) + sd phi(z)   (0 where sd = 0),
// Phi and phi the standard normal CDF and density: the expected amount by
// which a sample at q beats the incumbent, large where the mean is high
// (exploitation) or the model is unsure (exploration).
//
// Thread: none of its own; each object is used by one thread.
#pragma once

#include <vector>

namespace hvdcompat {

using Point = std::vector<double>;

class GaussianProcess {
 public:
  struct Hyper {
    double length = 0.3;      // l, in the units of the inputs
    double signal_var = 1.0;  // s2
    double noise_var = 0.64;  // n2
  };

  // Conditions the model on `x` (n points of equal dimension) and `y`.
  // Throws InternalError when n = 0 or the kernel matrix is not positive
  // definite (n2 = 0 with repeated points).
  void Fit(const std::vector<Point>& x, const std::vector<double>& y, const Hyper& hyper);
  // Posterior mean and standard deviation of f at `q`. Only after Fit.
  void Predict(const Point& q, double* mean, double* stddev) const;
  double LogMarginalLikelihood() const { return lml_; }
  const Hyper& hyper() const { return hyper_; }

  // The (length, signal variance) on a fixed log-spaced grid that maximises
  // the log marginal likelihood, with noise_var given. Deterministic.
  static Hyper ChooseHyper(const std::vector<Point>& x, const std::vector<double>& y,
                           double noise_var);

 private:
  double Kernel(const Point& a, const Point& b) const;

  Hyper hyper_;
  std::vector<Point> x_;
  std::vector<double> chol_;   // L, row-major n x n (lower triangle used)
  std::vector<double> alpha_;  // K^-1 y
  double lml_ = 0;
};

// d Phi(d / sd) + sd phi(d / sd) with d = mean - best - xi; 0 when sd <= 0.
double ExpectedImprovement(double mean, double stddev, double best, double xi);

}  // namespace hvdcompat
