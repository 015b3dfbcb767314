// The incremental decoder against teacher-forced logits, and a P/D-style handoff of its pages.
#include "oscarkv/engine/decode.h"

#include <cmath>

#include "gtest/gtest.h"
#include "test_util.h"

namespace oscarkv::engine {
namespace {

std::vector<int32_t> Bytes(const std::string& s) {
  std::vector<int32_t> t;
  for (char c : s) t.push_back(static_cast<uint8_t>(c));
  return t;
}

CodecProfile SmallProfile(const ModelConfig& c, uint32_t sink, uint32_t recent) {
  CodecProfile p;
  p.model_id = c.model_id;
  p.model_revision = "test";
  p.num_layers = c.num_layers;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.page_tokens = 16;
  p.group_size = 128;
  p.sink_tokens = sink;
  p.recent_tokens = recent;
  return p;
}

const char kPrompt[] =
    "The git-rebase command reapplies commits on top of another base tip. If <branch> is "
    "specified, git rebase will perform an automatic git switch <branch> before doing";

TEST(DecodeTest, AllBf16PagesMatchTeacherForcedLogits) {
  const std::string dir = testing::RefModelDir();
  if (dir.empty()) GTEST_SKIP() << "reference model not found (set OSCARKV_REFMODEL)";
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok());
  const ModelConfig& c = (*model)->config();
  auto ident = std::make_shared<RotationSet>(RotationSet::Identity(c.num_layers, c.num_kv_heads, c.head_dim));
  // A sink larger than the sequence: every page is BF16, so decoding must reproduce the
  // teacher-forced BF16 forward.
  auto dec = Decoder::Create(**model, SmallProfile(c, 512, 32), ident, 512);
  ASSERT_TRUE(dec.ok()) << dec.status();
  const std::vector<int32_t> prompt = Bytes(kPrompt);
  ASSERT_TRUE((*dec)->Prefill(prompt).ok());
  std::vector<std::vector<float>> step_logits = {(*dec)->next_logits()};
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE((*dec)->Step().ok());
    step_logits.push_back((*dec)->next_logits());
  }
  const std::vector<int32_t>& all = (*dec)->tokens();
  MixedPrecisionAttention bf16(KvCodec::Bf16());
  std::vector<float> tf;
  ASSERT_TRUE((*model)->Forward(all, bf16, &tf).ok());
  for (size_t i = 0; i < step_logits.size(); ++i) {
    const size_t pos = prompt.size() - 1 + i;
    for (uint32_t v = 0; v < c.vocab_size; ++v) {
      ASSERT_NEAR(step_logits[i][v], tf[pos * c.vocab_size + v], 0.05) << "step " << i;
    }
  }
  EXPECT_EQ((*dec)->pages().plan.size(), (all.size() + 15) / 16);
}

TEST(DecodeTest, HandoffOfPagesContinuesIdentically) {
  const std::string dir = testing::RefModelDir();
  if (dir.empty()) GTEST_SKIP() << "reference model not found (set OSCARKV_REFMODEL)";
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok());
  const ModelConfig& c = (*model)->config();
  auto had = std::make_shared<RotationSet>(RotationSet::Hadamard(c.num_layers, c.num_kv_heads, c.head_dim));
  const CodecProfile profile = SmallProfile(c, 16, 32);
  auto a = Decoder::Create(**model, profile, had, 512);
  auto b = Decoder::Create(**model, profile, had, 512);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<int32_t> prompt = Bytes(kPrompt);
  ASSERT_TRUE((*a)->Prefill(prompt).ok());
  // INT2 history exists after the prefill.
  bool has_int2 = false;
  for (const auto& p : (*a)->pages().plan) has_int2 |= p.kind == PageKind::kInt2;
  EXPECT_TRUE(has_int2);
  const SequencePages handed = (*a)->pages();  // what the prefill worker stores
  auto first = (*a)->Step();
  ASSERT_TRUE(first.ok());
  std::vector<int32_t> resume = prompt;
  resume.push_back(*first);
  ASSERT_TRUE((*b)->Resume(resume, handed).ok());
  auto ga = (*a)->Generate(40), gb = (*b)->Generate(40);  // crosses page flushes
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_EQ(*ga, *gb);
  EXPECT_EQ((*a)->pages().plan.size(), (*b)->pages().plan.size());
}

TEST(DecodeTest, RejectsMismatchedShapes) {
  const std::string dir = testing::RefModelDir();
  if (dir.empty()) GTEST_SKIP() << "reference model not found (set OSCARKV_REFMODEL)";
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok());
  const ModelConfig& c = (*model)->config();
  auto wrong = std::make_shared<RotationSet>(RotationSet::Identity(c.num_layers + 1, c.num_kv_heads, c.head_dim));
  EXPECT_FALSE(Decoder::Create(**model, SmallProfile(c, 16, 32), wrong, 256).ok());
}

}  // namespace
}  // namespace oscarkv::engine
