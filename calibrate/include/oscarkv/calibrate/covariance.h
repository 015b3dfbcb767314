// fp64 covariance accumulation and the OSCAR rotation built from it.
//
// A CovarianceAccumulator sums w_i * x_i x_i^T over rows x_i of dimension d (in fp64, with the
// products done by Eigen, so the result is deterministic for a fixed build and thread count).
// OscarRotationFromCovariance eigendecomposes the mean (Eigen::SelfAdjointEigenSolver), sorts
// eigenvectors by descending eigenvalue, fixes each eigenvector's sign (largest-magnitude
// component positive, so equal inputs give equal rotations), and composes R = U * H * P_br
// with kernels' ComposeOscarRotation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace oscarkv::calibrate {

class CovarianceAccumulator {
 public:
  explicit CovarianceAccumulator(uint32_t d = 0) : d_(d), sum_(size_t{d} * d, 0.0) {}
  uint32_t dim() const { return d_; }
  // Rows x[i*stride .. i*stride+d) for i < n, with optional per-row weights.
  void Add(const float* x, uint32_t n, size_t stride, const float* weights = nullptr);
  void Merge(const CovarianceAccumulator& other);
  double weight() const { return weight_; }
  // The weighted mean of x x^T, row-major d x d.
  std::vector<double> Mean() const;

 private:
  uint32_t d_ = 0;
  std::vector<double> sum_;
  double weight_ = 0;
};

struct EigenRotation {
  std::vector<float> rotation;     // R = U H P_br, row-major d x d
  std::vector<float> eigenvalues;  // descending
  std::vector<float> eigenvectors;  // U, row-major, eigenvectors as columns
};
EigenRotation OscarRotationFromCovariance(const std::vector<double>& cov, uint32_t d);

}  // namespace oscarkv::calibrate
