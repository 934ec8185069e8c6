#include "autotune/gaussian_process.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "core/common.h"

namespace hvdcompat {

namespace {

constexpr double kPi = 3.14159265358979323846;

// In-place Cholesky of the n x n row-major `a` (lower triangle); false when
// a pivot is not positive.
bool Cholesky(std::vector<double>* a, size_t n) {
  std::vector<double>& m = *a;
  for (size_t j = 0; j < n; ++j) {
    double d = m[j * n + j];
    for (size_t k = 0; k < j; ++k) d -= m[j * n + k] * m[j * n + k];
    if (!(d > 0)) return false;
    const double ljj = std::sqrt(d);
    m[j * n + j] = ljj;
    for (size_t i = j + 1; i < n; ++i) {
      double s = m[i * n + j];
      for (size_t k = 0; k < j; ++k) s -= m[i * n + k] * m[j * n + k];
      m[i * n + j] = s / ljj;
    }
  }
  return true;
}

// Solves L v = b in place.
void ForwardSolve(const std::vector<double>& l, size_t n, std::vector<double>* b) {
  for (size_t i = 0; i < n; ++i) {
    double s = (*b)[i];
    for (size_t k = 0; k < i; ++k) s -= l[i * n + k] * (*b)[k];
    (*b)[i] = s / l[i * n + i];
  }
}

// Solves L^T v = b in place.
void BackSolve(const std::vector<double>& l, size_t n, std::vector<double>* b) {
  for (size_t i = n; i-- > 0;) {
    double s = (*b)[i];
    for (size_t k = i + 1; k < n; ++k) s -= l[k * n + i] * (*b)[k];
    (*b)[i] = s / l[i * n + i];
  }
}

}  // namespace

double GaussianProcess::Kernel(const Point& a, const Point& b) const {
  double d2 = 0;
  for (size_t i = 0; i < a.size(); ++i) d2 += (a[i] - b[i]) * (a[i] - b[i]);
  return hyper_.signal_var * std::exp(-d2 / (2 * hyper_.length * hyper_.length));
}

void GaussianProcess::Fit(const std::vector<Point>& x, const std::vector<double>& y,
                          const Hyper& hyper) {
  HVD_ENFORCE(!x.empty() && x.size() == y.size(), "GP fit on " << x.size() << " points and "
                                                               << y.size() << " values");
  hyper_ = hyper;
  x_ = x;
  const size_t n = x.size();
  chol_.assign(n * n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) chol_[i * n + j] = Kernel(x[i], x[j]);
    chol_[i * n + i] += hyper.noise_var;
  }
  HVD_ENFORCE(Cholesky(&chol_, n), "GP kernel matrix not positive definite (noise variance "
                                       << hyper.noise_var << ", " << n << " points)");
  alpha_ = y;
  ForwardSolve(chol_, n, &alpha_);
  double fit = 0;
  for (double v : alpha_) fit += v * v;  // y^T K^-1 y = |L^-1 y|^2
  BackSolve(chol_, n, &alpha_);
  double logdet = 0;
  for (size_t i = 0; i < n; ++i) logdet += std::log(chol_[i * n + i]);
  lml_ = -0.5 * fit - logdet - 0.5 * static_cast<double>(n) * std::log(2 * kPi);
}

void GaussianProcess::Predict(const Point& q, double* mean, double* stddev) const {
  HVD_ENFORCE(!x_.empty(), "GP prediction before Fit");
  const size_t n = x_.size();
  std::vector<double> ks(n);
  double m = 0;
  for (size_t i = 0; i < n; ++i) {
    ks[i] = Kernel(x_[i], q);
    m += ks[i] * alpha_[i];
  }
  ForwardSolve(chol_, n, &ks);
  double explained = 0;
  for (double v : ks) explained += v * v;
  *mean = m;
  *stddev = std::sqrt(std::max(0.0, hyper_.signal_var - explained));
}

GaussianProcess::Hyper GaussianProcess::ChooseHyper(const std::vector<Point>& x,
                                                    const std::vector<double>& y,
                                                    double noise_var) {
  Hyper best;
  best.noise_var = noise_var;
  double best_lml = -std::numeric_limits<double>::infinity();
  GaussianProcess gp;
  // Lengths from 1/30 to 2 of the unit cube's side, signal variances around
  // the (standardised) scores' own variance of 1.
  for (int i = 0; i < 24; ++i) {
    const double length = std::exp(std::log(1.0 / 30) + i * (std::log(60.0) / 23));
    for (double s2 : {0.25, 0.5, 1.0, 2.0, 4.0}) {
      Hyper h{length, s2, noise_var};
      gp.Fit(x, y, h);
      if (gp.LogMarginalLikelihood() > best_lml) {
        best_lml = gp.LogMarginalLikelihood();
        best = h;
      }
    }
  }
  return best;
}

double ExpectedImprovement(double mean, double stddev, double best, double xi) {
  if (!(stddev > 0)) return 0.0;
  const double d = mean - best - xi;
  const double z = d / stddev;
  const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
  const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * kPi);
  return d * cdf + stddev * pdf;
}

}  // namespace hvdcompat
