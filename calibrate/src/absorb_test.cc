// V-rotation absorption on the real reference model: the rewritten checkpoint computes the
// same logits to bf16 rounding.
#include "oscarkv/calibrate/absorb.h"

#include <cmath>
#include <filesystem>

#include "gtest/gtest.h"
#include "oscarkv/engine/model.h"
#include "oscarkv/util/refmodel.h"

namespace oscarkv::calibrate {
namespace {

std::string RefModelDir() { return FindRefModel(); }

TEST(AbsorbTest, RewrittenModelMatchesOriginal) {
  const std::string dir = RefModelDir();
  if (dir.empty()) GTEST_SKIP() << "reference model not found (set OSCARKV_REFMODEL)";
  auto model = engine::Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const auto& c = (*model)->config();
  // A non-trivial orthogonal rotation per (layer, head): U a signed permutation, R = U H P.
  std::vector<float> m;
  for (uint32_t i = 0; i < c.num_layers * 2 * c.num_kv_heads; ++i) {
    std::vector<float> u(size_t{c.head_dim} * c.head_dim, 0.0f);
    for (uint32_t r = 0; r < c.head_dim; ++r) {
      u[r * c.head_dim + (r * 5 + i) % c.head_dim] = ((r + i) % 3) ? 1.0f : -1.0f;
    }
    const std::vector<float> rot = ComposeOscarRotation(u, c.head_dim);
    m.insert(m.end(), rot.begin(), rot.end());
  }
  auto set = RotationSet::FromData(c.num_layers, c.num_kv_heads, c.head_dim, m,
                                   std::vector<float>(c.num_layers * 2 * c.num_kv_heads, 1.0f));
  ASSERT_TRUE(set.ok());
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("oscarkv_absorb_" + std::to_string(::getpid()))).string();
  ASSERT_TRUE(AbsorbValueRotations(dir, *set, out).ok());
  auto rewritten = engine::Model::Load(out);
  ASSERT_TRUE(rewritten.ok()) << rewritten.status();
  // The rewritten v_proj differs from the original (the rotation really is applied).
  EXPECT_NE((*rewritten)->layer(0).wv, (*model)->layer(0).wv);

  std::vector<int32_t> tokens;
  for (char ch : std::string("Absorbing R_V into v_proj and o_proj leaves logits unchanged.\n"
                             "SELECT 1; git log --oneline; print('hello')\n")) {
    tokens.push_back(static_cast<uint8_t>(ch));
  }
  engine::MixedPrecisionAttention a(engine::KvCodec::Bf16()), b(engine::KvCodec::Bf16());
  std::vector<float> want, got;
  ASSERT_TRUE((*model)->Forward(tokens, a, &want).ok());
  ASSERT_TRUE((*rewritten)->Forward(tokens, b, &got).ok());
  double max_err = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_err = std::max(max_err, double(std::fabs(got[i] - want[i])));
    max_abs = std::max(max_abs, double(std::fabs(want[i])));
  }
  EXPECT_LT(max_err, max_abs / 256.0) << "max |logit| " << max_abs;  // bf16 rounding
  std::filesystem::remove_all(out);
}

TEST(AbsorbTest, ValueIdentityKeepsKeysAndClips) {
  RotationSet s = RotationSet::Hadamard(2, 1, 64, 0.97f, 0.9f);
  s.set_range_mode(1, KV::kValue, 0, RangeMode::kSearch);
  const RotationSet v = ValueIdentity(s);
  EXPECT_EQ(std::vector<float>(v.matrix(1, KV::kKey, 0), v.matrix(1, KV::kKey, 0) + 64 * 64),
            std::vector<float>(s.matrix(1, KV::kKey, 0), s.matrix(1, KV::kKey, 0) + 64 * 64));
  EXPECT_EQ(v.matrix(0, KV::kValue, 0)[0], 1.0f);
  EXPECT_EQ(v.matrix(0, KV::kValue, 0)[1], 0.0f);
  EXPECT_EQ(v.clips(), s.clips());
  EXPECT_EQ(v.range_mode(1, KV::kValue, 0), RangeMode::kSearch);
}

}  // namespace
}  // namespace oscarkv::calibrate
