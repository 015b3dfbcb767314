#include "oscarkv/engine/model.h"

#include <omp.h>

#include <Eigen/Core>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "oscarkv/engine/safetensors.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::engine {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat>;
using MutMap = Eigen::Map<RowMat>;

// y[n][out] = x[n][in] * W^T, W row-major [out][in]. Rows are split across OpenMP threads;
// each slice is one single-threaded BLAS call (Eigen forwards products to BLAS).
void Linear(const float* x, uint32_t n, uint32_t in, const std::vector<float>& w, uint32_t out,
            float* y) {
  const int64_t chunks = std::min<int64_t>(omp_get_max_threads(), (n + 63) / 64);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const uint32_t r0 = static_cast<uint32_t>(n * c / chunks), r1 = static_cast<uint32_t>(n * (c + 1) / chunks);
    if (r1 == r0) continue;
    ConstMap X(x + size_t{r0} * in, r1 - r0, in), W(w.data(), out, in);
    MutMap Y(y + size_t{r0} * out, r1 - r0, out);
    Y.noalias() = X * W.transpose();
  }
}

void RmsNorm(const float* x, uint32_t n, uint32_t dim, const std::vector<float>& w, double eps,
             float* y) {
  for (uint32_t i = 0; i < n; ++i) {
    const float* r = x + size_t{i} * dim;
    float* o = y + size_t{i} * dim;
    float ss = 0.0f;
    for (uint32_t j = 0; j < dim; ++j) ss += r[j] * r[j];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + static_cast<float>(eps));
    for (uint32_t j = 0; j < dim; ++j) o[j] = w[j] * (r[j] * inv);
  }
}

absl::StatusOr<uint32_t> U32(const nlohmann::json& j, const char* key, bool required,
                             uint32_t def = 0) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("config.json: missing ", key));
    return def;
  }
  if (!j[key].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", key, " is not an integer"));
  }
  return j[key].get<uint32_t>();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJsonFile(const std::string& path) {
  OSCARKV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON"));
  ModelConfig c;
  const std::string type = j.value("model_type", "");
  if (type != "qwen3") {
    return absl::UnimplementedError(
        absl::StrCat(path, ": model_type '", type, "' (this engine runs qwen3 checkpoints)"));
  }
  OSCARKV_ASSIGN_OR_RETURN(c.vocab_size, U32(j, "vocab_size", true));
  OSCARKV_ASSIGN_OR_RETURN(c.hidden_size, U32(j, "hidden_size", true));
  OSCARKV_ASSIGN_OR_RETURN(c.intermediate_size, U32(j, "intermediate_size", true));
  OSCARKV_ASSIGN_OR_RETURN(c.num_layers, U32(j, "num_hidden_layers", true));
  OSCARKV_ASSIGN_OR_RETURN(c.num_q_heads, U32(j, "num_attention_heads", true));
  OSCARKV_ASSIGN_OR_RETURN(c.num_kv_heads, U32(j, "num_key_value_heads", false, c.num_q_heads));
  OSCARKV_ASSIGN_OR_RETURN(c.head_dim, U32(j, "head_dim", false, c.hidden_size / c.num_q_heads));
  OSCARKV_ASSIGN_OR_RETURN(c.max_positions, U32(j, "max_position_embeddings", false, 32768));
  c.rope_theta = j.value("rope_theta", 10000.0);
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    return absl::UnimplementedError(absl::StrCat(path, ": rope_scaling is not supported"));
  }
  if (c.num_kv_heads == 0 || c.num_q_heads % c.num_kv_heads != 0 || c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": inconsistent head counts"));
  }
  c.model_id = std::filesystem::path(path).parent_path().filename().string();
  if (j.contains("_name_or_path") && j["_name_or_path"].is_string() &&
      !j["_name_or_path"].get<std::string>().empty()) {
    c.model_id = j["_name_or_path"].get<std::string>();
  }
  return c;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir) {
  UseSingleThreadedBlas();
  auto m = std::unique_ptr<Model>(new Model);
  OSCARKV_ASSIGN_OR_RETURN(m->config_,
                           ModelConfig::FromJsonFile((std::filesystem::path(dir) / "config.json").string()));
  const ModelConfig& c = m->config_;
  OSCARKV_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(dir));
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim(),
                D = c.head_dim, V = c.vocab_size;
  OSCARKV_ASSIGN_OR_RETURN(m->embed_, ckpt->GetF32("model.embed_tokens.weight", {V, H}));
  OSCARKV_ASSIGN_OR_RETURN(m->final_norm_, ckpt->GetF32("model.norm.weight", {H}));
  if (!c.tie_word_embeddings || ckpt->Has("lm_head.weight")) {
    if (ckpt->Has("lm_head.weight")) {
      OSCARKV_ASSIGN_OR_RETURN(m->lm_head_, ckpt->GetF32("lm_head.weight", {V, H}));
    } else if (!c.tie_word_embeddings) {
      return absl::NotFoundError(absl::StrCat(dir, ": untied model without lm_head.weight"));
    }
  }
  m->layers_.resize(c.num_layers);
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerWeights& w = m->layers_[l];
    OSCARKV_ASSIGN_OR_RETURN(w.wq, ckpt->GetF32(p + "self_attn.q_proj.weight", {Q, H}));
    OSCARKV_ASSIGN_OR_RETURN(w.wk, ckpt->GetF32(p + "self_attn.k_proj.weight", {KV, H}));
    OSCARKV_ASSIGN_OR_RETURN(w.wv, ckpt->GetF32(p + "self_attn.v_proj.weight", {KV, H}));
    OSCARKV_ASSIGN_OR_RETURN(w.wo, ckpt->GetF32(p + "self_attn.o_proj.weight", {H, Q}));
    OSCARKV_ASSIGN_OR_RETURN(w.q_norm, ckpt->GetF32(p + "self_attn.q_norm.weight", {D}));
    OSCARKV_ASSIGN_OR_RETURN(w.k_norm, ckpt->GetF32(p + "self_attn.k_norm.weight", {D}));
    OSCARKV_ASSIGN_OR_RETURN(w.input_norm, ckpt->GetF32(p + "input_layernorm.weight", {H}));
    OSCARKV_ASSIGN_OR_RETURN(w.post_attention_norm,
                             ckpt->GetF32(p + "post_attention_layernorm.weight", {H}));
    OSCARKV_ASSIGN_OR_RETURN(w.gate, ckpt->GetF32(p + "mlp.gate_proj.weight", {I, H}));
    OSCARKV_ASSIGN_OR_RETURN(w.up, ckpt->GetF32(p + "mlp.up_proj.weight", {I, H}));
    OSCARKV_ASSIGN_OR_RETURN(w.down, ckpt->GetF32(p + "mlp.down_proj.weight", {H, I}));
    if (ckpt->Has(p + "self_attn.q_proj.bias") || ckpt->Has(p + "self_attn.k_proj.bias")) {
      return absl::UnimplementedError("attention biases are not supported");
    }
  }
  // Same arithmetic as HF: inv_freq in fp32 from theta^(2i/d).
  m->inv_freq_.resize(D / 2);
  for (int64_t i = 0; i < D / 2; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(D);
    m->inv_freq_[i] = 1.0f / static_cast<float>(std::pow(c.rope_theta, static_cast<double>(expo)));
  }
  return m;
}

void Model::Embed(std::span<const int32_t> tokens, float* x) const {
  const uint32_t H = config_.hidden_size;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::copy_n(embed_.data() + size_t(tokens[i]) * H, H, x + i * H);
  }
}

void Model::AttentionProjections(uint32_t l, const float* x, uint32_t n,
                                 const uint32_t* positions, float* q, float* k, float* v) const {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[l];
  const uint32_t H = c.hidden_size, D = c.head_dim, half = D / 2;
  std::vector<float> h(size_t{n} * H);
  RmsNorm(x, n, H, w.input_norm, c.rms_norm_eps, h.data());
  Linear(h.data(), n, H, w.wq, c.q_dim(), q);
  Linear(h.data(), n, H, w.wk, c.kv_dim(), k);
  Linear(h.data(), n, H, w.wv, c.kv_dim(), v);
  // Per-head RMSNorm then rotate-half RoPE, in place.
  auto norm_rope = [&](float* buf, uint32_t heads, const std::vector<float>& nw) {
#pragma omp parallel for schedule(static) if (n >= 16)
    for (int64_t i = 0; i < int64_t{n}; ++i) {
      std::vector<float> tmp(D);
      for (uint32_t hh = 0; hh < heads; ++hh) {
        float* r = buf + (size_t(i) * heads + hh) * D;
        RmsNorm(r, 1, D, nw, c.rms_norm_eps, tmp.data());
        const float pos = static_cast<float>(positions[i]);
        for (uint32_t j = 0; j < half; ++j) {
          const float f = pos * inv_freq_[j];
          const float cs = std::cos(f), sn = std::sin(f);
          const float a = tmp[j], b = tmp[j + half];
          r[j] = a * cs - b * sn;
          r[j + half] = b * cs + a * sn;
        }
      }
    }
  };
  norm_rope(q, c.num_q_heads, w.q_norm);
  norm_rope(k, c.num_kv_heads, w.k_norm);
}

void Model::FinishLayer(uint32_t l, const float* attn, uint32_t n, float* x) const {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[l];
  const uint32_t H = c.hidden_size, I = c.intermediate_size;
  std::vector<float> o(size_t{n} * H);
  Linear(attn, n, c.q_dim(), w.wo, H, o.data());
  for (size_t i = 0; i < o.size(); ++i) x[i] += o[i];
  std::vector<float> h(size_t{n} * H), g(size_t{n} * I), u(size_t{n} * I);
  RmsNorm(x, n, H, w.post_attention_norm, c.rms_norm_eps, h.data());
  Linear(h.data(), n, H, w.gate, I, g.data());
  Linear(h.data(), n, H, w.up, I, u.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  Linear(g.data(), n, I, w.down, H, o.data());
  for (size_t i = 0; i < o.size(); ++i) x[i] += o[i];
}

void Model::Logits(const float* x, uint32_t n, float* logits) const {
  const uint32_t H = config_.hidden_size;
  std::vector<float> h(size_t{n} * H);
  RmsNorm(x, n, H, final_norm_, config_.rms_norm_eps, h.data());
  Linear(h.data(), n, H, lm_head_.empty() ? embed_ : lm_head_, config_.vocab_size, logits);
}

absl::Status Model::Forward(std::span<const int32_t> tokens, AttentionBackend& attention,
                            std::vector<float>* logits, const LayerObserver& observer) const {
  const ModelConfig& c = config_;
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  if (n == 0) return absl::InvalidArgumentError("Forward needs at least one token");
  for (int32_t t : tokens) {
    if (t < 0 || static_cast<uint32_t>(t) >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", t, " outside the vocabulary"));
    }
  }
  std::vector<float> x(size_t{n} * c.hidden_size);
  Embed(tokens, x.data());
  std::vector<uint32_t> pos(n);
  for (uint32_t i = 0; i < n; ++i) pos[i] = i;
  std::vector<float> q(size_t{n} * c.q_dim()), k(size_t{n} * c.kv_dim()),
      v(size_t{n} * c.kv_dim()), attn(size_t{n} * c.q_dim());
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    AttentionProjections(l, x.data(), n, pos.data(), q.data(), k.data(), v.data());
    AttentionInputs in{l, n, c.num_q_heads, c.num_kv_heads, c.head_dim, q.data(), k.data(), v.data()};
    if (observer) observer(in);
    OSCARKV_RETURN_IF_ERROR(attention.Attend(in, attn.data()));
    FinishLayer(l, attn.data(), n, x.data());
  }
  logits->resize(size_t{n} * c.vocab_size);
  Logits(x.data(), n, logits->data());
  return absl::OkStatus();
}

}  // namespace oscarkv::engine
