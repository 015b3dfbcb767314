// Calibration recovers a planted eigenbasis.
#include "oscarkv/calibrate/covariance.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <span>

#include "gtest/gtest.h"
#include "oscarkv/calibrate/calibrator.h"
#include "oscarkv/engine/safetensors.h"
#include <filesystem>
#include <unistd.h>
#include "oscarkv/kernels/quantize.h"
#include "oscarkv/kernels/rotation.h"

namespace oscarkv::calibrate {
namespace {

// A random orthogonal d x d matrix (Gram-Schmidt on Gaussian columns), row-major.
std::vector<double> RandomOrthogonal(uint32_t d, std::mt19937& rng) {
  std::normal_distribution<double> n;
  std::vector<double> q(size_t{d} * d);
  for (auto& v : q) v = n(rng);
  for (uint32_t j = 0; j < d; ++j) {
    for (uint32_t k = 0; k < j; ++k) {
      double dot = 0;
      for (uint32_t i = 0; i < d; ++i) dot += q[i * d + j] * q[i * d + k];
      for (uint32_t i = 0; i < d; ++i) q[i * d + j] -= dot * q[i * d + k];
    }
    double norm = 0;
    for (uint32_t i = 0; i < d; ++i) norm += q[i * d + j] * q[i * d + j];
    for (uint32_t i = 0; i < d; ++i) q[i * d + j] /= std::sqrt(norm);
  }
  return q;
}

// Rows x = z * diag(sqrt(lambda)) * U^T: covariance U diag(lambda) U^T.
std::vector<float> PlantedRows(const std::vector<double>& u, const std::vector<double>& lambda,
                               uint32_t n, uint32_t stride_heads, std::mt19937& rng) {
  const uint32_t d = static_cast<uint32_t>(lambda.size());
  std::normal_distribution<double> g;
  std::vector<float> x(size_t{n} * stride_heads * d);
  for (uint32_t r = 0; r < n * stride_heads; ++r) {
    std::vector<double> z(d);
    for (uint32_t k = 0; k < d; ++k) z[k] = g(rng) * std::sqrt(lambda[k]);
    for (uint32_t i = 0; i < d; ++i) {
      double acc = 0;
      for (uint32_t k = 0; k < d; ++k) acc += u[size_t{i} * d + k] * z[k];
      x[size_t{r} * d + i] = static_cast<float>(acc);
    }
  }
  return x;
}

TEST(CovarianceTest, RecoversPlantedEigenbasis) {
  const uint32_t d = 32;
  std::mt19937 rng(3);
  const std::vector<double> u = RandomOrthogonal(d, rng);
  std::vector<double> lambda(d);
  for (uint32_t k = 0; k < d; ++k) lambda[k] = std::pow(0.8, k) * 10;
  const std::vector<float> x = PlantedRows(u, lambda, 20000, 1, rng);
  CovarianceAccumulator acc(d);
  acc.Add(x.data(), 20000, d);
  const EigenRotation e = OscarRotationFromCovariance(acc.Mean(), d);
  for (uint32_t k = 0; k < 8; ++k) {  // well-separated leading eigenvectors
    double dot = 0;
    for (uint32_t i = 0; i < d; ++i) dot += u[i * d + k] * e.eigenvectors[i * d + k];
    EXPECT_GT(std::fabs(dot), 0.98) << "eigenvector " << k;
    EXPECT_NEAR(e.eigenvalues[k], lambda[k], 0.05 * lambda[k]);
  }
  // R = U H P_br: orthogonal, and equal to kernels' composition of the recovered U.
  EXPECT_EQ(e.rotation, ComposeOscarRotation(e.eigenvectors, d));
  for (uint32_t i = 0; i < d; ++i) {
    double n2 = 0;
    for (uint32_t j = 0; j < d; ++j) n2 += double(e.rotation[i * d + j]) * e.rotation[i * d + j];
    EXPECT_NEAR(n2, 1.0, 1e-4);
  }
}

TEST(CovarianceTest, WeightsScaleRows) {
  const float rows[4] = {1, 0, 0, 1};
  const float w[2] = {4, 0};
  CovarianceAccumulator acc(2);
  acc.Add(rows, 2, 2, w);
  const std::vector<double> m = acc.Mean();
  EXPECT_DOUBLE_EQ(m[0], 1.0);  // 4 * 1 / (4 + 0)
  EXPECT_DOUBLE_EQ(m[3], 0.0);
}

TEST(CalibratorTest, KeyRotationFollowsPlantedQueryCovariance) {
  // Queries with a planted covariance; keys/values isotropic. R_K's first column block must
  // come from the planted eigenbasis: R_K = U H P, so U = R_K P^T H^T.
  const uint32_t d = 64, T = 256, hq = 2, hkv = 1;
  std::mt19937 rng(4);
  const std::vector<double> u = RandomOrthogonal(d, rng);
  std::vector<double> lambda(d), flat(d, 1.0);
  for (uint32_t k = 0; k < d; ++k) lambda[k] = std::pow(0.85, k) * 4;
  CalibrationOptions o;
  o.clip_candidates.clear();
  Calibrator cal(1, hq, hkv, d, o);
  for (int w = 0; w < 20; ++w) {
    const std::vector<float> q = PlantedRows(u, lambda, T, hq, rng);
    const std::vector<float> k = PlantedRows(u, flat, T, hkv, rng);
    const std::vector<float> v = PlantedRows(u, flat, T, hkv, rng);
    cal.AccumulateCovariances({0, T, hq, hkv, d, q.data(), k.data(), v.data()});
  }
  ASSERT_TRUE(cal.BuildRotations().ok());
  auto a = cal.Finish({});
  ASSERT_TRUE(a.ok()) << a.status();
  // Recover U from R: U = R * P^T * H^T (H symmetric, P an involution).
  const float* r = a->rotations.matrix(0, KV::kKey, 0);
  const std::vector<float> h = HadamardMatrix(d);
  const std::vector<uint32_t> perm = BitReversalPermutation(d);
  for (uint32_t k = 0; k < 6; ++k) {
    double dot = 0;
    for (uint32_t i = 0; i < d; ++i) {
      double uik = 0;  // (R P^T H)_{ik} = sum_j R[i][perm^-1 ...]
      for (uint32_t j = 0; j < d; ++j) uik += double(r[i * d + j]) * h[perm[j] * d + k];
      dot += uik * u[i * d + k];
    }
    EXPECT_GT(std::fabs(dot), 0.95) << "eigenvector " << k;
  }
  EXPECT_EQ(a->metadata["calibration_tokens"], 20 * T);
}

// Two dump files (the second held out for the clip search), 2 layers, GQA 2:1, d = 64; each
// file's K and V rows have a per-channel scale (and, with `spiky`, rare outliers).
std::vector<std::string> WriteDumps(const std::string& tag, uint32_t T, bool spiky = false) {
  const uint32_t hq = 2, hkv = 1, d = 64;
  std::mt19937 rng(8);
  std::normal_distribution<float> n;
  std::vector<std::string> files;
  for (int f = 0; f < 2; ++f) {
    engine::SafetensorsWriter w;
    for (int l = 0; l < 2; ++l) {
      std::vector<float> q(size_t{T} * hq * d), k(size_t{T} * hkv * d), v(size_t{T} * hkv * d);
      for (auto* buf : {&q, &k, &v}) {
        for (size_t i = 0; i < buf->size(); ++i) (*buf)[i] = n(rng) * (1.0f + (i % d) * 0.05f);
      }
      if (spiky) {
        for (auto* buf : {&k, &v}) {
          for (size_t i = 0; i < buf->size(); i += 37) (*buf)[i] *= (l == 0 ? 6.0f : 2.0f);
        }
      }
      const std::string p = "layers." + std::to_string(l) + ".";
      w.AddF32(p + "q", {T, hq, d}, q);
      w.AddF32(p + "k", {T, hkv, d}, k);
      w.AddF32(p + "v", {T, hkv, d}, v);
    }
    w.SetMetadata("model", "synthetic");
    files.push_back((std::filesystem::temp_directory_path() /
                     ("oscarkv_dump_" + tag + std::to_string(::getpid()) + "_" +
                      std::to_string(f) + ".safetensors")).string());
    EXPECT_TRUE(w.WriteTo(files.back()).ok());
  }
  return files;
}

TEST(CalibratorTest, ActivationDumpsGiveAnArtifact) {
  const std::vector<std::string> files = WriteDumps("a", 400);
  CalibrationOptions o;
  o.sink = 16;
  o.recent = 32;
  o.group = 64;
  o.query_start = 100;
  auto a = CalibrateFromDumps(files, o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rotations.layers(), 2u);
  EXPECT_EQ(a->rotations.kv_heads(), 1u);
  EXPECT_EQ(a->metadata["model"], "synthetic");
  EXPECT_EQ(a->metadata["clip_search"].size(), 4u);  // 2 layers x K,V x 1 head
  // Same input, same artifact.
  auto b = CalibrateFromDumps(files, o);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->rotations.Digest(), b->rotations.Digest());
  for (const auto& f : files) std::filesystem::remove(f);
}

// --range fixed: per (layer, K|V, head) the candidate with the smallest total unbiased score
// over the held-out file's rotated rows past the sink (rows [sink, last query + 1)), at the
// head's clip; recomputed here from the artifact's rotations.
TEST(CalibratorTest, FixedRangeCandidatesMinimiseTheHeldOutScore) {
  const uint32_t T = 400, d = 64;
  const std::vector<std::string> files = WriteDumps("f", T, /*spiky=*/true);
  for (bool clip_search : {false, true}) {
    CalibrationOptions o;
    o.sink = 16;
    o.recent = 32;
    o.group = 32;
    o.query_start = 100;
    o.fixed_range = true;
    if (!clip_search) o.clip_candidates.clear();
    auto a = CalibrateFromDumps(files, o);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->metadata["range_mode"], "unbiased-fixed");
    ASSERT_EQ(a->metadata["range_candidates"].size(), 4u);
    const uint32_t rows = 100 + ((T - 1 - 100) / 8) * 8 + 1;  // through the last query row
    EXPECT_EQ(a->metadata["range_rows"], rows - o.sink);
    auto dump = engine::SafetensorsFile::Open(files[1]);
    ASSERT_TRUE(dump.ok());
    size_t t = 0;
    for (uint32_t l = 0; l < 2; ++l) {
      for (KV kv : {KV::kKey, KV::kValue}) {
        const RangeMode m = a->rotations.range_mode(l, kv, 0);
        ASSERT_TRUE(IsUnbiasedFixed(m)) << static_cast<int>(m);
        auto x = (*dump)->GetF32("layers." + std::to_string(l) + (kv == KV::kKey ? ".k" : ".v"),
                                 {int64_t{T}, 1, int64_t{d}});
        ASSERT_TRUE(x.ok());
        const float* r = a->rotations.matrix(l, kv, 0);
        double scores[8] = {};
        std::vector<float> y(d);
        for (uint32_t s = o.sink; s < rows; ++s) {
          for (uint32_t j = 0; j < d; ++j) {
            double acc = 0;
            for (uint32_t i = 0; i < d; ++i) acc += double{(*x)[size_t{s} * d + i]} * r[i * d + j];
            y[j] = static_cast<float>(acc);
          }
          ClipRowAtQuantile(std::span<float>(y), a->rotations.clip(l, kv, 0));
          AddUnbiasedScores(y.data(), d, o.group, scores);
        }
        const int want = static_cast<int>(std::min_element(scores, scores + 8) - scores);
        // The calibrator's float products round differently: accept a candidate within 1e-6.
        const int got = FixedCandidate(m);
        EXPECT_LE(scores[got], scores[want] * (1 + 1e-6)) << l << " " << int(kv) << " got " << got
                                                          << " want " << want;
        const auto& row = a->metadata["range_candidates"][t++];
        EXPECT_EQ(row["candidate"], got);
        EXPECT_GE(row["score_vs_unbiased"].get<double>(), 1.0);
      }
    }
    // Deterministic.
    auto b = CalibrateFromDumps(files, o);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(a->rotations.Digest(), b->rotations.Digest());
  }
  for (const auto& f : files) std::filesystem::remove(f);
}

}  // namespace
}  // namespace oscarkv::calibrate
