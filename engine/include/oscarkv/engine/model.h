// The reference engine's model: a Qwen3-style decoder loaded from a Hugging Face checkpoint
// folder (config.json + safetensors, sharded or not). Weights are bf16 (or f16/f32) on disk and
// held as fp32 in memory; every product accumulates in fp32.
//
// Supported Qwen3 features: GQA (num_key_value_heads), per-head q/k RMSNorm before RoPE,
// rotate-half RoPE with configurable theta, SwiGLU MLP, tied or untied embeddings.
//
// The model computes everything except attention itself, which goes through an
// AttentionBackend (attention.h): that is where the KV cache and its codec live. A Model is
// immutable after Load; Forward may run concurrently from several threads only with distinct
// backends (it parallelises internally with OpenMP).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/engine/attention.h"

namespace oscarkv::engine {

struct ModelConfig {
  std::string model_id;  // the checkpoint folder's name unless config.json says otherwise
  uint32_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  uint32_t num_q_heads = 0, num_kv_heads = 0, head_dim = 0, max_positions = 0;
  double rope_theta = 10000.0, rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;

  static absl::StatusOr<ModelConfig> FromJsonFile(const std::string& path);
  uint32_t q_dim() const { return num_q_heads * head_dim; }
  uint32_t kv_dim() const { return num_kv_heads * head_dim; }
};

struct LayerWeights {
  // Row-major [out, in] as stored by HF.
  std::vector<float> wq, wk, wv, wo, gate, up, down;
  std::vector<float> input_norm, post_attention_norm, q_norm, k_norm;
};

// Called once per layer during Forward with that layer's post-norm, post-RoPE q/k and v.
using LayerObserver = std::function<void(const AttentionInputs&)>;

class Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir);

  const ModelConfig& config() const { return config_; }
  const LayerWeights& layer(uint32_t l) const { return layers_[l]; }
  // For checkpoint rewrites (V-rotation absorption) and tests.
  LayerWeights& mutable_layer(uint32_t l) { return layers_[l]; }

  // Teacher-forced forward over `tokens` at positions [0, n). Writes logits [n][vocab].
  absl::Status Forward(std::span<const int32_t> tokens, AttentionBackend& attention,
                       std::vector<float>* logits, const LayerObserver& observer = {}) const;

  // Building blocks (used by Forward and by the incremental decoder). Row-major buffers of
  // `n` tokens; `positions[i]` is the RoPE position of row i.
  void Embed(std::span<const int32_t> tokens, float* x) const;                  // [n][hidden]
  void AttentionProjections(uint32_t l, const float* x, uint32_t n, const uint32_t* positions,
                            float* q, float* k, float* v) const;  // q [n][Hq*d], k,v [n][Hkv*d]
  void FinishLayer(uint32_t l, const float* attn, uint32_t n, float* x) const;  // o_proj + MLP
  void Logits(const float* x, uint32_t n, float* logits) const;                  // norm + head

 private:
  ModelConfig config_;
  std::vector<float> embed_, final_norm_, lm_head_;  // lm_head_ empty when tied
  std::vector<LayerWeights> layers_;
  std::vector<float> inv_freq_;
};

}  // namespace oscarkv::engine
