#include "oscarkv/kernels/block_key.h"

#include <numeric>

#include "gtest/gtest.h"

namespace oscarkv {
namespace {

// Golden vectors: produced by the independent Python implementation in tools/oscarkv_keys.py
// (hashlib only) and listed in docs/FORMAT.md. Changing any of them breaks every engine's
// cached keys: bump the format version instead.
TEST(CodecId, GoldenVectors) {
  EXPECT_EQ(BuiltinProfile("qwen3-8b")->Id().Hex(), "4be25704bf3761cb7196d7029b0c67ed");
  EXPECT_EQ(BuiltinProfile("refmodel")->Id().Hex(), "c5bc90c8c91954515b762ed6bedbf267");
  CodecProfile p = *BuiltinProfile("qwen3-8b");
  p.rotation_digest.fill(1);
  EXPECT_EQ(p.Id().Hex(), "b0f7827f2a02f7c99e053faac7c79e14");
}

TEST(CodecId, EveryFieldMatters) {
  const CodecProfile base = *BuiltinProfile("qwen3-8b");
  std::vector<CodecProfile> variants(12, base);
  variants[0].model_id = "x";
  variants[1].model_revision = "r2";
  variants[2].num_layers = 35;
  variants[3].num_kv_heads = 4;
  variants[4].tp_rank = 1, variants[4].tp_size = 2;
  variants[5].tp_size = 2;
  variants[6].head_dim = 64;
  variants[7].page_tokens = 32;
  variants[8].group_size = 64;
  variants[9].sink_tokens = 0;
  variants[10].recent_tokens = 128;
  variants[11].rotation_digest[31] = 9;
  for (const auto& v : variants) EXPECT_NE(v.Id(), base.Id());
}

TEST(CodecId, HexRoundTripAndErrors) {
  const CodecId id = BuiltinProfile("refmodel")->Id();
  EXPECT_EQ(*CodecId::FromHex(id.Hex()), id);
  EXPECT_FALSE(CodecId::FromHex("abc").ok());
  EXPECT_FALSE(CodecId::FromHex(std::string(32, 'z')).ok());
}

TEST(BlockKey, GoldenVectors) {
  const CodecId codec = BuiltinProfile("qwen3-8b")->Id();
  std::vector<uint32_t> tokens(128);
  std::iota(tokens.begin(), tokens.end(), 0u);
  tokens.push_back(7);  // partial block: no key
  auto keys = ComputeBlockKeys(codec, "", tokens, 64);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].Hex(), "5d55a8bf9ffbceec922d5a1b7acc1d7f");
  EXPECT_EQ(keys[1].Hex(), "10cb911c588a67c541fd440aa76e9779");
  auto salted = ComputeBlockKeys(codec, "tenant-a", tokens, 64);
  EXPECT_EQ(salted[0].Hex(), "db9f58cfc2462c86ab995409005f7b67");
  EXPECT_EQ(salted[1].Hex(), "7049ff28b9393592eaa46b861479f5dc");
  std::vector<uint32_t> big(16);
  for (uint32_t i = 0; i < 16; ++i) big[i] = 0xFFFFFFFFu - i;
  EXPECT_EQ(ComputeBlockKeys(codec, "", big, 16)[0].Hex(), "6f8cd0cc9f5a28312be094f960017f57");
}

TEST(BlockKey, ChainingMakesKeysPrefixDependent) {
  const CodecId codec = BuiltinProfile("refmodel")->Id();
  std::vector<uint32_t> a(128, 1), b(128, 1);
  b[3] = 2;  // differs in block 0 only
  auto ka = ComputeBlockKeys(codec, "", a, 64), kb = ComputeBlockKeys(codec, "", b, 64);
  EXPECT_NE(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]);  // same tokens in block 1, different prefix
  EXPECT_EQ(*BlockKey::FromHex(ka[1].Hex()), ka[1]);
  EXPECT_FALSE(BlockKey::FromHex("00").ok());
}

}  // namespace
}  // namespace oscarkv
