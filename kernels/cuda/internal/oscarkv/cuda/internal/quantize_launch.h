// Internal interface of the quantize-on-write kernels: the kernel arguments with their load-path
// and precision options, for the kernels' sources, their GPU tests, bench/ and bench/write_probe
// (which time the alternatives beside the default). The product path is LaunchQuantizeWrite
// (oscarkv/cuda/quantize_write.h), which runs kAuto with precise_rotation. Measurements behind
// the choices are in bench/results/NOTES.md.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "oscarkv/cuda/quantize_write.h"

namespace oscarkv::cuda {

// QuantizeWriteParams (the fields the product launch takes) plus the launch options.
struct QuantizeWriteArgs : QuantizeWriteParams {
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
  // is round 1's kernel structure (direct loads; selecting kernels with 4-warp CTAs, 4 tiles per
  // CTA) with today's range selection, kept for side-by-side benches and as the GPU tests'
  // byte-for-byte reference of the other paths. The direct
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
    kAuto, kStaged, kDirect, kRound1, kLoadAhead, kLoadAtTile, kPrefetchL1,
    kWgmma4, kWgmma8, kWgmma12, kStream, kStream3
  };
  LoadPath load_path = LoadPath::kAuto;
  QuantizeWriteArgs() = default;
  // The launch of `p` with these options.
  explicit QuantizeWriteArgs(const QuantizeWriteParams& p, LoadPath path = LoadPath::kAuto,
                             bool precise = true)
      : QuantizeWriteParams(p), precise_rotation(precise), load_path(path) {}
};


// Enqueues the write with the given options (LaunchQuantizeWrite is this with the defaults).
// Errors as LaunchQuantizeWrite's, and Unimplemented for a wgmma or streaming load path in a
// build or on a device without sm_90a kernels (QuantizeWriteHasWgmma).
absl::Status LaunchQuantizeWrite(const QuantizeWriteArgs& args, cudaStream_t stream);

}  // namespace oscarkv::cuda
