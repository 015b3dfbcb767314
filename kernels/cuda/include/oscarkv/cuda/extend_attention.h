// Extend (chunked-prefill) attention over a paged prefix: the C new tokens of each sequence
// attend to the sequence's cached prefix -- pages of any mix of kinds, INT2 history and BF16
// sink/tail, in the docs/FORMAT.md layout and the page tables of decode (decode_attention.h) --
// and causally to the new tokens themselves (new token i sees new tokens 0..i), whose K/V rows
// are given densely in bf16. Sequences of one launch may have different prefix and chunk
// lengths; a sequence without pages is plain prefill.
//
// Kernels: on a compute-capability 9.0 device with this build's sm_90a code, a warp-specialised
// tensor-core kernel (wgmma): one CTA per (128 query rows, sequence, KV head), the rows being
// the KV head's GQA group of query heads for 128 / gqa consecutive new tokens, so every key tile
// is read and dequantized once for all of them; two producer warpgroups dequantize INT2 codes
// (or convert bf16 rows) into fp16 tiles in shared memory, two consumer warpgroups compute
// S = Q·Kᵀ, the online softmax and O += P·V. Sequences without prefix pages (plain prefill) run
// in a second launch of the same kernel whose producers load the bf16 rows straight into the
// operand tiles by TMA (bf16 products, no conversion), one persistent CTA per SM. Elsewhere an mma.sync kernel computes the same
// function (16 new tokens x 4 query heads per CTA).
//
// Precision: fp16 keys, values and probabilities (2^-11 relative each) with fp32 accumulation,
// like FlashAttention's fp16 prefill -- bf16 query and probabilities (2^-8) over the bf16 rows
// for plain prefill, like dense bf16 attention; the tensor-core kernel rotates the query by R_K
// (and the output by R_Vᵀ) on tensor cores with R in fp16 and the operand split into fp16 high
// and low parts. ~1e-3 relative output error against the exact reference
// (ReferenceExtendAttention), a few 1e-3 for plain prefill.
//
// Supported: head_dim 128, group 128 or 64, page_tokens 64..256 (multiple of 64), GQA 1..8,
// |K|, |V| < 65504. Output and LSE are fp32 (LSE natural log), rotated space unless
// unrotate_output.
//
// Launch = plan (host, once) + run (device): PlanExtend picks the kernel and sets its launch
// attributes for at most max_seqs sequences of at most max_new_tokens new tokens each; a launch
// with that plan then neither synchronizes with the host nor allocates, so it can be captured
// in a CUDA graph and replayed with other lengths (q_indptr) and page tables, as long as the
// device data stays within the plan's maxima and the host-side params (pointers, num_seqs) are
// those captured. Reentrant; no workspace.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oscarkv/cuda/decode_attention.h"

#include <cuda_runtime_api.h>

namespace oscarkv::cuda {

inline constexpr int kExtendQueryBlock = 16;  // new tokens per CTA of the mma.sync kernel

struct ExtendParams {
  DecodeShape shape;
  PagedKVTable table;  // the cached prefix of each sequence (table.num_seqs sequences)
  // New-token rows of sequence b are [q_indptr[b], q_indptr[b+1]) (device pointer).
  const int32_t* q_indptr = nullptr;
  int32_t max_new_tokens = 0;  // max over sequences of new tokens (<= the plan's maximum)
  const float* q = nullptr;    // [total_new][num_q_heads][128], unrotated model space
  // K and V of the new tokens, bf16 bits, already rotated (R_K / R_V applied, as written to
  // pages): [total_new][num_kv_heads][128], each 16-byte aligned.
  const uint16_t* k_new = nullptr;
  const uint16_t* v_new = nullptr;
  // [num_kv_heads][d][d] R_K of `layer` (nullptr: q already rotated) and R_V (used when
  // unrotate_output), each 16-byte aligned.
  const float* rot_k = nullptr;
  const float* rot_v = nullptr;
  bool unrotate_output = false;
  float softmax_scale = 0;  // <= 0: 1/sqrt(head_dim)
  float* out = nullptr;     // [total_new][num_q_heads][128]
  float* lse = nullptr;     // [total_new][num_q_heads] (may be nullptr)
};

struct ExtendPlan {
  DecodeShape shape;
  int32_t max_seqs = 0;
  int32_t max_new_tokens = 0;  // per sequence; sets the grid of every launch
  bool tensor_cores = false;   // the wgmma kernel (else the mma.sync one)
};

// Checks the shape and the device, picks the kernel and sets its shared-memory limit (may
// synchronize: call outside graph capture). Errors: InvalidArgument for an unsupported shape
// or maximum; Internal for a CUDA error.
absl::StatusOr<ExtendPlan> PlanExtend(const DecodeShape& shape, int32_t max_seqs, int32_t max_new_tokens);

// Enqueues one launch with `plan` (no host synchronization, no allocation). params.shape must be
// plan.shape (any layer), params.table.num_seqs <= plan.max_seqs, and every sequence's new
// tokens (q_indptr) <= plan.max_new_tokens. Errors: InvalidArgument for params outside the plan
// or missing buffers; Internal for a launch error.
absl::Status LaunchExtendAttention(const ExtendPlan& plan, const ExtendParams& params, cudaStream_t stream);

// PlanExtend for exactly these params, then the launch (not capturable on a process's first call).
absl::Status LaunchExtendAttention(const ExtendParams& params, cudaStream_t stream);

}  // namespace oscarkv::cuda
