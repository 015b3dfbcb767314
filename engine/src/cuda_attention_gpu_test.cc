// CudaAttention (quantize-on-write + paged decode kernels, one sequence per query position)
// against MixedPrecisionAttention (the CPU reference) for every codec the harness evaluates:
// BF16, naive INT2, Hadamard INT2, and OSCAR-style INT2 (non-trivial orthogonal rotations,
// clip ratios, all three write-time range modes), with the published windows (64/256), no
// windows, and unaligned windows; on the reference model's real per-layer q/k/v and on random
// inputs with outlier channels, GQA 1, 4 and 8, groups 128 and 64. Skips without a GPU.
//
// K/V are rounded to bf16 before both backends see them (the write kernel reads bf16 rows), so
// the remaining differences are arithmetic: rotation order (~1e-6 relative, which rarely moves
// an INT2 code across a rounding boundary) and tensor-core products (~1e-4 relative; see
// kernels/cuda/src/decode_attention_gpu_test.cc). Tolerances (set from the first H200 run's
// maxima, with 3-4x margin; that run printed every figure, see the log of scripts/gpu/eval_gpu.sh):
//   BF16 codec:  |gpu - cpu| <= 2e-3 * (1 + |cpu|) for every element (measured rel RMS ~2e-6);
//   INT2 codecs with BF16 windows: relative RMS error ||gpu - cpu|| / ||cpu|| <= 1e-3 (measured
//                <= 3.6e-4) and at most 1% of the elements outside 2e-3 * (1 + |cpu|) (measured
//                <= 0.3%: the INT2 score/value products use fp16 operands, and a code moved across
//                a rounding boundary by the rotation order shifts a key by a whole step);
//   INT2 with no BF16 windows (sink 0, recent 0): rel RMS <= 2e-2, <= 10% outside (measured
//                7.7e-3 and 2.9%): the attention-sink tokens are INT2 there, so one flipped code
//                or range candidate of token 0 moves every later query of that head.
// The test can fail: the gap between two codecs (naive vs Hadamard) is checked to exceed these
// tolerances many times over, and every output element is checked finite.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/engine/attention.h"
#include "oscarkv/engine/cuda_attention.h"
#include "oscarkv/engine/eval.h"
#include "oscarkv/engine/model.h"
#include "oscarkv/engine/safetensors.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/rotation.h"
#include "attention_cases.h"
#include "test_util.h"

namespace oscarkv::engine {
namespace {

using testing::Codecs;
using testing::Compare;
using testing::Diff;
using testing::LayerInputs;
using testing::RealLayers;

#define SKIP_WITHOUT_GPU() \
  if (!cuda::HaveCudaDevice()) GTEST_SKIP() << "no CUDA device: CudaAttention GPU test skipped"

void CheckCodec(const KvCodec& codec, const std::vector<LayerInputs>& layers, const std::string& what) {
  SCOPED_TRACE(what + " codec " + codec.name);
  MixedPrecisionAttention cpu(codec);
  auto gpu = MakeCudaAttention(codec);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  for (const LayerInputs& li : layers) {
    const size_t n = size_t{li.tokens} * li.hq * li.d;
    std::vector<float> want(n), got(n, std::nanf(""));
    ASSERT_TRUE(cpu.Attend(li.view(), want.data()).ok());
    absl::Status s = (*gpu)->Attend(li.view(), got.data());
    ASSERT_TRUE(s.ok()) << s;
    const Diff d = Compare(got, want);
    std::printf("  %-34s %-10s layer %u T=%u: rel_rms %.2e, outside %.4f%%, max |err|/bound %.2f\n",
                what.c_str(), codec.name.c_str(), li.layer, li.tokens, d.rel_rms,
                100 * d.frac_outside, d.max_excess);
    EXPECT_TRUE(d.finite) << "non-finite output (an element not written?)";
    const bool no_windows = codec.sink == 0 && codec.recent == 0;
    if (!codec.int2) {
      EXPECT_LE(d.max_excess, 1.0) << "layer " << li.layer;
    } else if (!no_windows) {
      EXPECT_LE(d.rel_rms, 1e-3) << "layer " << li.layer;
      EXPECT_LE(d.frac_outside, 0.01) << "layer " << li.layer;
    } else {
      EXPECT_LE(d.rel_rms, 2e-2) << "layer " << li.layer;
      EXPECT_LE(d.frac_outside, 0.10) << "layer " << li.layer;
    }
  }
}

TEST(CudaAttentionGpu, MatchesCpuOnTheReferenceModel) {
  SKIP_WITHOUT_GPU();
  if (testing::RefModelDir().empty()) GTEST_SKIP() << "reference model not found";
  auto model = Model::Load(testing::RefModelDir());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const std::vector<LayerInputs> layers = RealLayers(**model, 700);
  ASSERT_EQ(layers.size(), c.num_layers);
  // Real activations have large logits, where the int8 query split shows first.
  for (auto [sink, recent] : {std::pair{64u, 256u}, std::pair{0u, 0u}, std::pair{5u, 37u}}) {
    for (const KvCodec& codec : Codecs(c.num_layers, c.num_kv_heads, c.head_dim, sink, recent, 128)) {
      if (!codec.int2 && sink != 64) continue;
      CheckCodec(codec, layers, "refmodel sink " + std::to_string(sink) + " recent " + std::to_string(recent));
    }
  }
}

TEST(CudaAttentionGpu, MatchesCpuOnRandomInputs) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto [hq, hkv, group, T] : {std::tuple{8u, 2u, 128u, 333u}, std::tuple{8u, 1u, 64u, 530u},
                                   std::tuple{2u, 2u, 128u, 64u}}) {
    const uint32_t d = 128, layers = 2;
    std::vector<LayerInputs> in;
    for (uint32_t l = 0; l < layers; ++l) {
      LayerInputs li{l, T, hq, hkv, d};
      li.q.resize(size_t{T} * hq * d);
      li.k.resize(size_t{T} * hkv * d);
      li.v.resize(li.k.size());
      for (size_t i = 0; i < li.q.size(); ++i) li.q[i] = nd(rng) * (i % d == 7 ? 4.f : 1.f);
      for (size_t i = 0; i < li.k.size(); ++i) {
        li.k[i] = RoundToBf16(nd(rng) * (i % d == 3 ? 6.f : 1.f) + (i % d == 9 ? 3.f : 0.f));
        li.v[i] = RoundToBf16(nd(rng));
      }
      in.push_back(std::move(li));
    }
    for (const KvCodec& codec : Codecs(layers, hkv, d, 64, 256, group)) {
      CheckCodec(codec, in, "random gqa " + std::to_string(hq / hkv) + " group " + std::to_string(group));
    }
  }
}

// Tolerance sanity: two different INT2 codecs differ by far more than the tolerance, so a GPU
// backend that used the wrong rotation or precision for any region would fail above.
TEST(CudaAttentionGpu, ToleranceSeparatesCodecs) {
  SKIP_WITHOUT_GPU();
  if (testing::RefModelDir().empty()) GTEST_SKIP() << "reference model not found";
  auto model = Model::Load(testing::RefModelDir());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const std::vector<LayerInputs> layers = RealLayers(**model, 700);
  const auto codecs = Codecs(c.num_layers, c.num_kv_heads, c.head_dim, 64, 256, 128);
  MixedPrecisionAttention naive(codecs[1]);
  auto hadamard = MakeCudaAttention(codecs[2]);
  ASSERT_TRUE(hadamard.ok());
  const LayerInputs& li = layers[3];
  const size_t n = size_t{li.tokens} * li.hq * li.d;
  std::vector<float> a(n), b(n);
  ASSERT_TRUE(naive.Attend(li.view(), a.data()).ok());
  ASSERT_TRUE((*hadamard)->Attend(li.view(), b.data()).ok());
  const Diff d = Compare(b, a);
  std::printf("  naive (cpu) vs hadamard (gpu), layer 3: rel_rms %.2e, outside %.2f%%\n", d.rel_rms,
              100 * d.frac_outside);
  EXPECT_GT(d.rel_rms, 10 * 1e-3);
  EXPECT_GT(d.frac_outside, 10 * 0.01);
}

// The harness runs through the GPU backend end to end (2 short windows, all codecs). Here K/V
// are not pre-rounded: the GPU path quantizes bf16(k)·R where the CPU quantizes k·R, a different
// INT2 noise draw on ~1% of the elements, which on 2 short windows moved recall bpb by up to
// 0.0074 (first H200 run). So INT2 codecs within 0.02 here, BF16 within 0.001 (measured 1e-4);
// the 0.002 criterion is the 16-window acceptance run's (scripts/gpu/eval_gpu.sh).
TEST(CudaAttentionGpu, EvalHarnessThroughTheGpuBackend) {
  SKIP_WITHOUT_GPU();
  if (testing::RefModelDir().empty()) GTEST_SKIP() << "reference model not found";
  auto model = Model::Load(testing::RefModelDir());
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  auto text = ReadFileBytes(testing::RefModelDir() + "/val.txt");
  ASSERT_TRUE(text.ok());
  EvalOptions o;
  o.windows = 2;
  o.window_bytes = 512;
  o.recall_span = 200;
  const auto codecs = Codecs(c.num_layers, c.num_kv_heads, c.head_dim, 64, 128, 128);
  const std::string t(text->begin(), text->end());
  auto cpu = EvaluateCodecs(**model, t, codecs, o);
  auto gpu = EvaluateCodecs(**model, t, codecs, o, {},
                            [](const KvCodec& k) { return MakeCudaAttention(k); });
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
  for (size_t i = 0; i < codecs.size(); ++i) {
    std::printf("  eval %-10s cpu bpb %.4f recall %.4f | gpu bpb %.4f recall %.4f\n",
                codecs[i].name.c_str(), (*cpu)[i].bpb, (*cpu)[i].recall_bpb, (*gpu)[i].bpb,
                (*gpu)[i].recall_bpb);
    const double tol = codecs[i].int2 ? 0.02 : 0.001;
    EXPECT_NEAR((*gpu)[i].bpb, (*cpu)[i].bpb, tol) << codecs[i].name;
    EXPECT_NEAR((*gpu)[i].recall_bpb, (*cpu)[i].recall_bpb, tol) << codecs[i].name;
  }
}

}  // namespace
}  // namespace oscarkv::engine
