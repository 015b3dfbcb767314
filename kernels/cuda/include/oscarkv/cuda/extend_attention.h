// Extend (chunked-prefill) attention over a paged prefix: the C new tokens of each sequence
// attend to the sequence's cached prefix -- pages of any mix of kinds, INT2 history and BF16
// sink/tail, in the docs/FORMAT.md layout -- and causally to the new tokens themselves (new
// token i sees new tokens 0..i), whose K/V rows are given densely in bf16.
//
// One CTA per (16 new tokens, sequence, KV head, group of 4 query heads); warp w serves query
// head 4z + w of the KV head's GQA group for the CTA's 16 tokens, so every K/V tile read from the
// pages is shared by up to 4 heads x 16 tokens. K/V tiles of 64 tokens are dequantized (INT2:
// min + code·scale in fp32) or converted (bf16) to fp16 in shared memory; scores Q·Kᵀ and the
// value product P·V run on tensor cores (mma.sync m16n8k16, fp16 operands, fp32 accumulators)
// with an online softmax in base 2. Query rows are rotated by R_K and scaled in the CTA.
//
// Precision: fp16 query, keys, values and probabilities (2^-11 relative each) with fp32
// accumulation -- like FlashAttention's bf16/fp16 prefill, ~1e-3 relative output error against
// the exact reference (ReferenceExtendAttention).
//
// Supported: head_dim 128, group 128 or 64, page_tokens 64..256 (multiple of 64), GQA 1..8,
// |K|, |V| < 65504. Output and LSE are fp32 (LSE natural log), rotated space unless
// unrotate_output. Reentrant; no workspace.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "oscarkv/cuda/decode_attention.h"

#include <cuda_runtime_api.h>

namespace oscarkv::cuda {

inline constexpr int kExtendQueryBlock = 16;  // new tokens per CTA

struct ExtendParams {
  DecodeShape shape;
  PagedKVTable table;  // the cached prefix of each sequence (table.num_seqs sequences)
  // New-token rows of sequence b are [q_indptr[b], q_indptr[b+1]) (device pointer).
  const int32_t* q_indptr = nullptr;
  int32_t max_new_tokens = 0;  // max over sequences of new tokens (sets the grid)
  const float* q = nullptr;    // [total_new][num_q_heads][128], unrotated model space
  // K and V of the new tokens, bf16 bits, already rotated (R_K / R_V applied, as written to
  // pages): [total_new][num_kv_heads][128].
  const uint16_t* k_new = nullptr;
  const uint16_t* v_new = nullptr;
  const float* rot_k = nullptr;  // [num_kv_heads][d][d] R_K of `layer` (nullptr: q already rotated)
  const float* rot_v = nullptr;  // [num_kv_heads][d][d] R_V, used when unrotate_output
  bool unrotate_output = false;
  float softmax_scale = 0;  // <= 0: 1/sqrt(head_dim)
  float* out = nullptr;     // [total_new][num_q_heads][128]
  float* lse = nullptr;     // [total_new][num_q_heads] (may be nullptr)
};

// Errors: InvalidArgument for an unsupported shape or missing buffers; Internal for a launch
// error.
absl::Status LaunchExtendAttention(const ExtendParams& params, cudaStream_t stream);

}  // namespace oscarkv::cuda
