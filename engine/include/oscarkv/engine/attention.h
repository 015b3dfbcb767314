// The seam between the model and its KV cache. The model hands a backend one layer's queries,
// keys and values for a whole teacher-forced sequence; the backend stores K/V through a codec
// and returns the attention output. The CPU backend here (MixedPrecisionAttention) is the
// reference; a GPU backend through kernels/cuda implements the same interface.
//
// Decode semantics in teacher-forced evaluation: for query position t and key position s <= t,
// the key/value is read in BF16 when s < sink or s >= t + 1 - recent (the last `recent`
// positions up to and including t), and as the INT2 dequantized row otherwise. All rows a codec
// stores are rotated (R_K for keys, R_V for values); BF16 rows are the rotated rows rounded to
// bf16. The query is rotated by R_K, the output mapped back by R_V^T.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "oscarkv/kernels/quantize.h"
#include "oscarkv/kernels/rotation.h"

namespace oscarkv::engine {

struct AttentionInputs {
  uint32_t layer = 0;
  uint32_t tokens = 0;  // positions [0, tokens)
  uint32_t num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  const float* q = nullptr;  // [tokens][num_q_heads][head_dim], post q_norm and RoPE
  const float* k = nullptr;  // [tokens][num_kv_heads][head_dim], post k_norm and RoPE
  const float* v = nullptr;  // [tokens][num_kv_heads][head_dim]
};

// How a KV cache stores rows.
struct KvCodec {
  std::string name = "bf16";
  bool int2 = false;  // false: every row BF16 (unrotated, no windows needed)
  std::shared_ptr<const RotationSet> rotations;  // required when int2
  uint32_t sink = 64, recent = 256, group = 128;

  static KvCodec Bf16() { return KvCodec{}; }
  static KvCodec Int2(std::string name, std::shared_ptr<const RotationSet> rotations,
                      uint32_t sink, uint32_t recent, uint32_t group) {
    KvCodec c;
    c.name = std::move(name);
    c.int2 = true;
    c.rotations = std::move(rotations);
    c.sink = sink;
    c.recent = recent;
    c.group = group;
    return c;
  }
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  // out: [tokens][num_q_heads][head_dim], in the model's (unrotated) value space.
  virtual absl::Status Attend(const AttentionInputs& in, float* out) = 0;
};

// Reference CPU backend: causal softmax attention with the codec's mixed-precision reads,
// blocked over query rows and parallel over heads (OpenMP). Stateless between calls.
class MixedPrecisionAttention : public AttentionBackend {
 public:
  explicit MixedPrecisionAttention(KvCodec codec);
  absl::Status Attend(const AttentionInputs& in, float* out) override;
  const KvCodec& codec() const { return codec_; }

 private:
  KvCodec codec_;
};

// The engine parallelises with OpenMP above BLAS, so BLAS itself must run single-threaded;
// Model::Load and the CPU backend call this (idempotent).
void UseSingleThreadedBlas();

// The codec's INT2 write path for one rotated row (clip at the set's ratio, quantize with the
// set's range mode, dequantize) in place. Exposed for calibration and tests.
void QuantizeDequantizeRow(const RotationSet& rotations, uint32_t layer, KV kv, uint32_t head,
                           uint32_t group, float* row);
// The same with an explicit clip ratio and range mode (head_dim <= 256, group >= 32).
void QuantizeDequantizeRow(float* row, uint32_t d, uint32_t group, float clip, RangeMode mode);

}  // namespace oscarkv::engine
