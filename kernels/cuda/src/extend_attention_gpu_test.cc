// GPU tests of the extend attention kernel against ReferenceExtendAttention (CPU, exact softmax
// per new token over the dequantized prefix plus new tokens 0..i), on fresh random inputs:
// prefixes of mixed INT2/BF16 pages (and empty ones), new-token counts across the 16-token query
// blocks and 64-key tiles, GQA 1/4/8, groups 128/64, pages of 64/128 tokens, output
// unrotation. The output is poisoned (NaN) before the launch.
//
// Tolerance (why): query, keys, values and probabilities are fp16 operands (2^-11 relative
// each) with fp32 accumulation: |out - ref| <= 5e-3 * (1 + |ref|), |lse - ref| <= 5e-3.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/cuda/extend_attention.h"
#include "oscarkv/cuda/reference.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/page_set.h"

namespace oscarkv::cuda {
namespace {

struct ExtendCase {
  std::vector<uint32_t> prefix;   // prefix tokens per sequence
  std::vector<int32_t> new_tokens;
  uint32_t kv_heads = 2, gqa = 4, group = 128, page_tokens = 64;
  bool unrotate = false;
  uint32_t seed = 1;
};

void RunExtend(const ExtendCase& c) {
  SCOPED_TRACE("gqa " + std::to_string(c.gqa) + " G" + std::to_string(c.group) + " T" +
               std::to_string(c.page_tokens) + (c.unrotate ? " unrotate" : ""));
  CodecProfile prof;
  prof.model_id = "test";
  prof.model_revision = "1";
  prof.num_layers = 2;
  prof.num_kv_heads = c.kv_heads;
  prof.page_tokens = c.page_tokens;
  prof.group_size = c.group;
  prof.sink_tokens = 64;
  prof.recent_tokens = 128;
  const uint32_t L = 2, H = c.kv_heads, d = 128, Hq = H * c.gqa, layer = 1;
  RotationSet rot = RotationSet::Hadamard(L, H, d, 0.96f, 0.92f);
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd;
  HostPagedKV kv;
  std::vector<std::vector<uint8_t>> pages;
  std::vector<uint8_t> kinds;
  std::vector<uint16_t> counts;
  std::vector<int32_t> q_indptr = {0};
  kv.seq_page_indptr.push_back(0);
  int32_t max_new = 0;
  for (size_t b = 0; b < c.prefix.size(); ++b) {
    const uint32_t n = c.prefix[b];
    if (n > 0) {
      std::vector<float> f(size_t{L} * 2 * n * H * d);
      for (auto& v : f) v = nd(rng) * (1.0f + 0.5f * static_cast<float>(b));
      auto sp = BuildSequencePages(prof, rot, KVSequenceView{f.data(), L, H, d, n});
      ASSERT_TRUE(sp.ok()) << sp.status();
      for (size_t i = 0; i < sp->pages.size(); ++i) {
        kv.seq_page_ids.push_back(static_cast<int32_t>(pages.size()));
        kinds.push_back(static_cast<uint8_t>(sp->plan[i].kind));
        counts.push_back(static_cast<uint16_t>(sp->plan[i].token_count));
        pages.push_back(std::move(sp->pages[i]));
      }
    }
    kv.seq_page_indptr.push_back(static_cast<int32_t>(kv.seq_page_ids.size()));
    q_indptr.push_back(q_indptr.back() + c.new_tokens[b]);
    max_new = std::max(max_new, c.new_tokens[b]);
  }
  for (auto& pg : pages) kv.pages.emplace_back(pg);
  const size_t total = static_cast<size_t>(q_indptr.back());
  std::vector<float> q(total * Hq * d);
  for (auto& v : q) v = nd(rng);
  std::vector<uint16_t> k_new(total * H * d), v_new(total * H * d);
  for (auto& v : k_new) v = FloatToBf16(nd(rng));
  for (auto& v : v_new) v = FloatToBf16(nd(rng) * 0.7f);
  auto ref = ReferenceExtendAttention(prof, rot, kv, layer, q_indptr, q, k_new, v_new, Hq, c.unrotate);
  ASSERT_TRUE(ref.ok()) << ref.status();

  std::vector<DeviceBuffer> dpages;
  std::vector<const uint8_t*> ptrs;
  for (const auto& pg : pages) {
    auto buf = DeviceBuffer::FromHost(pg);
    ASSERT_TRUE(buf.ok());
    ptrs.push_back(buf->as<uint8_t>());
    dpages.push_back(*std::move(buf));
  }
  if (ptrs.empty()) ptrs.push_back(nullptr);
  if (kinds.empty()) kinds.push_back(0), counts.push_back(0);
  std::vector<int32_t> ids = kv.seq_page_ids;
  if (ids.empty()) ids.push_back(0);
  auto d_ptrs = DeviceBuffer::FromHost(ptrs);
  auto d_kinds = DeviceBuffer::FromHost(kinds);
  auto d_counts = DeviceBuffer::FromHost(counts);
  auto d_indptr = DeviceBuffer::FromHost(kv.seq_page_indptr);
  auto d_ids = DeviceBuffer::FromHost(ids);
  auto d_qindptr = DeviceBuffer::FromHost(q_indptr);
  auto d_q = DeviceBuffer::FromHost(q);
  auto d_k = DeviceBuffer::FromHost(k_new);
  auto d_v = DeviceBuffer::FromHost(v_new);
  std::vector<float> rk(rot.matrix(layer, KV::kKey, 0), rot.matrix(layer, KV::kKey, 0) + H * d * d);
  std::vector<float> rv(rot.matrix(layer, KV::kValue, 0), rot.matrix(layer, KV::kValue, 0) + H * d * d);
  auto d_rk = DeviceBuffer::FromHost(rk);
  auto d_rv = DeviceBuffer::FromHost(rv);
  auto d_out = DeviceBuffer::Create(total * Hq * d * 4);
  auto d_lse = DeviceBuffer::Create(total * Hq * 4);
  for (auto* b : {&d_ptrs, &d_kinds, &d_counts, &d_indptr, &d_ids, &d_qindptr, &d_q, &d_k, &d_v,
                  &d_rk, &d_rv, &d_out, &d_lse}) {
    ASSERT_TRUE(b->ok()) << b->status();
  }
  ExtendParams p;
  p.shape = DecodeShape{L, H, Hq, d, c.group, c.page_tokens, layer};
  p.table.page_ptrs = d_ptrs->as<const uint8_t*>();
  p.table.page_kinds = d_kinds->as<uint8_t>();
  p.table.page_token_counts = d_counts->as<uint16_t>();
  p.table.seq_page_indptr = d_indptr->as<int32_t>();
  p.table.seq_page_ids = d_ids->as<int32_t>();
  p.table.num_seqs = static_cast<int32_t>(c.prefix.size());
  p.q_indptr = d_qindptr->as<int32_t>();
  p.max_new_tokens = max_new;
  p.q = d_q->as<float>();
  p.k_new = d_k->as<uint16_t>();
  p.v_new = d_v->as<uint16_t>();
  p.rot_k = d_rk->as<float>();
  p.rot_v = d_rv->as<float>();
  p.unrotate_output = c.unrotate;
  p.out = d_out->as<float>();
  p.lse = d_lse->as<float>();
  ASSERT_EQ(cudaMemset(p.out, 0xff, total * Hq * d * 4), cudaSuccess);  // NaN poison
  ASSERT_EQ(cudaMemset(p.lse, 0xff, total * Hq * 4), cudaSuccess);
  ASSERT_TRUE(LaunchExtendAttention(p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto out = d_out->ToHost<float>();
  auto lse = d_lse->ToHost<float>();
  ASSERT_TRUE(out.ok() && lse.ok());
  int bad = 0;
  double max_err = 0;
  for (size_t i = 0; i < out->size(); ++i) {
    const float r = ref->out[i], g = (*out)[i];
    const double err = std::fabs(double(g) - r);
    if (!(err <= 5e-3 * (1 + std::fabs(r)))) {
      if (++bad < 5) ADD_FAILURE() << "out[" << i << "] gpu " << g << " ref " << r;
    }
    if (std::isfinite(err)) max_err = std::max(max_err, err);
  }
  for (size_t i = 0; i < lse->size(); ++i) {
    const float r = ref->lse[i], g = (*lse)[i];
    if (!(std::fabs(g - r) <= 5e-3)) {
      if (++bad < 10) ADD_FAILURE() << "lse[" << i << "] gpu " << g << " ref " << r;
    }
  }
  EXPECT_EQ(bad, 0) << "max abs out error " << max_err;
}

TEST(ExtendAttentionGpu, MixedPrefixesGqa4) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  ExtendCase c;
  c.prefix = {700, 0, 100, 333};
  c.new_tokens = {37, 70, 1, 16};
  RunExtend(c);
}

TEST(ExtendAttentionGpu, GqaGroupsPagesAndUnrotation) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  for (uint32_t gqa : {1u, 8u}) {
    ExtendCase c;
    c.prefix = {400, 65};
    c.new_tokens = {17, 130};
    c.gqa = gqa;
    c.seed = 10 + gqa;
    RunExtend(c);
  }
  ExtendCase c;
  c.prefix = {500, 129};
  c.new_tokens = {33, 5};
  c.group = 64;
  c.page_tokens = 128;
  c.unrotate = true;
  c.seed = 21;
  RunExtend(c);
}

}  // namespace
}  // namespace oscarkv::cuda
