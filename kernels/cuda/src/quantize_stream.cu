// The streaming quantize-on-write kernel (sm_90a): rows stream through shared memory and are
// rotated by wgmma with both operands there, so the ALU is left with the range rule alone.
//
// One CTA per SM, four warpgroups. The CTA takes a contiguous range of the launch's 64-row tiles
// (tiles of one (layer, K|V, head) matrix are consecutive) and walks it matrix by matrix: R's
// bf16 hi + lo image (64 KiB, prepared once by PrepareRotationFragments) is copied into shared
// memory, then warpgroup w takes tiles w, w + 4, ... of the matrix. Each warpgroup streams its
// tiles through a private ring of 2 tiles (3 for rows already rotated, which need no image;
// cp.async, 16 KiB per tile, 128-byte swizzled as the
// wgmma operand layout wants), rotates a tile with 16 wgmma.m64n128k16 (8 k-steps x R hi, lo;
// A = the rows from shared memory; the next tile's copies and the destinations' loads are issued
// while they run), and its 128 threads then hold two rows each, 32 consecutive
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
#include "quantize_stream_device.cuh"

namespace oscarkv::cuda::detail {
namespace {

// Warpgroups per CTA (4 by default, 128 registers, 2-stage rings; 3 with 168 registers and
// 3-stage rings, LoadPath::kStream3, measured slower on an H200: unbiased-fixed 112.5 vs 105.0 us,
// min-max 82.6 vs 78.0 us, BF16 pages equal; 5 warpgroups at 96 registers spilled and measured
// 117.5 us, 97.1-97.8 against 92.7-95.1 in session 25) and tiles in flight per warpgroup (ring
// stages).
// Unrotated rows (kParts = 0: the flush, or V with R_V absorbed) need no image, so their rings
// take 3 stages at 4 warpgroups.
constexpr int StagesOf(int wgs, int parts) { return parts == 0 || wgs != 4 ? 3 : 2; }
constexpr int ImageBytesOf(int parts) { return parts == 0 ? 0 : kStreamImageBytes; }
constexpr int SmemBytesOf(int wgs, int parts) { return 1024 + ImageBytesOf(parts) + wgs * StagesOf(wgs, parts) * kTileBytes; }

// kParts: 2 rotates by R hi + lo (the product), 1 by R hi only (~2^-9 relative: timing
// diagnostics, LoadPath::kStream with precise_rotation false), 0 takes the rows as they are
// (already rotated: the flush, R_V absorbed), read from the ring into the same registers.
// kWgs: warpgroups per CTA.
template <int G, int kParts, int kWgs>
__global__ void __launch_bounds__(128 * kWgs, 1)
    StreamWriteKernel(const QuantizeWriteArgs p, int tiles_per_mat, int total_tiles) {
#if OSCARKV_HAVE_WGMMA
  constexpr int kThreads = 128 * kWgs, kStages = StagesOf(kWgs, kParts), kImage = ImageBytesOf(kParts);
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // Swizzled operand tiles want 1024-byte alignment.
  uint8_t* smem = smem_raw + ((1024u - (SmemAddr(smem_raw) & 1023u)) & 1023u);
  // The warpgroup index through a shuffle from lane 0: ptxas then knows it (and the ring and
  // wgmma descriptors derived from it) is warp-uniform and keeps them in uniform registers.
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), tw = tid & 127, lane = tid & 31;
  const int gid = lane >> 2, tig = lane & 3, wrow = 16 * ((tid >> 5) & 3);
  uint8_t* rimg = smem;
  uint8_t* ring = smem + kImage + wg * kStages * kTileBytes;
  const int H = static_cast<int>(p.num_kv_heads);
  const PageGeometry g2{p.num_layers, p.num_kv_heads, 128, G, p.page_tokens, PageKind::kInt2};
  const PageGeometry gb{p.num_layers, p.num_kv_heads, 128, G, p.page_tokens, PageKind::kBf16};
  const size_t codes_bytes = g2.codes_bytes();
  const TileSpan span = CtaTileSpan(total_tiles);
  for (long long g = span.begin; g < span.end;) {
    // One matrix's run of this CTA's tiles.
    const MatrixRun run = NextMatrixRun(g, span.end, tiles_per_mat);
    const int mat = run.mat, t_first = run.t_first, t_end = run.t_end;
    const int li = mat / (2 * H), kv = (mat / H) & 1, head = mat % H;
    const uint8_t mode = static_cast<uint8_t>(p.range_modes != nullptr ? p.range_modes[mat] : static_cast<uint8_t>(p.range_mode));
    if (mode != 0 && !IsUnbiasedFixed(static_cast<RangeMode>(mode))) __trap();  // the launcher checks
    const bool fixed = IsUnbiasedFixed(static_cast<RangeMode>(mode));
    const int ci = fixed ? FixedCandidate(static_cast<RangeMode>(mode)) : 0;
    const uint16_t* src = (kv ? p.v_src : p.k_src) + li * p.src_layer_stride + head * p.src_head_stride;
    const uint32_t layer = p.first_layer + li;
    const size_t seg2 = g2.segment_offset(layer, kv, head), segb = gb.segment_offset(layer, kv, head);

    __syncthreads();  // every warpgroup is done with the previous matrix's image
    if constexpr (kParts > 0) {
      const uint8_t* img = static_cast<const uint8_t*>(p.rot_fragments) + size_t(mat) * kRotationFragmentBytes + kStreamImageOffset;
      for (int c = tid; c < kStreamImageBytes / 16; c += kThreads) CpAsync16(rimg + 16 * c, img + 16 * c, true);
    }
    CpAsyncCommit();  // (an empty group without rotation: the same group count below)

    // This warpgroup's tiles: t_first + wg + kWgs·i, i < n.
    const int n = t_first + wg < t_end ? (t_end - t_first - wg + kWgs - 1) / kWgs : 0;
    auto tile_of = [&](int i) { return t_first + wg + kWgs * i; };
    // Thread tw copies 16-byte chunks tw + 128·q of the tile: row (tw + 128q) / 16, channel chunk
    // tw % 16 (a warp copies two whole rows).
    // Row (tw >> 4) + 8q sits at q·1024 past row tw >> 4 in the same swizzle phase (row & 7).
    const int cchunk = tw & 15, crow = tw >> 4;
    const int cdst = (cchunk >> 3) * kHalfTile + Swizzle128(crow, cchunk & 7);
    const int64_t cstep = 8 * p.src_token_stride;
    auto issue = [&](int i, int stage) {
      if (i < n) {
        const int tok0 = tile_of(i) * kTileRows + crow;
        const uint16_t* gsrc = src + int64_t(tok0) * p.src_token_stride + 8 * cchunk;
        uint8_t* st = ring + stage * kTileBytes + cdst;
        if ((tile_of(i) + 1) * kTileRows <= p.num_tokens) {  // a whole tile (warp-uniform)
#pragma unroll
          for (int q = 0; q < 8; ++q) CpAsync16(st + q * 1024, gsrc + q * cstep);
        } else {
          const int left = p.num_tokens - tok0;  // rows 8q < left exist
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            const bool ok = 8 * q < left;
            CpAsync16(st + q * 1024, ok ? gsrc : src, ok);
            gsrc += cstep;
          }
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
    const uint32_t rlo = SwizzledDescLo(SmemAddr(rimg));
    // Issues the rotation of the tile in `stage` into y (16 wgmmas, one commit group).
    auto rotate = [&](int stage, float (&y)[2][32]) {
      const uint32_t alo = SwizzledDescLo(SmemAddr(ring + stage * kTileBytes));
      WgmmaFenceAcc(y[0], y[1]);
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const uint32_t koff = ((s >> 2) * kHalfTile + (s & 3) * 32) >> 4;
        const uint32_t roff = ((s >> 2) * 16384 + (s & 3) * 32) >> 4;
        const uint64_t da = SwizzledDesc(alo + koff);
        if (s == 0) {
          WgmmaBf16<0>(y[0], y[1], da, SwizzledDesc(rlo + roff));
        } else {
          WgmmaBf16<1>(y[0], y[1], da, SwizzledDesc(rlo + roff));
        }
        if (kParts == 2) WgmmaBf16<1>(y[0], y[1], da, SwizzledDesc(rlo + ((2 * 16384) >> 4) + roff));
      }
      WgmmaCommit();
    };
    // Page kind and pointer of this thread's rows of the current tile (their destinations were
    // loaded a tile ahead), then the next tile's destinations.
    struct RowDst {
      uint8_t kind[2];
      uint8_t* page[2];
      int slot[2];
    };
    auto take_dst = [&](int next) {
      RowDst d;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        d.kind[r] = pid[r] >= 0 ? p.page_kinds[pid[r]] : 0;
        d.page[r] = pid[r] >= 0 ? p.page_ptrs[pid[r]] : nullptr;
        d.slot[r] = slot[r];
      }
      load_dst(next, pid, slot);
      return d;
    };
    // Writes this thread's two rotated rows: bf16 rows into BF16 pages, codes and parameters into
    // INT2 pages.
    auto finish = [&](const float (&y)[2][32], const RowDst& d) {
      bool int2[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        int2[r] = d.kind[r] == static_cast<uint8_t>(PageKind::kInt2);
        if (d.kind[r] == static_cast<uint8_t>(PageKind::kBf16)) {
          uint32_t packed[16];
#pragma unroll
          for (int q = 0; q < 16; ++q) packed[q] = PackBf162(__float2bfloat16_rn(y[r][2 * q]), __float2bfloat16_rn(y[r][2 * q + 1]));
          uint4* dst = reinterpret_cast<uint4*>(d.page[r] + segb + size_t(d.slot[r]) * 256 + 64 * tig);
#pragma unroll
          for (int q = 0; q < 4; ++q) dst[q] = make_uint4(packed[4 * q], packed[4 * q + 1], packed[4 * q + 2], packed[4 * q + 3]);
        }
      }
      // A row's lanes (a quad) share its kind; the selection's shuffles need the whole warp.
      if (!__any_sync(0xffffffffu, int2[0] || int2[1])) return;
      uint32_t cw[2][2];
      constexpr int kLanesPerGroup = G / 32;
      auto params_at = [&](int r, int group) {  // r may be a runtime row: selects, no local array
        uint8_t* const page = r ? d.page[1] : d.page[0];
        const int sl = r ? d.slot[1] : d.slot[0];
        return reinterpret_cast<uint32_t*>(page + seg2 + codes_bytes + size_t(sl) * (128 / G) * 4 + 4 * group);
      };
      if (fixed) {
        uint32_t pw;
        int mine;
        FixedCodes2<G>(y, ci, tig, cw, pw, mine);
        // G = 128: the even lane of each row's pair stores; G = 64: every lane, its (row, group).
        const bool int2_mine = mine ? int2[1] : int2[0];
        if (int2_mine && (G == 64 || (tig & 1) == 0)) *params_at(mine, G == 64 ? tig >> 1 : 0) = pw;
      } else {
        float mn[2], mx[2];
        RowRanges<G>(y, mn, mx);
        const DevParams q[2] = {MinMaxCodes(y[0], mn[0], mx[0], cw[0]), MinMaxCodes(y[1], mn[1], mx[1], cw[1])};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (int2[r] && tig % kLanesPerGroup == 0) *params_at(r, tig / kLanesPerGroup) = PackParams(q[r]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (int2[r]) *reinterpret_cast<uint2*>(d.page[r] + seg2 + size_t(d.slot[r]) * 32 + 8 * tig) = make_uint2(cw[r][0], cw[r][1]);
      }
    };
    for (int i = 0; i < n; ++i) {
      CpAsyncWait<kStages - 2>();
      FenceProxyAsync();
      WarpgroupBarrier(wg);  // tile i is in shared memory; tile i - 1's stage is free
      // The rotation runs on the tensor cores while this warpgroup issues the next copies and the
      // destinations' loads. (Two accumulator sets per warpgroup, one tile quantized while the
      // next rotates, made ptxas serialize the wgmmas: C7514/C7518. Finishing tile i's refit after
      // tile i + 1's rotation is issued measured slower: its DFMAs share the pipe with the
      // wgmmas. bench/results/NOTES.md session 25.)
      float y[2][32];
      if constexpr (kParts > 0) {
        rotate(i % kStages, y);
      } else {
        LoadTileRows(ring + (i % kStages) * kTileBytes, wrow + gid, tig, y);
      }
      issue(i + kStages - 1, (i + kStages - 1) % kStages);
      const RowDst d = take_dst(i + 1);
      if constexpr (kParts > 0) WgmmaWait(y[0], y[1]);
      finish(y, d);
    }
    CpAsyncWait<0>();
  }
#else
  __trap();
#endif
}

}  // namespace

bool StreamWriteSupports(const QuantizeWriteArgs& p, const char** why) {
  const char* reason = nullptr;
  const uint8_t m = static_cast<uint8_t>(p.range_mode);
  if (p.rot_fragments != nullptr && !p.precise_rotation && p.load_path != QuantizeWriteArgs::LoadPath::kStream) {  // kStream: hi only
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

absl::Status LaunchStreamWrite(const QuantizeWriteArgs& p, cudaStream_t stream) {
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write (stream) device");
  const int tiles_per_mat = (p.num_tokens + kTileRows - 1) / kTileRows;
  const long long total = static_cast<long long>(tiles_per_mat) * p.layer_count * 2 * p.num_kv_heads;
  if (total > (1ll << 31) - 1) return absl::InvalidArgumentError("quantize-on-write: launch too large");
  const int ctas = static_cast<int>(std::min<long long>(sms, total));
  using LoadPath = QuantizeWriteArgs::LoadPath;
  const int parts = p.rot_fragments == nullptr ? 0 : p.precise_rotation ? 2 : 1;
  const int wgs = parts != 0 && p.load_path == LoadPath::kStream3 ? 3 : 4;
  auto run = [&](auto kernel) -> absl::Status {
    const int smem = SmemBytesOf(wgs, parts);
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return CudaStatus(err, "quantize-on-write (stream) smem attribute");
    kernel<<<ctas, 128 * wgs, smem, stream>>>(p, tiles_per_mat, static_cast<int>(total));
    return CudaStatus(cudaGetLastError(), "quantize-on-write (stream) launch");
  };
  const bool g128 = p.group_size == 128;
  if (parts == 0) {  // unrotated rows (the flush, R_V absorbed): 4 warpgroups, 3-stage rings
    return g128 ? run(StreamWriteKernel<128, 0, 4>) : run(StreamWriteKernel<64, 0, 4>);
  }
  if (!p.precise_rotation) {  // kStream's R-hi-only diagnostic (StreamWriteSupports)
    return g128 ? run(StreamWriteKernel<128, 1, 4>) : run(StreamWriteKernel<64, 1, 4>);
  }
  if (wgs == 4) return g128 ? run(StreamWriteKernel<128, 2, 4>) : run(StreamWriteKernel<64, 2, 4>);
  return g128 ? run(StreamWriteKernel<128, 2, 3>) : run(StreamWriteKernel<64, 2, 3>);
}

}  // namespace oscarkv::cuda::detail
