#include "oscarkv/kernels/rotation.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace oscarkv {
namespace {

std::vector<float> RandomOrthogonal(uint32_t d, std::mt19937& rng) {
  // Gram-Schmidt on a Gaussian matrix (columns), in double.
  std::normal_distribution<double> n;
  std::vector<double> a(size_t{d} * d);
  for (auto& v : a) v = n(rng);
  for (uint32_t j = 0; j < d; ++j) {
    for (uint32_t k = 0; k < j; ++k) {
      double dot = 0;
      for (uint32_t i = 0; i < d; ++i) dot += a[i * d + j] * a[i * d + k];
      for (uint32_t i = 0; i < d; ++i) a[i * d + j] -= dot * a[i * d + k];
    }
    double norm = 0;
    for (uint32_t i = 0; i < d; ++i) norm += a[i * d + j] * a[i * d + j];
    norm = std::sqrt(norm);
    for (uint32_t i = 0; i < d; ++i) a[i * d + j] /= norm;
  }
  return std::vector<float>(a.begin(), a.end());
}

double MaxOffIdentity(const std::vector<float>& r, uint32_t d) {
  double worst = 0;
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t j = 0; j < d; ++j) {
      double s = 0;
      for (uint32_t k = 0; k < d; ++k) s += double{r[k * d + i]} * r[k * d + j];
      worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
    }
  }
  return worst;
}

TEST(Rotation, HadamardIsOrthogonalAndSymmetric) {
  for (uint32_t d : {64u, 128u, 256u}) {
    auto h = HadamardMatrix(d);
    EXPECT_LT(MaxOffIdentity(h, d), 1e-5) << d;
    for (uint32_t i = 0; i < d; ++i) {
      for (uint32_t j = 0; j < d; ++j) ASSERT_EQ(h[i * d + j], h[j * d + i]);
      ASSERT_FLOAT_EQ(std::fabs(h[i * d]), 1.0f / std::sqrt(float(d)));
    }
  }
}

TEST(Rotation, BitReversalIsAnInvolutionAndSpreadsGroups) {
  for (uint32_t d : {64u, 128u, 256u}) {
    auto p = BitReversalPermutation(d);
    std::vector<int> seen(d, 0);
    for (uint32_t i = 0; i < d; ++i) {
      ASSERT_EQ(p[p[i]], i);
      seen[p[i]]++;
    }
    for (int s : seen) ASSERT_EQ(s, 1);
    // Any aligned group of G outputs draws from G distinct "importance levels": its sources
    // are spread one per block of d/G consecutive input indices.
    for (uint32_t g : {32u, 64u}) {
      for (uint32_t g0 = 0; g0 < d; g0 += g) {
        std::vector<int> level(g, 0);
        for (uint32_t j = g0; j < g0 + g; ++j) level[p[j] / (d / g)]++;
        for (int c : level) ASSERT_EQ(c, 1);
      }
    }
  }
  EXPECT_EQ(BitReversalPermutation(8), (std::vector<uint32_t>{0, 4, 2, 6, 1, 5, 3, 7}));
}

TEST(Rotation, ComposedRotationIsOrthogonalAndPreservesDotProducts) {
  std::mt19937 rng(3);
  const uint32_t d = 128;
  auto u = RandomOrthogonal(d, rng);
  auto r = ComposeOscarRotation(u, d);
  EXPECT_LT(MaxOffIdentity(r, d), 1e-5);
  std::normal_distribution<float> n;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> q(d), k(d), qr(d), kr(d), back(d);
    for (uint32_t i = 0; i < d; ++i) q[i] = n(rng), k[i] = n(rng);
    RotateRow(q.data(), r.data(), d, qr.data());
    RotateRow(k.data(), r.data(), d, kr.data());
    double a = 0, b = 0;
    for (uint32_t i = 0; i < d; ++i) a += q[i] * k[i], b += qr[i] * kr[i];
    EXPECT_NEAR(a, b, 1e-4 * (1 + std::fabs(a)));
    UnrotateRow(kr.data(), r.data(), d, back.data());
    for (uint32_t i = 0; i < d; ++i) ASSERT_NEAR(back[i], k[i], 1e-5);
  }
}

TEST(Rotation, SetRejectsBadShapesAndClips) {
  EXPECT_FALSE(RotationSet::FromData(1, 1, 4, std::vector<float>(15), {1, 1}).ok());
  EXPECT_FALSE(RotationSet::FromData(1, 1, 4, std::vector<float>(32), {1}).ok());
  EXPECT_FALSE(RotationSet::FromData(1, 1, 4, std::vector<float>(32), {1, 1.5f}).ok());
  EXPECT_FALSE(RotationSet::FromData(1, 1, 4, std::vector<float>(32), {1, 0}).ok());
  auto ok = RotationSet::FromData(1, 1, 4, std::vector<float>(32), {1, 0.9f});
  ASSERT_TRUE(ok.ok());
  EXPECT_FLOAT_EQ(ok->clip(0, KV::kValue, 0), 0.9f);
}

TEST(Rotation, DigestDependsOnContent) {
  auto a = RotationSet::Identity(2, 2, 64);
  auto b = RotationSet::Hadamard(2, 2, 64);
  auto c = RotationSet::Identity(2, 2, 64, 0.96f, 1.0f);
  EXPECT_NE(a.Digest(), b.Digest());
  EXPECT_NE(a.Digest(), c.Digest());
  EXPECT_EQ(a.Digest(), RotationSet::Identity(2, 2, 64).Digest());
}

}  // namespace
}  // namespace oscarkv
