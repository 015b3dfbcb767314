// The streaming quantize-on-write kernel (quantize_stream.cu), internal to kernels/cuda: the
// launcher LaunchQuantizeWrite (quantize_write.cu) hands it the launches it supports.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "oscarkv/cuda/internal/quantize_launch.h"

namespace oscarkv::cuda::detail {

// The streaming kernel's copy of a rotation R (the second half of each prepared matrix,
// PrepareRotationFragments): R as bf16 hi + lo, each a wgmma B operand of 128 (n) x 128 (k) in two
// K-major tiles of 64 k values (128 n-rows x 128 bytes), 128-byte swizzled (16-byte chunk c of
// n-row n at chunk c ^ (n & 7)): hi tile 0, hi tile 1, lo tile 0, lo tile 1, 16 KiB each.
// wgmma n index n carries output channel StreamChannel(n), so that lane (gid, tig) of a warp
// ends up holding output channels [32·tig, 32·tig + 32) of its rows, in order (the accumulator
// of column 8j + 2·tig + e is channel 32·tig + 2j + e).
inline constexpr int kStreamImageBytes = 4 * 16384;
// Where the image sits in each prepared matrix: after the mma fragments.
inline constexpr size_t kStreamImageOffset = kRotationFragmentBytes - kStreamImageBytes;
__host__ __device__ constexpr int StreamChannel(int n) { return 32 * ((n % 8) / 2) + 2 * (n / 8) + (n % 2); }
// Byte offset of 16-byte chunk `chunk` (0..7) of 128-byte row `row` in a 128B-swizzled tile.
__host__ __device__ constexpr int Swizzle128(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

// Writes the image of one row-major fp32 128x128 R (y = x·R) to `image` (global memory); all
// threads of the calling CTA take part. hi = bf16(r), lo = bf16(r − hi): R to ~2^-17 relative.
__device__ inline void PrepareStreamImage(const float* r, uint8_t* image) {
  for (int idx = threadIdx.x; idx < 128 * 128; idx += blockDim.x) {
    const int n = idx / 128, k = idx % 128;
    const float v = r[k * 128 + StreamChannel(n)];
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    const __nv_bfloat16 lo = __float2bfloat16_rn(v - __bfloat162float(hi));
    const int off = (k / 64) * 16384 + Swizzle128(n, (k % 64) / 8) + 2 * (k % 8);
    *reinterpret_cast<__nv_bfloat16*>(image + off) = hi;
    *reinterpret_cast<__nv_bfloat16*>(image + 2 * 16384 + off) = lo;
  }
}

// The streaming kernel writes rotated rows (rot_fragments set, precise_rotation) into INT2 pages
// with min-max or unbiased-fixed ranges and no clip, and into BF16 pages. `why` (optional) gets
// the reason when it does not apply.
bool StreamWriteSupports(const QuantizeWriteArgs& p, const char** why = nullptr);

// Launches it (callers check StreamWriteSupports, and that this build runs sm_90a code on the
// device: QuantizeWriteHasWgmma).
absl::Status LaunchStreamWrite(const QuantizeWriteArgs& p, cudaStream_t stream);

}  // namespace oscarkv::cuda::detail
