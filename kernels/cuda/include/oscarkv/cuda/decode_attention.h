// Mixed-precision paged decode attention (one query token per sequence, one layer): the shapes
// and inputs of PagedDecoder (decode_runner.h), the engine's entry point.
//
// The KV cache of a batch of sequences is a set of pages in device memory, each in the exact
// docs/FORMAT.md layout (64-byte header, then a segment per (layer, K|V, KV head)). Sequences
// refer to pages CSR-style: sequence b owns page-table entries
// seq_page_ids[seq_page_indptr[b] .. seq_page_indptr[b+1]) in token order; each entry has a
// base pointer, a kind (INT2 history or BF16 sink/tail) and a valid token count. Pages of one
// sequence may be any mix of kinds; only the last page of a sequence may be partially filled,
// but every page's token_count is honoured.
//
// Supported: head_dim 128, group 128 or 64, page_tokens a multiple of 64 (64..256), GQA ratio
// (query heads per KV head) 1..8. Output and LSE are fp32; LSE is the natural log of the sum of
// exp(scaled scores), -inf (and output 0) for a sequence with no tokens. The extend
// (chunked-prefill) kernel over the same page tables is in extend_attention.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "oscarkv/kernels/page_format.h"

namespace oscarkv::cuda {

inline constexpr uint32_t kSliceTokens = 64;  // token granularity of work items

struct DecodeShape {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t num_q_heads = 0;
  uint32_t head_dim = 128;
  uint32_t group_size = 128;
  uint32_t page_tokens = 64;
  uint32_t layer = 0;  // the layer attended

  OSCARKV_HD uint32_t gqa() const { return num_q_heads / num_kv_heads; }
  OSCARKV_HD uint32_t slices_per_page() const { return page_tokens / kSliceTokens; }
  OSCARKV_HD PageGeometry geometry(PageKind kind) const {
    return PageGeometry{num_layers, num_kv_heads, head_dim, group_size, page_tokens, kind};
  }
};

// OK, or InvalidArgument naming what this kernel does not support.
absl::Status ValidateDecodeShape(const DecodeShape& shape);

// Device-side page table (all pointers are device pointers).
struct PagedKVTable {
  const uint8_t* const* page_ptrs = nullptr;   // [num_pages] base of each page
  const uint8_t* page_kinds = nullptr;         // [num_pages] PageKind
  const uint16_t* page_token_counts = nullptr; // [num_pages]
  const int32_t* seq_page_indptr = nullptr;    // [num_seqs + 1]
  const int32_t* seq_page_ids = nullptr;       // CSR column indices into the page arrays
  int32_t num_seqs = 0;
};

// One decode step's inputs (device pointers).
struct DecodeInputs {
  PagedKVTable table;
  const float* q = nullptr;      // [num_seqs][num_q_heads][head_dim], unrotated
  const float* rot_k = nullptr;  // [num_kv_heads][d][d] R_K of `layer` (nullptr: q already rotated)
  const float* rot_v = nullptr;  // [num_kv_heads][d][d] R_V, used when unrotate_output
  bool unrotate_output = false;  // multiply the output by R_Vᵀ (back to the model's basis)
  float softmax_scale = 0;       // <= 0: 1/sqrt(head_dim)
  float* out = nullptr;          // [num_seqs][num_q_heads][head_dim], 16-byte aligned
  float* lse = nullptr;          // [num_seqs][num_q_heads] (may be nullptr)
};

}  // namespace oscarkv::cuda
