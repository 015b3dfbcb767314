#include "oscarkv/kernels/page_set.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace oscarkv {

std::vector<PlannedPage> PlanSequencePages(const CodecProfile& p, uint32_t n) {
  const uint32_t T = p.page_tokens;
  std::vector<PlannedPage> plan;
  const uint32_t sink_end = std::min(n, ((p.sink_tokens + T - 1) / T) * T);
  uint32_t pos = 0;
  for (; pos < sink_end; pos += T) plan.push_back({PageKind::kBf16, pos, std::min(T, n - pos)});
  // History: full pages that end at or before n - recent.
  const uint32_t history_limit = n > p.recent_tokens ? n - p.recent_tokens : 0;
  while (pos + T <= history_limit) {
    plan.push_back({PageKind::kInt2, pos, T});
    pos += T;
  }
  for (; pos < n; pos += T) plan.push_back({PageKind::kBf16, pos, std::min(T, n - pos)});
  return plan;
}

absl::StatusOr<SequencePages> BuildSequencePages(const CodecProfile& p,
                                                 const RotationSet& rotations,
                                                 const KVSequenceView& kv) {
  SequencePages sp;
  sp.plan = PlanSequencePages(p, kv.seq_tokens);
  for (const PlannedPage& pp : sp.plan) {
    auto page = EncodePage(p, &rotations, pp.kind, kv, pp.first_token, pp.token_count);
    if (!page.ok()) return page.status();
    sp.pages.push_back(*std::move(page));
  }
  return sp;
}

namespace {

// Shared core: attention of rotated queries over rotated K/V rows supplied by `row(kv, t, h)`.
template <typename RowFn>
AttentionOutput Attend(const CodecProfile& p, const RotationSet& rot, uint32_t layer,
                       std::span<const float> q, uint32_t num_q_heads, bool unrotate,
                       float softmax_scale, uint32_t n, RowFn row) {
  const uint32_t d = p.head_dim, group = num_q_heads / p.num_kv_heads;
  const double scale = softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(static_cast<double>(d));
  AttentionOutput res;
  res.out.assign(size_t{num_q_heads} * d, 0.0f);
  res.lse.assign(num_q_heads, -std::numeric_limits<float>::infinity());
  std::vector<float> qr(d), acc_f(d);
  std::vector<double> scores(n), acc(d);
  for (uint32_t qh = 0; qh < num_q_heads; ++qh) {
    const uint32_t h = qh / group;
    RotateRow(q.data() + size_t{qh} * d, rot.matrix(layer, KV::kKey, h), d, qr.data());
    double m = -std::numeric_limits<double>::infinity();
    for (uint32_t t = 0; t < n; ++t) {
      const float* k = row(0, t, h);
      double s = 0;
      for (uint32_t i = 0; i < d; ++i) s += static_cast<double>(qr[i]) * k[i];
      scores[t] = s * scale;
      m = std::max(m, scores[t]);
    }
    if (n == 0) continue;
    double denom = 0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (uint32_t t = 0; t < n; ++t) {
      const double w = std::exp(scores[t] - m);
      denom += w;
      const float* v = row(1, t, h);
      for (uint32_t i = 0; i < d; ++i) acc[i] += w * v[i];
    }
    for (uint32_t i = 0; i < d; ++i) acc_f[i] = static_cast<float>(acc[i] / denom);
    float* out = res.out.data() + size_t{qh} * d;
    if (unrotate) {
      UnrotateRow(acc_f.data(), rot.matrix(layer, KV::kValue, h), d, out);
    } else {
      std::copy(acc_f.begin(), acc_f.end(), out);
    }
    res.lse[qh] = static_cast<float>(m + std::log(denom));
  }
  return res;
}

}  // namespace

absl::StatusOr<AttentionOutput> ReferenceDecodeAttention(
    const CodecProfile& p, const RotationSet& rot, std::span<const std::span<const uint8_t>> pages,
    uint32_t layer, std::span<const float> q, uint32_t num_q_heads, bool unrotate_output,
    float softmax_scale) {
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  if (layer >= p.num_layers) return absl::OutOfRangeError("layer out of range");
  if (num_q_heads == 0 || num_q_heads % p.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_q_heads ", num_q_heads,
                                                   " is not a multiple of kv heads ",
                                                   p.num_kv_heads));
  }
  if (q.size() != size_t{num_q_heads} * p.head_dim) {
    return absl::InvalidArgumentError("query size does not match num_q_heads * head_dim");
  }
  // Decode every page, then index rows by global token position.
  std::vector<DecodedPage> decoded;
  std::vector<std::pair<uint32_t, uint32_t>> where;  // (page, token in page)
  for (size_t i = 0; i < pages.size(); ++i) {
    auto dp = DecodePage(p, pages[i]);
    if (!dp.ok()) return dp.status();
    for (uint32_t t = 0; t < dp->token_count; ++t) where.emplace_back(static_cast<uint32_t>(i), t);
    decoded.push_back(*std::move(dp));
  }
  auto row = [&](uint32_t kv, uint32_t t, uint32_t h) {
    const auto [pi, pt] = where[t];
    return decoded[pi].view(p).row(layer, kv, pt, h);
  };
  return Attend(p, rot, layer, q, num_q_heads, unrotate_output, softmax_scale,
                static_cast<uint32_t>(where.size()), row);
}

AttentionOutput DenseDecodeAttention(const CodecProfile& p, const RotationSet& rot,
                                     const KVSequenceView& kv, uint32_t layer,
                                     std::span<const float> q, uint32_t num_q_heads,
                                     bool unrotate_output, float softmax_scale) {
  auto row = [&](uint32_t kvi, uint32_t t, uint32_t h) { return kv.row(layer, kvi, t, h); };
  return Attend(p, rot, layer, q, num_q_heads, unrotate_output, softmax_scale, kv.seq_tokens, row);
}

}  // namespace oscarkv
