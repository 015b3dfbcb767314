// Kernel parameters of CudaAttention for one layer of a window (CUDA builds only). The pointers
// are device pointers in the backend and host pointers in the host emulation test, which runs
// the same parameters through the kernels' CPU references (kernels/cuda/.../reference.h).
#pragma once

#include <cstdint>
#include <vector>

#include "oscarkv/cuda/decode_attention.h"
#include "oscarkv/cuda/quantize_write.h"
#include "oscarkv/engine/attention.h"
#include "window_pages.h"

namespace oscarkv::engine {

struct WindowBuffers {
  const uint16_t* k = nullptr;  // bf16 bits [tokens][kv_heads][d]
  const uint16_t* v = nullptr;
  uint8_t* const* page_ptrs = nullptr;  // physical pages (WindowPageLayout::page_kinds order)
  const uint8_t* page_kinds = nullptr;
  const int32_t* dst_page = nullptr;    // WindowPageLayout::dst_page / dst_slot
  const int32_t* dst_slot = nullptr;
  // INT2 codecs, every layer in RotationSet order ([layer][K|V][head]); nullptr for BF16.
  const uint8_t* rot_fragments = nullptr;  // PrepareRotationFragments of the matrices
  const float* clips = nullptr;
  const uint8_t* range_modes = nullptr;
  // Every byte of range_modes is min-max or unbiased-fixed (QuantizeWriteParams::
  // range_modes_fixed_only: such writes may take the streaming kernel).
  bool range_modes_fixed_only = false;
};

// Write of page set `set` of `layout` (tokens [first_token, tokens)) for `layer`. Pages hold one
// layer (num_layers 1); the layer picks the codec's rotation, clip ratios and range modes.
inline cuda::QuantizeWriteParams WindowWriteParams(const WindowPageLayout& layout, size_t set,
                                                   const KvCodec& codec, uint32_t layer,
                                                   uint32_t kv_heads, uint32_t d,
                                                   const WindowBuffers& b) {
  const size_t per_layer = size_t{2} * kv_heads, row = size_t{kv_heads} * d;
  const uint32_t first = layout.sets[set].first_token;
  cuda::QuantizeWriteParams w;
  w.num_layers = 1;
  w.num_kv_heads = kv_heads;
  w.head_dim = d;
  w.group_size = codec.group;
  w.page_tokens = kWindowPageTokens;
  w.first_layer = 0;
  w.layer_count = 1;
  w.src_layer_stride = static_cast<int64_t>(size_t{layout.tokens} * row);
  w.src_token_stride = static_cast<int64_t>(row);
  w.src_head_stride = d;
  w.k_src = b.k + first * row;
  w.v_src = b.v + first * row;
  w.num_tokens = static_cast<int32_t>(layout.tokens - first);
  w.page_ptrs = b.page_ptrs;
  w.page_kinds = b.page_kinds;
  w.dst_page = b.dst_page + layout.set_dst_offset[set];
  w.dst_slot = b.dst_slot + layout.set_dst_offset[set];
  if (codec.int2) {
    if (b.rot_fragments != nullptr) {
      w.rot_fragments = b.rot_fragments + layer * per_layer * cuda::kRotationFragmentBytes;
    }
    // A null table stays null (no clipping / `range_mode` for every head), never an offset
    // from null: the write kernel tests the pointer.
    w.clips = b.clips != nullptr ? b.clips + layer * per_layer : nullptr;
    w.range_modes = b.range_modes != nullptr ? b.range_modes + layer * per_layer : nullptr;
    w.range_modes_fixed_only = b.range_modes_fixed_only;
  }
  return w;
}

// Range modes of every (layer, K|V, head) as bytes, in RotationSet (clip) order.
inline std::vector<uint8_t> RangeModeBytes(const RotationSet& rot) {
  std::vector<uint8_t> modes;
  for (uint32_t l = 0; l < rot.layers(); ++l) {
    for (KV kv : {KV::kKey, KV::kValue}) {
      for (uint32_t h = 0; h < rot.kv_heads(); ++h) {
        modes.push_back(static_cast<uint8_t>(rot.range_mode(l, kv, h)));
      }
    }
  }
  return modes;
}

// Decode shape of a window: pages of one layer, one sequence per query position.
inline cuda::DecodeShape WindowDecodeShape(const KvCodec& codec, uint32_t q_heads,
                                           uint32_t kv_heads, uint32_t d) {
  cuda::DecodeShape s;
  s.num_layers = 1;
  s.num_kv_heads = kv_heads;
  s.num_q_heads = q_heads;
  s.head_dim = d;
  s.group_size = codec.group;
  s.page_tokens = kWindowPageTokens;
  s.layer = 0;
  return s;
}

}  // namespace oscarkv::engine
