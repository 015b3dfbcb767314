#include "oscarkv/calibrate/calibrator.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "oscarkv/engine/safetensors.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/quantize.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::calibrate {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstStrided = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;

RowMat HeadRows(const float* src, uint32_t tokens, uint32_t heads, uint32_t head, uint32_t d) {
  return ConstStrided(src + size_t{head} * d, tokens, d, Eigen::OuterStride<>(size_t{heads} * d));
}

// Causal softmax of q k^T / sqrt(d) for query rows at `positions` (ascending) over keys
// [0, max position]; rows beyond a query's position are zero.
RowMat CausalProbs(const RowMat& q, const RowMat& k, const std::vector<uint32_t>& positions) {
  const uint32_t n = positions.empty() ? 0 : positions.back() + 1;
  RowMat s = q * k.topRows(n).transpose();
  const float scale = 1.0f / std::sqrt(static_cast<float>(q.cols()));
  for (Eigen::Index r = 0; r < s.rows(); ++r) {
    const uint32_t m = positions[r] + 1;
    float mx = -std::numeric_limits<float>::infinity();
    for (uint32_t c = 0; c < m; ++c) mx = std::max(mx, s(r, c) *= scale);
    double sum = 0;
    for (uint32_t c = 0; c < m; ++c) sum += (s(r, c) = std::exp(s(r, c) - mx));
    const float inv = static_cast<float>(1.0 / sum);
    for (uint32_t c = 0; c < m; ++c) s(r, c) *= inv;
    for (uint32_t c = m; c < n; ++c) s(r, c) = 0.0f;
  }
  return s;
}

}  // namespace

const char* ValueWeightingName(ValueWeighting w) {
  switch (w) {
    case ValueWeighting::kScores: return "scores";
    case ValueWeighting::kOutputs: return "outputs";
    case ValueWeighting::kProxy: return "proxy";
  }
  return "?";
}

absl::StatusOr<ValueWeighting> ParseValueWeighting(const std::string& s) {
  if (s == "scores") return ValueWeighting::kScores;
  if (s == "outputs") return ValueWeighting::kOutputs;
  if (s == "proxy") return ValueWeighting::kProxy;
  return absl::InvalidArgumentError(
      absl::StrCat("value weighting '", s, "': expected scores, outputs or proxy"));
}

Calibrator::Calibrator(uint32_t layers, uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim,
                       CalibrationOptions options)
    : layers_(layers), q_heads_(q_heads), kv_heads_(kv_heads), d_(head_dim), o_(std::move(options)) {
  cov_.assign(size_t{layers} * 2 * kv_heads, CovarianceAccumulator(head_dim));
  clip_err_.assign(cov_.size() * std::max<size_t>(1, o_.clip_candidates.size()), 0.0);
  if (o_.fixed_range) {
    range_err_.assign(cov_.size() * RangeClips() * kRangeSearchCandidates, 0.0);
    range_v2_.assign(cov_.size() * RangeClips(), 0.0);
  }
}

void Calibrator::AccumulateCovariances(const engine::AttentionInputs& in) {
  const uint32_t T = in.tokens, d = d_, group = q_heads_ / kv_heads_;
  if (in.layer == 0) cov_tokens_ += T;
  std::vector<uint32_t> all(T);
  for (uint32_t i = 0; i < T; ++i) all[i] = i;
  for (uint32_t h = 0; h < kv_heads_; ++h) {
    CovarianceAccumulator& cq = cov_[Index(in.layer, 0, h)];
    CovarianceAccumulator& cs = cov_[Index(in.layer, 1, h)];
    const RowMat k = HeadRows(in.k, T, kv_heads_, h, d), v = HeadRows(in.v, T, kv_heads_, h, d);
    std::vector<RowMat> qs(group);
    for (uint32_t g = 0; g < group; ++g) {
      qs[g] = HeadRows(in.q, T, q_heads_, h * group + g, d);
      cq.Add(qs[g].data(), T, d);
    }
    std::vector<float> w(T, 0.0f);
    switch (o_.value_weighting) {
      case ValueWeighting::kScores:
      case ValueWeighting::kOutputs: {
        std::vector<RowMat> outs(group);
        std::vector<std::vector<float>> wg(group, std::vector<float>(T, 0.0f));
#pragma omp parallel for schedule(static)
        for (int64_t g = 0; g < int64_t{group}; ++g) {
          const RowMat p = CausalProbs(qs[g], k, all);
          if (o_.value_weighting == ValueWeighting::kOutputs) {
            outs[g] = p * v;
          } else {
            const Eigen::VectorXf col = p.array().square().colwise().sum().transpose();
            for (uint32_t s = 0; s < T; ++s) wg[g][s] = col(s);
          }
        }
        if (o_.value_weighting == ValueWeighting::kOutputs) {
          for (const RowMat& o : outs) cs.Add(o.data(), T, d);
        } else {
          for (uint32_t g = 0; g < group; ++g) {
            for (uint32_t s = 0; s < T; ++s) w[s] += wg[g][s];
          }
          cs.Add(v.data(), T, d, w.data());
        }
        break;
      }
      case ValueWeighting::kProxy: {
        const std::vector<double> c = cq.Mean();
        Eigen::MatrixXf cf = Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic,
                                                            Eigen::RowMajor>>(c.data(), d, d)
                                 .cast<float>();
        const RowMat kc = k * cf;
        double mean = 0;
        for (uint32_t s = 0; s < T; ++s) mean += (w[s] = kc.row(s).dot(k.row(s)));
        mean /= T;
        if (mean > 0) {
          for (float& x : w) x = static_cast<float>(x / mean);
        }
        cs.Add(v.data(), T, d, w.data());
        break;
      }
    }
  }
}

absl::Status Calibrator::BuildRotations() {
  eig_.resize(cov_.size());
  for (size_t i = 0; i < cov_.size(); ++i) {
    if (cov_[i].weight() <= 0) return absl::FailedPreconditionError("no calibration activations");
    eig_[i] = OscarRotationFromCovariance(cov_[i].Mean(), d_);
  }
  return absl::OkStatus();
}

void Calibrator::AccumulateRangeScores(uint32_t layer, uint32_t head, const float* k,
                                       const float* v, uint32_t rows) {
  const size_t ncl = RangeClips(), nc = o_.clip_candidates.size();
  const uint32_t d = d_, first = std::min(o_.sink, rows);  // sink rows stay BF16
  if (layer == 0 && head == 0) range_rows_ += rows - first;
  std::vector<double> err(2 * ncl * kRangeSearchCandidates, 0.0), v2(2 * ncl, 0.0);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < int64_t(2 * ncl); ++task) {
    const uint32_t kv = static_cast<uint32_t>(task / ncl);
    const size_t ci = task % ncl;
    const float c = nc > 0 ? o_.clip_candidates[ci] : (kv == 0 ? o_.fixed_clip_k : o_.fixed_clip_v);
    std::vector<float> row(d);
    for (uint32_t s = first; s < rows; ++s) {
      std::copy_n((kv == 0 ? k : v) + size_t{s} * d, d, row.begin());
      ClipRowAtQuantile(std::span<float>(row), c);
      AddUnbiasedScores(row.data(), d, o_.group, &err[task * kRangeSearchCandidates], &v2[task]);
    }
  }
  for (uint32_t kv = 0; kv < 2; ++kv) {
    const size_t base = Index(layer, kv, head) * ncl;
    for (size_t ci = 0; ci < ncl; ++ci) {
      range_v2_[base + ci] += v2[kv * ncl + ci];
      for (uint32_t i = 0; i < kRangeSearchCandidates; ++i) {
        range_err_[(base + ci) * kRangeSearchCandidates + i] +=
            err[(kv * ncl + ci) * kRangeSearchCandidates + i];
      }
    }
  }
}

void Calibrator::AccumulateClipErrors(const engine::AttentionInputs& in) {
  const size_t nc = o_.clip_candidates.size();
  if (nc == 0 && !o_.fixed_range) return;
  const uint32_t T = in.tokens, d = d_, group = q_heads_ / kv_heads_;
  std::vector<uint32_t> pos;
  for (uint32_t t = std::min(o_.query_start, T - 1); t < T; t += o_.query_stride) pos.push_back(t);
  if (in.layer == 0) {
    clip_windows_ += nc > 0;
    range_windows_ += o_.fixed_range;
  }
  const uint32_t n = pos.back() + 1;
  // The clip search measures under v2 when the fixed candidates are chosen afterwards.
  const RangeMode mode = o_.fixed_range ? RangeMode::kUnbiased : o_.range_mode;
  // lo[r][s]: key s is read from INT2 by query row r.
  auto is_lo = [&](uint32_t r, uint32_t s) {
    return s >= o_.sink && int64_t{s} < int64_t{pos[r]} + 1 - int64_t{o_.recent};
  };
  for (uint32_t h = 0; h < kv_heads_; ++h) {
    const Eigen::Map<const RowMat> rk(eig_[Index(in.layer, 0, h)].rotation.data(), d, d);
    const Eigen::Map<const RowMat> rv(eig_[Index(in.layer, 1, h)].rotation.data(), d, d);
    const RowMat k = HeadRows(in.k, n, kv_heads_, h, d) * rk;
    const RowMat v = HeadRows(in.v, n, kv_heads_, h, d) * rv;
    if (o_.fixed_range) AccumulateRangeScores(in.layer, h, k.data(), v.data(), n);
    if (nc == 0) continue;
    std::vector<RowMat> qs(group), p_exact(group), o_exact(group);
    for (uint32_t g = 0; g < group; ++g) {
      RowMat q(pos.size(), d);
      for (size_t r = 0; r < pos.size(); ++r) {
        q.row(r) = Eigen::Map<const Eigen::RowVectorXf>(
            in.q + (size_t{pos[r]} * q_heads_ + h * group + g) * d, d);
      }
      qs[g] = q * rk;
      p_exact[g] = CausalProbs(qs[g], k, pos);
      o_exact[g] = p_exact[g] * v;
    }
    std::vector<double> err(2 * nc, 0.0);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < int64_t(2 * nc); ++task) {
      const uint32_t kv = static_cast<uint32_t>(task / nc);
      const float c = o_.clip_candidates[task % nc];
      RowMat x = kv == 0 ? k : v;
      for (uint32_t s = 0; s < n; ++s) {
        engine::QuantizeDequantizeRow(x.row(s).data(), d, o_.group, c, mode);
      }
      double e = 0;
      for (uint32_t g = 0; g < group; ++g) {
        if (kv == 0) {
          // Keys: mixed-precision scores, exact values.
          RowMat s_lo = qs[g] * x.transpose(), s_hi = qs[g] * k.transpose();
          for (Eigen::Index r = 0; r < s_lo.rows(); ++r) {
            for (uint32_t s = 0; s < n; ++s) {
              if (!is_lo(r, s)) s_lo(r, s) = s_hi(r, s);
            }
          }
          const float scale = 1.0f / std::sqrt(static_cast<float>(d));
          for (Eigen::Index r = 0; r < s_lo.rows(); ++r) {
            const uint32_t m = pos[r] + 1;
            float mx = -std::numeric_limits<float>::infinity();
            for (uint32_t s = 0; s < m; ++s) mx = std::max(mx, s_lo(r, s) *= scale);
            double sum = 0;
            for (uint32_t s = 0; s < m; ++s) sum += (s_lo(r, s) = std::exp(s_lo(r, s) - mx));
            for (uint32_t s = 0; s < m; ++s) s_lo(r, s) = static_cast<float>(s_lo(r, s) / sum);
            for (uint32_t s = m; s < n; ++s) s_lo(r, s) = 0.0f;
          }
          e += (s_lo * v - o_exact[g]).squaredNorm();
        } else {
          // Values: exact scores, INT2 rows where the decode semantics read INT2.
          RowMat p = p_exact[g];
          for (Eigen::Index r = 0; r < p.rows(); ++r) {
            for (uint32_t s = 0; s < n; ++s) {
              if (!is_lo(r, s)) p(r, s) = 0.0f;
            }
          }
          e += (p * (x - v)).squaredNorm();
        }
      }
      err[task] = e;
    }
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (size_t ci = 0; ci < nc; ++ci) {
        clip_err_[Index(in.layer, kv, h) * nc + ci] += err[kv * nc + ci];
      }
    }
  }
}

absl::StatusOr<RotationArtifact> Calibrator::Finish(nlohmann::ordered_json metadata) const {
  if (eig_.size() != cov_.size()) return absl::FailedPreconditionError("BuildRotations not run");
  const size_t n = cov_.size(), dd = size_t{d_} * d_, nc = o_.clip_candidates.size();
  if (o_.fixed_range && range_rows_ == 0) {
    return absl::FailedPreconditionError(
        "fixed range candidates need held-out rows (past the sink) to score");
  }
  std::vector<float> matrices(n * dd), clips(n), eigenvalues(n * d_);
  std::vector<uint8_t> modes(n, static_cast<uint8_t>(o_.range_mode));
  nlohmann::ordered_json table = nlohmann::ordered_json::array();
  nlohmann::ordered_json range_table = nlohmann::ordered_json::array();
  for (uint32_t l = 0; l < layers_; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < kv_heads_; ++h) {
        const size_t i = Index(l, kv, h);
        std::copy(eig_[i].rotation.begin(), eig_[i].rotation.end(), matrices.begin() + i * dd);
        std::copy(eig_[i].eigenvalues.begin(), eig_[i].eigenvalues.end(),
                  eigenvalues.begin() + i * d_);
        float clip = kv == 0 ? o_.fixed_clip_k : o_.fixed_clip_v;
        size_t best = 0;  // the clip candidate (0 when none are searched)
        if (nc > 0 && clip_windows_ > 0) {
          for (size_t c = 1; c < nc; ++c) {
            if (clip_err_[i * nc + c] < clip_err_[i * nc + best]) best = c;
          }
          clip = o_.clip_candidates[best];
          const double base = clip_err_[i * nc];
          table.push_back({{"layer", l},
                           {"kv", kv == 0 ? "k" : "v"},
                           {"head", h},
                           {"clip", clip},
                           {"error_vs_no_clip", base > 0 ? clip_err_[i * nc + best] / base : 1.0}});
        }
        clips[i] = clip;
        if (o_.fixed_range) {
          // The first candidate with the smallest total score at the chosen clip.
          const size_t r = i * RangeClips() + best;
          const double* e = &range_err_[r * kRangeSearchCandidates];
          const int cand = static_cast<int>(std::min_element(e, e + kRangeSearchCandidates) - e);
          modes[i] = static_cast<uint8_t>(UnbiasedFixed(cand));
          range_table.push_back({{"layer", l},
                                 {"kv", kv == 0 ? "k" : "v"},
                                 {"head", h},
                                 {"candidate", cand},
                                 {"score_vs_unbiased", range_v2_[r] > 0 ? e[cand] / range_v2_[r] : 1.0}});
        }
      }
    }
  }
  OSCARKV_ASSIGN_OR_RETURN(RotationSet set, RotationSet::FromData(layers_, kv_heads_, d_,
                                                                  std::move(matrices),
                                                                  std::move(clips)));
  for (uint32_t l = 0; l < layers_; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < kv_heads_; ++h) {
        const uint8_t m = modes[Index(l, kv, h)];
        if (m != 0) set.set_range_mode(l, static_cast<KV>(kv), h, static_cast<RangeMode>(m));
      }
    }
  }
  RotationArtifact a{std::move(set), std::move(eigenvalues), std::move(metadata)};
  a.metadata["objective"] = "attention-output error on held-out windows";
  a.metadata["c_s"] = ValueWeightingName(o_.value_weighting);
  a.metadata["range_mode"] = o_.fixed_range ? "unbiased-fixed" : RangeModeName(o_.range_mode);
  if (o_.fixed_range) {
    a.metadata["range_selection"] =
        "per (layer, K|V, head) the unbiased v2 candidate with the smallest total score E over "
        "the held-out rows past the sink (docs/FORMAT.md 1.3.1), at the head's clip";
    a.metadata["range_windows"] = range_windows_;
    a.metadata["range_rows"] = range_rows_;
    a.metadata["range_candidates"] = range_table;
  }
  a.metadata["calibration_tokens"] = cov_tokens_;
  a.metadata["clip_search_windows"] = clip_windows_;
  a.metadata["clip_candidates"] = o_.clip_candidates;
  a.metadata["decode_semantics"] = {{"sink", o_.sink}, {"recent", o_.recent}, {"group", o_.group}};
  a.metadata["clip_search"] = table;
  return a;
}

absl::StatusOr<RotationArtifact> CalibrateModel(const engine::Model& model, const std::string& text,
                                                const CalibrationOptions& o,
                                                const ProgressFn& progress) {
  const engine::ModelConfig& c = model.config();
  const uint64_t available = text.size() / o.window_bytes;
  if (available < 2) {
    return absl::InvalidArgumentError(absl::StrCat("calibration text of ", text.size(),
                                                   " bytes holds fewer than 2 windows of ",
                                                   o.window_bytes));
  }
  // Consecutive chunks: the first `cov` for covariances, the next `held` for the clip search.
  const bool need_heldout = !o.clip_candidates.empty() || o.fixed_range;
  const uint64_t held = need_heldout ? std::min<uint64_t>(o.heldout, available / 4 + 1) : 0;
  const uint64_t cov = std::min<uint64_t>(o.windows, available - held);
  Calibrator cal(c.num_layers, c.num_q_heads, c.num_kv_heads, c.head_dim, o);
  engine::MixedPrecisionAttention attn(engine::KvCodec::Bf16());
  std::vector<float> logits;
  const uint64_t total = cov + held;
  uint64_t done = 0;
  auto window = [&](uint64_t i) {
    std::vector<int32_t> tokens(o.window_bytes);
    for (uint32_t j = 0; j < o.window_bytes; ++j) {
      tokens[j] = static_cast<uint8_t>(text[i * o.window_bytes + j]);
    }
    return tokens;
  };
  for (uint64_t i = 0; i < cov; ++i) {
    OSCARKV_RETURN_IF_ERROR(model.Forward(window(i), attn, &logits,
                                          [&](const engine::AttentionInputs& in) {
                                            cal.AccumulateCovariances(in);
                                          }));
    if (progress) progress(++done, total);
  }
  OSCARKV_RETURN_IF_ERROR(cal.BuildRotations());
  for (uint64_t i = cov; i < cov + held; ++i) {
    std::vector<int32_t> tokens = window(i);
    if (o.repeat_heldout && (i - cov) % 2 == 1) {
      // Long-range recall: the window's first half followed by its exact repeat.
      const uint32_t half = o.window_bytes / 2;
      std::copy_n(tokens.begin(), half, tokens.begin() + half);
    }
    OSCARKV_RETURN_IF_ERROR(model.Forward(tokens, attn, &logits,
                                          [&](const engine::AttentionInputs& in) {
                                            cal.AccumulateClipErrors(in);
                                          }));
    if (progress) progress(++done, total);
  }
  nlohmann::ordered_json meta;
  meta["model"] = c.model_id;
  meta["calibration_windows"] = cov;
  meta["window_bytes"] = o.window_bytes;
  const Sha256Digest th = Sha256(text.data(), text.size());
  meta["text_sha256"] = HexEncode(th.data(), th.size());
  return cal.Finish(std::move(meta));
}

absl::StatusOr<RotationArtifact> CalibrateFromDumps(const std::vector<std::string>& files,
                                                    const CalibrationOptions& o,
                                                    const ProgressFn& progress) {
  if (files.empty()) return absl::InvalidArgumentError("no activation dumps given");
  std::vector<std::unique_ptr<engine::SafetensorsFile>> dumps;
  for (const std::string& f : files) {
    OSCARKV_ASSIGN_OR_RETURN(auto s, engine::SafetensorsFile::Open(f));
    dumps.push_back(std::move(s));
  }
  // Shapes from the first file.
  uint32_t layers = 0;
  while (dumps[0]->Has(absl::StrCat("layers.", layers, ".q"))) ++layers;
  if (layers == 0) return absl::InvalidArgumentError(absl::StrCat(files[0], ": no layers.0.q"));
  OSCARKV_ASSIGN_OR_RETURN(engine::TensorInfo q0, dumps[0]->Get("layers.0.q"));
  OSCARKV_ASSIGN_OR_RETURN(engine::TensorInfo k0, dumps[0]->Get("layers.0.k"));
  if (q0.shape.size() != 3 || k0.shape.size() != 3 || q0.shape[2] != k0.shape[2] ||
      k0.shape[1] == 0 || q0.shape[1] % k0.shape[1] != 0) {
    return absl::InvalidArgumentError("dump shapes must be [tokens, heads, head_dim] with GQA");
  }
  const uint32_t hq = q0.shape[1], hkv = k0.shape[1], d = q0.shape[2];
  Calibrator cal(layers, hq, hkv, d, o);
  const bool need_heldout = !o.clip_candidates.empty() || o.fixed_range;
  const size_t held = (files.size() > 1 && need_heldout) ? 1 : 0;
  uint64_t done = 0;
  auto feed = [&](const engine::SafetensorsFile& f, bool clip_phase) -> absl::Status {
    for (uint32_t l = 0; l < layers; ++l) {
      const std::string p = absl::StrCat("layers.", l, ".");
      OSCARKV_ASSIGN_OR_RETURN(engine::TensorInfo qi, f.Get(p + "q"));
      const int64_t T = qi.shape.empty() ? 0 : qi.shape[0];
      OSCARKV_ASSIGN_OR_RETURN(std::vector<float> q, f.GetF32(p + "q", {T, hq, d}));
      OSCARKV_ASSIGN_OR_RETURN(std::vector<float> k, f.GetF32(p + "k", {T, hkv, d}));
      OSCARKV_ASSIGN_OR_RETURN(std::vector<float> v, f.GetF32(p + "v", {T, hkv, d}));
      engine::AttentionInputs in{l, static_cast<uint32_t>(T), hq, hkv, d, q.data(), k.data(), v.data()};
      if (clip_phase) {
        cal.AccumulateClipErrors(in);
      } else {
        cal.AccumulateCovariances(in);
      }
    }
    if (progress) progress(++done, files.size() + (held == 0 && need_heldout));
    return absl::OkStatus();
  };
  for (size_t i = 0; i + held < files.size(); ++i) OSCARKV_RETURN_IF_ERROR(feed(*dumps[i], false));
  OSCARKV_RETURN_IF_ERROR(cal.BuildRotations());
  if (need_heldout) {
    OSCARKV_RETURN_IF_ERROR(feed(*dumps[held ? files.size() - 1 : 0], true));
  }
  nlohmann::ordered_json meta;
  meta["model"] = dumps[0]->metadata().count("model") ? dumps[0]->metadata().at("model") : "unknown";
  meta["activation_dumps"] = files.size();
  return cal.Finish(std::move(meta));
}

}  // namespace oscarkv::calibrate
