// A short quality run on the reference model (2 windows), as CI runs it.
#include "oscarkv/engine/eval.h"

#include <cmath>

#include "gtest/gtest.h"
#include "oscarkv/engine/safetensors.h"
#include "test_util.h"

namespace oscarkv::engine {
namespace {

TEST(EvalTest, PlanIsDeterministicAndInRange) {
  EvalOptions o;
  o.windows = 5;
  auto a = PlanEval(10000, o), b = PlanEval(10000, o);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->window_offsets, b->window_offsets);
  EXPECT_EQ(a->recall_offsets.size(), 5u);
  for (uint64_t off : a->window_offsets) EXPECT_LE(off + o.window_bytes, 10000u);
  EXPECT_FALSE(PlanEval(100, o).ok());
}

TEST(EvalTest, ShortEvalOrdersCodecs) {
  const std::string dir = testing::RefModelDir();
  if (dir.empty()) GTEST_SKIP() << "reference model not found (set OSCARKV_REFMODEL)";
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  auto text = ReadFileBytes(dir + "/val.txt");
  ASSERT_TRUE(text.ok());
  const auto& c = (*model)->config();
  auto ident = std::make_shared<RotationSet>(RotationSet::Identity(c.num_layers, c.num_kv_heads, c.head_dim));
  EvalOptions o;
  o.windows = 2;
  o.window_bytes = 1024;
  o.recall_span = 400;
  auto unbiased = std::make_shared<RotationSet>(RotationSet::Hadamard(c.num_layers, c.num_kv_heads, c.head_dim));
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    for (uint32_t h = 0; h < c.num_kv_heads; ++h) {
      unbiased->set_range_mode(l, KV::kKey, h, RangeMode::kUnbiased);
      unbiased->set_range_mode(l, KV::kValue, h, RangeMode::kUnbiased);
    }
  }
  std::vector<KvCodec> codecs = {KvCodec::Bf16(), KvCodec::Int2("naive", ident, 0, 0, 128),
                                 KvCodec::Int2("hadamard-unbiased", unbiased, 0, 0, 128)};
  auto r = EvaluateCodecs(**model, std::string(text->begin(), text->end()), codecs, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT((*r)[0].bpb, 0.5);
  EXPECT_LT((*r)[0].bpb, 2.0);
  EXPECT_GT((*r)[1].bpb, (*r)[0].bpb);  // INT2 without windows costs quality
  EXPECT_GT((*r)[1].bpb, (*r)[2].bpb);  // rotation + unbiased ranges cost less than naive INT2
  EXPECT_GT((*r)[2].bpb, (*r)[0].bpb);
  EXPECT_LT((*r)[0].recall_bpb, (*r)[0].bpb);  // the repeat is easier
}

}  // namespace
}  // namespace oscarkv::engine
