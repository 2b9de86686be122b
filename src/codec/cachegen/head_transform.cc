#include "codec/cachegen/head_transform.h"

#include <cmath>
#include <string>

#include <Eigen/Eigenvalues>

namespace cachegen {

void TransposeTimes(const float* a, const float* in, float* out, uint32_t d) {
  for (uint32_t c = 0; c < d; ++c) out[c] = 0;
  for (uint32_t r = 0; r < d; ++r) {
    const float v = in[r];
    const float* ar = a + size_t{r} * d;
    for (uint32_t c = 0; c < d; ++c) out[c] += ar[c] * v;
  }
}

std::vector<float> Transposed(std::span<const float> u, uint32_t d) {
  std::vector<float> t(u.size());
  for (uint32_t r = 0; r < d; ++r)
    for (uint32_t c = 0; c < d; ++c) t[size_t{c} * d + r] = u[size_t{r} * d + c];
  return t;
}

std::vector<float> LearnHeadTransform(std::span<const double> covariance, uint32_t d) {
  Eigen::MatrixXd cov(d, d);
  for (uint32_t r = 0; r < d; ++r)
    for (uint32_t c = 0; c < d; ++c) cov(r, c) = 0.5 * (covariance[size_t{r} * d + c] + covariance[size_t{c} * d + r]);
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(cov);
  const Eigen::MatrixXd& v = eig.eigenvectors();  // columns, increasing eigenvalues
  std::vector<float> u(size_t{d} * d);
  for (uint32_t c = 0; c < d; ++c) {
    const Eigen::Index col = Eigen::Index(d - 1 - c);
    Eigen::Index top = 0;
    v.col(col).cwiseAbs().maxCoeff(&top);
    const double sign = v(top, col) < 0 ? -1.0 : 1.0;
    for (uint32_t r = 0; r < d; ++r) u[size_t{r} * d + c] = static_cast<float>(sign * v(r, col));
  }
  return u;
}

Status CheckHeadTransform(std::span<const float> u, uint32_t d) {
  if (u.size() != size_t{d} * d) return Status::Corrupt("head transform of the wrong size");
  for (uint32_t c = 0; c < d; ++c) {
    double norm = 0;
    for (uint32_t r = 0; r < d; ++r) {
      const float v = u[size_t{r} * d + c];
      if (!std::isfinite(v)) return Status::Corrupt("head transform with a non-finite entry");
      norm += double(v) * v;
    }
    if (std::abs(norm - 1.0) > 1e-3)
      return Status::Corrupt("head transform column " + std::to_string(c) + " is not of unit length");
  }
  return Status::Ok();
}

}  // namespace cachegen
