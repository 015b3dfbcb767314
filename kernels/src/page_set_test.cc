#include "oscarkv/kernels/page_set.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace oscarkv {
namespace {

CodecProfile Profile(uint32_t sink, uint32_t recent, uint32_t T = 16, uint32_t g = 128) {
  CodecProfile p;
  p.model_id = "test/pageset";
  p.num_layers = 2;
  p.num_kv_heads = 2;
  p.head_dim = 128;
  p.group_size = g;
  p.page_tokens = T;
  p.sink_tokens = sink;
  p.recent_tokens = recent;
  return p;
}

TEST(PagePlan, SinkHistoryTail) {
  const CodecProfile p = Profile(16, 32);
  auto plan = PlanSequencePages(p, 100);
  // sink [0,16) bf16; history: full pages ending <= 68 -> [16,32),[32,48),[48,64); tail [64,100).
  ASSERT_EQ(plan.size(), 7u);
  EXPECT_EQ(plan[0].kind, PageKind::kBf16);
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(plan[i].kind, PageKind::kInt2);
  for (int i = 4; i < 7; ++i) EXPECT_EQ(plan[i].kind, PageKind::kBf16);
  EXPECT_EQ(plan[6].first_token, 96u);
  EXPECT_EQ(plan[6].token_count, 4u);
  uint32_t tail = 0;
  for (auto& pp : plan) tail += (pp.kind == PageKind::kBf16 && pp.first_token >= 16) ? pp.token_count : 0;
  EXPECT_GE(tail, p.recent_tokens);
  EXPECT_LT(tail, p.recent_tokens + p.page_tokens);
}

TEST(PagePlan, EdgeCases) {
  EXPECT_TRUE(PlanSequencePages(Profile(16, 32), 0).empty());
  auto short_seq = PlanSequencePages(Profile(64, 256), 10);  // all sink
  ASSERT_EQ(short_seq.size(), 1u);
  EXPECT_EQ(short_seq[0].token_count, 10u);
  auto no_windows = PlanSequencePages(Profile(0, 0), 40);  // history only + partial tail
  ASSERT_EQ(no_windows.size(), 3u);
  EXPECT_EQ(no_windows[0].kind, PageKind::kInt2);
  EXPECT_EQ(no_windows[1].kind, PageKind::kInt2);
  EXPECT_EQ(no_windows[2].kind, PageKind::kBf16);
  EXPECT_EQ(no_windows[2].token_count, 8u);
}

double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) e += (a[i] - b[i]) * (a[i] - b[i]), r += b[i] * b[i];
  return std::sqrt(e / r);
}

// The paged reference must equal dense attention over the dequantized rows.
TEST(ReferenceAttention, MixedPageSetEqualsDenseOnDequantized) {
  std::mt19937 rng(21);
  std::normal_distribution<float> n;
  for (uint32_t seq : {1u, 15u, 16u, 100u, 203u}) {
    for (uint32_t qheads : {2u, 8u, 16u}) {
      const CodecProfile p = Profile(16, 32, 16, 64);
      std::vector<float> kv(size_t{2} * 2 * seq * 2 * 128);
      for (auto& v : kv) v = n(rng);
      KVSequenceView view{kv.data(), 2, 2, 128, seq};
      auto rot = RotationSet::Hadamard(2, 2, 128, 0.96f, 1.0f);
      auto sp = BuildSequencePages(p, rot, view);
      ASSERT_TRUE(sp.ok()) << sp.status();
      // Dense rotated K/V from the decoded pages.
      std::vector<float> dense(kv.size());
      KVSequenceView dv{dense.data(), 2, 2, 128, seq};
      for (size_t i = 0; i < sp->pages.size(); ++i) {
        auto dp = *DecodePage(p, sp->pages[i]);
        for (uint32_t l = 0; l < 2; ++l)
          for (uint32_t kvi = 0; kvi < 2; ++kvi)
            for (uint32_t t = 0; t < dp.token_count; ++t)
              for (uint32_t h = 0; h < 2; ++h)
                std::copy_n(dp.view(p).row(l, kvi, t, h), 128,
                            const_cast<float*>(dv.row(l, kvi, sp->plan[i].first_token + t, h)));
      }
      std::vector<float> q(size_t{qheads} * 128);
      for (auto& v : q) v = n(rng);
      std::vector<std::span<const uint8_t>> spans(sp->pages.begin(), sp->pages.end());
      for (bool unrotate : {false, true}) {
        auto paged = ReferenceDecodeAttention(p, rot, spans, 1, q, qheads, unrotate);
        ASSERT_TRUE(paged.ok()) << paged.status();
        auto dense_out = DenseDecodeAttention(p, rot, dv, 1, q, qheads, unrotate);
        EXPECT_LT(RelErr(paged->out, dense_out.out), 1e-5) << seq << " " << qheads;
        EXPECT_LT(RelErr(paged->lse, dense_out.lse), 1e-5);
      }
    }
  }
}

// With BF16-only pages and identity rotation the reference is ordinary attention.
TEST(ReferenceAttention, MatchesPlainAttentionWithinBf16) {
  std::mt19937 rng(23);
  std::normal_distribution<float> n;
  const uint32_t seq = 50;
  CodecProfile p = Profile(1000, 1000);
  std::vector<float> kv(size_t{2} * 2 * seq * 2 * 128);
  for (auto& v : kv) v = n(rng);
  KVSequenceView view{kv.data(), 2, 2, 128, seq};
  auto rot = RotationSet::Hadamard(2, 2, 128);
  auto sp = *BuildSequencePages(p, rot, view);
  for (auto& pp : sp.plan) ASSERT_EQ(pp.kind, PageKind::kBf16);
  std::vector<float> q(4 * 128);
  for (auto& v : q) v = n(rng);
  std::vector<std::span<const uint8_t>> spans(sp.pages.begin(), sp.pages.end());
  auto got = *ReferenceDecodeAttention(p, rot, spans, 0, q, 4, /*unrotate_output=*/true);
  auto eye = RotationSet::Identity(2, 2, 128);
  auto want = DenseDecodeAttention(p, eye, view, 0, q, 4, true);  // original space, fp32 K/V
  EXPECT_LT(RelErr(got.out, want.out), 1e-2);
}

TEST(ReferenceAttention, BadArguments) {
  const CodecProfile p = Profile(16, 32);
  auto rot = RotationSet::Identity(2, 2, 128);
  std::vector<float> q(3 * 128);
  std::vector<std::span<const uint8_t>> none;
  EXPECT_FALSE(ReferenceDecodeAttention(p, rot, none, 0, q, 3, false).ok());
  EXPECT_FALSE(ReferenceDecodeAttention(p, rot, none, 5, q, 2, false).ok());
  std::vector<uint8_t> junk(100, 0);
  std::vector<std::span<const uint8_t>> bad = {junk};
  std::vector<float> q2(2 * 128);
  EXPECT_FALSE(ReferenceDecodeAttention(p, rot, bad, 0, q2, 2, false).ok());
}

}  // namespace
}  // namespace oscarkv
