// The random-weight checkpoint the demo falls back to: deterministic bytes, loads through
// Model::Load, and runs a forward pass whose greedy tokens are printable.
#include "oscarkv/engine/random_checkpoint.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "gtest/gtest.h"
#include "oscarkv/engine/attention.h"
#include "oscarkv/engine/model.h"
#include "oscarkv/engine/safetensors.h"

namespace oscarkv::engine {
namespace {

std::string TempDir(const std::string& name) {
  return ::testing::TempDir() + "/random_ckpt_" + std::to_string(::getpid()) + "_" + name;
}

TEST(RandomCheckpointTest, SameOptionsSameBytes) {
  const std::string a = TempDir("a"), b = TempDir("b"), c = TempDir("c");
  ASSERT_TRUE(WriteRandomCheckpoint(a).ok());
  ASSERT_TRUE(WriteRandomCheckpoint(b).ok());
  RandomCheckpointOptions other;
  other.seed = 7;
  ASSERT_TRUE(WriteRandomCheckpoint(c, other).ok());
  for (const char* f : {"config.json", "model.safetensors"}) {
    auto ba = ReadFileBytes(a + "/" + f), bb = ReadFileBytes(b + "/" + f);
    ASSERT_TRUE(ba.ok() && bb.ok());
    EXPECT_EQ(*ba, *bb) << f;
  }
  auto weights = ReadFileBytes(a + "/model.safetensors");
  auto weights_c = ReadFileBytes(c + "/model.safetensors");
  EXPECT_NE(*weights, *weights_c);
  EXPECT_GT(weights->size(), 1u << 20);  // "a few MB"
  EXPECT_LT(weights->size(), 12u << 20);
  for (const auto& d : {a, b, c}) std::filesystem::remove_all(d);
}

TEST(RandomCheckpointTest, LoadsAndRunsAForwardPass) {
  const std::string dir = TempDir("load");
  ASSERT_TRUE(WriteRandomCheckpoint(dir).ok());
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& cfg = (*model)->config();
  EXPECT_EQ(cfg.vocab_size, 256u);
  EXPECT_EQ(cfg.num_layers, 4u);
  EXPECT_EQ(cfg.head_dim, 128u);
  EXPECT_EQ(cfg.model_id, "oscarkv-random-qwen3");
  const std::string text = "The prefill host computes the KV cache; the decode host continues.";
  std::vector<int32_t> tokens(text.begin(), text.end());
  MixedPrecisionAttention attn(KvCodec::Bf16());
  std::vector<float> logits;
  ASSERT_TRUE((*model)->Forward(tokens, attn, &logits).ok());
  ASSERT_EQ(logits.size(), tokens.size() * 256);
  int printable = 0;
  std::vector<int> argmax;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float* row = logits.data() + i * 256;
    int best = 0;
    for (int t = 0; t < 256; ++t) {
      ASSERT_TRUE(std::isfinite(row[t]));
      if (row[t] > row[best]) best = t;
    }
    printable += best >= 32 && best < 127;
    argmax.push_back(best);
  }
  EXPECT_EQ(printable, static_cast<int>(tokens.size()));
  // Not a constant function of the input: greedy tokens vary along the sequence.
  EXPECT_GT(std::set<int>(argmax.begin(), argmax.end()).size(), 3u);
  std::filesystem::remove_all(dir);
}

TEST(RandomCheckpointTest, RejectsInconsistentShapes) {
  RandomCheckpointOptions o;
  o.num_kv_heads = 3;  // 4 q heads do not split into 3 groups
  EXPECT_EQ(WriteRandomCheckpoint(TempDir("bad"), o).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace oscarkv::engine
