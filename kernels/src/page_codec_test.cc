#include "oscarkv/kernels/page_codec.h"

#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "oscarkv/kernels/numeric.h"

namespace oscarkv {
namespace {

CodecProfile SmallProfile(uint32_t d = 128, uint32_t g = 128, uint32_t T = 16) {
  CodecProfile p;
  p.model_id = "test/small";
  p.num_layers = 2;
  p.num_kv_heads = 2;
  p.head_dim = d;
  p.group_size = g;
  p.page_tokens = T;
  return p;
}

std::vector<float> RandomKV(const CodecProfile& p, uint32_t tokens, std::mt19937& rng) {
  std::normal_distribution<float> n;
  std::vector<float> kv(size_t{p.num_layers} * 2 * tokens * p.num_kv_heads * p.head_dim);
  for (auto& v : kv) v = n(rng);
  return kv;
}

TEST(PageCodec, Qwen3PageSizesAndRatio) {
  const CodecProfile p = *BuiltinProfile("qwen3-8b");
  const size_t int2 = GeometryFor(p, PageKind::kInt2).page_bytes();
  const size_t bf16 = GeometryFor(p, PageKind::kBf16).page_bytes();
  EXPECT_EQ(int2, 64u + 36u * 2 * 8 * (64 * 32 + 64 * 4));  // 1,327,168
  EXPECT_EQ(bf16, 64u + 36u * 2 * 8 * 64 * 128 * 2);        // 9,437,248
  EXPECT_GE(static_cast<double>(bf16) / int2, 7.0);
}

TEST(PageCodec, RoundTripAllShapes) {
  std::mt19937 rng(5);
  for (uint32_t d : {64u, 128u, 256u}) {
    for (uint32_t g : {32u, 64u, 128u}) {
      if (g > d) continue;
      const CodecProfile p = SmallProfile(d, g, 16);
      auto kv = RandomKV(p, 20, rng);
      KVSequenceView view{kv.data(), p.num_layers, p.num_kv_heads, d, 20};
      auto rot = RotationSet::Hadamard(p.num_layers, p.num_kv_heads, d);
      for (PageKind kind : {PageKind::kInt2, PageKind::kBf16}) {
        auto page = EncodePage(p, &rot, kind, view, 4, 13);
        ASSERT_TRUE(page.ok()) << page.status();
        EXPECT_EQ(page->size(), GeometryFor(p, kind).page_bytes());
        auto dec = DecodePage(p, *page);
        ASSERT_TRUE(dec.ok()) << dec.status();
        ASSERT_EQ(dec->token_count, 13u);
        // Compare against the rotated input row.
        double err = 0, ref = 0;
        std::vector<float> rr(d);
        for (uint32_t l = 0; l < 2; ++l)
          for (uint32_t kvi = 0; kvi < 2; ++kvi)
            for (uint32_t t = 0; t < 13; ++t)
              for (uint32_t h = 0; h < 2; ++h) {
                RotateRow(view.row(l, kvi, 4 + t, h), rot.matrix(l, KV(kvi), h), d, rr.data());
                const float* got = dec->view(p).row(l, kvi, t, h);
                for (uint32_t i = 0; i < d; ++i) {
                  err += (got[i] - rr[i]) * (got[i] - rr[i]);
                  ref += rr[i] * rr[i];
                }
              }
        const double rel = std::sqrt(err / ref);
        if (kind == PageKind::kBf16) {
          EXPECT_LT(rel, 4e-3);
        } else {
          EXPECT_LT(rel, 0.55) << d << " " << g;  // 4-level quantization of Gaussian rows
          EXPECT_GT(rel, 0.05);
        }
      }
    }
  }
}

TEST(PageCodec, EqualInputsGiveEqualBytes) {
  std::mt19937 rng(9);
  const CodecProfile p = SmallProfile();
  auto kv = RandomKV(p, 16, rng);
  KVSequenceView view{kv.data(), 2, 2, 128, 16};
  auto a = EncodePage(p, nullptr, PageKind::kInt2, view, 0, 10);
  auto b = EncodePage(p, nullptr, PageKind::kInt2, view, 0, 10);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

class BadPageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(13);
    p_ = SmallProfile();
    kv_ = RandomKV(p_, 16, rng);
    KVSequenceView view{kv_.data(), 2, 2, 128, 16};
    page_ = *EncodePage(p_, nullptr, PageKind::kInt2, view, 0, 16);
  }
  absl::Status Decode() { return DecodePage(p_, page_).status(); }
  CodecProfile p_;
  std::vector<float> kv_;
  std::vector<uint8_t> page_;
};

TEST_F(BadPageTest, GoodPageDecodes) { EXPECT_TRUE(Decode().ok()); }

TEST_F(BadPageTest, TruncatedPage) {
  page_.resize(page_.size() - 1);
  EXPECT_EQ(Decode().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Decode().message().find("truncated"), std::string::npos);
  page_.resize(10);
  EXPECT_EQ(Decode().code(), absl::StatusCode::kInvalidArgument);
  page_.clear();
  EXPECT_EQ(Decode().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BadPageTest, WrongMagic) {
  page_[0] ^= 0xff;
  EXPECT_NE(Decode().message().find("magic"), std::string::npos);
}

TEST_F(BadPageTest, WrongVersion) {
  page_[4] = 9;
  EXPECT_NE(Decode().message().find("version"), std::string::npos);
}

TEST_F(BadPageTest, ChecksumMismatchInPayload) {
  page_[page_.size() / 2] ^= 0x10;
  EXPECT_EQ(Decode().code(), absl::StatusCode::kDataLoss);
}

TEST_F(BadPageTest, ChecksumCoversHeader) {
  page_[offsetof(PageHeader, token_count)] = 3;  // plausible but altered header field
  EXPECT_EQ(Decode().code(), absl::StatusCode::kDataLoss);
}

TEST_F(BadPageTest, UnsupportedGroupOrHeadDimInHeader) {
  page_[offsetof(PageHeader, group_size)] = 48;
  EXPECT_NE(Decode().message().find("group_size"), std::string::npos);
  SetUp();
  page_[offsetof(PageHeader, head_dim)] = 96;
  EXPECT_NE(Decode().message().find("head_dim"), std::string::npos);
}

TEST_F(BadPageTest, OtherCodecIsRejected) {
  CodecProfile other = p_;
  other.recent_tokens = 1;
  auto s = DecodePage(other, page_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("codec"), std::string::npos);
}

TEST_F(BadPageTest, RandomCorruptionNeverCrashesOrDecodes) {
  std::mt19937 rng(17);
  const auto good = page_;
  for (int i = 0; i < 500; ++i) {
    page_ = good;
    const int flips = 1 + rng() % 4;
    for (int f = 0; f < flips; ++f) page_[rng() % page_.size()] ^= 1u << (rng() % 8);
    EXPECT_FALSE(Decode().ok());
  }
}

TEST(PageCodec, UnsupportedProfilesAreErrors) {
  std::vector<float> kv(2 * 2 * 16 * 2 * 128);
  KVSequenceView view{kv.data(), 2, 2, 128, 16};
  CodecProfile p = SmallProfile();
  p.group_size = 48;
  EXPECT_EQ(EncodePage(p, nullptr, PageKind::kInt2, view, 0, 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  p = SmallProfile();
  p.head_dim = 96;
  EXPECT_FALSE(EncodePage(p, nullptr, PageKind::kInt2, view, 0, 16).ok());
  p = SmallProfile();
  p.page_tokens = 20;
  EXPECT_FALSE(EncodePage(p, nullptr, PageKind::kInt2, view, 0, 16).ok());
  p = SmallProfile();
  EXPECT_FALSE(EncodePage(p, nullptr, PageKind::kInt2, view, 10, 16).ok());  // past the end
  EXPECT_FALSE(EncodePage(p, nullptr, PageKind::kInt2, view, 0, 17).ok());   // > page_tokens
  auto wrong_rot = RotationSet::Identity(1, 2, 128);
  EXPECT_FALSE(EncodePage(p, &wrong_rot, PageKind::kInt2, view, 0, 16).ok());
  std::vector<uint8_t> small(100);
  EXPECT_FALSE(EncodePage(p, nullptr, PageKind::kInt2, view, 0, 16, small).ok());
}

TEST(PageCodec, StandaloneParseChecksShapeAndSize) {
  std::vector<float> kv(2 * 2 * 16 * 2 * 128, 0.5f);
  KVSequenceView view{kv.data(), 2, 2, 128, 16};
  auto page = *EncodePage(SmallProfile(), nullptr, PageKind::kBf16, view, 0, 16);
  auto h = ParsePageHeaderStandalone(page);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->kind, static_cast<uint8_t>(PageKind::kBf16));
  page.push_back(0);
  EXPECT_FALSE(ParsePageHeaderStandalone(page).ok());
}

}  // namespace
}  // namespace oscarkv
