// Incremental decoding over kernels' paged, mixed-precision KV cache.
//
// Prefill runs the prompt through the model (attention over exact K/V, as engines do), then
// stores its K/V as the sequence's pages (kernels' page plan: BF16 sink pages, INT2 history,
// BF16 tail). Each generated token's K/V is appended to the tail; once the tail reaches
// recent + page_tokens tokens its oldest page is flushed to INT2, exactly as PlanSequencePages
// describes. Decode attention reads the rows as the pages hold them (BF16 rows rounded, INT2
// rows dequantized), rotating the query by R_K and the output back by R_V^T.
//
// pages() is what a prefill worker hands to a decode worker (P/D): a Decoder on another process
// resumes from Resume(tokens, pages) and continues greedily with the same results, because the
// pages are the whole KV state. Not thread-safe; one Decoder per sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/engine/model.h"
#include "oscarkv/kernels/page_set.h"

namespace oscarkv::engine {

class Decoder {
 public:
  // `profile` must match the model's shape (layers, KV heads, head_dim); `rotations` the
  // profile (its digest is not checked here). capacity: the most tokens the sequence may reach.
  static absl::StatusOr<std::unique_ptr<Decoder>> Create(const Model& model, CodecProfile profile,
                                                         std::shared_ptr<const RotationSet> rotations,
                                                         uint32_t capacity);

  // Runs the prompt (at least one token) and builds its pages.
  absl::Status Prefill(std::span<const int32_t> prompt);
  // Resumes from another decoder's pages over tokens[0, n-1) and runs tokens[n-1] (n >= 2).
  absl::Status Resume(std::span<const int32_t> tokens, const SequencePages& pages);
  // Greedy: appends argmax of the current next-token logits and runs it; returns the token.
  absl::StatusOr<int32_t> Step();
  absl::StatusOr<std::vector<int32_t>> Generate(uint32_t n);

  const std::vector<int32_t>& tokens() const { return tokens_; }
  // Pages of the tokens whose K/V is stored (all tokens so far).
  const SequencePages& pages() const { return pages_; }
  const std::vector<float>& next_logits() const { return logits_; }
  const CodecProfile& profile() const { return profile_; }

 private:
  Decoder(const Model& m, CodecProfile p, std::shared_ptr<const RotationSet> r, uint32_t cap);
  // Runs one token at position tokens_.size()-1 through the model, appending its K/V.
  absl::Status RunLast();
  // Re-plans the pages for `stored_` tokens and re-encodes/decodes the pages that changed.
  absl::Status SyncPages();
  KVSequenceView RawView() const {
    return {raw_.data(), profile_.num_layers, profile_.num_kv_heads, profile_.head_dim, capacity_};
  }
  float* Row(std::vector<float>& buf, uint32_t l, uint32_t kv, uint32_t t, uint32_t h) {
    return buf.data() + (((size_t{l} * 2 + kv) * capacity_ + t) * profile_.num_kv_heads + h) *
                            profile_.head_dim;
  }

  const Model& model_;
  CodecProfile profile_;
  std::shared_ptr<const RotationSet> rotations_;
  uint32_t capacity_;
  std::vector<int32_t> tokens_;
  uint32_t stored_ = 0;     // tokens whose K/V is in the cache
  std::vector<float> raw_;  // model-space fp32 K/V [layers][2][capacity][heads][d]
  std::vector<float> eff_;  // rotated rows as the pages hold them, same layout
  SequencePages pages_;
  std::vector<float> logits_;
};

}  // namespace oscarkv::engine
