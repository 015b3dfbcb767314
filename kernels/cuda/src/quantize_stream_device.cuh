// Device helpers of the streaming quantize-on-write kernel (quantize_stream.cu), kept apart so
// that bench/write_probe.cu measures the same code: the wgmma wrappers and shared-memory
// descriptors of the rotation, and the quantization of a thread's two accumulator rows (their
// group ranges, min-max codes, the unbiased-fixed rule with one row's tail per lane). Internal to
// kernels/cuda.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "quantize_common.cuh"
#include "quantize_stream.h"

namespace oscarkv::cuda::detail {
namespace {

// A tile: 64 rows (wgmma M) of 128 bf16 channels, stored as two halves of 64 channels (8 KiB
// each), 128-byte swizzled as the wgmma operand layout wants.
constexpr int kTileRows = 64;
constexpr int kHalfTile = kTileRows * 128;
constexpr int kTileBytes = 2 * kHalfTile;

// Rows already rotated, read from a swizzled tile into the rotated accumulators' layout: this
// thread's rows `row` and `row` + 8, channels 32·tig .. 32·tig + 31, widened to fp32.
__device__ __forceinline__ void LoadTileRows(const uint8_t* tile, int row, int tig, float (&y)[2][32]) {
  const uint8_t* st = tile + (tig >> 1) * kHalfTile;
  const int c0 = (4 * tig) & 7;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint4 v = *reinterpret_cast<const uint4*>(st + Swizzle128(row + 8 * r, c0 + q));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        y[r][8 * q + 2 * e] = __uint_as_float(w[e] << 16);
        y[r][8 * q + 2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
      }
    }
  }
}

// The launch's 64-row tiles, (layer, K|V, head) matrix by matrix, are split into one contiguous
// span per CTA; a CTA walks its span as runs of one matrix's consecutive tiles.
struct TileSpan {
  long long begin, end;
};
__device__ __forceinline__ TileSpan CtaTileSpan(int total_tiles) {
  return {static_cast<long long>(total_tiles) * blockIdx.x / gridDim.x,
          static_cast<long long>(total_tiles) * (blockIdx.x + 1) / gridDim.x};
}
struct MatrixRun {
  int mat, t_first, t_end;  // the matrix and its tiles [t_first, t_end)
};
// The run that starts at tile g of the span (g < end); advances g past it.
__device__ __forceinline__ MatrixRun NextMatrixRun(long long& g, long long end, int tiles_per_mat) {
  MatrixRun r;
  r.mat = static_cast<int>(g / tiles_per_mat);
  r.t_first = static_cast<int>(g % tiles_per_mat);
  const long long run_end = r.t_first + (end - g);
  r.t_end = run_end < tiles_per_mat ? static_cast<int>(run_end) : tiles_per_mat;
  g += r.t_end - r.t_first;
  return r;
}

// Shared-memory matrix descriptor of a K-major, 128-byte swizzled operand tile (8-row groups
// 1024 bytes apart); the start address may sit 32/64/96 bytes into the swizzle atom (k-steps).
// Low word: start address >> 4 (14 bits; shared addresses are < 2^18, so adding an offset >> 4
// never carries out of the field) and leading byte offset 1; high word: stride 1024 >> 4 and
// the 128-byte swizzle mode (bits 62-63 = 1).
__device__ __forceinline__ uint32_t SwizzledDescLo(uint32_t smem_addr) { return (smem_addr >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t SwizzledDesc(uint32_t lo) {
  return static_cast<uint64_t>(lo) | (static_cast<uint64_t>((1024 >> 4) | (1u << 30)) << 32);
}

// y (+)= A(64 x 16, shared) · B(16 x 128, shared), bf16 operands, fp32 accumulators.
template <int kAccumulate>
__device__ __forceinline__ void WgmmaBf16(float (&y0)[32], float (&y1)[32], uint64_t da, uint64_t db) {
#if OSCARKV_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : OSCARKV_WG_ACC(y0, y1)
      : "l"(da), "l"(db), "n"(kAccumulate));
#endif
}
__device__ __forceinline__ void WgmmaFenceAcc(float (&y0)[32], float (&y1)[32]) {
#if OSCARKV_HAVE_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" : OSCARKV_WG_ACC(y0, y1) : : "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#if OSCARKV_HAVE_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits for this warpgroup's wgmmas; the accumulators are operands, so no access moves across.
__device__ __forceinline__ void WgmmaWait(float (&y0)[32], float (&y1)[32]) {
#if OSCARKV_HAVE_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" : OSCARKV_WG_ACC(y0, y1) : : "memory");
#endif
}
// Makes this thread's completed cp.async writes visible to the tensor cores (async proxy).
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Barrier of one warpgroup (ids 1..kWgs; 0 is __syncthreads).
__device__ __forceinline__ void WarpgroupBarrier(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");
}

// A row's group minimum / maximum from its lanes' ones, saturated to ±65504.
template <int G>
__device__ __forceinline__ float SaturatedGroupMin(float v) { return fminf(fmaxf(GroupMin<G>(v), -65504.0f), 65504.0f); }
template <int G>
__device__ __forceinline__ float SaturatedGroupMax(float v) { return fminf(fmaxf(GroupMax<G>(v), -65504.0f), 65504.0f); }

// The group minimum and maximum (saturated to ±65504) of both of this lane's rows.
template <int G>
__device__ __forceinline__ void RowRanges(const float (&y)[2][32], float (&mn)[2], float (&mx)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mn[r] = mx[r] = y[r][0];
#pragma unroll
    for (int i = 1; i < 32; ++i) {
      mn[r] = fminf(mn[r], y[r][i]);
      mx[r] = fmaxf(mx[r], y[r][i]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mn[r] = SaturatedGroupMin<G>(mn[r]);
    mx[r] = SaturatedGroupMax<G>(mx[r]);
  }
}

// Min-max (§1.3) codes of one row's 32 values on this lane.
__device__ __forceinline__ DevParams MinMaxCodes(const float (&y)[32], float mn, float mx, uint32_t (&cw)[2]) {
  const DevParams q = RangeParams(mn, mx);
  LaneCodes(y, q, cw);
  return q;
}

// Finishes both rows from their lane sums and codes (cw still carrying the magic): the rows'
// lane sums are reduce-scattered over the group's lanes, so that each lane finishes one row and
// the per-row work (totals, fp64 divisions, refit, fp16 parameters) runs once per warp instead of
// once per row: G = 128, lanes 0-1 of a quad take row 0 and lanes 2-3 row 1 (one fp64 division
// each: s on the even lane, δ on the odd one, exchanged); G = 64, lane tig takes row tig & 1 of
// group tig >> 1. Leaves this lane's codes of both rows in cw (channel j at bits 2·(j % 16) of
// word j / 16) and the packed parameters of its own row `mine`.
template <int G>
__device__ __forceinline__ void FixedFinish2(const FixedRange (&f)[2], FixedSums (&a)[2], int ci, int tig,
                                             uint32_t (&cw)[2][2], uint32_t& params, int& mine) {
  FixedLaneDone(cw[0], a[0]);
  FixedLaneDone(cw[1], a[1]);
  const uint32_t c1[2] = {CodeSum(cw[0]), CodeSum(cw[1])};
  // Keep row `mine`, hand the other row's sums to the lane that keeps it.
  mine = G == 128 ? (tig >> 1) : (tig & 1);
  constexpr int kFirst = G == 128 ? 2 : 1;
  FixedSums k = mine ? a[1] : a[0];
  const FixedSums o = mine ? a[0] : a[1];
  uint32_t kc = mine ? c1[1] : c1[0];
  const uint32_t oc = mine ? c1[0] : c1[1];
  k.s0 += __shfl_xor_sync(0xffffffffu, o.s0, kFirst);
  k.sy += __shfl_xor_sync(0xffffffffu, o.sy, kFirst);
  k.sq += __shfl_xor_sync(0xffffffffu, o.sq, kFirst);
  k.sf += __shfl_xor_sync(0xffffffffu, o.sf, kFirst);
  kc += __shfl_xor_sync(0xffffffffu, oc, kFirst);
  if constexpr (G == 128) {  // the quad's other lane of the same row
    k.s0 += __shfl_xor_sync(0xffffffffu, k.s0, 1);
    k.sy += __shfl_xor_sync(0xffffffffu, k.sy, 1);
    k.sq += __shfl_xor_sync(0xffffffffu, k.sq, 1);
    k.sf += __shfl_xor_sync(0xffffffffu, k.sf, 1);
    kc += __shfl_xor_sync(0xffffffffu, kc, 1);
  }
  const FixedRange fm = mine ? f[1] : f[0];
  const FixedTotals t = FixedTotalsOf<G>(k, kc);
  double s, delta;
  if constexpr (G == 128) {
    const bool is_delta = tig & 1;
    const double res = __ddiv_rn(is_delta ? static_cast<double>(fm.w) : static_cast<double>(t.num),
                                 is_delta ? 98304.0 : static_cast<double>(t.det));
    const double other = __shfl_xor_sync(0xffffffffu, res, 1);
    s = is_delta ? other : res;
    delta = is_delta ? res : other;
  } else {
    s = __ddiv_rn(static_cast<double>(t.num), static_cast<double>(t.det));
    delta = __ddiv_rn(static_cast<double>(fm.w), 98304.0);
  }
  params = PackParams(FixedParams<G>(t, fm, ci, s, delta));
}

// Unbiased-fixed candidate ci on both of this lane's rows (quantize_common.cuh's rule), their
// group ranges included: row 1's minimum and maximum (FMNMX, the ALU pipe) run in row 0's element
// loop (bound by the FMA-heavy pipe; without rotation this measured 71.3 -> 66.3 µs for the
// flush, bench/results/NOTES.md session 26). Then FixedFinish2.
template <int G>
__device__ __forceinline__ void FixedCodes2(const float (&y)[2][32], int ci, int tig, uint32_t (&cw)[2][2],
                                            uint32_t& params, int& mine) {
  float mn0 = y[0][0], mx0 = y[0][0];
#pragma unroll
  for (int i = 1; i < 32; ++i) {
    mn0 = fminf(mn0, y[0][i]);
    mx0 = fmaxf(mx0, y[0][i]);
  }
  mn0 = SaturatedGroupMin<G>(mn0);
  mx0 = SaturatedGroupMax<G>(mx0);
  FixedRange f[2];
  f[0] = MakeFixedRange(mn0, mx0, ci);
  FixedSums a[2];
  cw[0][0] = cw[0][1] = cw[1][0] = cw[1][1] = 0u;
  float mn1 = y[1][0], mx1 = y[1][0];
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    cw[0][j / 16] += FixedElement(y[0][j], f[0], a[0]) << (2 * (j % 16));
    if (j > 0) {
      mn1 = fminf(mn1, y[1][j]);
      mx1 = fmaxf(mx1, y[1][j]);
    }
  }
  mn1 = SaturatedGroupMin<G>(mn1);
  mx1 = SaturatedGroupMax<G>(mx1);
  f[1] = MakeFixedRange(mn1, mx1, ci);
#pragma unroll
  for (int j = 0; j < 32; ++j) cw[1][j / 16] += FixedElement(y[1][j], f[1], a[1]) << (2 * (j % 16));
  FixedFinish2<G>(f, a, ci, tig, cw, params, mine);
}

}  // namespace
}  // namespace oscarkv::cuda::detail
