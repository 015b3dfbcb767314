// Quantize-on-write: new K/V rows (bf16, e.g. post-RoPE keys from the engine) are rotated
// (x·R on tensor cores, R in high + low parts), then written
// straight into their page slots in the docs/FORMAT.md layout -- bf16 rows for BF16 pages (sink,
// recent tail), or clipped INT2 codes + fp16 (scale, min) for INT2 pages. The same kernel with no
// rotation is the flush that moves the oldest tail tokens (already rotated bf16 rows) into an
// INT2 page.
//
// Bit-exactness: given the same fp32 row, codes and fp16 parameters equal the CPU reference
// (kernels/src/quantize.cc: quantile clip with linear interpolation, directed-rounding fp16
// parameters, correctly rounded 1/scale, unfused multiply then add). The rotation itself is
// computed in a different order than RotateRow and with R rounded to fp16 (~2^-12 relative;
// hi + lo: ~2^-22, rows agree with the CPU to ~1e-6), so rotated rows are not bit for bit;
// unrotated writes are bit-exact.
//
// Range selection: every RangeMode rule of the CPU codec (quantize.h, docs/FORMAT.md §1.3.1) is
// mirrored bit for bit -- kMinMax, unbiased-fixed i (one candidate's integer sums, one refit per
// group), kSearch (8 candidate ranges, integer error) and
// kUnbiased ("unbiased v2": one level position per element, a shared-memory atomic into the
// lane's private bin of its level, suffix sums at the 17 candidate thresholds, a
// reduce-scatter over the group's lanes, each lane refitting and scoring its candidates in
// fp64; all sums are exact integers, so the order of the atomics does not matter).
// Quantile clip: when the order statistics are in the top 16 of 128 (c >= ~0.89, OSCAR's clips)
// every lane sorts its own top 8 with sorting networks and the quad merges the lists (bitonic,
// two shuffle rounds); the rare rows where one lane holds more than 8 of the top values take an
// exact walk over the distinct values; lower quantiles a 31-step bitwise selection.
// Page headers are not written here: the caller owns header fields and the checksum.
// Supported: head_dim 128, group 128 or 64; |x| < 65504 for rotated writes (fp16 operands).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/kernels/quantize.h"

namespace oscarkv::cuda {

// Bytes of one prepared d x d (d = 128) rotation matrix: the mma.sync / wgmma fragments (R as fp16
// hi + lo, 64 KiB) followed by the streaming kernel's image (R as bf16 hi + lo, 128B-swizzled
// K-major wgmma operand tiles, 64 KiB).
inline constexpr size_t kRotationFragmentBytes = 2 * 128 * 128 * 4;

// Converts `count` row-major fp32 128x128 matrices (device) into the layouts the write kernels
// read (device, count * kRotationFragmentBytes).
absl::Status PrepareRotationFragments(const float* matrices, int count, void* fragments,
                                      cudaStream_t stream);

struct QuantizeWriteParams {
  // Page geometry (kind comes from page_kinds).
  uint32_t num_layers = 0, num_kv_heads = 0, head_dim = 128, group_size = 128, page_tokens = 64;
  uint32_t first_layer = 0;  // rows of layers [first_layer, first_layer + layer_count)
  uint32_t layer_count = 1;
  // Source rows, bf16 bits: element (layer i, K|V, token t, head h, channel c) at
  //   (kv ? v_src : k_src) + i*src_layer_stride + t*src_token_stride + h*src_head_stride + c.
  const uint16_t* k_src = nullptr;
  const uint16_t* v_src = nullptr;
  int64_t src_layer_stride = 0, src_token_stride = 0, src_head_stride = 0;
  int32_t num_tokens = 0;
  // Destination: token t goes to slot dst_slot[t] of page-table entry dst_page[t].
  uint8_t* const* page_ptrs = nullptr;
  const uint8_t* page_kinds = nullptr;
  const int32_t* dst_page = nullptr;
  const int32_t* dst_slot = nullptr;
  // Prepared rotations [layer_count][2][num_kv_heads] (PrepareRotationFragments); nullptr: rows
  // are already rotated (the flush, or R_V absorbed into the checkpoint).
  const void* rot_fragments = nullptr;
  // Clip ratios [layer_count][2][num_kv_heads] applied to INT2 rows; nullptr: no clipping (and
  // the faster kernel built without the clip, for the default codec's `--clip none`).
  const float* clips = nullptr;
  // Range selection of INT2 groups (see the top of this file): per (layer, K|V, head) modes
  // [layer_count][2][num_kv_heads] as RangeMode bytes (RotationSet::range_mode order, like
  // clips), or nullptr to use `range_mode` for every head.
  RangeMode range_mode = RangeMode::kMinMax;
  const uint8_t* range_modes = nullptr;
  // The caller's promise that every byte of `range_modes` is min-max or unbiased-fixed (the
  // streaming kernel's rules): the table is in device memory, so the launcher cannot look.
  bool range_modes_fixed_only = false;
};

// Enqueues the write on `stream` (no host synchronisation, no allocation): the fastest kernel
// this build and device have for the launch's rotation, page kinds, range modes and clips.
// Errors: InvalidArgument for an unsupported geometry or missing buffers; Internal for a CUDA
// launch error.
absl::Status LaunchQuantizeWrite(const QuantizeWriteParams& params, cudaStream_t stream);

// Whether this build runs sm_90a kernels (wgmma) on the current device: quantize_write.cu is
// compiled for sm_90a where the kernels are built for sm_90 (kernels/cuda/CMakeLists.txt).
bool QuantizeWriteHasWgmma();

}  // namespace oscarkv::cuda
