// Quantize-on-write: new K/V rows (bf16, e.g. post-RoPE keys from the engine) are rotated
// (x·R on tensor cores, R as fp16 high + low parts, or fp16 only: `precise_rotation`), then written
// straight into their page slots in the docs/FORMAT.md layout -- bf16 rows for BF16 pages (sink,
// recent tail), or clipped INT2 codes + fp16 (scale, min) for INT2 pages. The same kernel with no
// rotation is the flush that moves the oldest tail tokens (already rotated bf16 rows) into an
// INT2 page. Rows may stream through a cp.async ring in shared memory (`load_path`).
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
  // R as fp16 high + low parts (the default; rotation error ~1e-6 relative); false uses the high
  // part only: ~2^-12 relative, half the tensor work and fragment traffic (default write 174.2 ->
  // 158.7 us on wgmma, 220.8 -> 186.3 us on mma.sync, H200, 12:16 UTC 2026-11-30). Not the
  // default: on the reference model's real K/V no INT2 code differs from the fp32 rotation, but
  // 0.4-1% of groups pick another range candidate, and the engine's
  // CPU-vs-GPU attention test (engine/src/cuda_attention_gpu_test.cc) measured relative RMS
  // errors of 1.0e-3 to 6.9e-3 against its 1e-3 bound (random inputs with outlier channels).
  bool precise_rotation = true;
  // How rows reach the kernel: kStaged streams them through a cp.async ring in shared memory
  // (one balanced wave of CTAs); kDirect loads them straight into registers. kAuto: staged for
  // the min-max / bf16 kernels (measured faster), direct for the selecting kernels (compute-
  // bound: staged measured 1.5-3% slower, and with R hi+lo the ring costs CTAs per SM). kRound1
  // is round 1's kernel as it was (direct loads; selecting kernels with 4-warp CTAs, 19 band
  // bins, 4 tiles per CTA), kRound2 round 2's selecting kernel as it was (direct loads, positions
  // kept per element, three compares per code), both kept for side-by-side benches. The direct
  // selecting kernels (kAuto, kDirect) run round 3's selection (quantize_write.cu) and load the
  // next tile's rows one tile ahead into registers when unrotated, prefetch them into L1 one tile
  // ahead when rotated (measured faster each way); kLoadAhead / kPrefetchL1 force either,
  // kLoadAtTile does neither (each tile loaded when reached; kPrefetchL1 is round 3's rotating
  // selecting kernel, mma.sync). All write the same bytes.
  // kWgmma4 / 8 / 12 (rotating selecting kernels, sm_90a builds; see quantize_write.cu): the
  // rotation on wgmma, R read by the tensor cores from shared memory, CTAs of 4, 8 or 12 warps
  // (1, 2 or 3 warpgroups), rows prefetched into L1 one tile ahead; LaunchQuantizeWrite fails
  // (Unimplemented) without sm_90a kernels (QuantizeWriteHasWgmma). kAuto takes kWgmma8 for the
  // rotating selecting kernels where the build has it, compiled without the quantile clip when
  // `clips` is null (default codec write on an H200: mma.sync 220.8 us, kWgmma8 174.2 us, kAuto
  // 169.0 us), round 3's mma.sync kernel otherwise. For the rotating min-max / bf16 kernels kAuto
  // stays on mma.sync (staged); kWgmma* run them on wgmma (one warpgroup per CTA): INT2 pages
  // 142.8 -> 113.4 us, but BF16 pages 125.0 -> 141.7 us.
  // kStream: the streaming kernel (quantize_stream.cu, sm_90a): rows through shared memory, R as
  // bf16 hi + lo read by wgmma from shared memory, one CTA of 4 warpgroups per SM; it takes
  // rotated rows (precise_rotation) and already rotated ones (the flush, R_V absorbed: read from
  // its rings into the same registers, 3-stage rings) with no clip into BF16 pages and INT2
  // pages with min-max or unbiased-fixed ranges, and kAuto takes it for every such launch (an
  // error for others).
  // kStream with precise_rotation false rotates by R's bf16 high part only (~2^-9 relative:
  // timing diagnostics only; kAuto never takes it). kStream3: the same kernel with 3 warpgroups
  // (3-stage rings, 168 registers), for side-by-side benches (rows already rotated: 4 warpgroups
  // either way).
  enum class LoadPath : uint8_t {
    kAuto, kStaged, kDirect, kRound1, kRound2, kLoadAhead, kLoadAtTile, kPrefetchL1,
    kWgmma4, kWgmma8, kWgmma12, kStream, kStream3
  };
  LoadPath load_path = LoadPath::kAuto;
  // Range selection of INT2 groups (see the top of this file): per (layer, K|V, head) modes
  // [layer_count][2][num_kv_heads] as RangeMode bytes (RotationSet::range_mode order, like
  // clips), or nullptr to use `range_mode` for every head.
  RangeMode range_mode = RangeMode::kMinMax;
  const uint8_t* range_modes = nullptr;
  // The caller's promise that every byte of `range_modes` is min-max or unbiased-fixed (the
  // streaming kernel's rules): the table is in device memory, so the launcher cannot look.
  bool range_modes_fixed_only = false;
};

absl::Status LaunchQuantizeWrite(const QuantizeWriteParams& params, cudaStream_t stream);

// Whether this build runs sm_90a kernels (wgmma) on the current device: quantize_write.cu is
// compiled for sm_90a where the kernels are built for sm_90 (kernels/cuda/CMakeLists.txt).
bool QuantizeWriteHasWgmma();

}  // namespace oscarkv::cuda
