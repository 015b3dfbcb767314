// The quantize-on-write kernel's rotation (quantize_write.cu; internal to kernels/cuda/src): CTA
// sizes, the layout of the prepared rotation fragments (PrepareFragmentsKernel) and the wgmma
// rotation of sm_90a builds (WgmmaF16N128).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "device_util.cuh"
#include "quantize_common.cuh"
#include "quantize_stream.h"
#include "oscarkv/cuda/internal/quantize_launch.h"

namespace oscarkv::cuda {
namespace {

using namespace detail;

// Warps per CTA (16 tokens each): 6 for the rotating selecting kernels (the 64 KiB of R hi+lo
// fragments are shared by 6 warps; 2 CTAs = 12 warps per SM), 4 otherwise; `wg` (a multiple of
// 4, whole warpgroups) for the wgmma kernels.
__host__ __device__ constexpr int WarpsOf(bool select, bool rotate, bool round1, int wg = 0) {
  return wg != 0 ? wg : select && rotate && !round1 ? 6 : 4;
}
constexpr int kFragSmem = 16 * 8 * 32 * 16;  // [n-tile][k-step][lane] uint4 = 64 KiB

// Input channel of mma k index `k` at k-step `s`, for the lane layout above.
__host__ __device__ constexpr int KChannel(int s, int k) {
  return 32 * ((k % 8) / 2) + 4 * s + 2 * (k / 8) + (k % 2);
}
// Output channel of mma n index `n` of n-tile `j`.
__host__ __device__ constexpr int NChannel(int j, int n) { return 32 * (n / 2) + 2 * j + (n % 2); }

// Writes both prepared forms of matrix blockIdx.x: the mma fragments (first kFragSmem bytes of its
// kRotationFragmentBytes) and the streaming kernel's bf16 image after them (PrepareStreamImage).
__global__ void PrepareFragmentsKernel(const float* mats, uint8_t* prepared) {
  const int m = blockIdx.x;  // matrix
  const float* r = mats + size_t(m) * 128 * 128;
  uint4* out = reinterpret_cast<uint4*>(prepared + size_t(m) * kRotationFragmentBytes);
  static_assert(kStreamImageOffset == kFragSmem, "the image follows the fragments");
  PrepareStreamImage(r, prepared + size_t(m) * kRotationFragmentBytes + kStreamImageOffset);
  for (int idx = threadIdx.x; idx < 16 * 8 * 32; idx += blockDim.x) {
    const int j = idx / 256, s = (idx / 32) % 8, lane = idx % 32;
    const int gid = lane >> 2, tig = lane & 3;
    uint32_t hi[2], lo[2];
    for (int b = 0; b < 2; ++b) {
      __half h[2], l[2];
      for (int e = 0; e < 2; ++e) {
        const int k = 2 * tig + 8 * b + e;
        const float v = r[KChannel(s, k) * 128 + NChannel(j, gid)];
        h[e] = __float2half_rn(v);
        l[e] = __float2half_rn(v - __half2float(h[e]));
      }
      hi[b] = PackHalf2(h[0], h[1]);
      lo[b] = PackHalf2(l[0], l[1]);
    }
    out[idx] = make_uint4(hi[0], hi[1], lo[0], lo[1]);
  }
}

// ---- The rotation on wgmma (sm_90a; LoadPath::kWgmma*) ----------------------------------------
// A warpgroup (4 warps) rotates its 4 x 16 rows with wgmma.m64n128k16: A (the rows, fp16) from
// the registers mma.sync's A fragments use (the same layout per warp), B (R's hi and lo parts)
// read by the tensor cores from shared memory -- once per 64 rows instead of the ~4 KB of LDS.128
// per 16 rows of the mma.sync path --, the fp32 accumulators in y's registers (the m64nNk16 D
// layout per warp is mma.sync's C layout, n8 block j = the mma path's n-tile j). The products are
// chained in the same order as the mma.sync path (k-step s outer, hi then lo, starting from 0),
// so the GPU tests can require the same bytes. Shared memory per k-step s and part (hi, lo): a
// 16 (k) x 128 (n) tile of 4 KiB, K-major without swizzle: core matrix (n-block j, k-half kb) =
// 8 rows (n) x 16 bytes (8 k values) at j * 256 + kb * 128. Tile (s, part) at (2s + part) * 4 KiB
// (hi + lo) or s * 4 KiB (hi only).
constexpr int kWgTileBytes = 16 * 128 * 2;
// Shared-memory matrix descriptor: start address, leading byte offset 128 (k halves), stride
// byte offset 256 (n blocks), no swizzle.
__device__ __forceinline__ uint64_t WgmmaDesc(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr & 0x3ffffu) >> 4) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(256 >> 4) << 32);
}
// Word w (0..3) of prepared fragment uint4 `idx` (PrepareFragmentsKernel's [j][s][lane] order)
// -> its byte offset in the wgmma layout (hi + lo when `precise`, else hi words only).
__device__ __forceinline__ int WgmmaFragOffset(int idx, int w, bool precise) {
  const int j = idx / 256, s = (idx / 32) % 8, lane = idx % 32, gid = lane >> 2, tig = lane & 3;
  const int part = w >> 1, kb = w & 1;
  const int tile = precise ? 2 * s + part : s;
  return tile * kWgTileBytes + j * 256 + kb * 128 + gid * 16 + tig * 4;
}
// y += A(64 x 16, this warp's 16 rows in mma.sync A fragments) * B(16 x 128 at `desc`).
__device__ __forceinline__ void WgmmaF16N128(float (&y0)[32], float (&y1)[32], uint32_t a0, uint32_t a1,
                                             uint32_t a2, uint32_t a3, uint64_t desc) {
#if OSCARKV_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : OSCARKV_WG_ACC(y0, y1)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
#else
  __trap();
#endif
}
// wgmma.fence before the first wgmma of a tile (orders the accumulators' and A's register writes
// before the tensor cores read them); commit + wait after the last one, the accumulators named
// as operands so that no access to them moves across.
__device__ __forceinline__ void WgmmaFence(float (&y0)[32], float (&y1)[32], uint32_t (&a)[2][16]) {
#if OSCARKV_HAVE_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n"
               : OSCARKV_WG_ACC(y0, y1),
                 "+r"(a[0][0]), "+r"(a[0][1]), "+r"(a[0][2]), "+r"(a[0][3]),
                 "+r"(a[0][4]), "+r"(a[0][5]), "+r"(a[0][6]), "+r"(a[0][7]),
                 "+r"(a[0][8]), "+r"(a[0][9]), "+r"(a[0][10]), "+r"(a[0][11]),
                 "+r"(a[0][12]), "+r"(a[0][13]), "+r"(a[0][14]), "+r"(a[0][15]),
                 "+r"(a[1][0]), "+r"(a[1][1]), "+r"(a[1][2]), "+r"(a[1][3]),
                 "+r"(a[1][4]), "+r"(a[1][5]), "+r"(a[1][6]), "+r"(a[1][7]),
                 "+r"(a[1][8]), "+r"(a[1][9]), "+r"(a[1][10]), "+r"(a[1][11]),
                 "+r"(a[1][12]), "+r"(a[1][13]), "+r"(a[1][14]), "+r"(a[1][15])
               :
               : "memory");
#endif
}
// Whether this build's kernels for the current device carry the wgmma path (sm_90a code).
__global__ void WgmmaProbeKernel(int* out) { *out = OSCARKV_HAVE_WGMMA; }

}  // namespace
}  // namespace oscarkv::cuda
