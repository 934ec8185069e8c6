#include "autotune/bayesian_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/common.h"

namespace hvdcompat {

namespace {

double Clamp01(double v) { return std::min(1.0, std::max(0.0, v)); }

}  // namespace

BayesianOptimizer::BayesianOptimizer(size_t dims, double noise, uint64_t seed, double xi)
    : dims_(dims),
      // A floor keeps K positive definite when a point is sampled twice.
      noise_var_(std::max(noise * noise, 1e-6)),
      xi_(xi),
      rng_(seed) {}

void BayesianOptimizer::AddSample(Point x, double y) {
  HVD_ENFORCE_EQ(x.size(), dims_, "dimension of an autotune sample");
  for (auto& v : x) v = Clamp01(v);
  x_.push_back(std::move(x));
  y_.push_back(y);
}

void BayesianOptimizer::Fit() {
  HVD_ENFORCE(!x_.empty(), "Bayesian optimisation fit without samples");
  double mean = 0;
  for (double v : y_) mean += v;
  mean /= static_cast<double>(y_.size());
  double var = 0;
  for (double v : y_) var += (v - mean) * (v - mean);
  var /= static_cast<double>(y_.size());
  const double sd = var > 1e-24 ? std::sqrt(var) : 1.0;
  ys_.resize(y_.size());
  for (size_t i = 0; i < y_.size(); ++i) ys_[i] = (y_[i] - mean) / sd;
  gp_.Fit(x_, ys_, GaussianProcess::ChooseHyper(x_, ys_, noise_var_));
  // With noisy scores the best observation overstates its point; the
  // model's mean there is the fairer incumbent.
  incumbent_ = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < x_.size(); ++i) {
    double m, s;
    gp_.Predict(x_[i], &m, &s);
    if (m > incumbent_) {
      incumbent_ = m;
      incumbent_index_ = i;
    }
  }
}

size_t BayesianOptimizer::BestSample() {
  Fit();
  return incumbent_index_;
}

double BayesianOptimizer::ExpectedImprovementAt(const Point& x) const {
  double m, s;
  gp_.Predict(x, &m, &s);
  return ExpectedImprovement(m, s, incumbent_, xi_);
}

Point BayesianOptimizer::NextSample() {
  if (x_.empty()) return Point(dims_, 0.5);
  Fit();
  // EI is cheap here (tens of samples, few dimensions): score a random
  // cloud, then polish the best few by a shrinking pattern search.
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  constexpr int kCandidates = 2048;
  constexpr size_t kPolished = 6;
  std::vector<std::pair<double, Point>> cloud;
  cloud.reserve(kCandidates);
  for (int i = 0; i < kCandidates; ++i) {
    Point p(dims_);
    for (auto& v : p) v = unit(rng_);
    cloud.emplace_back(ExpectedImprovementAt(p), std::move(p));
  }
  std::partial_sort(cloud.begin(), cloud.begin() + std::min(kPolished, cloud.size()), cloud.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  Point best = cloud[0].second;
  double best_ei = cloud[0].first;
  for (size_t c = 0; c < kPolished && c < cloud.size(); ++c) {
    Point p = cloud[c].second;
    double ei = cloud[c].first;
    for (double step = 0.05; step > 1e-3; step /= 2) {
      bool moved = true;
      while (moved) {
        moved = false;
        for (size_t d = 0; d < dims_; ++d) {
          for (double dir : {-1.0, 1.0}) {
            Point q = p;
            q[d] = Clamp01(q[d] + dir * step);
            double e = ExpectedImprovementAt(q);
            if (e > ei) {
              ei = e;
              p = std::move(q);
              moved = true;
            }
          }
        }
      }
    }
    if (ei > best_ei) {
      best_ei = ei;
      best = p;
    }
  }
  return best;
}

}  // namespace hvdcompat
