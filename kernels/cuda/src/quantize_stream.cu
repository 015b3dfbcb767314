// The streaming quantize-on-write kernel (sm_90a): rows stream through shared memory and are
// rotated by wgmma with both operands there, so the ALU is left with the range rule alone.
//
// One CTA per SM, three warpgroups. The CTA takes a contiguous range of the launch's 64-row tiles
// (tiles of one (layer, K|V, head) matrix are consecutive) and walks it matrix by matrix: R's
// bf16 hi + lo image (64 KiB, prepared once by PrepareRotationFragments) is copied into shared
// memory, then warpgroup w takes tiles w, w + 3, ... of the matrix. Each warpgroup streams its
// tiles through a private ring of kStages tiles (cp.async, 16 KiB per tile, 128-byte swizzled as
// the wgmma operand layout wants), rotates a tile with 16 wgmma.m64n128k16 (8 k-steps x R hi, lo;
// A = the rows from shared memory), and its 128 threads then hold two rows each, 32 consecutive
// output channels per lane (StreamChannel). They quantize them in registers -- min-max or the
// unbiased-fixed range rule (docs/FORMAT.md §1.3.1: one candidate's sums per element, one
// refit per row) -- and store the codes and fp16 parameters, or the rotated bf16 row for BF16
// pages, into the destination slots.
//
// Rotation precision: R as bf16 hi + lo (~2^-17 relative), the rows exactly as stored (bf16),
// fp32 accumulation. With R = identity (or any permutation) the rotated rows are exact, so the
// written bytes equal the CPU reference bit for bit (the GPU tests check both cases).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "device_util.cuh"
#include "oscarkv/kernels/page_format.h"
#include "quantize_common.cuh"
#include "quantize_stream.h"

namespace oscarkv::cuda::detail {
namespace {

constexpr int kWgs = 3;  // warpgroups per CTA
constexpr int kThreads = 128 * kWgs;
constexpr int kStages = 3;                 // tiles in flight per warpgroup
constexpr int kTileRows = 64;              // rows per tile (wgmma M)
constexpr int kHalfTile = kTileRows * 128;  // 64 rows x 64 channels (bf16) = 8 KiB
constexpr int kTileBytes = 2 * kHalfTile;
constexpr int kFragPart = 128 * 128 * 4;  // the mma fragments before the image in each prepared matrix
constexpr int kSmemBytes = 1024 + kStreamImageBytes + kWgs * kStages * kTileBytes;

// Shared-memory matrix descriptor of a K-major, 128-byte swizzled operand tile (8-row groups
// 1024 bytes apart); the start address may sit 32/64/96 bytes into the swizzle atom (k-steps).
__device__ __forceinline__ uint64_t SwizzledDesc(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr & 0x3ffffu) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
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
// Makes this thread's completed cp.async writes visible to the tensor cores (async proxy).
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Barrier of one warpgroup (ids 1..kWgs; 0 is __syncthreads).
__device__ __forceinline__ void WarpgroupBarrier(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");
}

// Quantizes one row's group (this lane's 32 consecutive channels, the group spread over G/32
// lanes) with range mode `mode` (kMinMax or unbiased-fixed); codes packed as stored (channel j
// of the lane at bits 2·(j % 16) of word j / 16). Every lane of the warp must call it.
template <int G>
__device__ __forceinline__ DevParams QuantizeLane(const float (&y)[32], uint8_t mode, uint32_t (&cw)[2]) {
  float mn = y[0], mx = y[0];
#pragma unroll
  for (int i = 1; i < 32; ++i) {
    mn = fminf(mn, y[i]);
    mx = fmaxf(mx, y[i]);
  }
  mn = fminf(fmaxf(GroupMin<G>(mn), -65504.0f), 65504.0f);
  mx = fminf(fmaxf(GroupMax<G>(mx), -65504.0f), 65504.0f);
  cw[0] = cw[1] = 0u;
  if (!IsUnbiasedFixed(static_cast<RangeMode>(mode))) {  // min-max (§1.3)
    const DevParams q = RangeParams(mn, mx);
    const float minf = H2F(q.min16), sf = H2F(q.scale16);
    const float inv = sf > 0.f ? __frcp_rn(sf) : 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const float t = __fadd_rn(__fmul_rn(__fsub_rn(y[i], minf), inv), 0.5f);
      cw[i / 16] |= static_cast<uint32_t>(min(max(static_cast<int>(floorf(t)), 0), 3)) << (2 * (i % 16));
    }
    return q;
  }
  return SelectUnbiasedFixed<G>(y, FixedCandidate(static_cast<RangeMode>(mode)), mn, mx, cw);
}

// kParts: 2 rotates by R hi + lo (the product), 1 by R hi only (~2^-9 relative: timing
// diagnostics, LoadPath::kStream with precise_rotation false).
template <int G, int kParts>
__global__ void __launch_bounds__(kThreads, 1)
    StreamWriteKernel(const QuantizeWriteParams p, int tiles_per_mat, int total_tiles) {
#if OSCARKV_HAVE_WGMMA
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // Swizzled operand tiles want 1024-byte alignment.
  uint8_t* smem = smem_raw + ((1024u - (SmemAddr(smem_raw) & 1023u)) & 1023u);
  const int tid = threadIdx.x, wg = tid >> 7, tw = tid & 127, lane = tid & 31;
  const int gid = lane >> 2, tig = lane & 3, wrow = 16 * ((tid >> 5) & 3);
  uint8_t* rimg = smem;
  uint8_t* ring = smem + kStreamImageBytes + wg * kStages * kTileBytes;
  const int H = static_cast<int>(p.num_kv_heads);
  const PageGeometry g2{p.num_layers, p.num_kv_heads, 128, G, p.page_tokens, PageKind::kInt2};
  const PageGeometry gb{p.num_layers, p.num_kv_heads, 128, G, p.page_tokens, PageKind::kBf16};
  const size_t codes_bytes = g2.codes_bytes();
  const long long g_begin = static_cast<long long>(total_tiles) * blockIdx.x / gridDim.x;
  const long long g_end = static_cast<long long>(total_tiles) * (blockIdx.x + 1) / gridDim.x;
  for (long long g = g_begin; g < g_end;) {
    // One matrix's run of this CTA's tiles.
    const int mat = static_cast<int>(g / tiles_per_mat), t_first = static_cast<int>(g % tiles_per_mat);
    const long long run_end = t_first + (g_end - g);
    const int t_end = run_end < tiles_per_mat ? static_cast<int>(run_end) : tiles_per_mat;
    g += t_end - t_first;
    const int li = mat / (2 * H), kv = (mat / H) & 1, head = mat % H;
    const uint8_t mode = static_cast<uint8_t>(p.range_modes != nullptr ? p.range_modes[mat] : static_cast<uint8_t>(p.range_mode));
    if (mode != 0 && !IsUnbiasedFixed(static_cast<RangeMode>(mode))) __trap();  // the launcher checks
    const uint16_t* src = (kv ? p.v_src : p.k_src) + li * p.src_layer_stride + head * p.src_head_stride;
    const uint32_t layer = p.first_layer + li;
    const size_t seg2 = g2.segment_offset(layer, kv, head), segb = gb.segment_offset(layer, kv, head);

    __syncthreads();  // every warpgroup is done with the previous matrix's image
    const uint8_t* img = static_cast<const uint8_t*>(p.rot_fragments) + size_t(mat) * kRotationFragmentBytes + kFragPart;
    for (int c = tid; c < kStreamImageBytes / 16; c += kThreads) CpAsync16(rimg + 16 * c, img + 16 * c, true);
    CpAsyncCommit();

    // This warpgroup's tiles: t_first + wg + kWgs·i, i < n.
    const int n = t_first + wg < t_end ? (t_end - t_first - wg + kWgs - 1) / kWgs : 0;
    auto tile_of = [&](int i) { return t_first + wg + kWgs * i; };
    // Thread tw copies 16-byte chunks tw + 128·q of the tile: row (tw + 128q) / 16, channel chunk
    // tw % 16 (a warp copies two whole rows).
    const int cchunk = tw & 15;
    auto issue = [&](int i, int stage) {
      if (i < n) {
        const int tok0 = tile_of(i) * kTileRows;
        uint8_t* st = ring + stage * kTileBytes + (cchunk >> 3) * kHalfTile;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const int row = (tw >> 4) + 8 * q, tok = tok0 + row;
          const bool ok = tok < p.num_tokens;
          CpAsync16(st + Swizzle128(row, cchunk & 7), src + int64_t(ok ? tok : 0) * p.src_token_stride + 8 * cchunk, ok);
        }
      }
      CpAsyncCommit();
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s, s);
    CpAsyncWait<kStages - 1>();  // the image (committed first)
    FenceProxyAsync();
    __syncthreads();

    // Destinations of this thread's rows (wrow + gid + 8r of each tile), one tile ahead.
    int pid[2] = {0, 0}, slot[2] = {0, 0};
    auto load_dst = [&](int i, int (&pd)[2], int (&sl)[2]) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int tok = tile_of(i) * kTileRows + wrow + gid + 8 * r;
        const bool ok = i < n && tok < p.num_tokens;
        pd[r] = ok ? p.dst_page[tok] : -1;
        sl[r] = ok ? p.dst_slot[tok] : 0;
      }
    };
    load_dst(0, pid, slot);
    const uint32_t rbase = SmemAddr(rimg);
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages;
      CpAsyncWait<kStages - 2>();
      FenceProxyAsync();
      WarpgroupBarrier(wg);  // tile i is in shared memory; tile i - 1's stage is free
      issue(i + kStages - 1, (i + kStages - 1) % kStages);
      uint8_t kind[2];
      uint8_t* page[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        kind[r] = pid[r] >= 0 ? p.page_kinds[pid[r]] : 0;
        page[r] = pid[r] >= 0 ? p.page_ptrs[pid[r]] : nullptr;
      }
      int slot_now[2] = {slot[0], slot[1]};
      load_dst(i + 1, pid, slot);

      float y[2][32];
      const uint32_t abase = SmemAddr(ring + stage * kTileBytes);
      WgmmaFenceAcc(y[0], y[1]);
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const uint32_t koff = (s >> 2) * kHalfTile + (s & 3) * 32;
        const uint32_t roff = (s >> 2) * 16384 + (s & 3) * 32;
        const uint64_t da = SwizzledDesc(abase + koff);
        if (s == 0) {
          WgmmaBf16<0>(y[0], y[1], da, SwizzledDesc(rbase + roff));
        } else {
          WgmmaBf16<1>(y[0], y[1], da, SwizzledDesc(rbase + roff));
        }
        if (kParts == 2) WgmmaBf16<1>(y[0], y[1], da, SwizzledDesc(rbase + 2 * 16384 + roff));
      }
      WgmmaCommitWait(y[0], y[1]);

#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const bool int2 = kind[r] == static_cast<uint8_t>(PageKind::kInt2);
        if (kind[r] == static_cast<uint8_t>(PageKind::kBf16)) {
          uint32_t packed[16];
#pragma unroll
          for (int q = 0; q < 16; ++q) packed[q] = PackBf162(__float2bfloat16_rn(y[r][2 * q]), __float2bfloat16_rn(y[r][2 * q + 1]));
          uint4* dst = reinterpret_cast<uint4*>(page[r] + segb + size_t(slot_now[r]) * 256 + 64 * tig);
#pragma unroll
          for (int q = 0; q < 4; ++q) dst[q] = make_uint4(packed[4 * q], packed[4 * q + 1], packed[4 * q + 2], packed[4 * q + 3]);
        }
        // A row's lanes (a quad) share its kind; the selection's shuffles need the whole warp.
        if (!__any_sync(0xffffffffu, int2)) continue;
        uint32_t cw[2];
        const DevParams q = QuantizeLane<G>(y[r], mode, cw);
        if (int2) {
          uint8_t* base = page[r] + seg2;
          *reinterpret_cast<uint2*>(base + size_t(slot_now[r]) * 32 + 8 * tig) = make_uint2(cw[0], cw[1]);
          constexpr int kLanesPerGroup = G / 32;
          if (tig % kLanesPerGroup == 0) {
            *reinterpret_cast<uint32_t*>(base + codes_bytes + size_t(slot_now[r]) * (128 / G) * 4 + 4 * (tig / kLanesPerGroup)) =
                PackParams(q);
          }
        }
      }
    }
    CpAsyncWait<0>();
  }
#else
  __trap();
#endif
}

}  // namespace

bool StreamWriteSupports(const QuantizeWriteParams& p, const char** why) {
  const char* reason = nullptr;
  const uint8_t m = static_cast<uint8_t>(p.range_mode);
  if (p.rot_fragments == nullptr) {
    reason = "rows are not rotated";
  } else if (!p.precise_rotation && p.load_path != QuantizeWriteParams::LoadPath::kStream) {
    reason = "R fp16-only rotation asked";
  } else if (p.clips != nullptr) {
    reason = "quantile clips";
  } else if (p.head_dim != 128 || (p.group_size != 128 && p.group_size != 64)) {
    reason = "shape";
  } else if (p.range_modes != nullptr ? !p.range_modes_fixed_only
                                      : (m != 0 && !IsUnbiasedFixed(static_cast<RangeMode>(m)))) {
    reason = "range modes other than min-max and unbiased-fixed";
  }
  if (why != nullptr) *why = reason;
  return reason == nullptr;
}

absl::Status LaunchStreamWrite(const QuantizeWriteParams& p, cudaStream_t stream) {
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write (stream) device");
  const int tiles_per_mat = (p.num_tokens + kTileRows - 1) / kTileRows;
  const long long total = static_cast<long long>(tiles_per_mat) * p.layer_count * 2 * p.num_kv_heads;
  if (total > (1ll << 31) - 1) return absl::InvalidArgumentError("quantize-on-write: launch too large");
  const int ctas = static_cast<int>(std::min<long long>(sms, total));
  auto run = [&](auto kernel) -> absl::Status {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return CudaStatus(err, "quantize-on-write (stream) smem attribute");
    kernel<<<ctas, kThreads, kSmemBytes, stream>>>(p, tiles_per_mat, static_cast<int>(total));
    return CudaStatus(cudaGetLastError(), "quantize-on-write (stream) launch");
  };
  if (!p.precise_rotation) {
    return p.group_size == 128 ? run(StreamWriteKernel<128, 1>) : run(StreamWriteKernel<64, 1>);
  }
  return p.group_size == 128 ? run(StreamWriteKernel<128, 2>) : run(StreamWriteKernel<64, 2>);
}

}  // namespace oscarkv::cuda::detail
