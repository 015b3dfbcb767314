// Rotations: the normalised Walsh-Hadamard matrix, the bit-reversal permutation, the OSCAR
// composition R = U * H * P_br, and RotationSet -- the per (layer, K|V, KV head) rotations and
// clip ratios that a codec profile refers to by digest.
//
// Convention: rows are rotated on the right, x' = x * R (R is d x d, row-major). R is
// orthogonal, so q.k = (qR).(kR) and a value-space output o' is mapped back by o = o' * R^T.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/quantize.h"

namespace oscarkv {

// Row-major d x d Sylvester Hadamard divided by sqrt(d); d a power of two.
std::vector<float> HadamardMatrix(uint32_t d);
// perm[i] = i with its log2(d) bits reversed; an involution.
std::vector<uint32_t> BitReversalPermutation(uint32_t d);
// R = U * H * P with P[i][perm[i]] = 1, so column j of R is column perm[j] of U*H.
// U is row-major d x d (eigenvectors as columns, sorted by descending eigenvalue).
std::vector<float> ComposeOscarRotation(std::span<const float> u, uint32_t d);

// out[j] = sum_i x[i] * r[i*d + j]
void RotateRow(const float* x, const float* r, uint32_t d, float* out);
// out[i] = sum_j x[j] * r[i*d + j]   (multiplication by R^T)
void UnrotateRow(const float* x, const float* r, uint32_t d, float* out);

enum class KV : uint32_t { kKey = 0, kValue = 1 };

// Rotations and clip ratios for every (layer, K|V, KV head). Immutable once built; safe to
// share across threads.
class RotationSet {
 public:
  // Identity rotations (naive INT2) with the given clip ratio (1 = no clip).
  static RotationSet Identity(uint32_t layers, uint32_t kv_heads, uint32_t d, float clip_k = 1,
                              float clip_v = 1);
  // Hadamard rotations (QuaRot-style) with the given clip ratio.
  static RotationSet Hadamard(uint32_t layers, uint32_t kv_heads, uint32_t d, float clip_k = 1,
                              float clip_v = 1);
  // From explicit data: matrices [layers][2][kv_heads][d][d], clips [layers][2][kv_heads].
  static absl::StatusOr<RotationSet> FromData(uint32_t layers, uint32_t kv_heads, uint32_t d,
                                              std::vector<float> matrices,
                                              std::vector<float> clips);

  uint32_t layers() const { return layers_; }
  uint32_t kv_heads() const { return kv_heads_; }
  uint32_t head_dim() const { return d_; }
  const float* matrix(uint32_t layer, KV kv, uint32_t head) const {
    return matrices_.data() + Index(layer, kv, head) * d_ * d_;
  }
  float clip(uint32_t layer, KV kv, uint32_t head) const { return clips_[Index(layer, kv, head)]; }
  void set_clip(uint32_t layer, KV kv, uint32_t head, float c) { clips_[Index(layer, kv, head)] = c; }
  // Write-time range selection of INT2 rows (quantize.h); kMinMax unless set.
  RangeMode range_mode(uint32_t layer, KV kv, uint32_t head) const {
    return range_modes_.empty() ? RangeMode::kMinMax
                                : static_cast<RangeMode>(range_modes_[Index(layer, kv, head)]);
  }
  void set_range_mode(uint32_t layer, KV kv, uint32_t head, RangeMode m) {
    if (range_modes_.empty()) range_modes_.assign(clips_.size(), 0);
    range_modes_[Index(layer, kv, head)] = static_cast<uint8_t>(m);
  }
  bool has_range_modes() const {
    for (uint8_t m : range_modes_) {
      if (m != 0) return true;
    }
    return false;
  }
  const std::vector<float>& matrices() const { return matrices_; }
  const std::vector<float>& clips() const { return clips_; }

  // SHA-256 over "OSCARKV-ROT-V1", u32le layers, kv_heads, d, the matrices then the clips as
  // little-endian fp32, then -- only when some range mode is not kMinMax -- "RANGE" and one
  // byte per (layer, K|V, head) in clip order. Enters CodecProfile::rotation_digest.
  Sha256Digest Digest() const;

 private:
  size_t Index(uint32_t layer, KV kv, uint32_t head) const {
    return (size_t{layer} * 2 + static_cast<uint32_t>(kv)) * kv_heads_ + head;
  }
  uint32_t layers_ = 0, kv_heads_ = 0, d_ = 0;
  std::vector<float> matrices_;
  std::vector<float> clips_;
  std::vector<uint8_t> range_modes_;  // empty: all kMinMax
};

}  // namespace oscarkv
