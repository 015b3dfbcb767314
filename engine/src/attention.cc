#include "oscarkv/engine/attention.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "oscarkv/kernels/numeric.h"

namespace oscarkv::engine {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using MutMap = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;

constexpr uint32_t kBlock = 128;  // query rows per task

// One KV head's stored rows in the codec's (rotated) space: hi = BF16, lo = INT2 dequantized.
struct HeadRows {
  RowMat k_hi, k_lo, v_hi, v_lo;
};

// Gathers rows [tokens][heads][d] of one head into a dense [tokens][d] matrix.
RowMat Gather(const float* src, uint32_t tokens, uint32_t heads, uint32_t head, uint32_t d) {
  return ConstMap(src + size_t{head} * d, tokens, d, Eigen::OuterStride<>(size_t{heads} * d));
}

}  // namespace

extern "C" void openblas_set_num_threads(int);

void UseSingleThreadedBlas() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

MixedPrecisionAttention::MixedPrecisionAttention(KvCodec codec) : codec_(std::move(codec)) {
  UseSingleThreadedBlas();
}

void QuantizeDequantizeRow(const RotationSet& rotations, uint32_t layer, KV kv, uint32_t head,
                           uint32_t group, float* row) {
  const uint32_t d = rotations.head_dim();
  ClipRowAtQuantile(std::span<float>(row, d), rotations.clip(layer, kv, head));
  uint8_t codes[256 / 4];
  uint16_t params[2 * 256 / 32];
  QuantizeRowInt2(row, d, group, rotations.range_mode(layer, kv, head), codes, params);
  DequantizeRowInt2(codes, params, d, group, row);
}

void QuantizeDequantizeRow(float* row, uint32_t d, uint32_t group, float clip, RangeMode mode) {
  ClipRowAtQuantile(std::span<float>(row, d), clip);
  uint8_t codes[256 / 4];
  uint16_t params[2 * 256 / 32];
  QuantizeRowInt2(row, d, group, mode, codes, params);
  DequantizeRowInt2(codes, params, d, group, row);
}

absl::Status MixedPrecisionAttention::Attend(const AttentionInputs& in, float* out) {
  const uint32_t T = in.tokens, d = in.head_dim, Hq = in.num_q_heads, Hkv = in.num_kv_heads;
  const uint32_t group_heads = Hq / Hkv;
  const KvCodec& c = codec_;
  const RotationSet* rot = c.rotations.get();
  if (c.int2) {
    if (rot == nullptr) return absl::InvalidArgumentError("INT2 codec without rotations");
    if (rot->head_dim() != d || rot->kv_heads() != Hkv || in.layer >= rot->layers()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rotation set shape (", rot->layers(), " layers, ", rot->kv_heads(), " KV heads, d=",
          rot->head_dim(), ") does not match the model"));
    }
    if (d % c.group != 0 || d > 256 || c.group < 32) {
      return absl::InvalidArgumentError(absl::StrCat("group ", c.group, " for head_dim ", d));
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  // 1. Stored rows per KV head (rotated, rounded / quantized).
  std::vector<HeadRows> rows(Hkv);
  std::vector<RowMat> rk(Hkv), rv(Hkv);
  for (uint32_t h = 0; h < Hkv; ++h) {
    RowMat k = Gather(in.k, T, Hkv, h, d), v = Gather(in.v, T, Hkv, h, d);
    if (c.int2) {
      rk[h] = Eigen::Map<const RowMat>(rot->matrix(in.layer, KV::kKey, h), d, d);
      rv[h] = Eigen::Map<const RowMat>(rot->matrix(in.layer, KV::kValue, h), d, d);
      k = k * rk[h];
      v = v * rv[h];
    }
    rows[h].k_hi = k.unaryExpr([](float x) { return RoundToBf16(x); });
    rows[h].v_hi = v.unaryExpr([](float x) { return RoundToBf16(x); });
    if (c.int2) {
      rows[h].k_lo = k;
      rows[h].v_lo = v;
    }
  }
  if (c.int2) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t{T} * Hkv; ++i) {
      const uint32_t h = static_cast<uint32_t>(i % Hkv), t = static_cast<uint32_t>(i / Hkv);
      QuantizeDequantizeRow(*rot, in.layer, KV::kKey, h, c.group, rows[h].k_lo.row(t).data());
      QuantizeDequantizeRow(*rot, in.layer, KV::kValue, h, c.group, rows[h].v_lo.row(t).data());
    }
  }

  // 2. Blocked causal attention, one task per (query head, block of query rows).
  const uint32_t blocks = (T + kBlock - 1) / kBlock;
  const uint32_t sink = c.int2 ? c.sink : T, recent = c.recent;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < int64_t{Hq} * blocks; ++task) {
    const uint32_t j = static_cast<uint32_t>(task % Hq);
    const uint32_t b = blocks - 1 - static_cast<uint32_t>(task / Hq);  // big blocks first
    const uint32_t h = j / group_heads;
    const uint32_t t0 = b * kBlock, t1 = std::min(T, t0 + kBlock), B = t1 - t0;
    const HeadRows& hr = rows[h];
    RowMat q = ConstMap(in.q + (size_t{t0} * Hq + j) * d, B, d, Eigen::OuterStride<>(size_t{Hq} * d));
    if (c.int2) q = q * rk[h];
    // Column ranges: [0, s_end) sink (hi); [sink, lo_end) may be lo; [band, t1) may be hi.
    const uint32_t s_end = std::min(sink, t1);
    const uint32_t lo_end = (c.int2 && t1 > recent) ? std::max(sink, t1 - recent) : sink;
    const uint32_t hi_start = t0 + 1 > recent ? t0 + 1 - recent : 0;
    const uint32_t band = std::min(t1, std::max(hi_start, s_end));
    RowMat S(B, t1);
    if (s_end > 0) S.leftCols(s_end).noalias() = q * hr.k_hi.topRows(s_end).transpose();
    if (lo_end > sink) {
      S.middleCols(sink, lo_end - sink).noalias() =
          q * hr.k_lo.middleRows(sink, lo_end - sink).transpose();
    }
    if (t1 > band) {
      RowMat hi = q * hr.k_hi.middleRows(band, t1 - band).transpose();
      for (uint32_t r = 0; r < B; ++r) {
        const int64_t lo_below = int64_t{t0 + r} + 1 - int64_t{recent};  // s < this is lo
        for (uint32_t s = band; s < t1; ++s) {
          if (s >= lo_end || int64_t{s} >= lo_below) S(r, s) = hi(r, s - band);
        }
      }
    }
    // Softmax over s <= t (vectorised exp).
    S *= scale;
    for (uint32_t r = 0; r < B; ++r) {
      const uint32_t n = t0 + r + 1;
      auto row = S.row(r).head(n).array();
      const float mx = row.maxCoeff();
      row = (row - mx).exp();
      row *= 1.0f / row.sum();
      if (n < t1) S.row(r).tail(t1 - n).setZero();
    }
    // Output = P_sink V_hi + P_lo V_lo + P_band V_hi (split where the band overlaps lo).
    RowMat o = RowMat::Zero(B, d);
    if (s_end > 0) o.noalias() += S.leftCols(s_end) * hr.v_hi.topRows(s_end);
    if (t1 > band) {
      RowMat p_hi = S.middleCols(band, t1 - band);
      for (uint32_t r = 0; r < B; ++r) {
        const int64_t lo_below = int64_t{t0 + r} + 1 - int64_t{recent};
        for (uint32_t s = band; s < std::min(t1, lo_end); ++s) {
          if (int64_t{s} < lo_below) {
            p_hi(r, s - band) = 0.0f;  // this entry is read from INT2 below
          } else {
            S(r, s) = 0.0f;  // read from BF16 here, drop from the INT2 product
          }
        }
      }
      o.noalias() += p_hi * hr.v_hi.middleRows(band, t1 - band);
    }
    if (lo_end > sink) {
      o.noalias() += S.middleCols(sink, lo_end - sink) * hr.v_lo.middleRows(sink, lo_end - sink);
    }
    if (c.int2) o = o * rv[h].transpose();
    MutMap(out + (size_t{t0} * Hq + j) * d, B, d, Eigen::OuterStride<>(size_t{Hq} * d)) = o;
  }
  return absl::OkStatus();
}

}  // namespace oscarkv::engine
