// The engine's logits against golden logits from an independent implementation
// (transformers, tools/golden/make_golden_logits.py).
#include <cmath>

#include "gtest/gtest.h"
#include "oscarkv/engine/eval.h"
#include "oscarkv/engine/model.h"
#include "oscarkv/engine/safetensors.h"
#include "test_util.h"

namespace oscarkv::engine {
namespace {

TEST(ModelTest, ConfigParsesQwen3Fields) {
  const std::string dir = testing::RefModelDir();
  if (dir.empty()) GTEST_SKIP() << "reference model not found (set OSCARKV_REFMODEL)";
  auto c = ModelConfig::FromJsonFile(dir + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers, 8u);
  EXPECT_EQ(c->num_q_heads, 8u);
  EXPECT_EQ(c->num_kv_heads, 2u);
  EXPECT_EQ(c->head_dim, 128u);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_FALSE(c->tie_word_embeddings);
}

TEST(ModelTest, LogitsMatchTransformersGolden) {
  const std::string dir = testing::RefModelDir();
  if (dir.empty()) GTEST_SKIP() << "reference model not found (set OSCARKV_REFMODEL)";
  auto golden =
      SafetensorsFile::Open(testing::SourceDir() + "/engine/testdata/golden_logits.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  auto ids_info = (*golden)->Get("input_ids");
  ASSERT_TRUE(ids_info.ok());
  std::vector<int32_t> ids(ids_info->numel());
  std::memcpy(ids.data(), ids_info->data, ids_info->bytes);
  auto want = (*golden)->GetF32("logits");
  ASSERT_TRUE(want.ok());

  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  // An all-BF16 cache; golden is fp32 K/V, so bf16 rounding of K/V is the only difference
  // besides summation order.
  MixedPrecisionAttention attn(KvCodec::Bf16());
  std::vector<float> logits;
  ASSERT_TRUE((*model)->Forward(ids, attn, &logits).ok());
  ASSERT_EQ(logits.size(), want->size());
  double max_err = 0, max_abs = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    max_err = std::max(max_err, double(std::fabs(logits[i] - (*want)[i])));
    max_abs = std::max(max_abs, double(std::fabs((*want)[i])));
  }
  // bf16 has 8 significant bits: relative 2^-8 of the logit range bounds the difference.
  EXPECT_LT(max_err, max_abs / 256.0) << "max |logit| " << max_abs;
  const double nll = SumNll(logits, ids, 256, 1);
  const double want_nll = SumNll(*want, ids, 256, 1);
  EXPECT_NEAR(nll / (ids.size() - 1), want_nll / (ids.size() - 1), 0.01);
  std::printf("max |logit diff| %.5f (max |logit| %.2f); nats/byte %.5f vs golden %.5f\n",
              max_err, max_abs, nll / (ids.size() - 1), want_nll / (ids.size() - 1));
}

}  // namespace
}  // namespace oscarkv::engine
