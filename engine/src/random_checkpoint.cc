#include "oscarkv/engine/random_checkpoint.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "oscarkv/engine/safetensors.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::engine {
namespace {

constexpr uint32_t kVocab = 256;  // byte tokens

// fp32 -> bf16, round to nearest even (the weights are finite by construction).
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

class Weights {
 public:
  explicit Weights(uint64_t seed) : rng_(seed) {}

  // n values uniform in [-a, a]: 24 random bits per value, scaled exactly, so every platform
  // produces the same floats.
  std::vector<float> Uniform(size_t n, float a) {
    std::vector<float> v(n);
    for (auto& x : v) {
      const auto bits = static_cast<int64_t>(rng_() >> 40);                // [0, 2^24)
      x = a * (static_cast<float>(bits - (int64_t{1} << 23)) / 8388608.0f);  // [-a, a)
    }
    return v;
  }

  // A linear layer's [out, in] weight with unit-variance outputs for unit-variance inputs.
  std::vector<float> Linear(uint32_t out, uint32_t in) {
    return Uniform(size_t{out} * in, std::sqrt(3.0f / static_cast<float>(in)));
  }

  void Add(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    std::vector<uint16_t> bf(v.size());
    for (size_t i = 0; i < v.size(); ++i) bf[i] = ToBf16(v[i]);
    writer_.Add(name, DType::kBF16, std::move(shape), bf.data(), bf.size() * 2);
  }

  SafetensorsWriter& writer() { return writer_; }

 private:
  std::mt19937_64 rng_;
  SafetensorsWriter writer_;
};

}  // namespace

absl::Status WriteRandomCheckpoint(const std::string& dir, const RandomCheckpointOptions& o) {
  if (o.num_layers == 0 || o.hidden_size == 0 || o.intermediate_size == 0 ||
      o.num_kv_heads == 0 || o.num_q_heads % o.num_kv_heads != 0 || o.head_dim % 2 != 0 ||
      o.head_dim == 0) {
    return absl::InvalidArgumentError("random checkpoint: inconsistent shape");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));

  nlohmann::json config = {
      {"model_type", "qwen3"},
      {"architectures", {"Qwen3ForCausalLM"}},
      {"_name_or_path", o.model_id},
      {"vocab_size", kVocab},
      {"hidden_size", o.hidden_size},
      {"intermediate_size", o.intermediate_size},
      {"num_hidden_layers", o.num_layers},
      {"num_attention_heads", o.num_q_heads},
      {"num_key_value_heads", o.num_kv_heads},
      {"head_dim", o.head_dim},
      {"rope_theta", 1000000.0},
      {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", o.max_positions},
      {"tie_word_embeddings", false},
      {"hidden_act", "silu"},
      {"torch_dtype", "bfloat16"},
      {"attention_bias", false},
      {"oscarkv_random_seed", o.seed},
  };
  const std::string config_text = config.dump(1) + "\n";
  OSCARKV_RETURN_IF_ERROR(WriteFileBytes((std::filesystem::path(dir) / "config.json").string(),
                                         config_text.data(), config_text.size()));

  const int64_t H = o.hidden_size, I = o.intermediate_size, D = o.head_dim,
                Q = int64_t{o.num_q_heads} * D, KV = int64_t{o.num_kv_heads} * D;
  Weights w(o.seed);
  const std::vector<float> ones_h(H, 1.0f), ones_d(D, 1.0f);
  w.Add("model.embed_tokens.weight", {kVocab, H}, w.Uniform(size_t{kVocab} * H, 1.7f));
  for (uint32_t l = 0; l < o.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    w.Add(p + "self_attn.q_proj.weight", {Q, H}, w.Linear(Q, H));
    w.Add(p + "self_attn.k_proj.weight", {KV, H}, w.Linear(KV, H));
    w.Add(p + "self_attn.v_proj.weight", {KV, H}, w.Linear(KV, H));
    // Residual branches scaled down so the stream stays dominated by the embedding.
    std::vector<float> wo = w.Linear(H, Q), down = w.Linear(H, I);
    for (auto& x : wo) x *= 0.5f;
    for (auto& x : down) x *= 0.5f;
    w.Add(p + "self_attn.o_proj.weight", {H, Q}, wo);
    w.Add(p + "self_attn.q_norm.weight", {D}, ones_d);
    w.Add(p + "self_attn.k_norm.weight", {D}, ones_d);
    w.Add(p + "input_layernorm.weight", {H}, ones_h);
    w.Add(p + "post_attention_layernorm.weight", {H}, ones_h);
    w.Add(p + "mlp.gate_proj.weight", {I, H}, w.Linear(I, H));
    w.Add(p + "mlp.up_proj.weight", {I, H}, w.Linear(I, H));
    w.Add(p + "mlp.down_proj.weight", {H, I}, down);
  }
  w.Add("model.norm.weight", {H}, ones_h);
  // The head: rows of non-printable bytes are zero (logit 0), printable ASCII rows random with
  // a wide spread, so the greedy token is printable ASCII with overwhelming probability.
  std::vector<float> head = w.Uniform(size_t{kVocab} * H, 4.0f * std::sqrt(3.0f / H));
  for (uint32_t t = 0; t < kVocab; ++t) {
    if (t >= 32 && t < 127) continue;
    std::fill_n(head.begin() + int64_t{t} * H, H, 0.0f);
  }
  w.Add("lm_head.weight", {kVocab, H}, head);
  w.writer().SetMetadata("format", "pt");
  return w.writer().WriteTo((std::filesystem::path(dir) / "model.safetensors").string());
}

}  // namespace oscarkv::engine
