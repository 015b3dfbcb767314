// The two extend-attention kernels behind LaunchExtendAttention (extend_attention.h), internal
// to kernels/cuda: the wgmma kernel (extend_attention_wgmma.cu, sm_90a) and the mma.sync kernel
// (extend_attention.cu) that runs where the wgmma one cannot. Tests reach both through here.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "oscarkv/cuda/extend_attention.h"

namespace oscarkv::cuda::detail {

// Query rows (query head x new token pairs of one KV head) per CTA of the wgmma kernel: the
// GQA group's heads of 128 / gqa consecutive tokens.
inline constexpr int kExtendWgmmaRows = 128;
inline int ExtendWgmmaTokensPerCta(int gqa) { return kExtendWgmmaRows / gqa; }

// Whether this build carries the wgmma kernel for the current device (sm_90a code on a
// compute-capability 9.0 device); the first call runs a probe kernel (not capturable).
bool ExtendWgmmaAvailable();
// Sets the wgmma kernel's shared-memory limit (once per device, before launches and capture).
absl::Status PrepareExtendWgmma();
// Enqueues the wgmma kernel over max_new_tokens (checked by the caller, as the shape). diag
// (bench diagnostics at group 128, wrong outputs): 1 the producer skips the dequantization, 2 the
// raw copies; 3 and 4 (right outputs for sequences without prefix pages only): the plain-prefill
// kernel alone, with one CTA per work item (3) or its persistent CTAs (4); 5 as 4 without the tile
// loads (wrong outputs).
absl::Status LaunchExtendWgmma(const ExtendParams& p, int max_new_tokens, cudaStream_t stream, int diag = 0);

// The plain-prefill kernel (extend_dense_wgmma.cu): its shared-memory limit, and its launch over
// the sequences without prefix pages of items_x token blocks each (diag as above, 3..5).
absl::Status PrepareExtendDense();
absl::Status LaunchExtendDense(const ExtendParams& p, int max_new_tokens, int items_x, cudaStream_t stream, int diag);

// The mma.sync kernel (any sm_80+ device).
absl::Status PrepareExtendMma();
absl::Status LaunchExtendMma(const ExtendParams& p, int max_new_tokens, cudaStream_t stream);

}  // namespace oscarkv::cuda::detail
