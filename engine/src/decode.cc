#include "oscarkv/engine/decode.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::engine {

namespace {

// Captures the K/V of every layer during a prefill forward.
class CapturingAttention : public AttentionBackend {
 public:
  explicit CapturingAttention(std::vector<float>* raw, uint32_t capacity)
      : inner_(KvCodec::Bf16()), raw_(raw), capacity_(capacity) {}
  absl::Status Attend(const AttentionInputs& in, float* out) override {
    const size_t row = size_t{in.num_kv_heads} * in.head_dim;
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const float* src = kv == 0 ? in.k : in.v;
      float* dst = raw_->data() + (size_t{in.layer} * 2 + kv) * capacity_ * row;
      std::copy_n(src, size_t{in.tokens} * row, dst);
    }
    return inner_.Attend(in, out);
  }

 private:
  MixedPrecisionAttention inner_;
  std::vector<float>* raw_;
  uint32_t capacity_;
};

bool SamePage(const PlannedPage& a, const PlannedPage& b) {
  return a.kind == b.kind && a.first_token == b.first_token && a.token_count == b.token_count;
}

}  // namespace

Decoder::Decoder(const Model& m, CodecProfile p, std::shared_ptr<const RotationSet> r, uint32_t cap)
    : model_(m), profile_(std::move(p)), rotations_(std::move(r)), capacity_(cap) {
  const size_t n = size_t{profile_.num_layers} * 2 * cap * profile_.num_kv_heads * profile_.head_dim;
  raw_.assign(n, 0.0f);
  eff_.assign(n, 0.0f);
}

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::Create(const Model& model, CodecProfile profile,
                                                         std::shared_ptr<const RotationSet> rotations,
                                                         uint32_t capacity) {
  const ModelConfig& c = model.config();
  OSCARKV_RETURN_IF_ERROR(profile.Validate());
  if (profile.num_layers != c.num_layers || profile.num_kv_heads != c.num_kv_heads ||
      profile.head_dim != c.head_dim) {
    return absl::InvalidArgumentError("codec profile shape does not match the model");
  }
  if (!rotations || rotations->layers() != c.num_layers || rotations->kv_heads() != c.num_kv_heads ||
      rotations->head_dim() != c.head_dim) {
    return absl::InvalidArgumentError("rotation set missing or of another shape");
  }
  if (capacity == 0 || capacity > c.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("capacity must be in [1, ", c.max_positions, "]"));
  }
  return std::unique_ptr<Decoder>(new Decoder(model, std::move(profile), std::move(rotations), capacity));
}

absl::Status Decoder::SyncPages() {
  const std::vector<PlannedPage> plan = PlanSequencePages(profile_, stored_);
  SequencePages next;
  next.plan = plan;
  next.pages.resize(plan.size());
  const uint32_t L = profile_.num_layers, H = profile_.num_kv_heads, d = profile_.head_dim;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (i < pages_.plan.size() && SamePage(pages_.plan[i], plan[i])) {
      next.pages[i] = std::move(pages_.pages[i]);
      continue;
    }
    OSCARKV_ASSIGN_OR_RETURN(next.pages[i],
                             EncodePage(profile_, rotations_.get(), plan[i].kind, RawView(),
                                        plan[i].first_token, plan[i].token_count));
    OSCARKV_ASSIGN_OR_RETURN(DecodedPage dec, DecodePage(profile_, next.pages[i]));
    const KVSequenceView v = dec.view(profile_);
    for (uint32_t l = 0; l < L; ++l) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        for (uint32_t t = 0; t < plan[i].token_count; ++t) {
          for (uint32_t h = 0; h < H; ++h) {
            std::copy_n(v.row(l, kv, t, h), d, Row(eff_, l, kv, plan[i].first_token + t, h));
          }
        }
      }
    }
  }
  pages_ = std::move(next);
  return absl::OkStatus();
}

absl::Status Decoder::Prefill(std::span<const int32_t> prompt) {
  if (prompt.empty() || prompt.size() > capacity_) {
    return absl::InvalidArgumentError("prompt must have 1..capacity tokens");
  }
  tokens_.assign(prompt.begin(), prompt.end());
  CapturingAttention attn(&raw_, capacity_);
  std::vector<float> logits;
  OSCARKV_RETURN_IF_ERROR(model_.Forward(prompt, attn, &logits));
  const uint32_t V = model_.config().vocab_size;
  logits_.assign(logits.end() - V, logits.end());
  stored_ = static_cast<uint32_t>(prompt.size());
  pages_ = {};
  return SyncPages();
}

absl::Status Decoder::Resume(std::span<const int32_t> tokens, const SequencePages& pages) {
  if (tokens.size() < 2 || tokens.size() > capacity_) {
    return absl::InvalidArgumentError("resume needs 2..capacity tokens");
  }
  const uint32_t n = static_cast<uint32_t>(tokens.size()) - 1;
  const std::vector<PlannedPage> plan = PlanSequencePages(profile_, n);
  if (pages.plan.size() != plan.size() || pages.pages.size() != plan.size()) {
    return absl::InvalidArgumentError(absl::StrCat("pages do not cover ", n, " tokens"));
  }
  const uint32_t L = profile_.num_layers, H = profile_.num_kv_heads, d = profile_.head_dim;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!SamePage(plan[i], pages.plan[i])) return absl::InvalidArgumentError("unexpected page plan");
    OSCARKV_ASSIGN_OR_RETURN(DecodedPage dec, DecodePage(profile_, pages.pages[i]));
    if (dec.kind != plan[i].kind || dec.token_count != plan[i].token_count) {
      return absl::DataLossError("page kind or token count disagrees with the plan");
    }
    const KVSequenceView v = dec.view(profile_);
    for (uint32_t l = 0; l < L; ++l) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        for (uint32_t t = 0; t < plan[i].token_count; ++t) {
          for (uint32_t h = 0; h < H; ++h) {
            const float* row = v.row(l, kv, t, h);
            const uint32_t tok = plan[i].first_token + t;
            std::copy_n(row, d, Row(eff_, l, kv, tok, h));
            // Model-space rows for later flushes: R^T of what the page holds (BF16 tail rows
            // come back to within bf16 rounding of the original).
            UnrotateRow(row, rotations_->matrix(l, static_cast<KV>(kv), h), d, Row(raw_, l, kv, tok, h));
          }
        }
      }
    }
  }
  pages_ = pages;
  tokens_.assign(tokens.begin(), tokens.end());
  stored_ = n;
  return RunLast();
}

absl::Status Decoder::RunLast() {
  const ModelConfig& c = model_.config();
  const uint32_t pos = static_cast<uint32_t>(tokens_.size()) - 1;
  if (pos != stored_) return absl::InternalError("decoder state out of sync");
  if (pos >= capacity_) return absl::ResourceExhaustedError("sequence reached its capacity");
  const uint32_t d = c.head_dim, Hq = c.num_q_heads, Hkv = c.num_kv_heads, group = Hq / Hkv;
  std::vector<float> x(c.hidden_size), q(c.q_dim()), k(c.kv_dim()), v(c.kv_dim()), attn(c.q_dim());
  model_.Embed(std::span<const int32_t>(&tokens_[pos], 1), x.data());
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    model_.AttentionProjections(l, x.data(), 1, &pos, q.data(), k.data(), v.data());
    // The new token sits in the BF16 tail during its own step: it attends to its K/V rounded
    // to bf16 (rotated). Pages are re-planned after the step.
    for (uint32_t h = 0; h < Hkv; ++h) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        float* raw = Row(raw_, l, kv, pos, h);
        std::copy_n((kv == 0 ? k.data() : v.data()) + h * d, d, raw);
        float* eff = Row(eff_, l, kv, pos, h);
        RotateRow(raw, rotations_->matrix(l, static_cast<KV>(kv), h), d, eff);
        for (uint32_t i = 0; i < d; ++i) eff[i] = RoundToBf16(eff[i]);
      }
    }
    const uint32_t n = pos + 1;
    for (uint32_t j = 0; j < Hq; ++j) {
      const uint32_t h = j / group;
      std::vector<float> qr(d), acc(d, 0.0f);
      RotateRow(q.data() + j * d, rotations_->matrix(l, KV::kKey, h), d, qr.data());
      std::vector<double> s(n);
      double mx = -1e300;
      for (uint32_t t = 0; t < n; ++t) {
        const float* kr = Row(eff_, l, 0, t, h);
        double dot = 0;
        for (uint32_t i = 0; i < d; ++i) dot += double{qr[i]} * kr[i];
        s[t] = dot / std::sqrt(double(d));
        mx = std::max(mx, s[t]);
      }
      double sum = 0;
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (uint32_t t = 0; t < n; ++t) {
        const float p = static_cast<float>(s[t] / sum);
        const float* vr = Row(eff_, l, 1, t, h);
        for (uint32_t i = 0; i < d; ++i) acc[i] += p * vr[i];
      }
      UnrotateRow(acc.data(), rotations_->matrix(l, KV::kValue, h), d, attn.data() + j * d);
    }
    model_.FinishLayer(l, attn.data(), 1, x.data());
  }
  stored_ = pos + 1;
  OSCARKV_RETURN_IF_ERROR(SyncPages());
  logits_.resize(c.vocab_size);
  model_.Logits(x.data(), 1, logits_.data());
  return absl::OkStatus();
}

absl::StatusOr<int32_t> Decoder::Step() {
  if (logits_.empty()) return absl::FailedPreconditionError("Prefill or Resume first");
  const int32_t next =
      static_cast<int32_t>(std::max_element(logits_.begin(), logits_.end()) - logits_.begin());
  tokens_.push_back(next);
  OSCARKV_RETURN_IF_ERROR(RunLast());
  return next;
}

absl::StatusOr<std::vector<int32_t>> Decoder::Generate(uint32_t n) {
  std::vector<int32_t> out;
  for (uint32_t i = 0; i < n; ++i) {
    OSCARKV_ASSIGN_OR_RETURN(int32_t t, Step());
    out.push_back(t);
  }
  return out;
}

}  // namespace oscarkv::engine
