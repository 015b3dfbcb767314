#include "oscarkv/engine/safetensors.h"

#include "gtest/gtest.h"

namespace oscarkv::engine {
namespace {

TEST(SafetensorsTest, WriterOutputReadsBack) {
  SafetensorsWriter w;
  w.AddF32("a", {2, 3}, {1, 2, 3, 4, 5, 6});
  const uint16_t bf[2] = {0x3f80, 0xc000};  // 1.0, -2.0
  w.Add("b", DType::kBF16, {2}, bf, sizeof(bf));
  w.SetMetadata("model", "x");
  auto f = SafetensorsFile::FromBytes(w.Serialize(), "mem");
  ASSERT_TRUE(f.ok()) << f.status();
  auto a = (*f)->GetF32("a", {2, 3});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  auto b = (*f)->GetF32("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ((*f)->metadata().at("model"), "x");
  EXPECT_FALSE((*f)->GetF32("a", {3, 2}).ok());
  EXPECT_EQ((*f)->Get("zz").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(w.Serialize(), w.Serialize());
}

TEST(SafetensorsTest, RejectsCorruptFiles) {
  SafetensorsWriter w;
  w.AddF32("a", {4}, {1, 2, 3, 4});
  std::vector<uint8_t> bytes = w.Serialize();
  EXPECT_FALSE(SafetensorsFile::FromBytes({1, 2, 3}, "short").ok());
  std::vector<uint8_t> truncated(bytes.begin(), bytes.end() - 4);
  EXPECT_FALSE(SafetensorsFile::FromBytes(truncated, "truncated").ok());
  std::vector<uint8_t> huge = bytes;
  huge[7] = 0x7f;
  EXPECT_FALSE(SafetensorsFile::FromBytes(huge, "huge").ok());
  std::vector<uint8_t> garbage = bytes;
  garbage[9] = '!';
  EXPECT_FALSE(SafetensorsFile::FromBytes(garbage, "garbage").ok());
}

}  // namespace
}  // namespace oscarkv::engine
