// GPU tests of the paged decode kernel against ReferencePagedDecode (CPU, exact softmax), on
// fresh random inputs: batch sizes, lengths that are not page multiples, empty sequences, empty
// history (all BF16), history only (all INT2), GQA 1/4/8, groups 128/64, page sizes 64/128,
// output unrotation. The output is poisoned (NaN) before every launch.
//
// Tolerances (why): the INT2 score product uses fp16 query parts (hi+lo ≈ fp32) and fp16
// weights W = p·scale (2^-11 relative per weight); the BF16 path splits q and p into bf16
// hi+lo. packed_int8_values (the GQA <= 4 kernel) quantizes each rotated query head to a 14-bit
// fixed point (|error| <= max|q| / 16256 per channel) and rounds the weights W = p·scale to
// 16-bit integers in per-warp units (2^-16..2^-15 of the largest weight so far, see
// internal/decode_launch.h), and prints how often its units changed ("[ stats ] " lines);
// baseline (the GQA 5..8 kernel, also run at GQA <= 4 here) keeps fp16 products. Against
// the double-precision reference that leaves
// ~1e-4 relative error; we require |out - ref| <= 2e-3 * (1 + |ref|) and |lse - ref| <= 2e-3
// for every variant, and print each variant's measured maximum ("[ error ]" lines).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/cuda/decode_runner.h"
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/cuda/internal/decode_launch.h"
#include "oscarkv/cuda/reference.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/page_set.h"

namespace oscarkv::cuda {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device: GPU test skipped"

struct Case {
  std::vector<uint32_t> lengths;
  uint32_t kv_heads = 2, gqa = 4, group = 128, page_tokens = 64;
  uint32_t sink = 64, recent = 256;
  bool unrotate = false;
  enum Mode { kPlanned, kAllInt2, kAllBf16 } mode = kPlanned;
  bool precise = true;
  float q_scale = 2.0f;  // query std (smaller: flatter attention)
  // Every variant on a plan of 4 CTAs (items of ~100 slices, ~25 per warp, as at B=32 x 32K);
  // only packed_int8_values is held to the tolerance, the others' errors are printed (their
  // fp16 value product drifts with the item length, see below).
  bool long_items = false;
  uint32_t seed = 1;
  std::string Name() const {
    std::string s = "B" + std::to_string(lengths.size()) + " gqa" + std::to_string(gqa) + " G" +
                    std::to_string(group) + " T" + std::to_string(page_tokens);
    for (uint32_t l : lengths) s += " " + std::to_string(l);
    return s;
  }
};

// Runs the GPU kernel on `pages` (uploaded here) for two plan targets and compares with
// ReferencePagedDecode; the output is poisoned before every launch.
void CompareGpuWithReference(const CodecProfile& prof, const RotationSet& rot,
                             const std::vector<std::vector<uint8_t>>& pages,
                             const std::vector<uint8_t>& kinds, const std::vector<uint16_t>& counts,
                             const HostPagedKV& host, const std::vector<float>& q, uint32_t layer,
                             uint32_t Hq, bool unrotate, bool precise, bool long_items = false) {
  const uint32_t d = prof.head_dim, H = prof.num_kv_heads;
  const size_t B = host.seq_page_indptr.size() - 1;
  struct {
    bool unrotate, precise;
    uint32_t group, page_tokens;
  } c{unrotate, precise, prof.group_size, prof.page_tokens};
  auto ref = ReferencePagedDecode(prof, rot, host, layer, q, Hq, c.unrotate);
  ASSERT_TRUE(ref.ok()) << ref.status();

  // Device copies.
  std::vector<DeviceBuffer> dpages;
  std::vector<const uint8_t*> ptrs;
  for (const auto& pg : pages) {
    auto b = DeviceBuffer::FromHost(pg);
    ASSERT_TRUE(b.ok());
    ptrs.push_back(b->as<uint8_t>());
    dpages.push_back(*std::move(b));
  }
  auto d_ptrs = DeviceBuffer::FromHost(ptrs);
  auto d_kinds = DeviceBuffer::FromHost(kinds);
  auto d_counts = DeviceBuffer::FromHost(counts);
  auto d_indptr = DeviceBuffer::FromHost(host.seq_page_indptr);
  auto d_ids = DeviceBuffer::FromHost(host.seq_page_ids);
  auto d_q = DeviceBuffer::FromHost(q);
  std::vector<float> rk(rot.matrix(layer, KV::kKey, 0), rot.matrix(layer, KV::kKey, 0) + H * d * d);
  std::vector<float> rv(rot.matrix(layer, KV::kValue, 0), rot.matrix(layer, KV::kValue, 0) + H * d * d);
  auto d_rk = DeviceBuffer::FromHost(rk);
  auto d_rv = DeviceBuffer::FromHost(rv);
  auto d_out = DeviceBuffer::Create(B * Hq * d * 4);
  auto d_lse = DeviceBuffer::Create(B * Hq * 4);
  for (auto* b : {&d_ptrs, &d_kinds, &d_counts, &d_indptr, &d_ids, &d_q, &d_rk, &d_rv, &d_out, &d_lse}) {
    ASSERT_TRUE(b->ok()) << b->status();
  }
  DecodeShape shape{prof.num_layers, H, Hq, d, c.group, c.page_tokens, layer};
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  // A small CTA target forces multi-slice items (pipelining) and a large one many splits. Every
  // variant with the fused merge (the default when the plan has no empty pair), and the default
  // variant with the separate merge kernel too.
  struct Run {
    DecodeVariant variant;
    int target;
    bool merge_kernel;
    int rotation = 0;  // 1: in every CTA, 2: the rotation kernel, 0: PagedDecoder's choice
    bool linear_w_rows = false;
    bool shared_rotation = false;  // DecodeParams::share_rotation on
    bool early_copies = false;     // DecodeParams::copies_after_queries off
    bool cta_fragments = false;    // DecodeParams::prepared_fragments off
    int ctas_per_sm = -1;          // DecodeParams::int2_ctas_per_sm (-1: PagedDecoder's choice)
    int early_rotation = -1;       // DecodeParams::early_rotation (-1: PagedDecoder's choice)
    int bulk_merge = -1;           // DecodeParams::bulk_merge (-1: PagedDecoder's choice)
    bool frags_first = false;      // DecodeParams::fragments_before_copies on
    bool frags_after = false;      // ... off (PagedDecoder sets it with the rotation kernel)
    int tail_items = 0;            // PlanDecode's tail_items
    int l2_prefetch = 0;           // DecodeParams::l2_prefetch_slices
    int warps = 0;                 // DecodeParams::int2_warps (0: PagedDecoder's choice)
    int evict_first = -1;          // DecodeParams::stream_evict_first (-1: PagedDecoder's choice)
    int early = -1;                // DecodeParams::early_slices (-1: PagedDecoder's choice)
  };
  std::vector<Run> runs;
  for (DecodeVariant v : {DecodeVariant::kBaseline, DecodeVariant::kPackedInt8Values})
    for (int target : {0, 7}) runs.push_back({v, target, false});

  for (int target : {0, 7}) runs.push_back({DecodeParams{}.variant, target, true});
  // And with the queries rotated in every CTA and by the rotation kernel, with either merge.
  for (int rot : {1, 2})
    for (bool mk : {false, true}) runs.push_back({DecodeParams{}.variant, 7, mk, rot});
  // The fp16 value product's W exchange in the old row order (DecodeParams::linear_w_rows).
  for (int target : {0, 7}) runs.push_back({DecodeVariant::kBaseline, target, false, 0, true});
  // And with the rotation shared by the CTAs of each pair, with either merge and either copy
  // order, and the first copies issued before the queries.
  for (bool mk : {false, true}) runs.push_back({DecodeParams{}.variant, 7, mk, 1, false, true});
  for (bool shared : {false, true}) runs.push_back({DecodeParams{}.variant, 7, false, 1, false, shared, true});
  runs.push_back({DecodeParams{}.variant, 0, false, 1, false, true});
  // The rotation kernel with the int8 query fragments built in every CTA (prepared_fragments
  // off), and prepared for packed_int8 too; the INT2 kernel capped at 2 and 1 CTAs per SM.
  {
    Run r{DecodeParams{}.variant, 7, false, 2};
    r.cta_fragments = true;
    runs.push_back(r);
    runs.push_back({DecodeVariant::kBaseline, 7, false, 2});
    r = Run{DecodeParams{}.variant, 0, false, 2};
    r.ctas_per_sm = 2;
    runs.push_back(r);
    r = Run{DecodeParams{}.variant, 7, false, 1};
    r.ctas_per_sm = 1;
    runs.push_back(r);
    // The rotation kernel without a cap, with the merge kernel.
    r = Run{DecodeParams{}.variant, 0, true, 2};
    r.ctas_per_sm = 0;
    runs.push_back(r);
    // The rotation kernel as a programmatic dependent of the previous kernel, and not.
    for (int early : {0, 1}) {
      r = Run{DecodeParams{}.variant, 7, false, 2};
      r.early_rotation = early;
      runs.push_back(r);
    }
    // The fused merge with bulk copies of the partials, and with cp.async copies; small and
    // large CTA targets (one and several chunks of partials per pair), in-CTA rotation too.
    for (int bulk : {0, 1})
      for (int target : {0, 7, 600}) {
        r = Run{DecodeParams{}.variant, target, false, target == 600 ? 1 : 0};
        r.bulk_merge = bulk;
        runs.push_back(r);
      }
    // The prepared fragments (BF16 items: the rotated queries) loaded before the first copies
    // (fragments_before_copies, PagedDecoder's choice for several waves): the default variant
    // with either merge and packed_int8, and with the fragments built in every CTA.
    for (bool mk : {false, true}) {
      r = Run{DecodeParams{}.variant, 7, mk, 2};
      r.frags_first = true;
      runs.push_back(r);
    }
    r = Run{DecodeVariant::kBaseline, 7, false, 2};
    r.frags_first = true;
    runs.push_back(r);
    r = Run{DecodeParams{}.variant, 7, false, 2};
    r.frags_first = true;
    r.cta_fragments = true;
    runs.push_back(r);
    // And after them (fragments_before_copies off), with either merge and the 2-per-SM cap.
    for (bool mk : {false, true}) {
      r = Run{DecodeParams{}.variant, 0, mk, 2};
      r.frags_after = true;
      r.ctas_per_sm = 2;
      runs.push_back(r);
    }
    // A multi-wave plan whose last parts are split in halves dispatched last (tail_items), with
    // either merge.
    for (bool mk : {false, true}) {
      r = Run{DecodeParams{}.variant, 7, mk};
      r.tail_items = 6;
      runs.push_back(r);
    }
    // Slices prefetched into L2 in the prologue (l2_prefetch_slices), with the rotation kernel
    // (fragments after and before the first copies) and with the rotation in every CTA.
    for (int rot : {1, 2}) {
      r = Run{DecodeParams{}.variant, 7, false, rot};
      r.l2_prefetch = 4;
      runs.push_back(r);
    }
    r = Run{DecodeParams{}.variant, 0, false, 2};
    r.l2_prefetch = 64;
    r.frags_first = true;
    runs.push_back(r);
    // 8 warps per INT2 CTA (the rotation kernel, fragments before the copies): one
    // wave, one CTA per item of many slices, several waves; either merge.
    for (int warps : {8})
      for (int target : {0, 7, 600})
        for (bool mk : {false, true}) {
          r = Run{DecodeParams{}.variant, target, mk, 2};
          r.frags_first = true;
          r.warps = warps;
          runs.push_back(r);
        }
    // 8 warps with the merge's partials copied by cp.async (PagedDecoder's choice for 8 warps)
    // and by bulk copies, at the three plan sizes.
    for (int bulk : {0, 1})
      for (int target : {0, 7, 600}) {
        r = Run{DecodeParams{}.variant, target, false, 2};
        r.frags_first = true;
        r.warps = 8;
        r.bulk_merge = bulk;
        runs.push_back(r);
      }
    // 8 warps with the fragments loaded after the first copies.
    for (int target : {0, 7}) {
      r = Run{DecodeParams{}.variant, target, false, 2};
      r.frags_after = true;
      r.warps = 8;
      runs.push_back(r);
    }
    // 8 warps with and without the evict_first copies, with none or some of the first copies
    // before the wait for the rotation kernel, at the three plan sizes.
    for (int evict : {0, 1})
      for (int early : {0, 1, 2})
        for (int target : {0, 7, 600}) {
          r = Run{DecodeParams{}.variant, target, target == 7, 2};
          r.frags_first = true;
          r.warps = 8;
          r.evict_first = evict;
          r.early = early;
          runs.push_back(r);
        }
  }
  if (long_items) {
    runs.clear();
    for (DecodeVariant v : {DecodeVariant::kBaseline, DecodeVariant::kPackedInt8Values}) runs.push_back({v, 4, false});
  }
  // kPackedInt8Values' weight units: how often the accumulators had to be shifted.
  auto stats = DeviceBuffer::Create(3 * sizeof(uint32_t));
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const Run& run : runs) {
    if (run.warps > 4 && Hq / H > 4) continue;  // int2_warps > 4 runs at GQA <= 4 only
    const DecodeVariant variant = run.variant;
    const int target = run.target;
    SCOPED_TRACE(std::string("variant ") + DecodeVariantName(variant) + " target_ctas " +
                 std::to_string(target) + (run.merge_kernel ? " merge kernel" : "") +
                 (run.rotation == 1 ? " cta rotation" : run.rotation == 2 ? " rotation kernel" : "") +
                 (run.linear_w_rows ? " linear w rows" : "") +
                 (run.shared_rotation ? " shared rotation" : "") + (run.early_copies ? " early copies" : "") +
                 (run.cta_fragments ? " cta fragments" : "") +
                 (run.ctas_per_sm >= 0 ? " ctas/sm " + std::to_string(run.ctas_per_sm) : "") +
                 (run.early_rotation >= 0 ? " early rotation " + std::to_string(run.early_rotation) : "") +
                 (run.bulk_merge >= 0 ? " bulk merge " + std::to_string(run.bulk_merge) : "") +
                 (run.frags_first ? " fragments before copies" : "") +
                 (run.frags_after ? " fragments after copies" : "") +
                 (run.tail_items > 0 ? " tail items " + std::to_string(run.tail_items) : "") +
                 (run.l2_prefetch > 0 ? " l2 prefetch " + std::to_string(run.l2_prefetch) : "") +
                 (run.warps > 0 ? " warps " + std::to_string(run.warps) : "") +
                 (run.evict_first >= 0 ? " evict first " + std::to_string(run.evict_first) : "") +
                 (run.early >= 0 ? " early slices " + std::to_string(run.early) : ""));
    auto dec = CreatePagedDecoder(shape, host.seq_page_indptr, host.seq_page_ids, kinds, sms,
                                  {target, false, run.tail_items});
    ASSERT_TRUE(dec.ok()) << dec.status();
    DecodeParams p = DecoderParams(*dec);
    if (run.merge_kernel) p.fused_merge = false;
    if (run.rotation != 0) p.rotate_in_cta = run.rotation == 1;
    if (run.shared_rotation) p.share_rotation = true;
    if (run.early_copies) p.copies_after_queries = false;
    if (run.cta_fragments) p.prepared_fragments = false;
    if (run.ctas_per_sm >= 0) p.int2_ctas_per_sm = run.ctas_per_sm;
    if (run.early_rotation >= 0) p.early_rotation = run.early_rotation == 1;
    if (run.bulk_merge >= 0) p.bulk_merge = run.bulk_merge == 1;
    if (run.frags_first) p.fragments_before_copies = true;
    if (run.frags_after) p.fragments_before_copies = false;
    p.l2_prefetch_slices = run.l2_prefetch;
    if (run.warps > 0) p.int2_warps = run.warps;
    if (run.evict_first >= 0) p.stream_evict_first = run.evict_first == 1;
    if (run.early >= 0) p.early_slices = run.early;
    p.table.page_ptrs = d_ptrs->as<const uint8_t*>();
    p.table.page_kinds = d_kinds->as<uint8_t>();
    p.table.page_token_counts = d_counts->as<uint16_t>();
    p.table.seq_page_indptr = d_indptr->as<int32_t>();
    p.table.seq_page_ids = d_ids->as<int32_t>();
    p.q = d_q->as<float>();
    p.rot_k = d_rk->as<float>();
    p.rot_v = d_rv->as<float>();
    p.unrotate_output = c.unrotate;
    p.precise_query = c.precise;
    p.variant = variant;
    p.linear_w_rows = run.linear_w_rows;
    p.int8_value_stats = stats->as<uint32_t>();
    ASSERT_EQ(cudaMemset(p.int8_value_stats, 0, 3 * sizeof(uint32_t)), cudaSuccess);
    p.out = d_out->as<float>();
    p.lse = d_lse->as<float>();
    ASSERT_EQ(cudaMemset(p.out, 0xff, B * Hq * d * 4), cudaSuccess);  // NaN poison
    ASSERT_EQ(cudaMemset(p.lse, 0xff, B * Hq * 4), cudaSuccess);
    ASSERT_TRUE(LaunchDecodeAttention(p, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto out = d_out->ToHost<float>();
    auto lse = d_lse->ToHost<float>();
    ASSERT_TRUE(out.ok() && lse.ok());
    const float tol = c.precise ? 2e-3f : 1e-2f;
    const bool checked = !long_items || variant == DecodeVariant::kPackedInt8Values;
    int bad = 0;
    double max_err = 0, max_scaled = 0;
    for (size_t i = 0; i < out->size(); ++i) {
      const float r = ref->out[i], g = (*out)[i];
      const double err = std::fabs(double(g) - r);
      if (checked && !(err <= tol * (1 + std::fabs(r)))) {
        if (++bad < 5) ADD_FAILURE() << "out[" << i << "] gpu " << g << " ref " << r;
      }
      if (std::isfinite(err)) {
        max_err = std::max(max_err, err);
        max_scaled = std::max(max_scaled, err / (1 + std::fabs(r)));
      }
    }
    // The measured error of each variant (bench/results/NOTES.md quotes the maxima).
    std::string warps_tag;
    if (p.int2_warps != 4) {
      warps_tag = " int2_warps ";
      warps_tag += std::to_string(p.int2_warps);
    }
    std::printf("[ error ] %s target_ctas %d%s%s%s%s%s: max |out - ref| / (1 + |ref|) = %.3g (tolerance %.3g%s)\n",
                DecodeVariantName(variant), target, p.fused_merge ? "" : " merge kernel",
                p.rotate_in_cta ? "" : (p.prepared_fragments ? " rotation kernel" : " rotation kernel, cta fragments"),
                run.linear_w_rows ? " linear w rows" : "", p.int2_ctas_per_sm ? " capped ctas/sm" : "",
                warps_tag.c_str(), max_scaled, double(tol), checked ? "" : ", not checked: long items (fp16 value product)");
    auto st = stats->ToHost<uint32_t>();
    ASSERT_TRUE(st.ok());
    if (variant == DecodeVariant::kPackedInt8Values && Hq / H <= 4) {
      std::printf("[ stats ] packed_int8_values target_ctas %d: %u warp slices, %u warp items set "
                  "weight units, %u accumulator shifts\n",
                  target, (*st)[2], (*st)[0], (*st)[1]);
      // Every INT2 slice computed once.
      EXPECT_EQ((*st)[2], DecoderPlan(*dec).int2_slices);
    }
    for (size_t i = 0; i < lse->size(); ++i) {
      const float r = ref->lse[i], g = (*lse)[i];
      if (std::isinf(r)) {
        EXPECT_TRUE(std::isinf(g) && g < 0) << "lse[" << i << "] " << g;
      } else if (checked && !(std::fabs(g - r) <= tol)) {
        if (++bad < 10) ADD_FAILURE() << "lse[" << i << "] gpu " << g << " ref " << r;
      }
    }
    EXPECT_EQ(bad, 0) << "max abs out error " << max_err;
    ::testing::Test::RecordProperty("max_abs_err", std::to_string(max_err));
  }
}

void RunCase(const Case& c) {
  SCOPED_TRACE(c.Name());
  CodecProfile prof;
  prof.model_id = "test";
  prof.model_revision = "1";
  prof.num_layers = 2;
  prof.num_kv_heads = c.kv_heads;
  prof.head_dim = 128;
  prof.page_tokens = c.page_tokens;
  prof.group_size = c.group;
  prof.sink_tokens = c.sink;
  prof.recent_tokens = c.recent;
  ASSERT_TRUE(prof.Validate().ok());
  const uint32_t layer = 1, d = 128, H = c.kv_heads, Hq = H * c.gqa;
  RotationSet rot = RotationSet::Hadamard(prof.num_layers, H, d, 0.95f, 0.92f);
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd;

  // Pages of every sequence.
  std::vector<std::vector<uint8_t>> pages;
  std::vector<uint8_t> kinds;
  std::vector<uint16_t> counts;
  HostPagedKV host;
  host.seq_page_indptr.push_back(0);
  for (uint32_t n : c.lengths) {
    std::vector<float> kvdata(size_t{prof.num_layers} * 2 * n * H * d);
    for (auto& v : kvdata) v = nd(rng) * 0.8f + 0.1f;
    KVSequenceView view{kvdata.data(), prof.num_layers, H, d, n};
    std::vector<PlannedPage> plan = PlanSequencePages(prof, n);
    if (c.mode != Case::kPlanned) {
      plan.clear();
      for (uint32_t t = 0; t < n; t += c.page_tokens) {
        plan.push_back({c.mode == Case::kAllInt2 ? PageKind::kInt2 : PageKind::kBf16, t,
                        std::min(c.page_tokens, n - t)});
      }
    }
    for (const PlannedPage& pp : plan) {
      auto page = EncodePage(prof, &rot, pp.kind, view, pp.first_token, pp.token_count);
      ASSERT_TRUE(page.ok()) << page.status();
      host.seq_page_ids.push_back(static_cast<int32_t>(pages.size()));
      pages.push_back(*std::move(page));
      kinds.push_back(static_cast<uint8_t>(pp.kind));
      counts.push_back(static_cast<uint16_t>(pp.token_count));
    }
    host.seq_page_indptr.push_back(static_cast<int32_t>(host.seq_page_ids.size()));
  }
  for (const auto& pg : pages) host.pages.emplace_back(pg);
  const size_t B = c.lengths.size();
  std::vector<float> q(B * Hq * d);
  for (auto& v : q) v = nd(rng) * c.q_scale;

  CompareGpuWithReference(prof, rot, pages, kinds, counts, host, q, layer, Hq, c.unrotate, c.precise,
                          c.long_items);
}

// int2_warps: 4 or 8 (checked before any CUDA call).
TEST(DecodeAttentionOptions, Int2WarpsMustBeACompiledCount) {
  DecodeParams p;
  p.shape = DecodeShape{1, 8, 32, 128, 128, 64, 0};
  p.table.num_seqs = 1;
  p.num_items = 1;
  DecodeWorkItem item{};
  int32_t word = 0;
  float f = 0;
  p.items = &item;
  p.item_order = &word;
  p.item_indptr = &word;
  p.q = &f;
  p.out = &f;
  p.workspace = &f;
  for (int warps : {0, 5, 6, 12, 16, -4}) {
    p.int2_warps = warps;
    EXPECT_EQ(LaunchDecodeAttention(p, nullptr).code(), absl::StatusCode::kInvalidArgument) << warps;
  }
}

TEST(DecodeAttentionGpu, MixedPagesGqa4) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.lengths = {1000, 63, 400, 2049};
  RunCase(c);
}

TEST(DecodeAttentionGpu, GqaRatios) {
  SKIP_WITHOUT_GPU();
  for (uint32_t gqa : {1u, 4u, 8u}) {
    Case c;
    c.gqa = gqa;
    c.lengths = {777, 1500};
    c.seed = 10 + gqa;
    RunCase(c);
  }
}

TEST(DecodeAttentionGpu, Group64AndPage128) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.group = 64;
  c.lengths = {1300, 65};
  RunCase(c);
  Case c2;
  c2.page_tokens = 128;
  c2.lengths = {1111, 130, 5};
  c2.seed = 3;
  RunCase(c2);
  Case c3 = c2;
  c3.group = 64;
  c3.seed = 4;
  RunCase(c3);
}

TEST(DecodeAttentionGpu, EmptyHistoryAndHistoryOnly) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.lengths = {1, 64, 65, 300};  // no INT2 page at all (sink + recent cover everything)
  c.mode = Case::kAllBf16;
  RunCase(c);
  Case h;
  h.lengths = {64, 1000, 129};
  h.mode = Case::kAllInt2;
  h.seed = 5;
  RunCase(h);
}

TEST(DecodeAttentionGpu, EmptySequenceGivesZeroAndMinusInfLse) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.lengths = {0, 500, 0};
  RunCase(c);
}

TEST(DecodeAttentionGpu, UnrotatedOutputAndBatch) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.unrotate = true;
  c.gqa = 8;
  c.lengths = {};
  std::mt19937 rng(9);
  for (int i = 0; i < 9; ++i) c.lengths.push_back(1 + rng() % 1500);
  RunCase(c);
}

// Long items (~25 slices per warp, as the bench's B=32 x 32K plan), flat and peaked attention:
// the fp16 value product (1024 + 2^k·code operands, the 1024·Σ W offset removed at the end)
// loses accuracy as its fp32 accumulators grow over an item (measured: ~2e-4 for short items,
// 1.7e-3 at target 7 in MixedPagesGqa4, ~9e-3 at B=32 x 32K in the bench); the integer value
// product of packed_int8_values does not, and is held to the tolerance here.
TEST(DecodeAttentionGpu, LongItemsIntegerValueProduct) {
  SKIP_WITHOUT_GPU();
  for (float qs : {0.3f, 2.0f}) {
    Case c;
    c.lengths = {12000};
    c.mode = Case::kAllInt2;
    c.q_scale = qs;
    c.long_items = true;
    c.seed = 21;
    RunCase(c);
  }
}

TEST(DecodeAttentionGpu, SingleFp16QueryWithinLooserTolerance) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.precise = false;
  c.lengths = {3000};
  RunCase(c);
}

// Real K/V: post-RoPE keys/values and last-position queries of the reference model (layers 0
// and 7 over the first 700 bytes of val.txt; bench/testdata/refmodel_kv.bin, written by
// oscarkv_kv_dump from the CPU engine), Hadamard rotations with OSCAR's clips, sink + INT2
// history + BF16 tail pages, groups 128 and 64.
TEST(DecodeAttentionGpu, RealKvOfTheReferenceModel) {
  SKIP_WITHOUT_GPU();
  std::string path = "bench/testdata/refmodel_kv.bin";
  if (const char* src = std::getenv("OSCARKV_SOURCE_DIR")) path = std::string(src) + "/" + path;
  std::ifstream in(path, std::ios::binary);
  if (!in) GTEST_SKIP() << "no " << path;
  char magic[8];
  uint32_t hdr[5];
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(hdr), sizeof hdr);
  ASSERT_EQ(std::string(magic, 8), "OKVDUMP1");
  const uint32_t nl = hdr[0], n = hdr[1], Hq = hdr[2], H = hdr[3], d = hdr[4];
  ASSERT_EQ(d, 128u);
  for (uint32_t li = 0; li < nl; ++li) {
    uint32_t layer_index;
    in.read(reinterpret_cast<char*>(&layer_index), 4);
    std::vector<uint16_t> k(size_t{n} * H * d), v(k.size());
    std::vector<float> q(size_t{Hq} * d);
    in.read(reinterpret_cast<char*>(k.data()), k.size() * 2);
    in.read(reinterpret_cast<char*>(v.data()), v.size() * 2);
    in.read(reinterpret_cast<char*>(q.data()), q.size() * 4);
    ASSERT_TRUE(in.good());
    for (uint32_t group : {128u, 64u}) {
      SCOPED_TRACE("refmodel layer " + std::to_string(layer_index) + " G" + std::to_string(group));
      CodecProfile prof;
      prof.model_id = "oscarkv/refmodel";
      prof.model_revision = "v1";
      prof.num_layers = 1;
      prof.num_kv_heads = H;
      prof.group_size = group;
      RotationSet rot = RotationSet::Hadamard(1, H, d, 0.96f, 0.92f);
      // [layer 0][K|V][token][head][d] fp32 from the bf16 dump.
      std::vector<float> kv(size_t{2} * n * H * d);
      for (size_t i = 0; i < k.size(); ++i) {
        kv[i] = Bf16ToFloat(k[i]);
        kv[k.size() + i] = Bf16ToFloat(v[i]);
      }
      KVSequenceView view{kv.data(), 1, H, d, n};
      auto sp = BuildSequencePages(prof, rot, view);
      ASSERT_TRUE(sp.ok()) << sp.status();
      std::vector<uint8_t> kinds;
      std::vector<uint16_t> counts;
      HostPagedKV host;
      host.seq_page_indptr = {0, static_cast<int32_t>(sp->pages.size())};
      int int2_pages = 0;
      for (size_t i = 0; i < sp->pages.size(); ++i) {
        host.seq_page_ids.push_back(static_cast<int32_t>(i));
        kinds.push_back(static_cast<uint8_t>(sp->plan[i].kind));
        counts.push_back(static_cast<uint16_t>(sp->plan[i].token_count));
        int2_pages += sp->plan[i].kind == PageKind::kInt2;
      }
      ASSERT_GT(int2_pages, 0);
      for (const auto& pg : sp->pages) host.pages.emplace_back(pg);
      CompareGpuWithReference(prof, rot, sp->pages, kinds, counts, host, q, 0, Hq, true, true);
    }
  }
}

}  // namespace
}  // namespace oscarkv::cuda
