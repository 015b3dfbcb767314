// GPU tests of the extend attention kernels (the product launch -- the wgmma kernel on an H100 /
// H200 -- and the mma.sync kernel) against ReferenceExtendAttention (CPU, exact softmax per new
// token over the dequantized prefix plus new tokens 0..i), on fresh random inputs and on the
// reference model's K/V: prefixes of mixed INT2/BF16 pages (and empty ones: plain prefill), odd
// new-token counts across the 128-row CTAs and 64-key tiles, GQA 1/3/4/8, groups 128/64, pages
// of 64/128 tokens, pre-rotated queries, output unrotation, and a CUDA-graph replay with other
// lengths and page tables. Outputs are poisoned (NaN) before every launch.
//
// Tolerance (why): query, keys, values and probabilities are fp16 operands (2^-11 relative
// each) with fp32 accumulation: |out - ref| <= 5e-3 * (1 + |ref|), |lse - ref| <= 5e-3. Rows of
// sequences without prefix pages (plain prefill: the wgmma path multiplies the bf16 rows as
// they are, with a bf16 query and probabilities, 2^-8 relative each, like dense bf16 attention)
// get 1.5e-2 for both.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <fstream>

#include "extend_internal.h"
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
  bool prerotated_q = false;  // pass q·R_K and rot_k = nullptr
  bool mma_kernel = false;    // the mma.sync kernel instead of the product launch
  uint32_t seed = 1;
  // Real rows (optional): the prefix and new tokens are the first sum(prefix + new) tokens of
  // these [token][kv head][128] bf16 K and V rows, the queries `real_q` ([Hq][128]) plus noise.
  const std::vector<uint16_t>* real_k = nullptr;
  const std::vector<uint16_t>* real_v = nullptr;
  const std::vector<float>* real_q = nullptr;
};

#define SKIP_WITHOUT_GPU() \
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device: GPU test skipped"

ExtendCase Case(std::vector<uint32_t> prefix, std::vector<int32_t> new_tokens, uint32_t seed) {
  ExtendCase c;
  c.prefix = std::move(prefix);
  c.new_tokens = std::move(new_tokens);
  c.seed = seed;
  return c;
}

// A launch's page table on the device: the pages, their pointers, kinds and token counts, the
// sequences' page lists (an empty table as one null entry, so that no upload is empty).
struct DeviceTable {
  std::vector<DeviceBuffer> pages;
  absl::StatusOr<DeviceBuffer> ptrs, kinds, counts, indptr, ids;

  DeviceTable(const std::vector<std::vector<uint8_t>>& host_pages, std::vector<uint8_t> kind_list,
              std::vector<uint16_t> count_list, const std::vector<int32_t>& seq_page_indptr,
              std::vector<int32_t> seq_page_ids) {
    std::vector<const uint8_t*> p;
    for (const auto& pg : host_pages) {
      auto buf = DeviceBuffer::FromHost(pg);
      if (!buf.ok()) {
        ptrs = buf.status();
        return;
      }
      p.push_back(buf->as<uint8_t>());
      pages.push_back(*std::move(buf));
    }
    if (p.empty()) p.push_back(nullptr);
    if (kind_list.empty()) kind_list.push_back(0), count_list.push_back(0);
    if (seq_page_ids.empty()) seq_page_ids.push_back(0);
    ptrs = DeviceBuffer::FromHost(p);
    kinds = DeviceBuffer::FromHost(kind_list);
    counts = DeviceBuffer::FromHost(count_list);
    indptr = DeviceBuffer::FromHost(seq_page_indptr);
    ids = DeviceBuffer::FromHost(seq_page_ids);
  }
  absl::Status status() const {
    for (const auto* b : {&ptrs, &kinds, &counts, &indptr, &ids}) {
      if (!b->ok()) return b->status();
    }
    return absl::OkStatus();
  }
  void Fill(PagedKVTable& t, int32_t num_seqs) const {
    t.page_ptrs = ptrs->as<const uint8_t*>();
    t.page_kinds = kinds->as<uint8_t>();
    t.page_token_counts = counts->as<uint16_t>();
    t.seq_page_indptr = indptr->as<int32_t>();
    t.seq_page_ids = ids->as<int32_t>();
    t.num_seqs = num_seqs;
  }
};

void RunExtend(const ExtendCase& c) {
  SCOPED_TRACE("gqa " + std::to_string(c.gqa) + " G" + std::to_string(c.group) + " T" +
               std::to_string(c.page_tokens) + (c.unrotate ? " unrotate" : "") +
               (c.prerotated_q ? " prerotated" : "") + (c.mma_kernel ? " mma.sync" : "") +
               (c.real_k != nullptr ? " real K/V" : ""));
  CodecProfile prof;
  prof.model_id = "test";
  prof.model_revision = "1";
  prof.num_layers = 2;
  prof.num_kv_heads = c.kv_heads;
  prof.page_tokens = c.page_tokens;
  prof.group_size = c.group;
  prof.sink_tokens = 64;
  prof.recent_tokens = 128;
  const uint32_t L = c.real_k != nullptr ? 1 : 2, H = c.kv_heads, d = 128, Hq = H * c.gqa,
                 layer = L - 1;
  prof.num_layers = L;
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
  size_t real_tok = 0;  // next real row
  std::vector<uint16_t> k_new, v_new;
  for (size_t b = 0; b < c.prefix.size(); ++b) {
    const uint32_t n = c.prefix[b];
    if (n > 0) {
      std::vector<float> f(size_t{L} * 2 * n * H * d);
      if (c.real_k != nullptr) {  // [layer 0][K|V][token][head][d]
        for (size_t i = 0; i < size_t{n} * H * d; ++i) {
          f[i] = Bf16ToFloat((*c.real_k)[real_tok * H * d + i]);
          f[size_t{n} * H * d + i] = Bf16ToFloat((*c.real_v)[real_tok * H * d + i]);
        }
        real_tok += n;
      } else {
        for (auto& v : f) v = nd(rng) * (1.0f + 0.5f * static_cast<float>(b));
      }
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
    if (c.real_k != nullptr) {  // new rows: the next real rows, rotated as a page writer would
      for (int32_t t = 0; t < c.new_tokens[b]; ++t, ++real_tok) {
        for (uint32_t hh = 0; hh < H; ++hh) {
          float x[128], y[128];
          for (int kv = 0; kv < 2; ++kv) {
            const auto& src = kv ? *c.real_v : *c.real_k;
            for (uint32_t i = 0; i < d; ++i) x[i] = Bf16ToFloat(src[(real_tok * H + hh) * d + i]);
            RotateRow(x, rot.matrix(layer, kv ? KV::kValue : KV::kKey, hh), d, y);
            for (uint32_t i = 0; i < d; ++i) (kv ? v_new : k_new).push_back(FloatToBf16(y[i]));
          }
        }
      }
    }
  }
  for (auto& pg : pages) kv.pages.emplace_back(pg);
  const size_t total = static_cast<size_t>(q_indptr.back());
  std::vector<float> q(total * Hq * d);
  if (c.real_k != nullptr) {
    for (size_t i = 0; i < q.size(); ++i) q[i] = (*c.real_q)[i % (size_t{Hq} * d)] + 0.3f * nd(rng);
  } else {
    for (auto& v : q) v = nd(rng);
    k_new.resize(total * H * d);
    v_new.resize(total * H * d);
    for (auto& v : k_new) v = FloatToBf16(nd(rng));
    for (auto& v : v_new) v = FloatToBf16(nd(rng) * 0.7f);
  }
  auto ref = ReferenceExtendAttention(prof, rot, kv, layer, q_indptr, q, k_new, v_new, Hq, c.unrotate);
  ASSERT_TRUE(ref.ok()) << ref.status();

  const DeviceTable table(pages, kinds, counts, kv.seq_page_indptr, kv.seq_page_ids);
  ASSERT_TRUE(table.status().ok()) << table.status();
  auto d_qindptr = DeviceBuffer::FromHost(q_indptr);
  std::vector<float> q_dev = q;  // pre-rotated: q·R_K of the head's KV head
  if (c.prerotated_q) {
    for (size_t row = 0; row < total * Hq; ++row) {
      const uint32_t kvh = static_cast<uint32_t>(row % Hq) / c.gqa;
      RotateRow(q.data() + row * d, rot.matrix(layer, KV::kKey, kvh), d, q_dev.data() + row * d);
    }
  }
  if (k_new.empty()) k_new.push_back(0), v_new.push_back(0);
  if (q_dev.empty()) q_dev.push_back(0);
  auto d_q = DeviceBuffer::FromHost(q_dev);
  auto d_k = DeviceBuffer::FromHost(k_new);
  auto d_v = DeviceBuffer::FromHost(v_new);
  std::vector<float> rk(rot.matrix(layer, KV::kKey, 0), rot.matrix(layer, KV::kKey, 0) + H * d * d);
  std::vector<float> rv(rot.matrix(layer, KV::kValue, 0), rot.matrix(layer, KV::kValue, 0) + H * d * d);
  auto d_rk = DeviceBuffer::FromHost(rk);
  auto d_rv = DeviceBuffer::FromHost(rv);
  auto d_out = DeviceBuffer::Create(std::max<size_t>(1, total * Hq * d) * 4);
  auto d_lse = DeviceBuffer::Create(std::max<size_t>(1, total * Hq) * 4);
  for (auto* b : {&d_qindptr, &d_q, &d_k, &d_v, &d_rk, &d_rv, &d_out, &d_lse}) {
    ASSERT_TRUE(b->ok()) << b->status();
  }
  ExtendParams p;
  p.shape = DecodeShape{L, H, Hq, d, c.group, c.page_tokens, layer};
  table.Fill(p.table, static_cast<int32_t>(c.prefix.size()));
  p.q_indptr = d_qindptr->as<int32_t>();
  p.max_new_tokens = max_new;
  p.q = d_q->as<float>();
  p.k_new = d_k->as<uint16_t>();
  p.v_new = d_v->as<uint16_t>();
  p.rot_k = c.prerotated_q ? nullptr : d_rk->as<float>();
  p.rot_v = d_rv->as<float>();
  p.unrotate_output = c.unrotate;
  p.out = d_out->as<float>();
  p.lse = d_lse->as<float>();
  ASSERT_EQ(cudaMemset(p.out, 0xff, total * Hq * d * 4), cudaSuccess);  // NaN poison
  ASSERT_EQ(cudaMemset(p.lse, 0xff, total * Hq * 4), cudaSuccess);
  if (c.mma_kernel) {
    ASSERT_TRUE(detail::PrepareExtendMma().ok());
    ASSERT_TRUE(detail::LaunchExtendMma(p, max_new, nullptr).ok());
  } else {
    const absl::Status st = LaunchExtendAttention(p, nullptr);
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto out = d_out->ToHost<float>();
  auto lse = d_lse->ToHost<float>();
  ASSERT_TRUE(out.ok() && lse.ok());
  // Per new-token row: whether its sequence has no prefix pages (the bf16 path of the wgmma kernel).
  std::vector<bool> plain(total, false);
  for (size_t b = 0; b < c.prefix.size(); ++b) {
    for (int32_t t = q_indptr[b]; t < q_indptr[b + 1]; ++t) plain[t] = c.prefix[b] == 0 && !c.mma_kernel;
  }
  int bad = 0;
  double max_err[2] = {0, 0}, max_lse_err[2] = {0, 0};  // [paged, plain]
  for (size_t i = 0; i < out->size(); ++i) {
    const float r = ref->out[i], g = (*out)[i];
    const double err = std::fabs(double(g) - r);
    const bool pl = plain[i / (size_t{Hq} * d)];
    if (!(err <= (pl ? 1.5e-2 : 5e-3) * (1 + std::fabs(r)))) {
      if (++bad < 5) ADD_FAILURE() << "out[" << i << "] gpu " << g << " ref " << r;
    }
    if (std::isfinite(err)) max_err[pl] = std::max(max_err[pl], err);
  }
  for (size_t i = 0; i < lse->size(); ++i) {
    const float r = ref->lse[i], g = (*lse)[i];
    const double err = std::fabs(double(g) - r);
    const bool pl = plain[i / Hq];
    if (!(err <= (pl ? 1.5e-2 : 5e-3))) {
      if (++bad < 10) ADD_FAILURE() << "lse[" << i << "] gpu " << g << " ref " << r;
    }
    if (std::isfinite(err)) max_lse_err[pl] = std::max(max_lse_err[pl], err);
  }
  std::printf("[ extend ] max abs error out %.3g lse %.3g (paged rows), out %.3g lse %.3g (plain rows)\n",
              max_err[0], max_lse_err[0], max_err[1], max_lse_err[1]);
  EXPECT_EQ(bad, 0) << "max abs out error " << max_err[0] << " / " << max_err[1];
}

TEST(ExtendAttentionGpu, MixedPrefixesGqa4) {
  SKIP_WITHOUT_GPU();
  RunExtend(Case({700, 0, 100, 333}, {37, 70, 1, 16}, 1));
}

TEST(ExtendAttentionGpu, GqaGroupsPagesAndUnrotation) {
  SKIP_WITHOUT_GPU();
  for (uint32_t gqa : {1u, 8u}) {
    ExtendCase c = Case({400, 65}, {17, 130}, 10 + gqa);
    c.gqa = gqa;
    RunExtend(c);
  }
  ExtendCase c = Case({500, 129}, {33, 5}, 21);
  c.group = 64;
  c.page_tokens = 128;
  c.unrotate = true;
  RunExtend(c);
}

// Plain prefill (no pages) and odd lengths: chunks across the 128-row CTAs (32 tokens at GQA
// 4) and the 64-key tiles, a one-token chunk, a prefix ending mid-slice.
TEST(ExtendAttentionGpu, PlainPrefillAndOddLengths) {
  SKIP_WITHOUT_GPU();
  RunExtend(Case({0, 0}, {203, 65}, 31));
  RunExtend(Case({1000, 77, 0}, {129, 1, 300}, 32));
}

// Plain prefill over more work items (128-row token blocks x sequences x KV heads) than the
// device has SMs, so that the plain-prefill kernel's persistent CTAs run several items each
// (across KV heads, both rotation buffers, one tile ring), beside a sequence with prefix pages
// (skipped by that kernel); GQA 1, 4 and 8, with unrotation and with pre-rotated queries.
TEST(ExtendAttentionGpu, PlainPrefillPersistentCtas) {
  SKIP_WITHOUT_GPU();
  for (uint32_t gqa : {1u, 4u, 8u}) {
    ExtendCase c = Case({0, 150, 0}, {900, 40, 517}, 50 + gqa);
    c.kv_heads = 8;
    c.gqa = gqa;
    c.unrotate = gqa == 4;
    c.prerotated_q = gqa == 8;
    RunExtend(c);
  }
}

// GQA 3 (rows 126..127 of each CTA unused) and 2, queries given already rotated (rot_k
// nullptr), with and without unrotation.
TEST(ExtendAttentionGpu, Gqa3PaddingRowsAndPrerotatedQueries) {
  SKIP_WITHOUT_GPU();
  ExtendCase c = Case({450, 0}, {97, 50}, 41);
  c.gqa = 3;
  RunExtend(c);
  ExtendCase d = Case({300, 130}, {70, 45}, 42);
  d.gqa = 2;
  d.prerotated_q = true;
  RunExtend(d);
  d.unrotate = true;
  d.seed = 43;
  RunExtend(d);
}

// The mma.sync kernel (used where the wgmma one cannot run) on the same function.
TEST(ExtendAttentionGpu, MmaSyncKernel) {
  SKIP_WITHOUT_GPU();
  ExtendCase c = Case({700, 0, 100}, {37, 70, 1}, 1);
  c.mma_kernel = true;
  RunExtend(c);
}

// Real K/V: the reference model's post-RoPE keys and values (bench/testdata/refmodel_kv.bin,
// written by oscarkv_kv_dump from the CPU engine): a prefix of sink + INT2 + BF16 pages and the
// following rows as new tokens, queries the dump's plus noise; groups 128 and 64; and the same
// rows as a plain prefill (no pages).
TEST(ExtendAttentionGpu, RealKvOfTheReferenceModel) {
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
  const uint32_t n = hdr[1], Hq = hdr[2], H = hdr[3], d = hdr[4];
  ASSERT_EQ(d, 128u);
  uint32_t layer_index;
  in.read(reinterpret_cast<char*>(&layer_index), 4);
  std::vector<uint16_t> k(size_t{n} * H * d), v(k.size());
  std::vector<float> q(size_t{Hq} * d);
  in.read(reinterpret_cast<char*>(k.data()), k.size() * 2);
  in.read(reinterpret_cast<char*>(v.data()), v.size() * 2);
  in.read(reinterpret_cast<char*>(q.data()), q.size() * 4);
  ASSERT_TRUE(in.good());
  ASSERT_GE(n, 600u);
  auto real_case = [&](uint32_t prefix, int32_t new_tokens, uint32_t group, uint32_t seed) {
    ExtendCase c = Case({prefix}, {new_tokens}, seed);
    c.kv_heads = H;
    c.gqa = Hq / H;
    c.group = group;
    c.unrotate = true;
    c.real_k = &k;
    c.real_v = &v;
    c.real_q = &q;
    RunExtend(c);
  };
  for (uint32_t group : {128u, 64u}) real_case(450, 150, group, 50 + group);
  real_case(0, static_cast<int32_t>(std::min(n, 600u)), 128, 60);
}

// A launch captured in a CUDA graph with a plan sized for a maximum, replayed after the device
// lengths (q_indptr) and page table (seq_page_ids) changed: the replay's outputs equal an eager
// launch's on the same data.
TEST(ExtendAttentionGpu, GraphReplayWithOtherLengthsAndPages) {
  SKIP_WITHOUT_GPU();
  CodecProfile prof;
  prof.model_id = "test";
  prof.model_revision = "1";
  prof.num_layers = 1;
  prof.num_kv_heads = 2;
  prof.sink_tokens = 64;
  prof.recent_tokens = 64;
  const uint32_t H = 2, d = 128, gqa = 4, Hq = H * gqa, n = 400;
  RotationSet rot = RotationSet::Hadamard(1, H, d, 0.96f, 0.92f);
  std::mt19937 rng(77);
  std::normal_distribution<float> nd;
  std::vector<std::vector<uint8_t>> pages;
  std::vector<uint8_t> kinds;
  std::vector<uint16_t> counts;
  for (int b = 0; b < 2; ++b) {  // two sequences of n tokens, the same page plan
    std::vector<float> f(size_t{2} * n * H * d);
    for (auto& x : f) x = nd(rng);
    auto sp = BuildSequencePages(prof, rot, KVSequenceView{f.data(), 1, H, d, n});
    ASSERT_TRUE(sp.ok()) << sp.status();
    for (size_t i = 0; i < sp->pages.size(); ++i) {
      kinds.push_back(static_cast<uint8_t>(sp->plan[i].kind));
      counts.push_back(static_cast<uint16_t>(sp->plan[i].token_count));
      pages.push_back(std::move(sp->pages[i]));
    }
  }
  const int32_t per = static_cast<int32_t>(pages.size() / 2), max_new = 96, max_total = 2 * max_new;
  std::vector<int32_t> ids(2 * per), swapped(2 * per);
  for (int32_t i = 0; i < 2 * per; ++i) ids[i] = i, swapped[i] = (i + per) % (2 * per);
  const DeviceTable table(pages, kinds, counts, {0, per, 2 * per}, ids);
  ASSERT_TRUE(table.status().ok()) << table.status();
  std::vector<float> q(size_t{max_total} * Hq * d);
  for (auto& x : q) x = nd(rng);
  std::vector<uint16_t> kn(size_t{max_total} * H * d), vn(kn.size());
  for (auto& x : kn) x = FloatToBf16(nd(rng));
  for (auto& x : vn) x = FloatToBf16(nd(rng));
  auto d_qindptr = DeviceBuffer::FromHost(std::vector<int32_t>{0, 50, 90});
  auto d_q = DeviceBuffer::FromHost(q);
  auto d_k = DeviceBuffer::FromHost(kn);
  auto d_v = DeviceBuffer::FromHost(vn);
  std::vector<float> rk(rot.matrix(0, KV::kKey, 0), rot.matrix(0, KV::kKey, 0) + H * d * d);
  auto d_rk = DeviceBuffer::FromHost(rk);
  auto d_out = DeviceBuffer::Create(size_t{max_total} * Hq * d * 4);
  auto d_lse = DeviceBuffer::Create(size_t{max_total} * Hq * 4);
  for (auto* b : {&d_qindptr, &d_q, &d_k, &d_v, &d_rk, &d_out, &d_lse}) {
    ASSERT_TRUE(b->ok()) << b->status();
  }
  ExtendParams p;
  p.shape = DecodeShape{1, H, Hq, d, 128, 64, 0};
  table.Fill(p.table, 2);
  p.q_indptr = d_qindptr->as<int32_t>();
  p.max_new_tokens = max_new;
  p.q = d_q->as<float>();
  p.k_new = d_k->as<uint16_t>();
  p.v_new = d_v->as<uint16_t>();
  p.rot_k = d_rk->as<float>();
  p.out = d_out->as<float>();
  p.lse = d_lse->as<float>();
  auto plan = PlanExtend(p.shape, 2, max_new);
  ASSERT_TRUE(plan.ok()) << plan.status();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status captured = LaunchExtendAttention(*plan, p, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  auto run = [&](bool replay) -> std::vector<float> {
    EXPECT_EQ(cudaMemset(p.out, 0xff, size_t{max_total} * Hq * d * 4), cudaSuccess);
    if (replay) {
      EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    } else {
      EXPECT_TRUE(LaunchExtendAttention(*plan, p, stream).ok());
    }
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    auto out = d_out->ToHost<float>();
    EXPECT_TRUE(out.ok());
    return out.ok() ? *out : std::vector<float>{};
  };
  const std::vector<int32_t> lengths[2] = {{0, 50, 90}, {0, 96, 97}};
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_EQ(cudaMemcpy(const_cast<int32_t*>(p.q_indptr), lengths[round].data(),
                         3 * 4, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(const_cast<int32_t*>(p.table.seq_page_ids), (round ? swapped : ids).data(),
                         ids.size() * 4, cudaMemcpyHostToDevice),
              cudaSuccess);
    const std::vector<float> eager = run(false), replayed = run(true);
    const size_t written = size_t(lengths[round][2]) * Hq * d;
    ASSERT_EQ(eager.size(), replayed.size());
    int bad = 0;
    for (size_t i = 0; i < written; ++i) {
      if (!(std::isfinite(eager[i]) && eager[i] == replayed[i]) && ++bad < 5) {
        ADD_FAILURE() << "out[" << i << "] eager " << eager[i] << " replay " << replayed[i];
      }
    }
    EXPECT_EQ(bad, 0);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace oscarkv::cuda
