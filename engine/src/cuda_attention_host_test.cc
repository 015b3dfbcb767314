// CudaAttention's page layout and kernel parameters run on the host: the exact write
// parameters the backend launches (WindowWriteParams, per page set and layer) go through the
// write kernel's CPU reference (ReferenceQuantizeWrite), and each query position's page-table
// view (seq_indptr/seq_entries, entry token counts) is read back and attended in double. The
// result must equal MixedPrecisionAttention's -- the same decode semantics -- which checks
// everything the GPU path adds except the decode kernel itself (tested against its own
// reference in kernels/cuda). Runs in CPU CI (label unit; needs a CUDA build for the reference).
//
// Tolerance: K/V are bf16 before both paths, ReferenceQuantizeWrite rotates with RotateRow and
// the CPU backend with Eigen (different summation order), so an INT2 code can rarely flip:
// relative RMS error <= 1e-3 and >= 99.9% of the elements within 2e-3 * (1 + |cpu|); the BF16
// codec (no rotation, no quantization) within 2e-3 * (1 + |cpu|) everywhere.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "attention_cases.h"
#include "cuda_window.h"
#include "gtest/gtest.h"
#include "oscarkv/cuda/reference.h"
#include "oscarkv/kernels/quantize.h"
#include "window_pages.h"

namespace oscarkv::engine {
namespace {

using testing::Codecs;
using testing::Compare;
using testing::Diff;
using testing::LayerInputs;

// The backend's function with the kernels replaced by host code (see the top of the file).
std::vector<float> EmulateCudaAttention(const KvCodec& codec, const LayerInputs& in) {
  const uint32_t T = in.tokens, H = in.hkv, Hq = in.hq, d = in.d, gqa = Hq / H;
  const WindowPageLayout L = BuildWindowPageLayout(T, codec.int2, codec.sink, codec.recent);
  std::vector<std::vector<uint8_t>> pages(L.page_kinds.size());
  std::vector<uint8_t*> page_ptrs;
  std::vector<PageGeometry> geo;
  for (size_t i = 0; i < pages.size(); ++i) {
    geo.push_back(PageGeometry{1, H, d, codec.group, kWindowPageTokens,
                               static_cast<PageKind>(L.page_kinds[i])});
    pages[i].assign(geo.back().page_bytes(), 0xA5);  // poison: every read slot must be written
    page_ptrs.push_back(pages[i].data());
  }
  std::vector<uint16_t> k(in.k.size()), v(in.v.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = FloatToBf16(in.k[i]);
    v[i] = FloatToBf16(in.v[i]);
  }
  WindowBuffers b;
  b.k = k.data();
  b.v = v.data();
  b.page_ptrs = page_ptrs.data();
  b.page_kinds = L.page_kinds.data();
  b.dst_page = L.dst_page.data();
  b.dst_slot = L.dst_slot.data();
  std::vector<uint8_t> modes;
  std::unique_ptr<RotationSet> layer_rot;  // the attended layer's rotations as layer 0
  if (codec.int2) {
    const RotationSet& r = *codec.rotations;
    modes = RangeModeBytes(r);
    b.clips = r.clips().data();
    b.range_modes = modes.data();
    const size_t per = size_t{2} * H * d * d;
    std::vector<float> mats(r.matrices().begin() + in.layer * per,
                            r.matrices().begin() + (in.layer + 1) * per);
    std::vector<float> clips(r.clips().begin() + in.layer * 2 * H,
                             r.clips().begin() + (in.layer + 1) * 2 * H);
    auto one = RotationSet::FromData(1, H, d, mats, clips);
    EXPECT_TRUE(one.ok());
    layer_rot = std::make_unique<RotationSet>(*std::move(one));
  }
  for (size_t s = 0; s < L.sets.size(); ++s) {
    const cuda::QuantizeWriteParams w = WindowWriteParams(L, s, codec, in.layer, H, d, b);
    absl::Status st = cuda::ReferenceQuantizeWrite(w, layer_rot.get());
    EXPECT_TRUE(st.ok()) << st;
  }

  // Decode of every query position over its entries, in double.
  const float* rk = codec.int2 ? codec.rotations->matrix(in.layer, KV::kKey, 0) : nullptr;
  const float* rv = codec.int2 ? codec.rotations->matrix(in.layer, KV::kValue, 0) : nullptr;
  auto row = [&](int32_t entry, uint32_t slot, uint32_t kv, uint32_t h, float* out) {
    const uint32_t page = L.entry_page[entry];
    const PageGeometry& g = geo[page];
    const uint8_t* seg = pages[page].data() + g.segment_offset(0, kv, h);
    if (g.kind == PageKind::kBf16) {
      const uint16_t* r = reinterpret_cast<const uint16_t*>(seg + g.bf16_row_offset(slot));
      for (uint32_t i = 0; i < d; ++i) out[i] = Bf16ToFloat(r[i]);
    } else {
      DequantizeRowInt2(seg + g.code_row_offset(slot),
                        reinterpret_cast<const uint16_t*>(seg + g.scale_offset(slot, 0)), d,
                        codec.group, out);
    }
  };
  std::vector<float> out(size_t{T} * Hq * d);
  std::vector<float> q(d), kr(d), vr(d), acc(d);
  for (uint32_t t = 0; t < T; ++t) {
    for (uint32_t j = 0; j < Hq; ++j) {
      const uint32_t h = j / gqa;
      const float* qin = in.q.data() + (size_t{t} * Hq + j) * d;
      if (rk) {
        RotateRow(qin, rk + size_t{h} * d * d, d, q.data());
      } else {
        std::copy(qin, qin + d, q.begin());
      }
      std::vector<double> score;
      std::vector<std::vector<float>> values;
      for (int32_t i = L.seq_indptr[t]; i < L.seq_indptr[t + 1]; ++i) {
        const int32_t e = L.seq_entries[i];
        for (uint32_t slot = 0; slot < L.entry_count[e]; ++slot) {
          row(e, slot, 0, h, kr.data());
          row(e, slot, 1, h, vr.data());
          double dot = 0;
          for (uint32_t c = 0; c < d; ++c) dot += double{q[c]} * kr[c];
          score.push_back(dot / std::sqrt(double(d)));
          values.push_back(vr);
        }
      }
      double mx = -1e300, sum = 0;
      for (double s : score) mx = std::max(mx, s);
      std::vector<double> o(d, 0.0);
      for (size_t i = 0; i < score.size(); ++i) {
        const double p = std::exp(score[i] - mx);
        sum += p;
        for (uint32_t c = 0; c < d; ++c) o[c] += p * values[i][c];
      }
      for (uint32_t c = 0; c < d; ++c) acc[c] = static_cast<float>(o[c] / sum);
      float* dst = out.data() + (size_t{t} * Hq + j) * d;
      if (rv) {
        UnrotateRow(acc.data(), rv + size_t{h} * d * d, d, dst);
      } else {
        std::copy(acc.begin(), acc.end(), dst);
      }
    }
  }
  return out;
}

void Check(const KvCodec& codec, const LayerInputs& in, const std::string& what) {
  SCOPED_TRACE(what + " codec " + codec.name + " layer " + std::to_string(in.layer));
  MixedPrecisionAttention cpu(codec);
  std::vector<float> want(size_t{in.tokens} * in.hq * in.d);
  ASSERT_TRUE(cpu.Attend(in.view(), want.data()).ok());
  const std::vector<float> got = EmulateCudaAttention(codec, in);
  const Diff d = Compare(got, want);
  std::printf("  %-28s %-10s layer %u T=%u: rel_rms %.2e, outside %.4f%%, max |err|/bound %.2f\n",
              what.c_str(), codec.name.c_str(), in.layer, in.tokens, d.rel_rms,
              100 * d.frac_outside, d.max_excess);
  EXPECT_TRUE(d.finite);
  if (!codec.int2) {
    EXPECT_LE(d.max_excess, 1.0);
  } else {
    EXPECT_LE(d.rel_rms, 1e-3);
    EXPECT_LE(d.frac_outside, 1e-3);
  }
}

std::vector<uint32_t> LayersToCheck(uint32_t sink) {
  if (std::getenv("ALL_LAYERS")) return {0, 1, 2, 3, 4, 5, 6, 7};
  return {0, 5};
}

TEST(CudaAttentionHost, PagesAndParamsReproduceTheCpuBackendOnTheReferenceModel) {
  if (testing::RefModelDir().empty()) GTEST_SKIP() << "reference model not found";
  auto model = Model::Load(testing::RefModelDir());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const std::vector<LayerInputs> layers = testing::RealLayers(**model, 450);
  ASSERT_EQ(layers.size(), c.num_layers);
  for (auto [sink, recent, group] : {std::tuple{64u, 256u, 128u}, std::tuple{0u, 0u, 128u},
                                     std::tuple{5u, 37u, 64u}}) {
    for (const KvCodec& codec : Codecs(c.num_layers, c.num_kv_heads, c.head_dim, sink, recent, group)) {
      if (!codec.int2 && sink != 64) continue;
      for (uint32_t l : LayersToCheck(sink)) {
        Check(codec, layers[l], "sink " + std::to_string(sink) + " recent " + std::to_string(recent) +
                                    " group " + std::to_string(group));
      }
    }
  }
}

// Without clip or range-mode tables (no clipping, one range mode for all heads) the
// parameters of every layer carry null tables, not pointers offset from null (the write kernel
// would read them: an illegal address on the device at layer > 0).
TEST(CudaAttentionHost, NullTablesStayNullAtEveryLayer) {
  const WindowPageLayout L = BuildWindowPageLayout(300, /*int2=*/true, /*sink=*/4, /*recent=*/64);
  KvCodec codec;
  codec.int2 = true;
  codec.group = 128;
  WindowBuffers b;
  for (uint32_t layer : {0u, 1u, 7u}) {
    for (size_t s = 0; s < L.sets.size(); ++s) {
      const cuda::QuantizeWriteParams w = WindowWriteParams(L, s, codec, layer, 8, 128, b);
      EXPECT_EQ(w.clips, nullptr) << "layer " << layer;
      EXPECT_EQ(w.range_modes, nullptr) << "layer " << layer;
    }
  }
  std::vector<float> clips(2 * 8 * 8, 0.95f);
  b.clips = clips.data();
  EXPECT_EQ(WindowWriteParams(L, 0, codec, 3, 8, 128, b).clips, clips.data() + 3 * 16);
}

}  // namespace
}  // namespace oscarkv::engine
