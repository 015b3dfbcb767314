// GPU attention backend: the same AttentionBackend contract and decode semantics as
// MixedPrecisionAttention (attention.h), computed by the project's CUDA kernels
// (kernels/cuda): the window's K/V are written into pages by the quantize-on-write kernel
// (INT2 pages with the codec's rotations, clip ratios and range modes; BF16 pages, rotated, for
// sink and recent tokens), then the paged decode-attention kernel runs every query position as
// one sequence of a batch whose page table is that position's decode-time view (BF16 sink, INT2
// history, BF16 recent; see src/window_pages.h). The kernel rotates queries by R_K and maps the
// output back by R_Vᵀ. The rest of the forward pass stays on the CPU.
//
// Differences from the CPU reference, all below what bpb can see: the write kernel reads K/V as
// bf16 (rows are rounded to bf16 before the rotation, as a serving engine stores them), rotates
// in a different summation order, and the decode kernel multiplies on tensor cores.
// Supported: head_dim 128, group 64 or 128, query heads per KV head 1..8.
//
// Availability is a runtime question: in a build without CUDA, or on a machine without a GPU,
// MakeCudaAttention returns an error that says which.
// Thread-safety: one backend serves one Forward at a time (it owns a stream and buffers).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "oscarkv/engine/attention.h"

namespace oscarkv::engine {

// True when this binary was built with the CUDA kernels.
bool CudaAttentionCompiled();

// Options of the CUDA backend (none yet: the kernels pick their launch per plan).
struct CudaAttentionOptions {};

// FailedPrecondition without a usable device, Unimplemented in a build without CUDA,
// InvalidArgument for a codec the kernels do not support.
absl::StatusOr<std::unique_ptr<AttentionBackend>> MakeCudaAttention(
    KvCodec codec, const CudaAttentionOptions& options = {});

}  // namespace oscarkv::engine
