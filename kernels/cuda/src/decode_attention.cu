// Mixed-precision paged decode attention: the BF16-slice kernel, the log-sum-exp merge and the
// launch sequence (INT2 items, then BF16 items overlapping them through programmatic
// serialization, then the merge). The INT2 kernel and its variants are in decode_int2.cu; the
// shared pieces in decode_common.cuh.
//
// Work decomposition: one CTA (4 warps) per work item = (sequence, KV head, run of 64-token
// slices of one kind). K/V bytes of the item's slices stream through shared memory with
// cp.async in a multi-stage ring; each warp keeps its own online-softmax state for all GQA
// query heads of the KV head (the n = 8 columns of the mma tiles), and the 4 warps' states are
// merged before the item's partial result is written.
#include "decode_common.cuh"

namespace oscarkv::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// BF16 slices: K rows feed ldmatrix directly; V rows through ldmatrix.trans. Rows are stored in
// shared memory with the 16-byte chunk index XOR-swizzled by (row & 7), so the 8 row addresses
// of each ldmatrix hit distinct banks.

__device__ void Bf16Item(const DecodeParams& p, int item, const DecodeWorkItem& it, uint8_t* smem,
                         SliceTable tab) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const DecodeShape& sh = p.shape;
  const int gqa = static_cast<int>(sh.gqa());
  const PageGeometry geo = sh.geometry(PageKind::kBf16);
  const size_t seg_k = geo.segment_offset(sh.layer, 0, it.kv_head);
  const size_t seg_v = geo.segment_offset(sh.layer, 1, it.kv_head);

  const int n = it.num_slices;
  auto issue = [&](int unit, int stage) {
    uint8_t* sbase = smem + stage * kBf16Stage;
    const int info = tab.info[unit], tok0 = info >> 16, valid = info & 0xffff;
    const uint8_t* page = tab.ptr[unit];
    for (int c = tid; c < 2048; c += kThreads) {
      const int kv = c >> 10, t = (c >> 4) & 63, j = c & 15;
      const uint8_t* src = page + (kv ? seg_v : seg_k) + size_t(tok0 + t) * 256 + j * 16;
      const bool ok = t < valid;
      CpAsync16(sbase + kv * 16384 + t * 256 + ((j ^ (t & 7)) * 16), ok ? src : page, ok);
    }
  };
  // First copies, then the query rotation while they are in flight (its scratch is the last
  // stage, which the loop issues only after the rotation).
  for (int s = 0; s < kBf16Stages - 1; ++s) {
    if (s < n) issue(s, s);
    CpAsyncCommit();
  }
  float* qs = reinterpret_cast<float*>(smem + kBf16StageArea);
  RotateQueries(p, it, qs + 8 * 128, qs,
                reinterpret_cast<float*>(smem + (kBf16Stages - 1) * kBf16Stage), 8 * 128);
  const float* qrot = qs;
  uint32_t qhi[8][2], qlo[8][2];
  #pragma unroll
  for (int s = 0; s < 8; ++s) {
    #pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int ch = 16 * s + 8 * b + 2 * tig;
      const float x0 = gid < gqa ? qrot[gid * 128 + ch] : 0.f;
      const float x1 = gid < gqa ? qrot[gid * 128 + ch + 1] : 0.f;
      const __nv_bfloat16 h0 = __float2bfloat16_rn(x0), h1 = __float2bfloat16_rn(x1);
      qhi[s][b] = PackBf162(h0, h1);
      qlo[s][b] = PackBf162(__float2bfloat16_rn(x0 - __bfloat162float(h0)),
                            __float2bfloat16_rn(x1 - __bfloat162float(h1)));
    }
  }
  __syncthreads();  // the query area becomes the P exchange
  WarpState st;
  #pragma unroll
  for (int i = 0; i < 8; ++i)
    #pragma unroll
    for (int j = 0; j < 4; ++j) st.o[i][j] = 0.f;
  #pragma unroll
  for (int e = 0; e < 2; ++e) {
    st.m[e] = -INFINITY;
    st.l[e] = 0.f;
  }
  // P exchange: [plane hi/lo][head 8][24] bf16 per warp.
  __nv_bfloat16* px = reinterpret_cast<__nv_bfloat16*>(smem + kBf16StageArea + warp * kWarpXchg);
  constexpr int kPStride = 24;

  for (int u = 0; u < n; ++u) {
    CpAsyncWait<kBf16Stages - 2>();
    __syncthreads();
    if (u + kBf16Stages - 1 < n) issue(u + kBf16Stages - 1, (u + kBf16Stages - 1) % kBf16Stages);
    CpAsyncCommit();
    const uint8_t* ks = smem + (u % kBf16Stages) * kBf16Stage;
    const uint8_t* vs = ks + 16384;
    const int valid = tab.info[u] & 0xffff;
    const int t0 = warp * 16;
    if (t0 >= valid) continue;  // no valid token in this warp's tile
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    {
      const int mat = lane >> 3, rr = lane & 7;
      const int t = t0 + rr + 8 * (mat & 1);
      #pragma unroll
      for (int s = 0; s < 8; ++s) {
        const int chunk = 2 * s + (mat >> 1);
        uint32_t a[4];
        LdMatrixX4(a, ks + t * 256 + ((chunk ^ (t & 7)) * 16));
        MmaBf16(acc, a[0], a[1], a[2], a[3], qhi[s][0], qhi[s][1]);
        MmaBf16(acc, a[0], a[1], a[2], a[3], qlo[s][0], qlo[s][1]);
      }
    }
    float sc[4];
    #pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int t = t0 + gid + 8 * (c >> 1);
      sc[c] = t < valid ? acc[c] : -INFINITY;
    }
    float mu[2];
    #pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float cm = WarpMaxOverGid(fmaxf(sc[e], sc[2 + e]));
      float f;
      mu[e] = Rescale(st, e, cm, &f);
    }
    #pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int e = c & 1, r = c >> 1;
      const float pr = Ex2(sc[c] - mu[e]);
      st.l[e] += pr;
      const __nv_bfloat16 h = __float2bfloat16_rn(pr);
      const __nv_bfloat16 lo = __float2bfloat16_rn(pr - __bfloat162float(h));
      const int tok = gid + 8 * r, qh = 2 * tig + e;
      px[(0 * 8 + qh) * kPStride + tok] = h;
      px[(1 * 8 + qh) * kPStride + tok] = lo;
    }
    __syncwarp();
    const uint32_t bh0 = *reinterpret_cast<const uint32_t*>(px + (0 * 8 + gid) * kPStride + 2 * tig);
    const uint32_t bh1 = *reinterpret_cast<const uint32_t*>(px + (0 * 8 + gid) * kPStride + 2 * tig + 8);
    const uint32_t bl0 = *reinterpret_cast<const uint32_t*>(px + (1 * 8 + gid) * kPStride + 2 * tig);
    const uint32_t bl1 = *reinterpret_cast<const uint32_t*>(px + (1 * 8 + gid) * kPStride + 2 * tig + 8);
    {
      const int mat = lane >> 3, rr = lane & 7;
      const int t = t0 + rr + 8 * (mat >> 1);
      #pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int chunk = 2 * i + (mat & 1);
        uint32_t a[4];
        LdMatrixX4Trans(a, vs + t * 256 + ((chunk ^ (t & 7)) * 16));
        MmaBf16(st.o[i], a[0], a[1], a[2], a[3], bh0, bh1);
        MmaBf16(st.o[i], a[0], a[1], a[2], a[3], bl0, bl1);
      }
    }
    __syncwarp();
  }
  CpAsyncWait<0>();
  __syncthreads();
  FinishItem(p, item, st, smem,
             [&](int i, int r) { return 16 * i + gid + 8 * r; });
}

__global__ void __launch_bounds__(kThreads, 2) DecodeBf16Kernel(const DecodeParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  // The merge kernel (next, programmatic serialization) may start its CTAs now; they wait
  // for this grid's completion before reading the partials.
  asm volatile("griddepcontrol.launch_dependents;");
  const int item = p.item_order[p.num_int2_items + blockIdx.x];
  const DecodeWorkItem it = p.items[item];
  uint8_t* t = smem + kBf16StageArea + kWarps * kWarpXchg;
  SliceTable tab{reinterpret_cast<const uint8_t**>(t), reinterpret_cast<int32_t*>(t + kMaxItemSlices * 8)};
  LoadSliceTable(p, it, tab);
  __syncthreads();
  Bf16Item(p, item, it, smem, tab);
  // This grid (launched as a dependent of the INT2 kernel) completes only after the INT2
  // kernel has: the merge waits on this grid alone.
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Merges the partials of every item of (sequence, KV head) for one query head; optionally
// multiplies by R_Vᵀ. Items are processed 128 at a time: weights 2^(m_i - M)·l_i in parallel,
// then each thread (one channel) sums independent loads of the items' partial outputs.
__device__ __forceinline__ float BlockReduce(float v, float* red, bool is_max) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < 4; ++w) v = is_max ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

__global__ void __launch_bounds__(128) MergeKernel(const DecodeParams p) {
  __shared__ float os[128];
  __shared__ float wsm[128];
  __shared__ float red[4];
  const int sq = blockIdx.x;
  const int seq = sq / p.shape.num_q_heads, qh = sq % p.shape.num_q_heads;
  const int gqa = p.shape.gqa(), h = qh / gqa, j = qh % gqa;
  const int t = threadIdx.x;
  // Launched as a programmatic dependent of the decode kernel(s): wait for their partials.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const size_t qrot_bytes = 0;
  const float* part_o = reinterpret_cast<const float*>(static_cast<const uint8_t*>(p.workspace) + qrot_bytes);
  const size_t po_bytes = (sizeof(float) * size_t(p.num_items) * gqa * 128 + 255) / 256 * 256;
  const float* part_ml =
      reinterpret_cast<const float*>(static_cast<const uint8_t*>(p.workspace) + qrot_bytes + po_bytes);
  const int i0 = p.item_indptr[seq * p.shape.num_kv_heads + h];
  const int i1 = p.item_indptr[seq * p.shape.num_kv_heads + h + 1];
  float mx = -INFINITY;
  for (int i = i0 + t; i < i1; i += 128) {
    if (__ldcg(&part_ml[(size_t(i) * gqa + j) * 2 + 1]) > 0.f) mx = fmaxf(mx, __ldcg(&part_ml[(size_t(i) * gqa + j) * 2]));
  }
  mx = BlockReduce(mx, red, true);
  float L = 0.f, O = 0.f;
  if (mx != -INFINITY) {
    for (int c0 = i0; c0 < i1; c0 += 128) {
      const int i = c0 + t;
      float w = 0.f;
      if (i < i1) {
        const float l = __ldcg(&part_ml[(size_t(i) * gqa + j) * 2 + 1]);
        if (l > 0.f) w = exp2f(__ldcg(&part_ml[(size_t(i) * gqa + j) * 2]) - mx) * l;
      }
      __syncthreads();
      wsm[t] = w;
      L += w;
      __syncthreads();
      const int n = min(128, i1 - c0);
      int k = 0;
      for (; k + 4 <= n; k += 4) {
        const float* base = part_o + (size_t(c0 + k) * gqa + j) * 128 + t;
        const float o0 = __ldcg(base), o1 = __ldcg(base + size_t(gqa) * 128),
                    o2 = __ldcg(base + size_t(2 * gqa) * 128), o3 = __ldcg(base + size_t(3 * gqa) * 128);
        O += wsm[k] * o0 + wsm[k + 1] * o1 + wsm[k + 2] * o2 + wsm[k + 3] * o3;
      }
      for (; k < n; ++k) O += wsm[k] * __ldcg(&part_o[(size_t(c0 + k) * gqa + j) * 128 + t]);
    }
    L = BlockReduce(L, red, false);
  }
  const float o = L > 0.f ? O / L : 0.f;
  if (t == 0 && p.lse != nullptr) p.lse[sq] = L > 0.f ? (mx + log2f(L)) * kLn2 : -INFINITY;
  if (!p.unrotate_output || p.rot_v == nullptr) {
    p.out[size_t(sq) * 128 + t] = o;
    return;
  }
  os[t] = o;
  __syncthreads();
  // out[i] = Σ_k o[k] · R_V[i][k]: warp w computes outputs i = w, w+4, ...
  const float* r = p.rot_v + size_t(h) * 128 * 128;
  const int warp = t >> 5, lane = t & 31;
  const float4 ov = *reinterpret_cast<const float4*>(os + 4 * lane);
  for (int i = warp; i < 128; i += 4) {
    const float4 rv = *reinterpret_cast<const float4*>(r + size_t(i) * 128 + 4 * lane);
    float s = ov.x * rv.x + ov.y * rv.y + ov.z * rv.z + ov.w * rv.w;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) p.out[size_t(sq) * 128 + i] = s;
  }
}

}  // namespace

absl::Status LaunchDecodeAttention(const DecodeParams& p, cudaStream_t stream) {
  if (absl::Status s = ValidateDecodeShape(p.shape); !s.ok()) return s;
  if (p.table.num_seqs <= 0) return absl::OkStatus();
  if (p.num_items > 0 && (p.items == nullptr || p.item_order == nullptr)) {
    return absl::InvalidArgumentError("no work items / item order");
  }
  if (p.q == nullptr || p.out == nullptr || p.workspace == nullptr || p.item_indptr == nullptr) {
    return absl::InvalidArgumentError("decode attention: q, out, workspace and plan are required");
  }
  if (p.unrotate_output && p.rot_v == nullptr) {
    return absl::InvalidArgumentError("unrotate_output needs rot_v");
  }
  const float scale = p.softmax_scale > 0 ? p.softmax_scale : 1.0f / sqrtf(128.0f);
  const int sq = p.table.num_seqs * static_cast<int>(p.shape.num_q_heads);
  (void)scale;
  const int n2 = p.num_int2_items, nb = p.num_items - p.num_int2_items;
  if (n2 > 0) {
    LaunchDecodeInt2Kernels(p, n2, stream);
  }
  if (nb > 0) {
    static const bool once = SetSmem(DecodeBf16Kernel, SmemBytes<false>());
    (void)once;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(nb);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = SmemBytes<false>();
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (absl::Status st = CudaStatus(cudaLaunchKernelEx(&cfg, DecodeBf16Kernel, p), "bf16 decode launch");
        !st.ok()) {
      return st;
    }
  }
  {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(sq);
    cfg.blockDim = dim3(128);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (absl::Status st = CudaStatus(cudaLaunchKernelEx(&cfg, MergeKernel, p), "merge launch"); !st.ok()) {
      return st;
    }
  }
  return CudaStatus(cudaGetLastError(), "decode attention launch");
}

const char* DecodeVariantName(DecodeVariant v) {
  switch (v) {
    case DecodeVariant::kBaseline: return "baseline";
    case DecodeVariant::kPackedHeads: return "packed_heads";
  }
  return "unknown";
}

}  // namespace oscarkv::cuda
