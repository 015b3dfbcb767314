// OSCAR calibration: per layer and KV head, from real post-RoPE activations,
//   C_Q = mean q q^T over tokens and the query heads of the GQA group   -> R_K = U_Q H P_br
//   C_S = value covariance weighted by attention                        -> R_V = U_S H P_br
// then a per (layer, K|V, head) search over clip ratios ("no clip" included) that minimises
// the attention-output error on held-out windows under the codec's decode semantics (sink and
// recent BF16, everything else INT2).
//
// C_S variants (ValueWeighting):
//   kScores  (default) sum_s w_s v_s v_s^T, w_s = sum over the group's heads and queries t of
//            p_ts^2 -- the diagonal of S^T S, i.e. the expected output error of independent
//            per-row value errors, from the real softmax scores;
//   kOutputs V^T S^T S V: the covariance of the real attention outputs;
//   kProxy   OSCAR's public-code proxy w_s = k_s^T C_Q k_s (mean-normalised), C_Q from the
//            windows seen so far.
//
// Activations come either from the engine (CalibrateModel) or from dumps (CalibrateFromDumps)
// for models the engine cannot run. Deterministic for equal inputs and thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/calibrate/artifact.h"
#include "oscarkv/calibrate/covariance.h"
#include "oscarkv/engine/attention.h"
#include "oscarkv/engine/model.h"

namespace oscarkv::calibrate {

enum class ValueWeighting { kScores, kOutputs, kProxy };
const char* ValueWeightingName(ValueWeighting w);
absl::StatusOr<ValueWeighting> ParseValueWeighting(const std::string& s);

struct CalibrationOptions {
  uint32_t window_bytes = 2048;
  uint32_t windows = 24;  // windows for covariances (consecutive chunks of the text)
  uint32_t heldout = 4;   // further windows for the clip search
  // Every second held-out window is its first half followed by an exact repeat, so the clip
  // search sees long-range retrieval (which clipping's shrinkage hurts), not only local text.
  bool repeat_heldout = true;
  ValueWeighting value_weighting = ValueWeighting::kScores;
  // Clip ratios tried per (layer, K|V, head); 1 = no clip. Empty: no search, use fixed_clip_*.
  std::vector<float> clip_candidates = {1.0f, 0.995f, 0.99f, 0.985f, 0.98f, 0.97f,
                                        0.96f, 0.95f, 0.94f, 0.92f, 0.90f};
  float fixed_clip_k = 1.0f, fixed_clip_v = 1.0f;
  // Decode semantics the clip search measures under.
  uint32_t sink = 64, recent = 256, group = 128;
  RangeMode range_mode = RangeMode::kUnbiased;
  // Unbiased-fixed ranges (docs/FORMAT.md §1.3.1 modes 16..23): per (layer, K|V, head) the
  // candidate i whose unbiased v2 score E, summed over the head's rotated held-out rows (past
  // the sink, clipped at the head's chosen clip), is smallest; the artifact records mode 16+i.
  // The clip search (if any) then measures under kUnbiased; range_mode is not used.
  bool fixed_range = false;
  // Held-out query rows: positions query_start, query_start + query_stride, ...
  uint32_t query_start = 384, query_stride = 8;
};

using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

class Calibrator {
 public:
  Calibrator(uint32_t layers, uint32_t q_heads, uint32_t kv_heads, uint32_t head_dim,
             CalibrationOptions options);

  // Phase 1: one window's activations of one layer.
  void AccumulateCovariances(const engine::AttentionInputs& in);
  // Eigendecomposes every accumulated covariance.
  absl::Status BuildRotations();
  // Phase 2 (after BuildRotations): one held-out window's activations of one layer.
  void AccumulateClipErrors(const engine::AttentionInputs& in);
  // Picks clips (or applies the fixed ones) and assembles the artifact.
  absl::StatusOr<RotationArtifact> Finish(nlohmann::ordered_json metadata) const;

  uint64_t covariance_tokens() const { return cov_tokens_; }

 private:
  size_t Index(uint32_t l, uint32_t kv, uint32_t h) const { return (size_t{l} * 2 + kv) * kv_heads_ + h; }
  uint32_t layers_, q_heads_, kv_heads_, d_;
  CalibrationOptions o_;
  std::vector<CovarianceAccumulator> cov_;  // [layers][2][kv_heads]
  std::vector<EigenRotation> eig_;
  // fixed_range: the rows' v2 scores per candidate, [layers][2][kv_heads][clips][8] (clips: the
  // clip candidates, or the fixed clip), and kUnbiased's own score, [layers][2][kv_heads][clips].
  void AccumulateRangeScores(uint32_t layer, uint32_t head, const float* k, const float* v,
                             uint32_t rows);
  size_t RangeClips() const { return std::max<size_t>(1, o_.clip_candidates.size()); }
  std::vector<double> clip_err_;  // [layers][2][kv_heads][candidates]
  std::vector<double> range_err_, range_v2_;
  uint64_t cov_tokens_ = 0;
  uint64_t clip_windows_ = 0;
  uint64_t range_windows_ = 0, range_rows_ = 0;
};

// Runs the engine (BF16 cache) over consecutive windows of `text`.
absl::StatusOr<RotationArtifact> CalibrateModel(const engine::Model& model, const std::string& text,
                                                const CalibrationOptions& options,
                                                const ProgressFn& progress = {});

// Activation dumps: safetensors files with layers.{l}.q [tokens, q_heads, d], layers.{l}.k and
// layers.{l}.v [tokens, kv_heads, d] (post-norm, post-RoPE), one sequence per file starting at
// position 0. With several files the last one is held out for the clip search.
absl::StatusOr<RotationArtifact> CalibrateFromDumps(const std::vector<std::string>& files,
                                                    const CalibrationOptions& options,
                                                    const ProgressFn& progress = {});

}  // namespace oscarkv::calibrate
