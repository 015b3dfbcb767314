#include "oscarkv/calibrate/artifact.h"

#include <filesystem>
#include <random>

#include "gtest/gtest.h"
#include "oscarkv/engine/safetensors.h"

namespace oscarkv::calibrate {
namespace {

std::string TempDir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("oscarkv_artifact_" + name + "_" +
                                                     std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

RotationArtifact Sample() {
  std::vector<float> u(64 * 64, 0.0f);
  for (uint32_t i = 0; i < 64; ++i) u[i * 64 + (i * 7) % 64] = (i % 3) ? 1.0f : -1.0f;
  const std::vector<float> r = ComposeOscarRotation(u, 64);
  std::vector<float> m;
  for (int i = 0; i < 3 * 2 * 2; ++i) m.insert(m.end(), r.begin(), r.end());
  std::vector<float> clips = {1, 0.97f, 0.96f, 0.92f, 1, 1, 0.9f, 0.95f, 1, 0.99f, 0.98f, 1};
  RotationArtifact a{*RotationSet::FromData(3, 2, 64, m, clips), {}, {}};
  a.rotations.set_range_mode(2, KV::kValue, 1, RangeMode::kSearch);
  a.eigenvalues.resize(3 * 2 * 2 * 64);
  for (size_t i = 0; i < a.eigenvalues.size(); ++i) a.eigenvalues[i] = 1000.0f - i;
  a.metadata["model"] = "test";
  return a;
}

TEST(ArtifactTest, RoundTripsAndIsDeterministic) {
  const std::string dir = TempDir("rt");
  const RotationArtifact a = Sample();
  ASSERT_TRUE(WriteArtifact(a, dir).ok());
  auto b = ReadArtifact(dir);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->rotations.matrices(), a.rotations.matrices());
  EXPECT_EQ(b->rotations.clips(), a.rotations.clips());
  EXPECT_EQ(b->rotations.range_mode(2, KV::kValue, 1), RangeMode::kSearch);
  EXPECT_EQ(b->rotations.Digest(), a.rotations.Digest());
  EXPECT_EQ(b->eigenvalues, a.eigenvalues);
  EXPECT_EQ(b->metadata["model"], "test");
  const std::string dir2 = TempDir("rt2");
  ASSERT_TRUE(WriteArtifact(*b, dir2).ok());
  auto bytes1 = engine::ReadFileBytes(dir + "/rotations.safetensors");
  auto bytes2 = engine::ReadFileBytes(dir2 + "/rotations.safetensors");
  ASSERT_TRUE(bytes1.ok() && bytes2.ok());
  EXPECT_EQ(*bytes1, *bytes2);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir2);
}

TEST(ArtifactTest, RejectsTamperedTensors) {
  const std::string dir = TempDir("bad");
  ASSERT_TRUE(WriteArtifact(Sample(), dir).ok());
  auto bytes = engine::ReadFileBytes(dir + "/rotations.safetensors");
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() - 1] ^= 0x01;  // last clip ratio changes: digest mismatch
  ASSERT_TRUE(engine::WriteFileBytes(dir + "/rotations.safetensors", bytes->data(), bytes->size()).ok());
  auto r = ReadArtifact(dir);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(ReadArtifact(dir + "/missing").ok());
  std::filesystem::remove_all(dir);
}

// Range mode 2 was the retired "unbiased v1" rule (docs/FORMAT.md 1.3.1): an artifact that
// selects it is refused with a message that says what to do.
TEST(ArtifactTest, RejectsTheRetiredUnbiasedV1Mode) {
  const std::string dir = TempDir("v1");
  RotationArtifact a = Sample();
  a.rotations.set_range_mode(1, KV::kKey, 0, static_cast<RangeMode>(2));
  ASSERT_TRUE(WriteArtifact(a, dir).ok());
  auto r = ReadArtifact(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("re-run"), std::string::npos) << r.status();
  a.rotations.set_range_mode(1, KV::kKey, 0, RangeMode::kUnbiased);
  ASSERT_TRUE(WriteArtifact(a, dir).ok());
  EXPECT_TRUE(ReadArtifact(dir).ok());
  std::filesystem::remove_all(dir);
}

// Unbiased-fixed modes (bytes 16..23) round-trip and enter the digest; the digest of an artifact
// without them is unchanged (Sample()'s search mode only).
TEST(ArtifactTest, RoundTripsUnbiasedFixedModes) {
  const std::string dir = TempDir("fixed");
  RotationArtifact a = Sample();
  const Sha256Digest before = a.rotations.Digest();
  int i = 0;
  for (uint32_t l = 0; l < 3; ++l) {
    for (KV kv : {KV::kKey, KV::kValue}) {
      for (uint32_t h = 0; h < 2; ++h) a.rotations.set_range_mode(l, kv, h, UnbiasedFixed(i++ % 8));
    }
  }
  a.rotations.set_range_mode(0, KV::kKey, 1, RangeMode::kUnbiased);
  EXPECT_NE(a.rotations.Digest(), before);
  ASSERT_TRUE(WriteArtifact(a, dir).ok());
  auto b = ReadArtifact(dir);
  ASSERT_TRUE(b.ok()) << b.status();
  i = 0;
  for (uint32_t l = 0; l < 3; ++l) {
    for (KV kv : {KV::kKey, KV::kValue}) {
      for (uint32_t h = 0; h < 2; ++h, ++i) {
        const RangeMode want = l == 0 && kv == KV::kKey && h == 1 ? RangeMode::kUnbiased : UnbiasedFixed(i % 8);
        EXPECT_EQ(b->rotations.range_mode(l, kv, h), want) << l << " " << h;
      }
    }
  }
  EXPECT_EQ(b->rotations.Digest(), a.rotations.Digest());
  std::filesystem::remove_all(dir);
}

// Bytes that are no range mode are refused with a message naming the byte and the known modes.
TEST(ArtifactTest, RejectsUnknownRangeModes) {
  const std::string dir = TempDir("unknown");
  for (int m : {4, 5, 15, 24, 31, 255}) {
    RotationArtifact a = Sample();
    a.rotations.set_range_mode(2, KV::kKey, 0, static_cast<RangeMode>(m));
    ASSERT_TRUE(WriteArtifact(a, dir).ok());
    auto r = ReadArtifact(dir);
    ASSERT_FALSE(r.ok()) << m;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find("is " + std::to_string(m) + ", not a known range mode"),
              std::string::npos)
        << r.status();
    EXPECT_NE(r.status().message().find("k_range_mode"), std::string::npos) << r.status();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace oscarkv::calibrate
