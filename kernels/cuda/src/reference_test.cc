// CPU tests (label unit) of the kernels' host-side pieces: the split-KV planner and the CPU
// references of the POD interfaces (ReferenceQuantizeWrite against EncodePage, the paged
// decode reference against the dense one).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/cuda/decode_runner.h"
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/cuda/internal/decode_launch.h"
#include "oscarkv/cuda/reference.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/page_codec.h"
#include "oscarkv/kernels/page_set.h"
#include "oscarkv/kernels/quantize.h"

namespace oscarkv::cuda {
namespace {

DecodeShape Shape() { return DecodeShape{2, 8, 32, 128, 128, 64, 1}; }

TEST(PlanDecode, CoversEverySliceOnceWithHomogeneousItems) {
  std::mt19937 rng(1);
  std::vector<int32_t> indptr = {0}, ids;
  std::vector<uint8_t> kinds;
  for (int b = 0; b < 5; ++b) {
    const int pages = static_cast<int>(rng() % 300);
    for (int i = 0; i < pages; ++i) {
      ids.push_back(static_cast<int32_t>(kinds.size()));
      kinds.push_back(i == 0 || i + 5 > pages ? 2 : 1);  // sink, history, tail
    }
    indptr.push_back(static_cast<int32_t>(ids.size()));
  }
  for (int target : {0, 1, 50, 100000}) {
    auto plan = PlanDecode(Shape(), indptr, ids, kinds, 132, target);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->item_indptr.size(), 5u * 8 + 1);
    size_t slices = 0;
    for (int b = 0; b < 5; ++b) {
      for (int h = 0; h < 8; ++h) {
        int next = 0;
        for (int i = plan->item_indptr[b * 8 + h]; i < plan->item_indptr[b * 8 + h + 1]; ++i) {
          const DecodeWorkItem& it = plan->items[i];
          EXPECT_EQ(it.seq, b);
          EXPECT_EQ(it.kv_head, h);
          EXPECT_EQ(it.page_entry, indptr[b]);
          EXPECT_EQ(it.first_slice, next);
          EXPECT_GE(it.num_slices, 1);
          EXPECT_LE(it.num_slices, kMaxItemSlices);
          for (int s = it.first_slice; s < it.first_slice + it.num_slices; ++s) {
            EXPECT_EQ(kinds[ids[indptr[b] + s]], it.kind);
          }
          next += it.num_slices;
          slices += it.num_slices;
        }
        EXPECT_EQ(next, indptr[b + 1] - indptr[b]);
      }
    }
    EXPECT_EQ(slices, ids.size() * 8);
    EXPECT_EQ(plan->int2_slices + plan->bf16_slices, slices);
  }
}

// The default target is one resident wave: 2 CTAs/SM when BF16 slices dominate the cost (the
// BF16 kernel's residency) or the INT2 batch is small (under 64 slices per CTA at 3/SM), 3 for a
// large INT2 batch.
TEST(PlanDecode, DefaultTargetIsOneWaveOfTheDominantKernel) {
  struct C {
    uint8_t kind;
    int pages;
    size_t per_sm;
  };
  for (C c : {C{1, 512, 2}, C{2, 512, 2}, C{1, 4096, 3}}) {
    std::vector<int32_t> indptr = {0, c.pages}, ids(c.pages);
    std::vector<uint8_t> kinds(c.pages, c.kind);
    for (int i = 0; i < c.pages; ++i) ids[i] = i;
    auto plan = PlanDecode(Shape(), indptr, ids, kinds, 132);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const size_t wave = c.per_sm * 132;
    EXPECT_LE(plan->items.size(), wave) << "kind " << int{c.kind} << " pages " << c.pages;
    EXPECT_GE(plan->items.size(), wave * 3 / 4) << "kind " << int{c.kind} << " pages " << c.pages;
  }
}

// Whole waves: the item count of a uniform batch is not a little over a multiple of the
// resident CTA slots (a nearly empty extra wave doubles the time of those items). Bench
// shapes: BF16 B=8 x 32K and B=1 x 100K, INT2 B=1 x 100K and B=32 x 32K (132 SMs).
TEST(PlanDecode, NoNearlyEmptyLastWave) {
  struct C {
    int seqs, tokens;
    uint8_t kind;
  };
  for (C c : {C{8, 32768, 2}, C{1, 100000, 2}, C{1, 100000, 1}, C{32, 32768, 1}, C{1, 32768, 2}}) {
    const int pages = (c.tokens + 63) / 64;
    std::vector<int32_t> indptr = {0}, ids;
    std::vector<uint8_t> kinds;
    for (int b = 0; b < c.seqs; ++b) {
      for (int i = 0; i < pages; ++i) {
        ids.push_back(static_cast<int32_t>(kinds.size()));
        kinds.push_back(c.kind);
      }
      indptr.push_back(static_cast<int32_t>(ids.size()));
    }
    auto plan = PlanDecode(Shape(), indptr, ids, kinds, 132);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const size_t wave = c.kind == 2 ? 2 * 132 : 3 * 132;
    const size_t rem = plan->items.size() % wave;
    EXPECT_TRUE(rem == 0 || rem >= wave / 2)
        << c.seqs << " x " << c.tokens << " kind " << int{c.kind} << ": " << plan->items.size()
        << " items over " << wave << " slots";
  }
}

// INT2-dominated batches with sink and recent BF16 pages (the bench's B=8 x 32K): the INT2
// items take 2 slots per SM and the BF16 items the third, so every CTA is resident at once
// (the session-5 planner put 320 INT2 items on 396 slots and the 128 BF16 items after them).
// B=1 x 100K fits one wave already and keeps the session-5 plan.
TEST(PlanDecode, Int2BatchLeavesTheThirdSlotToBf16Items) {
  CodecProfile prof;
  prof.model_id = "test";
  prof.model_revision = "1";
  prof.num_layers = 2;
  prof.num_kv_heads = 8;
  prof.head_dim = 128;
  prof.page_tokens = 64;
  prof.group_size = 128;
  const std::vector<PlannedPage> pages = PlanSequencePages(prof, 32768);
  std::vector<int32_t> indptr = {0}, ids;
  std::vector<uint8_t> kinds;
  for (int b = 0; b < 8; ++b) {
    for (const PlannedPage& pp : pages) {
      ids.push_back(static_cast<int32_t>(kinds.size()));
      kinds.push_back(static_cast<uint8_t>(pp.kind));
    }
    indptr.push_back(static_cast<int32_t>(ids.size()));
  }
  auto count = [](const DecodePlan& plan, int32_t kind) {
    size_t n = 0;
    for (const DecodeWorkItem& it : plan.items) n += it.kind == kind;
    return n;
  };
  auto plan = PlanDecode(Shape(), indptr, ids, kinds, 132);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const size_t n_int2 = count(*plan, 1), n_bf16 = count(*plan, 2);
  EXPECT_GT(n_bf16, 0u);
  EXPECT_LE(n_int2, 2u * 132);
  EXPECT_GE(n_int2, 3u * 132 / 2);
  EXPECT_LE(n_int2 + n_bf16, 3u * 132);
  EXPECT_EQ(plan->num_int2_items, static_cast<int32_t>(plan->items.size()));  // one kernel
  auto s5 = PlanDecode(Shape(), indptr, ids, kinds, 132, 0, /*session5_slots=*/true);
  ASSERT_TRUE(s5.ok()) << s5.status();
  EXPECT_GT(s5->items.size(), 3u * 132);  // what the new planner avoids
  const std::vector<PlannedPage> long_pages = PlanSequencePages(prof, 100000);
  std::vector<int32_t> indptr1 = {0}, ids1;
  std::vector<uint8_t> kinds1;
  for (const PlannedPage& pp : long_pages) {
    ids1.push_back(static_cast<int32_t>(kinds1.size()));
    kinds1.push_back(static_cast<uint8_t>(pp.kind));
  }
  indptr1.push_back(static_cast<int32_t>(ids1.size()));
  auto p1 = PlanDecode(Shape(), indptr1, ids1, kinds1, 132);
  auto p1s5 = PlanDecode(Shape(), indptr1, ids1, kinds1, 132, 0, true);
  ASSERT_TRUE(p1.ok() && p1s5.ok());
  EXPECT_EQ(p1->items.size(), p1s5->items.size());
  EXPECT_LE(p1->items.size(), 2u * 132);
}

// tail_items: a multi-wave INT2 plan (B=32 x 32K on 132 SMs: 768 items on 396 slots) keeps
// covering every slice once, with tail_items halves (of tail_items / 2 split last parts) last
// among the INT2 items in `order`; off (0) and one-wave plans (B=1 x 100K) are unchanged.
TEST(PlanDecode, TailItemsAreSplitHalvesDispatchedLast) {
  auto batch = [](int seqs, int tokens) {
    std::vector<int32_t> indptr = {0}, ids;
    std::vector<uint8_t> kinds;
    const int pages = (tokens + 63) / 64;
    for (int b = 0; b < seqs; ++b) {
      for (int i = 0; i < pages; ++i) {
        ids.push_back(static_cast<int32_t>(kinds.size()));
        kinds.push_back(i == 0 || i + 2 > pages ? 2 : 1);  // sink, history, tail
      }
      indptr.push_back(static_cast<int32_t>(ids.size()));
    }
    return std::make_tuple(indptr, ids, kinds);
  };
  {
    auto [indptr, ids, kinds] = batch(32, 32768);
    auto base = PlanDecode(Shape(), indptr, ids, kinds, 132);
    auto split = PlanDecode(Shape(), indptr, ids, kinds, 132, 0, false, 264);
    ASSERT_TRUE(base.ok() && split.ok());
    EXPECT_EQ(base->tail_items, 0);
    ASSERT_EQ(split->tail_items, 264);
    EXPECT_EQ(split->items.size(), base->items.size() + 132);
    EXPECT_EQ(split->int2_slices, base->int2_slices);
    EXPECT_EQ(split->bf16_slices, base->bf16_slices);
    EXPECT_EQ(split->page_bytes_read, base->page_bytes_read);
    EXPECT_EQ(split->num_int2_items, base->num_int2_items + 132);
    // Slices of every (sequence, head) covered once, in order.
    for (size_t pair = 0; pair + 1 < split->item_indptr.size(); ++pair) {
      int next = 0;
      for (int i = split->item_indptr[pair]; i < split->item_indptr[pair + 1]; ++i) {
        EXPECT_EQ(split->items[i].first_slice, next);
        next += split->items[i].num_slices;
      }
      EXPECT_EQ(next, (indptr[pair / 8 + 1] - indptr[pair / 8]));
    }
    // The last 264 INT2 entries of `order` are the halves: each at most half a regular item.
    int max_regular = 0;
    int int2_in_order = 0;
    for (int i : split->order) {
      if (split->items[i].kind == 1) ++int2_in_order;
    }
    for (int k = 0; k < int2_in_order - 264; ++k) {
      const DecodeWorkItem& it = split->items[split->order[k]];
      ASSERT_EQ(it.kind, 1);
      max_regular = std::max(max_regular, it.num_slices);
    }
    for (int k = int2_in_order - 264; k < int2_in_order; ++k) {
      const DecodeWorkItem& it = split->items[split->order[k]];
      ASSERT_EQ(it.kind, 1);
      EXPECT_LE(it.num_slices, (max_regular + 1) / 2);
    }
  }
  {
    auto [indptr, ids, kinds] = batch(1, 100000);  // one wave: no split
    auto base = PlanDecode(Shape(), indptr, ids, kinds, 132);
    auto split = PlanDecode(Shape(), indptr, ids, kinds, 132, 0, false, 264);
    ASSERT_TRUE(base.ok() && split.ok());
    EXPECT_EQ(split->tail_items, 0);
    EXPECT_EQ(split->items.size(), base->items.size());
    EXPECT_EQ(split->order, base->order);
  }
}

// PagedDecoder's choice of 8-warp CTAs: B=1 at 32K and 100K tokens (the bench's shapes), not a
// short sequence, not B=32 x 32K (several waves), not GQA 8, not a BF16-heavy batch.
TEST(WantsWideInt2Ctas, OneWaveInt2BatchesOfEnoughSlices) {
  auto batch = [](int B, int L, std::vector<int32_t>* indptr, std::vector<int32_t>* ids,
                  std::vector<uint8_t>* kinds) {
    indptr->assign(1, 0);
    ids->clear();
    kinds->clear();
    const int pages = (L + 63) / 64;
    for (int b = 0; b < B; ++b) {
      for (int i = 0; i < pages; ++i) {
        ids->push_back(static_cast<int32_t>(kinds->size()));
        kinds->push_back(i == 0 || i + 5 > pages ? 2 : 1);  // sink, history, recent
      }
      indptr->push_back(static_cast<int32_t>(ids->size()));
    }
  };
  const DecodeShape gqa4{2, 8, 32, 128, 128, 64, 1}, gqa8{2, 4, 32, 128, 128, 64, 1};
  std::vector<int32_t> indptr, ids;
  std::vector<uint8_t> kinds;
  struct Want {
    int B, L;
    const DecodeShape* shape;
    bool wide;
  };
  for (const Want& w : {Want{1, 100000, &gqa4, true}, Want{1, 32768, &gqa4, true}, Want{1, 2048, &gqa4, false},
                        Want{32, 32768, &gqa4, false}, Want{8, 32768, &gqa4, false}, Want{1, 100000, &gqa8, false},
                        Want{16, 320, &gqa4, false}}) {
    batch(w.B, w.L, &indptr, &ids, &kinds);
    auto plan = PlanDecode(*w.shape, indptr, ids, kinds, 132);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(WantsWideInt2Ctas(*w.shape, *plan, 132), w.wide) << w.B << " x " << w.L << " gqa " << w.shape->gqa();
  }
}

TEST(PlanDecode, RejectsMalformedTables) {
  EXPECT_FALSE(PlanDecode(Shape(), {0, 2}, {0}, {1}, 132).ok());      // indptr past ids
  EXPECT_FALSE(PlanDecode(Shape(), {0, 1}, {3}, {1}, 132).ok());      // id out of range
  EXPECT_FALSE(PlanDecode(Shape(), {0, 1}, {0}, {7}, 132).ok());      // unknown kind
  DecodeShape s = Shape();
  s.head_dim = 64;
  EXPECT_FALSE(PlanDecode(s, {0}, {}, {}, 132).ok());
  s = Shape();
  s.num_q_heads = 8 * 16;  // GQA 16 unsupported
  EXPECT_FALSE(PlanDecode(s, {0}, {}, {}, 132).ok());
  s = Shape();
  s.page_tokens = 48;
  EXPECT_FALSE(PlanDecode(s, {0}, {}, {}, 132).ok());
}

CodecProfile SmallProfile(uint32_t group) {
  CodecProfile p;
  p.model_id = "test";
  p.model_revision = "1";
  p.num_layers = 2;
  p.num_kv_heads = 2;
  p.page_tokens = 64;
  p.group_size = group;
  return p;
}

// The write kernels' unbiased-fixed code (quantize_common.cuh, FixedElement) replaces the
// three threshold compares of docs/FORMAT.md §1.3.1 by two roundings on the FMA pipes:
// kMagic + c = bits(fma_rd(sat(rn((2^23 + v)·r4 + cb)), 4 − 2^-18, 2^23)), r4 = rn(1/(8192·(16 − ci))),
// cb = rn(r4/2 − (2^23 + O)·r4), O = 2048·(2ci − 8). Emulated here exactly (the first fma in
// double is exact before its one rounding to float; fma_rd onto 2^23 is 2^23 + floor of the exact
// product, which double holds), every position v of every candidate.
TEST(UnbiasedFixedCode, FmaPipeFormulaMatchesThresholdsForEveryPosition) {
  constexpr uint32_t kSteps = kUnbiasedStepsPerLevel;
  const double scale = 4.0 - 1.0 / 262144.0;
  for (int ci = 0; ci < 8; ++ci) {
    const int O = static_cast<int>(kSteps) * (2 * ci - 8);
    const float r4 = 1.0f / (4.0f * static_cast<float>(kSteps * (16 - ci)));
    const float cb = static_cast<float>(0.5 * r4 - (8388608.0 + O) * static_cast<double>(r4));
    int mismatches = 0;
    for (uint32_t v = 0; v <= 48 * kSteps; ++v) {
      const int want = (v >= (8 + ci) * kSteps) + (v >= 24 * kSteps) + (v >= (40 - ci) * kSteps);
      const double vb = 8388608.0 + v;
      const float wq = std::clamp(static_cast<float>(vb * r4 + cb), 0.0f, 1.0f);
      const int got = static_cast<int>(std::floor(static_cast<double>(wq) * scale));
      mismatches += got != want;
    }
    EXPECT_EQ(mismatches, 0) << "candidate " << ci;
  }
}

// The write kernels take Σv² of a group from its low 32 bits (an integer sum that wraps) and
// 98304²·Σu² with Σu² summed in float (quantize_common.cuh, FixedTotalsOf; v = floor(98304·u)):
// that must land within 2^31 of the true value. Replayed here as the kernels round (one fma per
// element on each lane, lane partials added pairwise), with each u the largest or the smallest
// float of its position (the largest (98304u)² − v²), on the rows that make the sums largest and
// on random ones, for both group sizes.
TEST(UnbiasedFixedSquares, LowBitsAndFloatSumGiveTheExactSum) {
  constexpr uint32_t kM = 0x4B000000u;
  std::mt19937 rng(7);
  // The smallest and the largest float u with floor(98304·u) = v.
  auto u_of = [](uint32_t v, bool largest) {
    if (v == kUnbiasedSteps) return 1.0f;
    const double edge = largest ? (v + 1.0) / kUnbiasedSteps : static_cast<double>(v) / kUnbiasedSteps;
    float u = static_cast<float>(edge);
    if (largest) {
      while (static_cast<double>(u) >= edge) u = std::nextafter(u, 0.0f);
    } else {
      while (static_cast<double>(u) < edge) u = std::nextafter(u, 2.0f);
    }
    return u;
  };
  for (int G : {64, 128})
    for (bool largest : {false, true})
      for (int pattern = 0; pattern < 6; ++pattern) {
        std::vector<uint32_t> v(G);
        for (int j = 0; j < G; ++j) {
          switch (pattern) {
            case 0: v[j] = kUnbiasedSteps - 1; break;
            case 1: v[j] = 0; break;
            case 2: v[j] = j % 2 ? kUnbiasedSteps - 1 : 0; break;
            case 3: v[j] = kUnbiasedSteps - 1 - static_cast<uint32_t>(j); break;
            default: v[j] = std::uniform_int_distribution<uint32_t>(0, kUnbiasedSteps)(rng);
          }
        }
        uint32_t s0 = 0, sq = 0;
        long long exact = 0;
        std::vector<float> lane(G / 32, 0.0f);
        for (int j = 0; j < G; ++j) {
          const float u = u_of(v[j], largest);
          ASSERT_EQ(static_cast<uint32_t>(std::floor(static_cast<double>(u) * kUnbiasedSteps)), v[j]);
          const uint32_t vb = kM + v[j];
          s0 += vb;
          sq += vb * vb;
          exact += static_cast<long long>(v[j]) * v[j];
          lane[j / 32] = std::fma(u, u, lane[j / 32]);
        }
        const float sf = G == 128 ? (lane[0] + lane[1]) + (lane[2] + lane[3]) : lane[0] + lane[1];
        const long long V1 = static_cast<long long>(s0 - static_cast<uint32_t>(G) * kM);
        const uint32_t lo = sq - 2u * kM * static_cast<uint32_t>(V1) - static_cast<uint32_t>(G) * kM * kM;
        const long long approx = std::llrint(static_cast<double>(sf) * 9663676416.0);
        EXPECT_LT(std::llabs(approx - exact), 1ll << 25) << "G " << G << " pattern " << pattern;
        const long long V2 = approx + static_cast<int32_t>(lo - static_cast<uint32_t>(approx));
        EXPECT_EQ(V2, exact) << "G " << G << " pattern " << pattern << (largest ? " largest u" : " smallest u");
      }
}

// ReferenceQuantizeWrite (the POD-interface reference of the write kernel) lays out exactly
// what EncodePage writes, for both kinds, with rotation and clipping, and with the rotation
// set's per-head write-time range modes passed as QuantizeWriteParams::range_modes.
TEST(ReferenceQuantizeWrite, MatchesEncodePagePayload) {
  for (uint32_t group : {128u, 64u})
  for (bool with_modes : {false, true}) {
    const CodecProfile prof = SmallProfile(group);
    const uint32_t T = 64, L = 2, H = 2, d = 128, n = 50;
    RotationSet rot = RotationSet::Hadamard(L, H, d, 0.95f, 0.9f);
    std::vector<uint8_t> modes;  // [L][2][H], clip order
    for (uint32_t l = 0; l < L; ++l)
      for (uint32_t kv = 0; kv < 2; ++kv)
        for (uint32_t h = 0; h < H; ++h) {
          const RangeMode kModes[3] = {RangeMode::kMinMax, RangeMode::kSearch, RangeMode::kUnbiased};
          const RangeMode m = with_modes ? kModes[(l * 4 + kv * 2 + h) % 3] : RangeMode::kMinMax;
          if (with_modes) rot.set_range_mode(l, static_cast<KV>(kv), h, m);
          modes.push_back(static_cast<uint8_t>(m));
        }
    std::mt19937 rng(group);
    std::normal_distribution<float> nd;
    // bf16-representable rows so both paths see identical inputs.
    std::vector<float> kvf(size_t{L} * 2 * n * H * d);
    for (auto& v : kvf) v = RoundToBf16(nd(rng));
    KVSequenceView view{kvf.data(), L, H, d, n};
    std::vector<uint16_t> ksrc(size_t{L} * n * H * d), vsrc(ksrc.size());
    for (uint32_t l = 0; l < L; ++l)
      for (uint32_t t = 0; t < n; ++t)
        for (uint32_t h = 0; h < H; ++h)
          for (uint32_t c = 0; c < d; ++c) {
            const size_t i = ((size_t{l} * n + t) * H + h) * d + c;
            ksrc[i] = FloatToBf16(view.row(l, 0, t, h)[c]);
            vsrc[i] = FloatToBf16(view.row(l, 1, t, h)[c]);
          }
    for (PageKind kind : {PageKind::kInt2, PageKind::kBf16}) {
      auto enc = EncodePage(prof, &rot, kind, view, 0, n);
      ASSERT_TRUE(enc.ok());
      std::vector<uint8_t> page(enc->size(), 0);
      std::vector<uint8_t*> ptrs = {page.data()};
      std::vector<uint8_t> kinds = {static_cast<uint8_t>(kind)};
      std::vector<int32_t> dst_page(n, 0), dst_slot(n);
      for (uint32_t t = 0; t < n; ++t) dst_slot[t] = static_cast<int32_t>(t);
      std::vector<float> clips;
      for (uint32_t l = 0; l < L; ++l)
        for (uint32_t kv = 0; kv < 2; ++kv)
          for (uint32_t h = 0; h < H; ++h) clips.push_back(rot.clip(l, static_cast<KV>(kv), h));
      QuantizeWriteParams p;
      p.num_layers = L;
      p.num_kv_heads = H;
      p.group_size = group;
      p.page_tokens = T;
      p.layer_count = L;
      p.k_src = ksrc.data();
      p.v_src = vsrc.data();
      p.src_layer_stride = int64_t{n} * H * d;
      p.src_token_stride = H * d;
      p.src_head_stride = d;
      p.num_tokens = n;
      p.page_ptrs = ptrs.data();
      p.page_kinds = kinds.data();
      p.dst_page = dst_page.data();
      p.dst_slot = dst_slot.data();
      p.clips = clips.data();
      if (with_modes) p.range_modes = modes.data();
      ASSERT_TRUE(ReferenceQuantizeWrite(p, &rot).ok());
      EXPECT_TRUE(std::equal(page.begin() + kPageHeaderBytes, page.end(),
                             enc->begin() + kPageHeaderBytes))
          << "group " << group << " kind " << PageKindName(kind) << " modes " << with_modes;
    }
  }
}

TEST(ReferencePagedDecode, MatchesDenseOnBf16Pages) {
  CodecProfile prof = SmallProfile(128);
  prof.sink_tokens = 64;
  prof.recent_tokens = 4096;  // everything stays BF16
  const uint32_t L = 2, H = 2, d = 128, Hq = 8;
  RotationSet rot = RotationSet::Hadamard(L, H, d);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  HostPagedKV kv;
  std::vector<std::vector<uint8_t>> pages;
  std::vector<std::vector<float>> dense;
  std::vector<uint32_t> lengths = {70, 5, 130};
  kv.seq_page_indptr.push_back(0);
  for (uint32_t n : lengths) {
    std::vector<float> f(size_t{L} * 2 * n * H * d);
    for (auto& v : f) v = nd(rng);
    KVSequenceView view{f.data(), L, H, d, n};
    auto sp = BuildSequencePages(prof, rot, view);
    ASSERT_TRUE(sp.ok());
    for (auto& pg : sp->pages) {
      kv.seq_page_ids.push_back(static_cast<int32_t>(pages.size()));
      pages.push_back(std::move(pg));
    }
    kv.seq_page_indptr.push_back(static_cast<int32_t>(kv.seq_page_ids.size()));
    dense.push_back(std::move(f));
  }
  for (auto& pg : pages) kv.pages.emplace_back(pg);
  std::vector<float> q(lengths.size() * Hq * d);
  for (auto& v : q) v = nd(rng);
  auto res = ReferencePagedDecode(prof, rot, kv, 1, q, Hq, true);
  ASSERT_TRUE(res.ok()) << res.status();
  for (size_t b = 0; b < lengths.size(); ++b) {
    // Dense reference over rotated rows.
    const uint32_t n = lengths[b];
    std::vector<float> rotated(dense[b].size());
    for (uint32_t l = 0; l < L; ++l)
      for (uint32_t kvi = 0; kvi < 2; ++kvi)
        for (uint32_t t = 0; t < n; ++t)
          for (uint32_t h = 0; h < H; ++h) {
            KVSequenceView in{dense[b].data(), L, H, d, n};
            KVSequenceView out{rotated.data(), L, H, d, n};
            RotateRow(in.row(l, kvi, t, h), rot.matrix(l, static_cast<KV>(kvi), h), d,
                      const_cast<float*>(out.row(l, kvi, t, h)));
          }
    KVSequenceView rv{rotated.data(), L, H, d, n};
    AttentionOutput ref = DenseDecodeAttention(prof, rot, rv, 1,
                                               std::span<const float>(q).subspan(b * Hq * d, Hq * d),
                                               Hq, true);
    for (size_t i = 0; i < ref.out.size(); ++i) {
      EXPECT_NEAR(res->out[b * Hq * d + i], ref.out[i], 2e-2) << b << " " << i;  // bf16 storage
    }
    for (uint32_t h = 0; h < Hq; ++h) EXPECT_NEAR(res->lse[b * Hq + h], ref.lse[h], 5e-2);
  }
}

// The extend reference for the first new token equals the paged decode reference over the
// prefix pages plus one BF16 page holding that token (mixed INT2/BF16 prefixes, GQA 4).
TEST(ReferenceExtendAttention, FirstNewTokenMatchesDecodeOverAppendedPage) {
  for (uint32_t group : {128u, 64u}) {
    CodecProfile prof = SmallProfile(group);
    prof.sink_tokens = 64;
    prof.recent_tokens = 64;  // INT2 history in sequences past ~192 tokens
    const uint32_t L = 2, H = 2, d = 128, Hq = 8, layer = 1;
    RotationSet rot = RotationSet::Hadamard(L, H, d, 0.96f, 0.92f);
    std::mt19937 rng(11 + group);
    std::normal_distribution<float> nd;
    HostPagedKV kv;
    std::vector<std::vector<uint8_t>> pages;
    const std::vector<uint32_t> lengths = {300, 0, 70};
    const std::vector<int32_t> new_counts = {3, 2, 1};
    std::vector<int32_t> q_indptr = {0};
    kv.seq_page_indptr.push_back(0);
    bool saw_int2 = false;
    for (size_t b = 0; b < lengths.size(); ++b) {
      const uint32_t n = lengths[b];
      if (n > 0) {
        std::vector<float> f(size_t{L} * 2 * n * H * d);
        for (auto& v : f) v = nd(rng);
        auto sp = BuildSequencePages(prof, rot, KVSequenceView{f.data(), L, H, d, n});
        ASSERT_TRUE(sp.ok()) << sp.status();
        for (size_t i = 0; i < sp->pages.size(); ++i) {
          saw_int2 |= sp->plan[i].kind == PageKind::kInt2;
          kv.seq_page_ids.push_back(static_cast<int32_t>(pages.size()));
          pages.push_back(std::move(sp->pages[i]));
        }
      }
      kv.seq_page_indptr.push_back(static_cast<int32_t>(kv.seq_page_ids.size()));
      q_indptr.push_back(q_indptr.back() + new_counts[b]);
    }
    ASSERT_TRUE(saw_int2);
    const size_t total = static_cast<size_t>(q_indptr.back());
    std::vector<float> q(total * Hq * d);
    for (auto& v : q) v = nd(rng);
    std::vector<uint16_t> k_new(total * H * d), v_new(total * H * d);
    for (auto& v : k_new) v = FloatToBf16(nd(rng));
    for (auto& v : v_new) v = FloatToBf16(nd(rng));
    for (auto& pg : pages) kv.pages.emplace_back(pg);
    auto ext = ReferenceExtendAttention(prof, rot, kv, layer, q_indptr, q, k_new, v_new, Hq, true);
    ASSERT_TRUE(ext.ok()) << ext.status();

    // Decode reference: each sequence's pages plus a BF16 page with its first new token.
    std::vector<std::vector<uint8_t>> extra;
    HostPagedKV kv2;
    kv2.seq_page_indptr.push_back(0);
    std::vector<float> q2;
    for (size_t b = 0; b < lengths.size(); ++b) {
      const size_t t0 = static_cast<size_t>(q_indptr[b]);
      std::vector<float> row(size_t{L} * 2 * H * d, 0.0f);  // [L][2][1][H][d]
      KVSequenceView one{row.data(), L, H, d, 1};
      for (uint32_t h = 0; h < H; ++h)
        for (uint32_t c = 0; c < d; ++c) {
          const_cast<float*>(one.row(layer, 0, 0, h))[c] = Bf16ToFloat(k_new[(t0 * H + h) * d + c]);
          const_cast<float*>(one.row(layer, 1, 0, h))[c] = Bf16ToFloat(v_new[(t0 * H + h) * d + c]);
        }
      auto pg = EncodePage(prof, nullptr, PageKind::kBf16, one, 0, 1);
      ASSERT_TRUE(pg.ok()) << pg.status();
      extra.push_back(*std::move(pg));
      for (int32_t i = kv.seq_page_indptr[b]; i < kv.seq_page_indptr[b + 1]; ++i) {
        kv2.seq_page_ids.push_back(kv.seq_page_ids[i]);
      }
      kv2.seq_page_ids.push_back(-1 - static_cast<int32_t>(b));  // patched below
      kv2.seq_page_indptr.push_back(static_cast<int32_t>(kv2.seq_page_ids.size()));
      q2.insert(q2.end(), q.begin() + t0 * Hq * d, q.begin() + (t0 + 1) * Hq * d);
    }
    kv2.pages = kv.pages;
    for (auto& id : kv2.seq_page_ids) {
      if (id < 0) {
        const size_t b = static_cast<size_t>(-1 - id);
        id = static_cast<int32_t>(kv2.pages.size());
        kv2.pages.emplace_back(extra[b]);
      }
    }
    auto dec = ReferencePagedDecode(prof, rot, kv2, layer, q2, Hq, true);
    ASSERT_TRUE(dec.ok()) << dec.status();
    for (size_t b = 0; b < lengths.size(); ++b) {
      const size_t t0 = static_cast<size_t>(q_indptr[b]);
      for (size_t i = 0; i < size_t{Hq} * d; ++i) {
        ASSERT_NEAR(ext->out[t0 * Hq * d + i], dec->out[b * Hq * d + i], 1e-4) << "seq " << b << " i " << i;
      }
      for (uint32_t h = 0; h < Hq; ++h) {
        EXPECT_NEAR(ext->lse[t0 * Hq + h], dec->lse[b * Hq + h], 1e-4);
      }
    }
    // Later new tokens see more keys: outputs differ from the first token's (causal, not stale).
    EXPECT_NE(ext->out[1 * Hq * d], ext->out[0]);
  }
}

}  // namespace
}  // namespace oscarkv::cuda
