#include "oscarkv/calibrate/covariance.h"

#include <Eigen/Core>
#include <Eigen/Eigenvalues>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "oscarkv/kernels/rotation.h"

namespace oscarkv::calibrate {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

void CovarianceAccumulator::Add(const float* x, uint32_t n, size_t stride, const float* weights) {
  if (n == 0) return;
  MatD rows(n, d_);
  for (uint32_t i = 0; i < n; ++i) {
    const double w = weights ? std::sqrt(std::max(0.0f, weights[i])) : 1.0;
    for (uint32_t j = 0; j < d_; ++j) rows(i, j) = w * x[size_t{i} * stride + j];
    weight_ += weights ? std::max(0.0f, weights[i]) : 1.0;
  }
  Eigen::Map<MatD> sum(sum_.data(), d_, d_);
  sum.noalias() += rows.transpose() * rows;
}

void CovarianceAccumulator::Merge(const CovarianceAccumulator& other) {
  for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += other.sum_[i];
  weight_ += other.weight_;
}

std::vector<double> CovarianceAccumulator::Mean() const {
  std::vector<double> m(sum_);
  if (weight_ > 0) {
    for (double& v : m) v /= weight_;
  }
  return m;
}

EigenRotation OscarRotationFromCovariance(const std::vector<double>& cov, uint32_t d) {
  MatD c = Eigen::Map<const MatD>(cov.data(), d, d);
  c = 0.5 * (c + c.transpose()).eval();  // exact symmetry for the solver
  Eigen::SelfAdjointEigenSolver<MatD> solver(c);
  const Eigen::VectorXd& ev = solver.eigenvalues();  // ascending
  const MatD& vecs = solver.eigenvectors();
  std::vector<uint32_t> order(d);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return ev(a) > ev(b); });
  EigenRotation out;
  out.eigenvalues.resize(d);
  out.eigenvectors.resize(size_t{d} * d);
  for (uint32_t k = 0; k < d; ++k) {
    const uint32_t src = order[k];
    out.eigenvalues[k] = static_cast<float>(ev(src));
    uint32_t arg = 0;
    for (uint32_t i = 1; i < d; ++i) {
      if (std::fabs(vecs(i, src)) > std::fabs(vecs(arg, src))) arg = i;
    }
    const double sign = vecs(arg, src) < 0 ? -1.0 : 1.0;
    for (uint32_t i = 0; i < d; ++i) {
      out.eigenvectors[size_t{i} * d + k] = static_cast<float>(sign * vecs(i, src));
    }
  }
  out.rotation = ComposeOscarRotation(out.eigenvectors, d);
  return out;
}

}  // namespace oscarkv::calibrate
