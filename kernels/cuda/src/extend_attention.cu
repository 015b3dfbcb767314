// Extend attention over a paged prefix plus causal new tokens (see extend_attention.h).
//
// Per K/V tile of 64 keys (prefix slices first, then the new tokens up to the CTA's last query):
// all 128 threads write the tile into shared memory as fp16 rows (stride 136 halves: the
// 32-bit score-operand loads and the ldmatrix.trans row addresses hit distinct banks), then each
// warp computes S = Q·Kᵀ (16 rows x 64 keys: 8 n-tiles x 8 k-steps), masks, updates its online
// softmax and adds P·V (P reused from the score accumulators as A fragments).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "device_util.cuh"
#include "extend_internal.h"
#include "oscarkv/cuda/extend_attention.h"

namespace oscarkv::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 128;
constexpr int kTile = 64;        // keys per tile
constexpr int kRowHalves = 136;  // fp16 row stride in shared memory
constexpr int kKvBytes = 2 * kTile * kRowHalves * 2;               // K and V tiles
constexpr int kQRawBytes = 4 * kExtendQueryBlock * 128 * 4;        // raw q rows, fp32
constexpr int kSmemBytes = kQRawBytes + kKvBytes;                  // 32 KiB + 34 KiB
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float Ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t Bf16x2ToHalf2(uint32_t w) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  const __half2 h = __float22half2_rn(f);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Key tile t of the CTA: a prefix slice (page, token offset, valid tokens, kind) or a block of
// new tokens.
struct TileSrc {
  const uint8_t* page;  // prefix page base (nullptr: new tokens)
  int tok0, valid, kind;
};

template <int G>
__global__ void __launch_bounds__(kThreads) ExtendKernel(const ExtendParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const DecodeShape& sh = p.shape;
  const int H = static_cast<int>(sh.num_kv_heads), Hq = static_cast<int>(sh.num_q_heads);
  const int gqa = static_cast<int>(sh.gqa());
  const int seq = blockIdx.y / H, h = blockIdx.y % H;
  const int q_begin = p.q_indptr[seq], num_new = p.q_indptr[seq + 1] - q_begin;
  const int qb0 = blockIdx.x * kExtendQueryBlock;
  if (qb0 >= num_new) return;  // uniform per CTA
  const int head = blockIdx.z * 4 + warp;  // query head within the GQA group
  const bool active = head < gqa;

  float* qraw = reinterpret_cast<float*>(smem);  // [4][16][128]
  __half* ks = reinterpret_cast<__half*>(smem + kQRawBytes);
  __half* vs = ks + kTile * kRowHalves;
  float* qrot = reinterpret_cast<float*>(smem + kQRawBytes);  // [4][16][128] before the tiles

  // Query rows (head 4z + hl, token qb0 + t), then q' = q·R_K·scale·log2(e).
  for (int i = tid; i < 4 * kExtendQueryBlock * 128; i += kThreads) {
    const int hl = i / (kExtendQueryBlock * 128), t = (i / 128) % kExtendQueryBlock, c = i % 128;
    const int hh = blockIdx.z * 4 + hl, tok = qb0 + t;
    qraw[i] = (hh < gqa && tok < num_new)
                  ? p.q[(size_t(q_begin + tok) * Hq + size_t(h) * gqa + hh) * 128 + c]
                  : 0.f;
  }
  __syncthreads();
  const float scale = (p.softmax_scale > 0 ? p.softmax_scale : 0.08838834764831845f) * kLog2e;
  if (p.rot_k == nullptr) {
    for (int i = tid; i < 4 * kExtendQueryBlock * 128; i += kThreads) qrot[i] = qraw[i] * scale;
  } else {
    const float* r = p.rot_k + size_t(h) * 128 * 128;
    const int ch = tid;  // output channel
    for (int rc = 0; rc < 4 * kExtendQueryBlock; rc += 16) {
      float acc[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[j] = 0.f;
      for (int i = 0; i < 128; ++i) {
        const float rv = r[i * 128 + ch];
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[j] = fmaf(qraw[(rc + j) * 128 + i], rv, acc[j]);
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) qrot[(rc + j) * 128 + ch] = acc[j] * scale;
    }
  }
  __syncthreads();
  // A fragments of this warp's 16 query rows (token rows gid and gid + 8), 8 k-steps.
  uint32_t qa[8][4];
  {
    const float* qw = qrot + warp * kExtendQueryBlock * 128;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = gid + 8 * (j & 1), col = 16 * s + 8 * (j >> 1) + 2 * tig;
        qa[s][j] = PackHalf2(__float2half_rn(qw[row * 128 + col]),
                             __float2half_rn(qw[row * 128 + col + 1]));
      }
    }
  }
  __syncthreads();  // qrot's area becomes the K/V tiles

  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) o[i][j] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const int spp = static_cast<int>(sh.slices_per_page());
  const int p0 = p.table.seq_page_indptr[seq], p1 = p.table.seq_page_indptr[seq + 1];
  const int prefix_slices = (p1 - p0) * spp;
  const int last_q = min(num_new, qb0 + kExtendQueryBlock);  // keys of new tokens < last_q
  const int new_tiles = (last_q + kTile - 1) / kTile;
  const PageGeometry g2 = sh.geometry(PageKind::kInt2), gb = sh.geometry(PageKind::kBf16);
  // K and V segment offsets (selected by value, not by a run-time array index: no local memory).
  const size_t seg2_k = g2.segment_offset(sh.layer, 0, h), seg2_v = g2.segment_offset(sh.layer, 1, h);
  const size_t segb_k = gb.segment_offset(sh.layer, 0, h), segb_v = gb.segment_offset(sh.layer, 1, h);
  const int codes_bytes = static_cast<int>(g2.codes_bytes());
  constexpr int NG = 128 / G;

  for (int tile = 0; tile < prefix_slices + new_tiles; ++tile) {
    TileSrc src;
    int new0 = 0;  // first new-token index of a new-token tile
    if (tile < prefix_slices) {
      const int pid = p.table.seq_page_ids[p0 + tile / spp];
      src.page = p.table.page_ptrs[pid];
      src.kind = p.table.page_kinds[pid];
      src.tok0 = (tile % spp) * kTile;
      src.valid = max(0, min(kTile, static_cast<int>(p.table.page_token_counts[pid]) - src.tok0));
      if (src.valid == 0) continue;  // uniform: every thread skips the empty slice
    } else {
      new0 = (tile - prefix_slices) * kTile;
      src.page = nullptr;
      src.kind = 0;
      src.tok0 = 0;
      src.valid = min(kTile, num_new - new0);
    }
    __syncthreads();  // the previous tile is consumed
    // K and V rows as fp16: 2 x 64 rows x 16 chunks of 8 channels.
    for (int i = tid; i < 2 * kTile * 16; i += kThreads) {
      const int kv = i / (kTile * 16), t = (i / 16) % kTile, chunk = i % 16;
      uint4 out = make_uint4(0u, 0u, 0u, 0u);
      if (t < src.valid) {
        if (src.page == nullptr) {
          const uint16_t* row = (kv ? p.v_new : p.k_new) + (size_t(q_begin + new0 + t) * H + h) * 128;
          const uint4 w = *reinterpret_cast<const uint4*>(row + chunk * 8);
          out = make_uint4(Bf16x2ToHalf2(w.x), Bf16x2ToHalf2(w.y), Bf16x2ToHalf2(w.z), Bf16x2ToHalf2(w.w));
        } else if (src.kind == static_cast<int>(PageKind::kBf16)) {
          const uint8_t* row = src.page + (kv ? segb_v : segb_k) + size_t(src.tok0 + t) * 256;
          const uint4 w = *reinterpret_cast<const uint4*>(row + chunk * 16);
          out = make_uint4(Bf16x2ToHalf2(w.x), Bf16x2ToHalf2(w.y), Bf16x2ToHalf2(w.z), Bf16x2ToHalf2(w.w));
        } else {
          const uint8_t* seg = src.page + (kv ? seg2_v : seg2_k);
          const int tok = src.tok0 + t;
          const uint32_t codes = *reinterpret_cast<const uint16_t*>(seg + size_t(tok) * 32 + chunk * 2);
          const int g = chunk * 8 / G;
          const uint32_t sm = *reinterpret_cast<const uint32_t*>(seg + codes_bytes + size_t(tok) * NG * 4 + g * 4);
          const float sf = __half2float(__ushort_as_half(static_cast<uint16_t>(sm & 0xffffu)));
          const float mn = __half2float(__ushort_as_half(static_cast<uint16_t>(sm >> 16)));
          uint32_t hw[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float x0 = __fadd_rn(mn, __fmul_rn(static_cast<float>((codes >> (4 * e)) & 3u), sf));
            const float x1 = __fadd_rn(mn, __fmul_rn(static_cast<float>((codes >> (4 * e + 2)) & 3u), sf));
            hw[e] = PackHalf2(__float2half_rn(x0), __float2half_rn(x1));
          }
          out = make_uint4(hw[0], hw[1], hw[2], hw[3]);
        }
      }
      *reinterpret_cast<uint4*>((kv ? vs : ks) + t * kRowHalves + chunk * 8) = out;
    }
    __syncthreads();
    if (!active) continue;

    float sacc[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) sacc[nt][j] = 0.f;
      const __half* krow = ks + (nt * 8 + gid) * kRowHalves + 2 * tig;
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + 16 * s);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + 16 * s + 8);
        MmaF16(sacc[nt], qa[s][0], qa[s][1], qa[s][2], qa[s][3], b0, b1);
      }
    }
    // Mask: keys past the tile's valid tokens; new-token keys after the query token.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int key = nt * 8 + 2 * tig + (c & 1);
        const int qtok = qb0 + gid + 8 * (c >> 1);
        bool ok = key < src.valid;
        if (src.page == nullptr) ok = ok && new0 + key <= qtok;
        if (!ok) sacc[nt][c] = -INFINITY;
      }
    }
    float mu[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) mx = fmaxf(mx, fmaxf(sacc[nt][2 * r], sacc[nt][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[r], mx);
      mu[r] = m_new == -INFINITY ? 0.f : m_new;
      const float f = Ex2(m[r] - mu[r]);
      m[r] = m_new;
      l[r] *= f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        o[i][2 * r] *= f;
        o[i][2 * r + 1] *= f;
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float pr = Ex2(sacc[nt][c] - mu[c >> 1]);
        l[c >> 1] += pr;
        sacc[nt][c] = pr;
      }
    }
    // O += P·V: P (16 rows x 16 keys per k-step) from the score accumulators.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t a0 = PackHalf2(__float2half_rn(sacc[2 * kk][0]), __float2half_rn(sacc[2 * kk][1]));
      const uint32_t a1 = PackHalf2(__float2half_rn(sacc[2 * kk][2]), __float2half_rn(sacc[2 * kk][3]));
      const uint32_t a2 = PackHalf2(__float2half_rn(sacc[2 * kk + 1][0]), __float2half_rn(sacc[2 * kk + 1][1]));
      const uint32_t a3 = PackHalf2(__float2half_rn(sacc[2 * kk + 1][2]), __float2half_rn(sacc[2 * kk + 1][3]));
      const int key = 16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
      for (int np = 0; np < 8; ++np) {
        uint32_t v[4];
        LdMatrixX4Trans(v, vs + key * kRowHalves + (2 * np + (lane >> 4)) * 8);
        MmaF16(o[2 * np], a0, a1, a2, a3, v[0], v[1]);
        MmaF16(o[2 * np + 1], a0, a1, a2, a3, v[2], v[3]);
      }
    }
  }

  // Normalize and write: rows gid, gid + 8 of the warp's head.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const int hg = h * gqa + head;  // global query head
  __syncthreads();  // tiles consumed: reuse their area for the unrotation
  float* os = reinterpret_cast<float*>(smem) + warp * kExtendQueryBlock * 128;  // [16][128]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = gid + 8 * r, tok = qb0 + row;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ch = nt * 8 + 2 * tig + e;
        const float v = o[nt][2 * r + e] * inv;
        if (p.unrotate_output) {
          os[row * 128 + ch] = v;
        } else if (active && tok < num_new) {
          p.out[(size_t(q_begin + tok) * Hq + hg) * 128 + ch] = v;
        }
      }
    }
    if (active && tig == 0 && tok < num_new && p.lse != nullptr) {
      p.lse[size_t(q_begin + tok) * Hq + hg] = l[r] > 0.f ? (m[r] + log2f(l[r])) * kLn2 : -INFINITY;
    }
  }
  if (!p.unrotate_output || !active) return;
  __syncwarp();
  // out[row][i] = Σ_k o[row][k] · R_V[i][k]; lane takes outputs i = lane + 32c.
  const float* rv = p.rot_v + size_t(h) * 128 * 128;
  for (int row = 0; row < kExtendQueryBlock; ++row) {
    const int tok = qb0 + row;
    if (tok >= num_new) break;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k = 0; k < 128; ++k) {
      const float x = os[row * 128 + k];
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[c] = fmaf(x, rv[size_t(lane + 32 * c) * 128 + k], acc[c]);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) p.out[(size_t(q_begin + tok) * Hq + hg) * 128 + lane + 32 * c] = acc[c];
  }
}

}  // namespace


namespace detail {

absl::Status PrepareExtendMma() {
  if (absl::Status s = CudaStatus(cudaFuncSetAttribute(ExtendKernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
                                  "extend attention shared memory");
      !s.ok()) {
    return s;
  }
  return CudaStatus(cudaFuncSetAttribute(ExtendKernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
                    "extend attention shared memory");
}

absl::Status LaunchExtendMma(const ExtendParams& p, int max_new_tokens, cudaStream_t stream) {
  const dim3 grid((max_new_tokens + kExtendQueryBlock - 1) / kExtendQueryBlock,
                  p.table.num_seqs * p.shape.num_kv_heads, (p.shape.gqa() + 3) / 4);
  if (p.shape.group_size == 128) {
    ExtendKernel<128><<<grid, kThreads, kSmemBytes, stream>>>(p);
  } else {
    ExtendKernel<64><<<grid, kThreads, kSmemBytes, stream>>>(p);
  }
  return CudaStatus(cudaGetLastError(), "extend attention launch");
}

}  // namespace detail

absl::StatusOr<ExtendPlan> PlanExtend(const DecodeShape& shape, int32_t max_seqs, int32_t max_new_tokens) {
  if (absl::Status s = ValidateDecodeShape(shape); !s.ok()) return s;
  if (max_seqs < 0 || max_new_tokens < 0) return absl::InvalidArgumentError("extend plan: negative maximum");
  if (int64_t{max_seqs} * shape.num_kv_heads > 65535) {
    return absl::InvalidArgumentError("extend plan: more than 65535 (sequence, KV head) pairs");
  }
  ExtendPlan plan;
  plan.shape = shape;
  plan.max_seqs = max_seqs;
  plan.max_new_tokens = max_new_tokens;
  plan.tensor_cores = detail::ExtendWgmmaAvailable();
  absl::Status s = plan.tensor_cores ? detail::PrepareExtendWgmma() : detail::PrepareExtendMma();
  if (!s.ok()) return s;
  return plan;
}

absl::Status LaunchExtendAttention(const ExtendPlan& plan, const ExtendParams& p, cudaStream_t stream) {
  const DecodeShape& a = plan.shape;
  const DecodeShape& b = p.shape;
  if (a.num_layers != b.num_layers || a.num_kv_heads != b.num_kv_heads || a.num_q_heads != b.num_q_heads ||
      a.head_dim != b.head_dim || a.group_size != b.group_size || a.page_tokens != b.page_tokens ||
      b.layer >= b.num_layers) {
    return absl::InvalidArgumentError("extend attention: params.shape differs from the plan's");
  }
  if (p.table.num_seqs < 0 || p.table.num_seqs > plan.max_seqs || p.max_new_tokens < 0 ||
      p.max_new_tokens > plan.max_new_tokens) {
    return absl::InvalidArgumentError("extend attention: more sequences or new tokens than the plan's maximum");
  }
  if (p.table.num_seqs == 0 || plan.max_new_tokens == 0) return absl::OkStatus();
  if (p.q == nullptr || p.k_new == nullptr || p.v_new == nullptr || p.out == nullptr ||
      p.q_indptr == nullptr || p.table.seq_page_indptr == nullptr) {
    return absl::InvalidArgumentError("extend attention: q, k_new, v_new, q_indptr, out and the page table are required");
  }
  if (p.unrotate_output && p.rot_v == nullptr) {
    return absl::InvalidArgumentError("unrotate_output needs rot_v");
  }
  if (reinterpret_cast<uintptr_t>(p.rot_k) % 16 != 0 || reinterpret_cast<uintptr_t>(p.rot_v) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.k_new) % 16 != 0 || reinterpret_cast<uintptr_t>(p.v_new) % 16 != 0) {
    return absl::InvalidArgumentError("extend attention: rot_k, rot_v, k_new and v_new must be 16-byte aligned");
  }
  return plan.tensor_cores ? detail::LaunchExtendWgmma(p, plan.max_new_tokens, stream)
                           : detail::LaunchExtendMma(p, plan.max_new_tokens, stream);
}

absl::Status LaunchExtendAttention(const ExtendParams& p, cudaStream_t stream) {
  auto plan = PlanExtend(p.shape, p.table.num_seqs, p.max_new_tokens);
  if (!plan.ok()) return plan.status();
  return LaunchExtendAttention(*plan, p, stream);
}

}  // namespace oscarkv::cuda
