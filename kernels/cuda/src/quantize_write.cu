// Quantize-on-write kernel: rotate (tensor cores), clip, INT2-quantize or bf16-round, and store
// rows into their page slots.
//
// A CTA owns one (layer, K|V, KV head) and loops over 64-token tiles (16 tokens per warp). Lane
// (gid, tig) ends up holding channels [32·tig, 32·tig+32) of tokens gid and gid+8 of its warp's
// tile: the mma k order (input channels) and n order (output channels) are permuted in the
// prepared fragments so that both the loads and the packed code stores are contiguous.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "device_util.cuh"
#include "oscarkv/cuda/quantize_write.h"

namespace oscarkv::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 128;
constexpr int kTileTokens = 64;
constexpr int kFragSmem = 16 * 8 * 32 * 16;  // [n-tile][k-step][lane] uint4 = 64 KiB

// Input channel of mma k index `k` at k-step `s`, for the lane layout above.
__host__ __device__ constexpr int KChannel(int s, int k) {
  return 32 * ((k % 8) / 2) + 4 * s + 2 * (k / 8) + (k % 2);
}
// Output channel of mma n index `n` of n-tile `j`.
__host__ __device__ constexpr int NChannel(int j, int n) { return 32 * (n / 2) + 2 * j + (n % 2); }

__global__ void PrepareFragmentsKernel(const float* mats, uint4* frags) {
  const int m = blockIdx.x;  // matrix
  const float* r = mats + size_t(m) * 128 * 128;
  uint4* out = frags + size_t(m) * 16 * 8 * 32;
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

// k-th smallest (0-based) of the 128 non-negative values (as bits) of one row held by the 4
// lanes of a quad (32 each): the largest r with #(a < r) <= k, built bit by bit.
__device__ __forceinline__ uint32_t QuadKth(const uint32_t (&a)[32], int k) {
  uint32_t r = 0;
  for (int bit = 30; bit >= 0; --bit) {
    const uint32_t t = r | (1u << bit);
    int c = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) c += a[i] < t;
    c += __shfl_xor_sync(0xffffffffu, c, 1);
    c += __shfl_xor_sync(0xffffffffu, c, 2);
    if (c <= k) r = t;
  }
  return r;
}

// The c-quantile of |y| over the quad's 128 values, exactly as AbsQuantile (numpy linear).
__device__ float QuadAbsQuantile(const float (&y)[32], float c) {
  uint32_t a[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) a[i] = __float_as_uint(fabsf(y[i]));
  const double pos = static_cast<double>(fmaxf(0.0f, c)) * 127.0;
  const int lo = static_cast<int>(pos);
  const float frac = static_cast<float>(pos - static_cast<double>(lo));
  const uint32_t rlo = QuadKth(a, lo);
  int le = 0;
  uint32_t above = 0x7f800000u;  // +inf
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    le += a[i] <= rlo;
    if (a[i] > rlo) above = min(above, a[i]);
  }
  le += __shfl_xor_sync(0xffffffffu, le, 1);
  le += __shfl_xor_sync(0xffffffffu, le, 2);
  above = min(above, __shfl_xor_sync(0xffffffffu, above, 1));
  above = min(above, __shfl_xor_sync(0xffffffffu, above, 2));
  const float a_lo = __uint_as_float(rlo);
  const float a_hi = (lo + 1 >= 128 || le >= lo + 2) ? a_lo : __uint_as_float(above);
  return __fadd_rn(a_lo, __fmul_rn(frac, __fsub_rn(a_hi, a_lo)));
}

// Quantizes this lane's 32 values of a row (group = G channels spread over G/32 lanes) and
// stores the codes (8 bytes) and, from the first lane of each group, the (scale, min) pair.
template <int G>
__device__ void QuantizeStore(const float (&y)[32], int tig, uint8_t* codes_row,
                              uint8_t* params_row) {
  float mn = y[0], mx = y[0];
#pragma unroll
  for (int i = 1; i < 32; ++i) {
    mn = fminf(mn, y[i]);
    mx = fmaxf(mx, y[i]);
  }
  mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  if (G == 128) {
    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, 2));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  }
  mn = fminf(fmaxf(mn, -65504.0f), 65504.0f);
  mx = fminf(fmaxf(mx, -65504.0f), 65504.0f);
  uint16_t min16 = __half_as_ushort(__float2half_rd(mn));
  if (min16 == 0xfc00) min16 = 0xfbff;
  const float minf = __half2float(__ushort_as_half(min16));
  uint16_t scale16 = __half_as_ushort(__float2half_ru(__fdiv_rn(__fsub_rn(mx, minf), 3.0f)));
  if (scale16 == 0x7c00) scale16 = 0x7bff;
  if (scale16 & 0x8000) scale16 = 0;
  const float sf = __half2float(__ushort_as_half(scale16));
  const float inv = sf > 0.f ? __frcp_rn(sf) : 0.f;
  uint32_t packed[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const float t = __fadd_rn(__fmul_rn(__fsub_rn(y[i], minf), inv), 0.5f);
    const int c = min(max(static_cast<int>(floorf(t)), 0), 3);
    packed[i / 16] |= static_cast<uint32_t>(c) << (2 * (i % 16));
  }
  *reinterpret_cast<uint2*>(codes_row + 8 * tig) = make_uint2(packed[0], packed[1]);
  const int lanes_per_group = G / 32;
  if (tig % lanes_per_group == 0) {
    const int g = tig / lanes_per_group;
    *reinterpret_cast<uint32_t*>(params_row + 4 * g) =
        static_cast<uint32_t>(scale16) | (static_cast<uint32_t>(min16) << 16);
  }
}

template <int G>
__global__ void __launch_bounds__(kThreads) QuantizeWriteKernel(const QuantizeWriteParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int head = blockIdx.y;
  const int li = blockIdx.z >> 1, kv = blockIdx.z & 1;
  const int H = static_cast<int>(p.num_kv_heads);
  const int mat = (li * 2 + kv) * H + head;
  const bool rotate = p.rot_fragments != nullptr;
  const uint4* frag = reinterpret_cast<const uint4*>(smem);
  if (rotate) {
    const uint8_t* src = static_cast<const uint8_t*>(p.rot_fragments) + size_t(mat) * kFragSmem;
    for (int c = tid; c < kFragSmem / 16; c += kThreads) CpAsync16(smem + c * 16, src + c * 16, true);
    CpAsyncCommit();
    CpAsyncWait<0>();
    __syncthreads();
  }
  const float clip = p.clips != nullptr ? p.clips[mat] : 1.0f;
  const uint16_t* base = (kv ? p.v_src : p.k_src) + li * p.src_layer_stride + head * p.src_head_stride;
  const uint32_t layer = p.first_layer + li;
  const PageGeometry g2{p.num_layers, p.num_kv_heads, 128, G, p.page_tokens, PageKind::kInt2};
  const PageGeometry gb{p.num_layers, p.num_kv_heads, 128, G, p.page_tokens, PageKind::kBf16};
  const size_t seg2 = g2.segment_offset(layer, kv, head), segb = gb.segment_offset(layer, kv, head);
  const int codes_bytes = static_cast<int>(g2.codes_bytes());
  const int tiles = (p.num_tokens + kTileTokens - 1) / kTileTokens;

  // Loads the lane's 32 input channels of rows gid and gid+8 of a tile (16 bf16x2 words each).
  auto load = [&](int tile, uint32_t (&xw)[2][16]) {
    const int t0 = tile * kTileTokens + warp * 16;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tk = t0 + gid + 8 * r;
      if (tile < tiles && tk < p.num_tokens) {
        const uint4* src = reinterpret_cast<const uint4*>(base + tk * p.src_token_stride + 32 * tig);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint4 v = src[q];
          xw[r][4 * q] = v.x;
          xw[r][4 * q + 1] = v.y;
          xw[r][4 * q + 2] = v.z;
          xw[r][4 * q + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int q = 0; q < 16; ++q) xw[r][q] = 0u;
      }
    }
  };
  uint32_t xw[2][16];
  load(blockIdx.x, xw);
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int t0 = tile * kTileTokens + warp * 16;
    int tok[2] = {t0 + gid, t0 + gid + 8};
    // Prefetch the next tile's rows while this one is rotated and quantized.
    uint32_t xn[2][16];
    load(tile + gridDim.x, xn);
    float y[2][32];
    if (rotate) {
      uint32_t a[2][16];  // fp16x2 of the same words
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int q = 0; q < 16; ++q) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xw[r][q]));
          const __half2 h = __float22half2_rn(f);
          a[r][q] = *reinterpret_cast<const uint32_t*>(&h);
        }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          if (p.precise_rotation) {
            const uint4 b = frag[(j * 8 + s) * 32 + lane];
            MmaF16(acc, a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1], b.x, b.y);
            MmaF16(acc, a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1], b.z, b.w);
          } else {
            const uint2 b = *reinterpret_cast<const uint2*>(&frag[(j * 8 + s) * 32 + lane]);
            MmaF16(acc, a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1], b.x, b.y);
          }
        }
        y[0][2 * j] = acc[0];
        y[0][2 * j + 1] = acc[1];
        y[1][2 * j] = acc[2];
        y[1][2 * j + 1] = acc[3];
      }
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int q = 0; q < 16; ++q) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xw[r][q]));
          y[r][2 * q] = f.x;
          y[r][2 * q + 1] = f.y;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const bool valid = tok[r] < p.num_tokens;
      const int tc = valid ? tok[r] : 0;
      const int pid = valid ? p.dst_page[tc] : 0;
      const int slot = valid ? p.dst_slot[tc] : 0;
      const bool int2 = valid && p.page_kinds[pid] == static_cast<uint8_t>(PageKind::kInt2);
      uint8_t* page = valid ? p.page_ptrs[pid] : nullptr;
      if (valid && !int2) {
        uint32_t packed[16];
#pragma unroll
        for (int q = 0; q < 16; ++q) {
          const __nv_bfloat162 b = __floats2bfloat162_rn(y[r][2 * q], y[r][2 * q + 1]);
          packed[q] = *reinterpret_cast<const uint32_t*>(&b);
        }
        uint4* dst = reinterpret_cast<uint4*>(page + segb + size_t(slot) * 256 + 64 * tig);
#pragma unroll
        for (int q = 0; q < 4; ++q)
          dst[q] = make_uint4(packed[4 * q], packed[4 * q + 1], packed[4 * q + 2], packed[4 * q + 3]);
      }
      // The quad's 4 lanes share the row, so `int2` is uniform within a quad; shuffles below
      // stay within quads, and whole quads skip together.
      if (!__any_sync(0xffffffffu, int2)) continue;
      if (clip < 1.0f) {
        const float t = QuadAbsQuantile(y[r], clip);
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const float v = y[r][i];
          y[r][i] = v < -t ? -t : (t < v ? t : v);
        }
      }
      uint8_t scratch[32];
      uint8_t* codes_row = int2 ? page + seg2 + size_t(slot) * 32 : scratch;
      uint8_t* params_row = int2 ? page + seg2 + codes_bytes + size_t(slot) * (128 / G) * 4 : scratch;
      if (int2) {
        QuantizeStore<G>(y[r], tig, codes_row, params_row);
      } else {
        // Keep the quad's shuffles convergent: lanes with nothing to write still take part.
        float dummy[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) dummy[i] = 0.f;
        QuantizeStore<G>(dummy, tig, scratch, scratch);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int q = 0; q < 16; ++q) xw[r][q] = xn[r][q];
  }
}

}  // namespace

absl::Status PrepareRotationFragments(const float* matrices, int count, void* fragments,
                                      cudaStream_t stream) {
  if (count <= 0) return absl::OkStatus();
  if (matrices == nullptr || fragments == nullptr) {
    return absl::InvalidArgumentError("PrepareRotationFragments: null buffer");
  }
  PrepareFragmentsKernel<<<count, 256, 0, stream>>>(matrices, static_cast<uint4*>(fragments));
  return CudaStatus(cudaGetLastError(), "prepare rotation fragments");
}

absl::Status LaunchQuantizeWrite(const QuantizeWriteParams& p, cudaStream_t stream) {
  if (p.head_dim != 128 || (p.group_size != 128 && p.group_size != 64)) {
    return absl::InvalidArgumentError("quantize-on-write needs head_dim 128 and group 128 or 64");
  }
  if (p.range_mode != RangeMode::kMinMax) {
    return absl::UnimplementedError(
        "quantize-on-write implements the min-max range rule only (RangeMode::kMinMax)");
  }
  if (p.num_tokens <= 0 || p.layer_count == 0) return absl::OkStatus();
  if (p.k_src == nullptr || p.v_src == nullptr || p.page_ptrs == nullptr ||
      p.page_kinds == nullptr || p.dst_page == nullptr || p.dst_slot == nullptr) {
    return absl::InvalidArgumentError("quantize-on-write: missing buffer");
  }
  if (p.first_layer + p.layer_count > p.num_layers) {
    return absl::InvalidArgumentError("quantize-on-write: layers out of range");
  }
  if (p.src_token_stride % 8 != 0 || p.src_head_stride % 8 != 0 || p.src_layer_stride % 8 != 0) {
    return absl::InvalidArgumentError("quantize-on-write: source strides must be 16-byte multiples");
  }
  const int tiles = (p.num_tokens + kTileTokens - 1) / kTileTokens;
  const int per_cta = p.rot_fragments != nullptr ? 8 : 2;  // amortize the 64 KiB fragment load
  dim3 grid((tiles + per_cta - 1) / per_cta, p.num_kv_heads, 2 * p.layer_count);
  const int smem = p.rot_fragments != nullptr ? kFragSmem : 0;
  if (p.group_size == 128) {
    cudaFuncSetAttribute(QuantizeWriteKernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, kFragSmem);
    QuantizeWriteKernel<128><<<grid, kThreads, smem, stream>>>(p);
  } else {
    cudaFuncSetAttribute(QuantizeWriteKernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, kFragSmem);
    QuantizeWriteKernel<64><<<grid, kThreads, smem, stream>>>(p);
  }
  return CudaStatus(cudaGetLastError(), "quantize-on-write launch");
}

}  // namespace oscarkv::cuda
