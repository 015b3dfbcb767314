// The mixed-precision page set of one sequence and the reference decode attention over it.
//
// Page plan for N tokens with page size T, sink S and recent window R:
//   * sink pages: the first ceil(S/T) pages (BF16);
//   * history pages: the following full pages (INT2) that end at or before N - R;
//   * tail: everything after the history, stored as BF16 pages; it holds between R and
//     R + T - 1 tokens (a page is flushed to INT2 once the tail reaches R + T tokens).
// So a key is BF16 if it is a sink token or within the last R..R+T-1 tokens, INT2 otherwise.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/kernels/page_codec.h"

namespace oscarkv {

struct PlannedPage {
  PageKind kind;
  uint32_t first_token;
  uint32_t token_count;
};

std::vector<PlannedPage> PlanSequencePages(const CodecProfile& profile, uint32_t seq_tokens);

struct SequencePages {
  std::vector<PlannedPage> plan;
  std::vector<std::vector<uint8_t>> pages;  // encoded bytes, one per plan entry
};

// Encodes a whole sequence by the plan above.
absl::StatusOr<SequencePages> BuildSequencePages(const CodecProfile& profile,
                                                 const RotationSet& rotations,
                                                 const KVSequenceView& kv);

struct AttentionOutput {
  std::vector<float> out;  // [num_q_heads][head_dim]
  std::vector<float> lse;  // [num_q_heads], natural log of sum exp(scaled scores)
};

// Reference single-token decode attention for `layer` over `pages` (any mix of kinds, in
// sequence order). q is [num_q_heads][head_dim] in the model's (unrotated) space; query head j
// reads KV head j / (num_q_heads / kv_heads). The query is rotated by R_K of its KV head, scores
// are scaled by `softmax_scale` (<= 0 means 1/sqrt(head_dim)), softmax is exact with
// log-sum-exp in double, and the output is in the rotated value space unless `unrotate_output`
// (then multiplied by R_V^T).
absl::StatusOr<AttentionOutput> ReferenceDecodeAttention(
    const CodecProfile& profile, const RotationSet& rotations,
    std::span<const std::span<const uint8_t>> pages, uint32_t layer, std::span<const float> q,
    uint32_t num_q_heads, bool unrotate_output, float softmax_scale = 0);

// Dense reference over explicit rotated K/V rows (used to check the paged one and by kernels'
// tests): kv holds rotated rows of `layer` for all tokens.
AttentionOutput DenseDecodeAttention(const CodecProfile& profile, const RotationSet& rotations,
                                     const KVSequenceView& rotated_kv, uint32_t layer,
                                     std::span<const float> q, uint32_t num_q_heads,
                                     bool unrotate_output, float softmax_scale = 0);

}  // namespace oscarkv
