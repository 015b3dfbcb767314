// CPU references of the CUDA kernels' POD interfaces, built from the codec's reference
// functions (ReferenceDecodeAttention, RotateRow, ClipRowAtQuantile, QuantizeRowInt2). They take
// the same structs as the kernels, with host pointers in place of device pointers, so tests
// compare kernel and reference on identical inputs. Host-only; CI runs them (label unit).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/cuda/decode_attention.h"
#include "oscarkv/cuda/quantize_write.h"
#include "oscarkv/kernels/page_set.h"
#include "oscarkv/kernels/rotation.h"

namespace oscarkv::cuda {

// Host page table: pages[i] is the full bytes of page-table entry i (valid header).
struct HostPagedKV {
  std::vector<std::span<const uint8_t>> pages;
  std::vector<int32_t> seq_page_indptr;
  std::vector<int32_t> seq_page_ids;
};

// Decode attention of every sequence through ReferenceDecodeAttention (exact softmax in
// double). q is [num_seqs][num_q_heads][d]. Output [num_seqs][num_q_heads][d] and lse
// [num_seqs][num_q_heads] (natural log).
absl::StatusOr<AttentionOutput> ReferencePagedDecode(const CodecProfile& profile,
                                                     const RotationSet& rotations,
                                                     const HostPagedKV& kv, uint32_t layer,
                                                     std::span<const float> q,
                                                     uint32_t num_q_heads, bool unrotate_output,
                                                     float softmax_scale = 0);

// Extend attention (LaunchExtendAttention's function) through DenseDecodeAttention, one new
// token at a time: new token i of sequence b attends to the dequantized prefix pages of b plus
// new tokens 0..i. q is [total_new][num_q_heads][d] (unrotated); k_new/v_new are bf16 bits of
// rotated rows [total_new][num_kv_heads][d]; q_indptr has num_seqs + 1 entries. Output
// [total_new][num_q_heads][d] and lse [total_new][num_q_heads].
absl::StatusOr<AttentionOutput> ReferenceExtendAttention(
    const CodecProfile& profile, const RotationSet& rotations, const HostPagedKV& kv,
    uint32_t layer, std::span<const int32_t> q_indptr, std::span<const float> q,
    std::span<const uint16_t> k_new, std::span<const uint16_t> v_new, uint32_t num_q_heads,
    bool unrotate_output, float softmax_scale = 0);

// Quantize-on-write on host memory: every pointer in `params` is a host pointer (page_ptrs to
// writable page buffers). `rotations` replaces rot_fragments (nullptr: rows already rotated);
// its matrices for layers [first_layer, first_layer + layer_count) are used.
absl::Status ReferenceQuantizeWrite(const QuantizeWriteParams& params, const RotationSet* rotations);

}  // namespace oscarkv::cuda
