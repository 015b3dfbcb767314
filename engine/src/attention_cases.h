// Test cases shared by the CudaAttention tests: per-layer inputs with owned storage, the
// codecs the harness evaluates (an OSCAR-style set with all range modes), output comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/engine/attention.h"
#include "oscarkv/engine/model.h"
#include "oscarkv/engine/safetensors.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/rotation.h"
#include "test_util.h"

namespace oscarkv::engine::testing {

// One layer's attention inputs with owned storage (K/V rounded to bf16).
struct LayerInputs {
  LayerInputs() = default;
  LayerInputs(uint32_t layer, uint32_t tokens, uint32_t hq, uint32_t hkv, uint32_t d)
      : layer(layer), tokens(tokens), hq(hq), hkv(hkv), d(d) {}
  uint32_t layer = 0, tokens = 0, hq = 0, hkv = 0, d = 128;
  std::vector<float> q, k, v;
  AttentionInputs view() const {
    return AttentionInputs{layer, tokens, hq, hkv, d, q.data(), k.data(), v.data()};
  }
};

inline LayerInputs Own(const AttentionInputs& in) {
  LayerInputs o;
  o.layer = in.layer;
  o.tokens = in.tokens;
  o.hq = in.num_q_heads;
  o.hkv = in.num_kv_heads;
  o.d = in.head_dim;
  const size_t nq = size_t{in.tokens} * in.num_q_heads * in.head_dim;
  const size_t nk = size_t{in.tokens} * in.num_kv_heads * in.head_dim;
  o.q.assign(in.q, in.q + nq);
  o.k.assign(in.k, in.k + nk);
  o.v.assign(in.v, in.v + nk);
  for (float& x : o.k) x = RoundToBf16(x);
  for (float& x : o.v) x = RoundToBf16(x);
  return o;
}

// OSCAR-style set: random signed permutations composed with Hadamard (orthogonal, dense), clips
// 0.96 (K) / 0.92 (V), range modes cycling minmax, search, unbiased over (layer, K|V, head).
// `fixed`: no clips, range modes cycling unbiased-fixed 6, 7, 5 and minmax -- what `oscarkv
// calibrate` writes by default, and the writes the CUDA path hands to its streaming kernel.
inline std::shared_ptr<RotationSet> OscarLike(uint32_t layers, uint32_t H, uint32_t d, uint32_t seed,
                                              bool fixed = false) {
  std::mt19937 rng(seed);
  std::vector<float> mats;
  for (uint32_t m = 0; m < layers * 2 * H; ++m) {
    std::vector<uint32_t> perm(d);
    for (uint32_t i = 0; i < d; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<float> u(size_t{d} * d, 0.f);
    for (uint32_t i = 0; i < d; ++i) u[size_t{i} * d + perm[i]] = (rng() & 1) ? 1.f : -1.f;
    std::vector<float> r = ComposeOscarRotation(u, d);
    mats.insert(mats.end(), r.begin(), r.end());
  }
  std::vector<float> clips;
  for (uint32_t l = 0; l < layers; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < H; ++h) clips.push_back(fixed ? 1.0f : kv == 0 ? 0.96f : 0.92f);
    }
  }
  auto set = RotationSet::FromData(layers, H, d, mats, clips);
  EXPECT_TRUE(set.ok()) << set.status();
  auto out = std::make_shared<RotationSet>(*std::move(set));
  const RangeMode kModes[3] = {RangeMode::kMinMax, RangeMode::kSearch, RangeMode::kUnbiased};
  const RangeMode kFixedModes[4] = {UnbiasedFixed(6), UnbiasedFixed(7), UnbiasedFixed(5), RangeMode::kMinMax};
  uint32_t i = 0;
  for (uint32_t l = 0; l < layers; ++l) {
    for (KV kv : {KV::kKey, KV::kValue}) {
      for (uint32_t h = 0; h < H; ++h, ++i) out->set_range_mode(l, kv, h, fixed ? kFixedModes[i % 4] : kModes[i % 3]);
    }
  }
  return out;
}

inline std::vector<KvCodec> Codecs(uint32_t layers, uint32_t H, uint32_t d, uint32_t sink, uint32_t recent,
                            uint32_t group) {
  auto naive = std::make_shared<RotationSet>(RotationSet::Identity(layers, H, d));
  auto hadamard = std::make_shared<RotationSet>(RotationSet::Hadamard(layers, H, d));
  return {KvCodec::Bf16(), KvCodec::Int2("naive", naive, sink, recent, group),
          KvCodec::Int2("hadamard", hadamard, sink, recent, group),
          KvCodec::Int2("oscar-like", OscarLike(layers, H, d, 11 + sink + group), sink, recent, group),
          KvCodec::Int2("oscar-fixed", OscarLike(layers, H, d, 13 + sink + group, true), sink, recent, group)};
}

struct Diff {
  double rel_rms = 0, max_excess = 0, frac_outside = 0;
  bool finite = true;
};

inline Diff Compare(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  Diff r;
  double num = 0, den = 0;
  size_t outside = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (!std::isfinite(gpu[i])) r.finite = false;
    const double e = std::fabs(double{gpu[i]} - cpu[i]), bound = 2e-3 * (1 + std::fabs(cpu[i]));
    num += e * e;
    den += double{cpu[i]} * cpu[i];
    if (!(e <= bound)) ++outside;
    r.max_excess = std::max(r.max_excess, e / bound);
  }
  r.rel_rms = std::sqrt(num / std::max(den, 1e-30));
  r.frac_outside = double(outside) / cpu.size();
  return r;
}

// The real model's per-layer inputs for one val.txt window of 700 tokens (not a page multiple).
inline std::vector<LayerInputs> RealLayers(const Model& model, uint32_t tokens) {
  auto text = ReadFileBytes(RefModelDir() + "/val.txt");
  EXPECT_TRUE(text.ok()) << text.status();
  std::vector<int32_t> ids(tokens);
  for (uint32_t i = 0; i < tokens; ++i) ids[i] = (*text)[12345 + i];
  std::vector<LayerInputs> layers;
  MixedPrecisionAttention bf16(KvCodec::Bf16());
  std::vector<float> logits;
  absl::Status s = model.Forward(ids, bf16, &logits,
                                 [&](const AttentionInputs& in) { layers.push_back(Own(in)); });
  EXPECT_TRUE(s.ok()) << s;
  return layers;
}

}  // namespace oscarkv::engine::testing
