#include "oscarkv/kernels/rotation.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace oscarkv {

std::vector<float> HadamardMatrix(uint32_t d) {
  std::vector<float> h(size_t{d} * d);
  const float norm = 1.0f / std::sqrt(static_cast<float>(d));
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t j = 0; j < d; ++j) {
      h[size_t{i} * d + j] = (std::popcount(i & j) & 1) ? -norm : norm;
    }
  }
  return h;
}

std::vector<uint32_t> BitReversalPermutation(uint32_t d) {
  const int bits = std::countr_zero(d);
  std::vector<uint32_t> perm(d);
  for (uint32_t i = 0; i < d; ++i) {
    uint32_t r = 0;
    for (int b = 0; b < bits; ++b) r |= ((i >> b) & 1u) << (bits - 1 - b);
    perm[i] = r;
  }
  return perm;
}

std::vector<float> ComposeOscarRotation(std::span<const float> u, uint32_t d) {
  const std::vector<float> h = HadamardMatrix(d);
  std::vector<double> uh(size_t{d} * d, 0.0);
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t k = 0; k < d; ++k) {
      const double a = u[size_t{i} * d + k];
      for (uint32_t j = 0; j < d; ++j) uh[size_t{i} * d + j] += a * h[size_t{k} * d + j];
    }
  }
  const std::vector<uint32_t> perm = BitReversalPermutation(d);
  std::vector<float> r(size_t{d} * d);
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t j = 0; j < d; ++j) r[size_t{i} * d + j] = static_cast<float>(uh[size_t{i} * d + perm[j]]);
  }
  return r;
}

void RotateRow(const float* x, const float* r, uint32_t d, float* out) {
  for (uint32_t j = 0; j < d; ++j) out[j] = 0.0f;
  for (uint32_t i = 0; i < d; ++i) {
    const float xi = x[i];
    const float* row = r + size_t{i} * d;
    for (uint32_t j = 0; j < d; ++j) out[j] += xi * row[j];
  }
}

void UnrotateRow(const float* x, const float* r, uint32_t d, float* out) {
  for (uint32_t i = 0; i < d; ++i) {
    const float* row = r + size_t{i} * d;
    float acc = 0.0f;
    for (uint32_t j = 0; j < d; ++j) acc += x[j] * row[j];
    out[i] = acc;
  }
}

namespace {

RotationSet Repeat(uint32_t layers, uint32_t kv_heads, uint32_t d, const std::vector<float>& m,
                   float clip_k, float clip_v) {
  const size_t n = size_t{layers} * 2 * kv_heads;
  std::vector<float> matrices;
  matrices.reserve(n * d * d);
  std::vector<float> clips(n);
  for (size_t i = 0; i < n; ++i) {
    matrices.insert(matrices.end(), m.begin(), m.end());
    clips[i] = ((i / kv_heads) % 2 == 0) ? clip_k : clip_v;
  }
  return *RotationSet::FromData(layers, kv_heads, d, std::move(matrices), std::move(clips));
}

}  // namespace

RotationSet RotationSet::Identity(uint32_t layers, uint32_t kv_heads, uint32_t d, float clip_k,
                                  float clip_v) {
  std::vector<float> eye(size_t{d} * d, 0.0f);
  for (uint32_t i = 0; i < d; ++i) eye[size_t{i} * d + i] = 1.0f;
  return Repeat(layers, kv_heads, d, eye, clip_k, clip_v);
}

RotationSet RotationSet::Hadamard(uint32_t layers, uint32_t kv_heads, uint32_t d, float clip_k,
                                  float clip_v) {
  return Repeat(layers, kv_heads, d, HadamardMatrix(d), clip_k, clip_v);
}

absl::StatusOr<RotationSet> RotationSet::FromData(uint32_t layers, uint32_t kv_heads, uint32_t d,
                                                  std::vector<float> matrices,
                                                  std::vector<float> clips) {
  const size_t n = size_t{layers} * 2 * kv_heads;
  if (layers == 0 || kv_heads == 0 || d == 0) {
    return absl::InvalidArgumentError("rotation set needs layers, kv_heads and head_dim > 0");
  }
  if (matrices.size() != n * d * d) {
    return absl::InvalidArgumentError(absl::StrCat("rotation matrices: expected ", n * d * d,
                                                   " floats, got ", matrices.size()));
  }
  if (clips.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip ratios: expected ", n, " values, got ", clips.size()));
  }
  for (float c : clips) {
    if (!(c > 0.0f && c <= 1.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("clip ratio ", c, " outside (0, 1]"));
    }
  }
  RotationSet s;
  s.layers_ = layers;
  s.kv_heads_ = kv_heads;
  s.d_ = d;
  s.matrices_ = std::move(matrices);
  s.clips_ = std::move(clips);
  return s;
}

Sha256Digest RotationSet::Digest() const {
  std::string buf = "OSCARKV-ROT-V1";
  for (uint32_t v : {layers_, kv_heads_, d_}) {
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  buf.append(reinterpret_cast<const char*>(matrices_.data()), matrices_.size() * sizeof(float));
  buf.append(reinterpret_cast<const char*>(clips_.data()), clips_.size() * sizeof(float));
  if (has_range_modes()) {
    buf += "RANGE";
    buf.append(reinterpret_cast<const char*>(range_modes_.data()), range_modes_.size());
  }
  return Sha256(buf.data(), buf.size());
}

}  // namespace oscarkv
