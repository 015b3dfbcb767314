// Mixed-precision paged decode attention: query rotation, split-KV attention over INT2 and BF16
// page slices on tensor cores, and the log-sum-exp merge.
//
// Work decomposition: one CTA (4 warps) per work item = (sequence, KV head, run of 64-token
// slices of one kind). K/V bytes of the item's slices stream through shared memory with
// cp.async in a multi-stage ring; each warp keeps its own online-softmax state for all GQA
// query heads of the KV head (the n = 8 columns of the mma tiles), and the 4 warps' states are
// merged before the item's partial result is written.
//
// INT2 in registers, no dequantization pass: a code c is placed in an fp16 lane as the bit
// pattern 0x6400 | (c << k), i.e. the value 1024 + c·2^k, with one LOP3 per two codes (k is
// the code's bit offset inside its 16-bit half, 0..8, so no shift is needed for most codes).
// The offset and the 2^k factor are removed in fp32 afterwards:
//   scores  q·x̂ = scale·(Σ q_i 2^-k_i (1024 + 2^k_i c_i) − 1024·Σ q_i 2^-k_i) + min·Σ q_i
//   values  Σ_t p_t x̂_t = 2^-k·(Σ_t W_t (1024 + 2^k c_t) − 1024·Σ_t W_t) + Σ_t p_t·min_t,
//           W_t = fp16(p_t·scale_t),
// where the tensor cores compute the first sums; the score offset is removed by starting the
// accumulators at −1024·Σ q·2^-k, and 1024·Σ W comes from one more mma with every code 0. Channel orders inside the mma tiles are
// permuted so each lane's operands come from contiguous bytes; the query fragments and the
// output mapping use the same permutation.
#include <algorithm>

#include "decode_bf16.cuh"

namespace oscarkv::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// INT2 slices. Each warp streams its own slices (w, w+4, ...) through a private 3-stage
// cp.async ring, so warps never wait for each other.

template <int G>
struct Int2Layout {
  static constexpr int NG = 128 / G;
  static constexpr int kCodes = 64 * 32;          // 64 rows x 32 bytes
  static constexpr int kParams = 64 * NG * 4;     // (scale, min) fp16 pairs
  static constexpr int kHalf = kCodes + kParams;  // K part, then V part
  // Byte offset inside a code row of word v (0, 1) of lane tig for the score product.
  __device__ static int KWordByte(int tig, int v) { return G == 128 ? 8 * tig + 4 * v : 16 * v + 4 * tig; }
};
constexpr int kInt2WarpStages = 3;

// r = (w & mask) | magic in one LOP3 (the magic lives in a register).
template <uint32_t kMask>
__device__ __forceinline__ uint32_t AndOr(uint32_t w, uint32_t magic) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "n"(kMask), "r"(magic));
  return r;
}
// Unpacks a 32-bit word whose two 16-bit halves each hold 8 codes (channel c of a half at bits
// 2c..2c+1) into 8 fp16x2 registers: r[c] = 1024 + 2^CodeShift(c)·code_c for both halves.
// Register r (0..7) of UnpackCodesM, from the word and the word >> 8 (r is a constant).
__device__ __forceinline__ uint32_t CodeReg(int r, uint32_t w, uint32_t w8, uint32_t magic) {
  switch (r) {
    case 0: return AndOr<0x00030003u>(w, magic);
    case 1: return AndOr<0x000C000Cu>(w, magic);
    case 2: return AndOr<0x00300030u>(w, magic);
    case 3: return AndOr<0x00C000C0u>(w, magic);
    case 4: return AndOr<0x03000300u>(w, magic);
    case 5: return AndOr<0x000C000Cu>(w8, magic);
    case 6: return AndOr<0x00300030u>(w8, magic);
    default: return AndOr<0x00C000C0u>(w8, magic);
  }
}
__device__ __forceinline__ void UnpackCodesM(uint32_t w, uint32_t magic, uint32_t (&r)[8]) {
  const uint32_t w8 = w >> 8;
  r[0] = AndOr<0x00030003u>(w, magic);
  r[1] = AndOr<0x000C000Cu>(w, magic);
  r[2] = AndOr<0x00300030u>(w, magic);
  r[3] = AndOr<0x00C000C0u>(w, magic);
  r[4] = AndOr<0x03000300u>(w, magic);
  r[5] = AndOr<0x000C000Cu>(w8, magic);
  r[6] = AndOr<0x00300030u>(w8, magic);
  r[7] = AndOr<0x00C000C0u>(w8, magic);
}

// D = A(16x32 u8, row) * B(32x8 s8, col) + D, int32 accumulate (exact).
__device__ __forceinline__ void MmaU8S8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t And(uint32_t w, uint32_t mask) { return w & mask; }
// x through an opaque move: the compiler keeps a lane constant in its register instead of
// recomputing it inside the main loop (it did, ~45 instructions per slice for kV8's offsets).
__device__ __forceinline__ int Opaque(int x) {
  asm volatile("mov.b32 %0, %0;" : "+r"(x));
  return x;
}
// D = A(16x32 u8, row) * B(32x8 u8, col) + D, int32 accumulate (exact).
__device__ __forceinline__ void MmaU8U8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// kI8 (DecodeVariant::kPackedInt8), the int8 score product. Lane (gid, tig) of an m-tile holds
// code words x = word v of rows gid and gid+8 (bytes KWordByte(tig, v)..+3) and x >> 4. One
// IMMA per (word v, shift h): A registers 0/1 (k = 4·tig + i) are x_h & 0x03030303, i.e. the
// codes of channels 4·(byte i) + 2h as u8 (weight 1); registers 2/3 (k = 16 + 4·tig + i) are
// x_h & 0x0C0C0C0C, the codes of channels 4·(byte i) + 2h + 1 times 4 (weight 4). The B
// operand carries 4·Q for weight-1 channels and Q for weight-4 ones, so every product is
// 4·code·Q; its column n is the high (n < 4) or low (n >= 4) int8 part of head n & 3
// (value = 256·high + low).
constexpr float kI8QMax = 8128.f;  // |Q| <= 8128: 4·Q splits into int8 high/low parts

// kV8 (DecodeVariant::kPackedInt8Values, implies kI8), the value product on int8 tensor cores.
// Per 64-token slice: 2 k-steps of 32 tokens x 8 m-tiles of 16 channels. Lane (gid, tig) takes
// the token quads q(sl) = 16·(tig >> 1) + 4·(tig & 1) + ((sl + tig) & 3) + {0, 8, 32, 40} for
// slots sl = 0..3 (slot 2·ks + b is the A/B register pair b of k-step ks; byte i of a register
// is token q(sl) + {0, 8, 32, 40}[i]); q(sl) mod 4 differs between the lanes tig, so with the
// V codes' 16-byte halves swapped by token bit 3 in shared memory (see issue) every matrix of
// an ldmatrix hits 8 distinct bank groups.
// One ldmatrix.x4.trans per slot gives the lane, for the 4 tokens, bytes 2·gid and 2·gid + 1 of
// both 16-byte halves of the code rows (channels 64·h + 8·gid .. +7); one PRMT per byte
// gathers the 4 tokens: R[b] = byte b of (2·gid, 2·gid + 1, 16 + 2·gid, 17 + 2·gid).
// m-tile mt's rows gid / gid+8 are bit position j = 2·(mt & 1) + r of byte b = mt >> 1
// (channel 64·(mt >> 2) + 8·gid + 2·(mt & 3) + r, so m-tiles 0..3 are group 0 at G = 64):
// R[b] & (3 << 2j) in every byte is code·4^j (u8), one LOP3 per 4 codes. The B operand is
// W = p·scale·c as a 16-bit integer (c: the head's weight units, see kPackedInt8Values):
// column 2h its high byte for head h, column 2h + 1 its low byte, so lane tig accumulates
// both parts of head tig (an accumulator shift needs no other lane). The softmax owner of
// token 16·mt + gid + 8r (mt = 2j + (tig >> 1)) packs its 4 tokens' bytes of one column into
// one word (byte i = token (j, r) = (i >> 1, i & 1): exactly a quad above) and stores it; the
// W rows are 16 words per column, pairs of rows in 32-word blocks with the halves swapped by
// ((c ^ (c >> 1) ^ (c >> 2)) & 1) so the stores and the 128-bit reads are conflict-free.
constexpr int kV8RefBits = 15;       // new weight units: the largest weight becomes <= 2^15
constexpr float kV8Magic = 8388608.f;  // 2^23: fma(w, s, 2^23)'s low 16 bits hold round(w·s)

// kI8: the int8 query fragments of lane `lane` from the rotated queries qrot ([gqa][128]):
// qb[v][hh][rr], the B operands of the score product (see kI8QMax), and for the heads the lane
// owns after the packed exchange, 1 / (4·S) (qinv) and Σ q per group (Q0i). The whole warp takes
// part (shuffles). Used by the INT2 kernel (built per CTA); QueryPrepKernel builds the same
// words on its 8 warps (PrepFragments, from the helpers below: this function stays as it was,
// because any change to the INT2 kernel's prologue code moves ptxas' schedule of its main loop,
// which has measured up to 5-7% slower per slice; bench/results/NOTES.md sessions 16, 19, 20).
template <int G>
__device__ __forceinline__ void Int8QueryFragments(const float* qrot, int gqa, int lane, uint32_t (&qb)[2][2][2],
                                                   float (&qinv)[2], float (&Q0i)[2][128 / G]) {
  using Lay = Int2Layout<G>;
  constexpr int NG = Lay::NG;
  const int gid = lane >> 2, tig = lane & 3;
  // Per head: max |q| and Σ q per group over the 128 channels (lane l holds channels 4l..4l+3),
  // the four heads' shuffle chains interleaved.
  float S[4], qsum[4][NG], mx[4], sum[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const float4 x = h < gqa ? reinterpret_cast<const float4*>(qrot + h * 128)[lane]
                             : make_float4(0.f, 0.f, 0.f, 0.f);
    mx[h] = fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w)));
    sum[h] = (x.x + x.y) + (x.z + x.w);
  }
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], off));
      // G = 64: lanes 0..15 hold channels 0..63 (group 0), lanes 16..31 group 1.
      if (G == 128 || off < 16) sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], off);
    }
  }
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    // Any S with |q·S| <= ~8160 is exact to split (see kI8QMax); the approximate division
    // (no slow path) is within 2 ulp.
    S[h] = mx[h] > 0.f ? __fdividef(kI8QMax, mx[h]) : 1.f;
#pragma unroll
    for (int g = 0; g < NG; ++g) qsum[h][g] = __shfl_sync(0xffffffffu, sum[h], 16 * g);
  }
  const int head = gid & 3;
  const bool lo_col = gid >= 4;
  const float s_head = head == 0 ? S[0] : head == 1 ? S[1] : head == 2 ? S[2] : S[3];
#pragma unroll
  for (int v = 0; v < 2; ++v) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        uint32_t word = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int ch = 4 * (Lay::KWordByte(tig, v) + i) + 2 * hh + rr;
          int bf = 0;
          if (head < gqa) {
            const int qi = __float2int_rn(qrot[head * 128 + ch] * s_head);
            bf = rr == 0 ? 4 * qi : qi;
          }
          const int hi = (bf + 128) >> 8;
          const int part = lo_col ? bf - 256 * hi : hi;
          word |= (static_cast<uint32_t>(part) & 0xffu) << (8 * i);
        }
        qb[v][hh][rr] = word;
      }
    }
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int h = 2 * (tig & 1) + e;
    const float sh = h == 0 ? S[0] : h == 1 ? S[1] : h == 2 ? S[2] : S[3];
    qinv[e] = __fdividef(0.25f, sh);
#pragma unroll
    for (int g = 0; g < NG; ++g)
      Q0i[e][g] = h == 0 ? qsum[0][g] : h == 1 ? qsum[1][g] : h == 2 ? qsum[2][g] : qsum[3][g];
  }
}

// kI8, per head h < 4 (zero past gqa): S[h] = kI8QMax / max |q| (1 for a zero row) and Σ q in
// sum[h] (G = 64: per 16-lane half, lanes 0..15 holding channels 0..63, group 0), lane l holding
// channels 4l..4l+3 of each head; the four heads' shuffle chains interleaved. The whole warp
// takes part.
template <int G>
__device__ __forceinline__ void Int8QueryScales(const float* qrot, int gqa, int lane, float (&S)[4], float (&sum)[4]) {
  float mx[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const float4 x = h < gqa ? reinterpret_cast<const float4*>(qrot + h * 128)[lane]
                             : make_float4(0.f, 0.f, 0.f, 0.f);
    mx[h] = fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w)));
    sum[h] = (x.x + x.y) + (x.z + x.w);
  }
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], off));
      if (G == 128 || off < 16) sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], off);
    }
  }
  // Any S with |q·S| <= ~8160 is exact to split (see kI8QMax); the approximate division (no slow
  // path) is within 2 ulp.
#pragma unroll
  for (int h = 0; h < 4; ++h) S[h] = mx[h] > 0.f ? __fdividef(kI8QMax, mx[h]) : 1.f;
}

// kI8: fragment word qb[v][hh][rr] of lane (gid, tig): bytes i = 0..3 from channel
// 4·(KWordByte(tig, v) + i) + 2·hh + rr of head gid & 3, scaled by its S and rounded (4·q for rr
// = 0); columns gid < 4 take the high int8 part, gid >= 4 the low part.
template <int G>
__device__ __forceinline__ uint32_t Int8QueryWord(const float* qrot, int gqa, int lane, const float (&S)[4], int v,
                                                  int hh, int rr) {
  using Lay = Int2Layout<G>;
  const int gid = lane >> 2, tig = lane & 3;
  const int head = gid & 3;
  const bool lo_col = gid >= 4;
  const float s_head = head == 0 ? S[0] : head == 1 ? S[1] : head == 2 ? S[2] : S[3];
  uint32_t word = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int ch = 4 * (Lay::KWordByte(tig, v) + i) + 2 * hh + rr;
    int bf = 0;
    if (head < gqa) {
      const int qi = __float2int_rn(qrot[head * 128 + ch] * s_head);
      bf = rr == 0 ? 4 * qi : qi;
    }
    const int hi = (bf + 128) >> 8;
    const int part = lo_col ? bf - 256 * hi : hi;
    word |= (static_cast<uint32_t>(part) & 0xffu) << (8 * i);
  }
  return word;
}

// kI8: for the heads lane (gid, tig) owns after the packed exchange (2·(tig & 1) + e), 1 / (4·S)
// and Σ q of group g (lane 16g's sum after Int8QueryScales). The whole warp takes part.
template <int G>
__device__ __forceinline__ void Int8QueryHeadWords(const float (&S)[4], const float (&sum)[4], int lane,
                                                   float (&qinv)[2], float (&Q0i)[2][128 / G]) {
  constexpr int NG = Int2Layout<G>::NG;
  const int tig = lane & 3;
  float qsum[4][NG];
#pragma unroll
  for (int h = 0; h < 4; ++h)
#pragma unroll
    for (int g = 0; g < NG; ++g) qsum[h][g] = __shfl_sync(0xffffffffu, sum[h], 16 * g);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int h = 2 * (tig & 1) + e;
    const float sh = h == 0 ? S[0] : h == 1 ? S[1] : h == 2 ? S[2] : S[3];
    qinv[e] = __fdividef(0.25f, sh);
#pragma unroll
    for (int g = 0; g < NG; ++g)
      Q0i[e][g] = h == 0 ? qsum[0][g] : h == 1 ? qsum[1][g] : h == 2 ? qsum[2][g] : qsum[3][g];
  }
}

// kPack (DecodeVariant::kPackedHeads, GQA <= 4), kSplit (kPackedSplitAcc), kI8
// (kPackedInt8, implies kPack) and kV8 (kPackedInt8Values, implies kI8): see
// decode_attention.h.
// kW: warps of the CTA (DecodeParams::int2_warps); more than 4 only with prepared fragments
// (the launch falls back to 4 warps otherwise).
template <int G, bool kPack, bool kSplit, bool kI8, bool kV8, int kW = kWarps>
__device__ void Int2Item(const DecodeParams& p, int item, const DecodeWorkItem& it, uint8_t* smem,
                         SliceTable tab) {
  using Lay = Int2Layout<G>;
  constexpr int NG = Lay::NG;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const DecodeShape& sh = p.shape;
  const int gqa = static_cast<int>(sh.gqa());
  const PageGeometry geo = sh.geometry(PageKind::kInt2);
  const size_t seg_k = geo.segment_offset(sh.layer, 0, it.kv_head);
  const size_t seg_v = geo.segment_offset(sh.layer, 1, it.kv_head);
  const int codes_bytes = static_cast<int>(geo.codes_bytes());
  uint32_t magic;
  asm volatile("mov.b32 %0, 0x64006400;" : "=r"(magic));

  WarpState st;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) st.o[i][j] = 0.f;
  float sw[NG][4];  // 1024·Σ W per (group, accumulator column) from the extra "offset" mma
  float pm[2][NG];  // Σ p·min per (query head, group), lane partials
#pragma unroll
  for (int g = 0; g < NG; ++g)
#pragma unroll
    for (int j = 0; j < 4; ++j) sw[g][j] = 0.f;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    st.m[e] = -INFINITY;
    st.l[e] = 0.f;
#pragma unroll
    for (int g = 0; g < NG; ++g) pm[e][g] = 0.f;
  }
  __half* wx = reinterpret_cast<__half*>(smem + Int2StageArea<kW>() + warp * kWarpXchg);
  uint8_t* ring = smem + warp * (kInt2WarpStages * kInt2Slot);

  const int n = it.num_slices;
  const int mine = n > warp ? (n - warp + kW - 1) / kW : 0;  // slices of this warp
  const size_t v_minus_k = seg_v - seg_k;
  const uint32_t ring_addr = SmemAddr(ring) + lane * 16;
  // kV8: V code chunk c (token c >> 1, half c & 1) lands at chunk c ^ ((c >> 4) & 1), so the
  // value product's ldmatrix rows (tokens q, q + 8 of 4 quads) hit 8 distinct bank groups.
  const uint32_t ring_addr_v = kV8 ? SmemAddr(ring) + 16 * (lane ^ ((lane >> 4) & 1)) : ring_addr;
  // Copies slice k of this warp into stage `stage`: the K codes (2 KiB contiguous), K params,
  // V codes, V params. Chunks past the valid tokens are zero-filled (src-size 0) and not read.
  // (Bulk/TMA copies issued by one lane, with an mbarrier per stage, measured 7-11% slower here:
  // the single-lane issue and the barrier wait cost as many instructions per slice and add latency.)
  // 8-warp CTAs: the copies carry an L2 policy, evict_first with stream_evict_first, else
  // evict_normal (as without a hint; one form of the copy either way).
  // (Both policies are created and one is selected without a branch: with the creation under a
  // branch, nvcc 13.0 issued some copies with a descriptor register it had not set, an illegal
  // instruction on the device.)
  uint64_t policy = 0;
  if constexpr (kW != kWarps) {
    uint64_t first, normal;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(normal));
    policy = p.stream_evict_first ? first : normal;
  }
  auto copy16 = [&](uint32_t dst, const uint8_t* src, int bytes) {
    if constexpr (kW != kWarps) {
      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                   "r"(bytes), "l"(policy));
    } else {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
    }
  };
  auto issue = [&](int k, int stage) {
    const int sl = warp + kW * k;
    const int info = tab.info[sl], tok0 = info >> 16, valid = info & 0xffff;
    const uint8_t* pk = tab.ptr[sl] + seg_k;
    const uint8_t* ck = pk + tok0 * 32 + lane * 16;
    const uint8_t* cv = ck + v_minus_k;
    const uint32_t d = ring_addr + stage * kInt2Slot;
    const uint32_t dv = ring_addr_v + stage * kInt2Slot;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int bytes = ((lane >> 1) + 16 * i) < valid ? 16 : 0;
      copy16(d + 512 * i, ck + 512 * i, bytes);
      copy16(dv + Lay::kHalf + 512 * i, cv + 512 * i, bytes);
    }
    if (lane < 16 * NG) {  // params: 4·NG bytes per token, 16/(4·NG) tokens per chunk
      const int bytes = lane * 4 / NG < valid ? 16 : 0;
      const uint8_t* pp = pk + codes_bytes + tok0 * 4 * NG + lane * 16;
      copy16(d + Lay::kCodes, pp, bytes);
      copy16(d + Lay::kHalf + Lay::kCodes, pp + v_minus_k, bytes);
    }
  };

  // Start the first copies, then get the rotated queries (from the rotation kernel, or rotated
  // here with rotate_in_cta) and build their fragments while the copies are in flight (the
  // in-CTA rotation's per-warp scratch is each warp's last stage, not issued yet).
  // The kernel's entry started the query rows' copy as the oldest group (RotateQueries waits
  // for it, with the slices' kInt2WarpStages - 1 = 2 groups still pending if they were issued
  // first). copies_after_queries: the first slices are issued after the queries, so the
  // rotation's R_K loads do not queue behind every CTA's first copies.
  static_assert(kInt2WarpStages == 3, "RotateQueries' q_staged wait counts 2 slice groups");
  float* qs = reinterpret_cast<float*>(smem + Int2StageArea<kW>());
  auto first_copies = [&](int from) {
#pragma unroll
    for (int k = 0; k < kInt2WarpStages - 1; ++k) {
      if (kW == kWarps || k >= from) {  // (from is 0 with 4 warps)
        if (k < mine) issue(k, k);
        CpAsyncCommit();
      }
    }
  };
  const bool late_copies = p.copies_after_queries && p.rotate_in_cta;
  // prepared_fragments: the rotation kernel built this pair's int8 query fragments; each lane
  // loads its 64 bytes of them after the first copies (no query area, no CTA barrier).
  const bool prepared = kI8 && !p.rotate_in_cta && p.prepared_fragments;
  // fragments_before_copies: the fragment loads go out before the first copies (volatile, so
  // they stay ahead of the cp.async issue).
  const bool frags_first = prepared && p.fragments_before_copies;
  const uint4* frag_src =
      QueryFragmentArea(p) + size_t(it.seq * static_cast<int>(sh.num_kv_heads) + it.kv_head) * 128 + lane;
  uint4 fw[4] = {};
  // early_slices (8-warp CTAs, fragments before the copies): each warp's first this-many
  // slices go out before the wait for the rotation kernel, the rest of its first copies after
  // the fragment loads.
  const int early = kW != kWarps && frags_first ? min(p.early_slices, kInt2WarpStages - 1) : 0;
#pragma unroll
  for (int k = 0; k < kInt2WarpStages - 1; ++k) {
    if (k < early) {
      if (k < mine) issue(k, k);
      CpAsyncCommit();
    }
  }
  if (frags_first) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
    for (int c = 0; c < 2 + NG; ++c) {
      asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(fw[c].x), "=r"(fw[c].y), "=r"(fw[c].z), "=r"(fw[c].w)
                   : "l"(frag_src + 32 * c));
    }
  }
  if (!late_copies) first_copies(early);
  // l2_prefetch_slices: this warp's next slices after the first copies are prefetched into L2
  // while the CTA waits for its queries (HBM otherwise idles in that prologue); lanes 0-15 take
  // the K code lines, 16-31 the V code lines, lanes 0-1 / 2-3 the K / V parameter lines.
  if (p.l2_prefetch_slices > 0) {
    const int last = min(mine, kInt2WarpStages - 1 + p.l2_prefetch_slices);
    for (int k = kInt2WarpStages - 1; k < last; ++k) {
      const int sl = warp + kW * k;
      const int info = tab.info[sl], tok0 = info >> 16, valid = info & 0xffff;
      const uint8_t* pk = tab.ptr[sl] + seg_k;
      const int line = 128 * (lane & 15);
      if (line < valid * 32) {
        const uint8_t* a = pk + tok0 * 32 + line + (lane >= 16 ? v_minus_k : 0);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
      }
      const int pline = 128 * (lane & 1);
      if (lane < 4 && pline < valid * 4 * NG) {
        const uint8_t* a = pk + codes_bytes + tok0 * 4 * NG + pline + (lane >= 2 ? v_minus_k : 0);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
      }
    }
  }
  if (frags_first) {
  } else if (prepared) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
  } else if constexpr (kW != kWarps) {
    __trap();  // the launch checks: more warps only with prepared fragments
  } else {
    // Query fragments (B operand of the score product): lane (gid, tig) holds query head gid.
    CtaQueries(p, it, qs + 8 * 128, qs,
               reinterpret_cast<float*>(smem + (kInt2WarpStages - 1) * kInt2Slot),
               kInt2WarpStages * kInt2Slot / 4, late_copies ? 0 : kInt2WarpStages - 1,
               *reinterpret_cast<const int*>(smem + kTicketSmemOffset));
  }
  if (late_copies) first_copies(0);
  if (tid == 0) MarkClock(p, kTlQuery);
  const float* qrot = qs;
  uint32_t qhi[8][2], qlo[8][2];
  // For this lane's accumulator columns (query heads 2·tig, 2·tig+1): Σ q per group, and the
  // accumulator start value −1024·Σ q·2^-k that removes the code offset inside the mma.
  float Q0[2][NG], Cinit[2][NG];
  // kI8: int8 query fragments qb[v][h][reg]; for the heads this lane owns after the packed
  // exchange, 1 / (4·S) and Σ q per group.
  uint32_t qb[2][2][2];
  float qinv[2], Q0i[2][NG];
  if constexpr (!kI8) {
    float q0[NG], q1[NG];  // Σ q (true) and Σ q·2^-k (as used), this lane's channels
#pragma unroll
    for (int g = 0; g < NG; ++g) q0[g] = q1[g] = 0.f;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const int v = s >> 2, u = s & 3;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int r = 2 * u + b;
        const int k = CodeShift(r);
        const float inv = 1.0f / static_cast<float>(1 << k);
        const int byte_lo = (r < 4 ? 0 : 1), idx = r & 3;
        const int base = Lay::KWordByte(tig, v);
        const int ch_lo = 4 * (base + byte_lo) + idx, ch_hi = 4 * (base + byte_lo + 2) + idx;
        const int head = kPack ? (gid & 3) : gid;
        const float x_lo = head < gqa ? qrot[head * 128 + ch_lo] * inv : 0.f;
        const float x_hi = head < gqa ? qrot[head * 128 + ch_hi] * inv : 0.f;
        const __half h_lo = __float2half_rn(x_lo), h_hi = __float2half_rn(x_hi);
        __half l_lo = __float2half_rn(0.f), l_hi = __float2half_rn(0.f);
        if (p.precise_query) {
          l_lo = __float2half_rn(x_lo - __half2float(h_lo));
          l_hi = __float2half_rn(x_hi - __half2float(h_hi));
        }
        const float used = __half2float(h_lo) + __half2float(l_lo) + __half2float(h_hi) +
                           __half2float(l_hi);
        const int g = (G == 64) ? v : 0;
        if (kPack) {
          // Column gid < 4: the high parts of head gid; column gid >= 4: the low parts of head
          // gid - 4 (the padding columns carry the precision), so one mma serves both.
          const bool lo_col = gid >= 4;
          qhi[s][b] = lo_col ? PackHalf2(l_lo, l_hi) : PackHalf2(h_lo, h_hi);
          q1[g] += lo_col ? __half2float(l_lo) + __half2float(l_hi)
                          : __half2float(h_lo) + __half2float(h_hi);
          q0[g] += lo_col ? 0.f : used * static_cast<float>(1 << k);
        } else {
          qhi[s][b] = PackHalf2(h_lo, h_hi);
          qlo[s][b] = PackHalf2(l_lo, l_hi);
          q1[g] += used;
          q0[g] += used * static_cast<float>(1 << k);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      q0[g] += __shfl_xor_sync(0xffffffffu, q0[g], 1);
      q0[g] += __shfl_xor_sync(0xffffffffu, q0[g], 2);
      q1[g] += __shfl_xor_sync(0xffffffffu, q1[g], 1);
      q1[g] += __shfl_xor_sync(0xffffffffu, q1[g], 2);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        Q0[e][g] = __shfl_sync(0xffffffffu, q0[g], (2 * tig + e) * 4);
        Cinit[e][g] = -1024.f * __shfl_sync(0xffffffffu, q1[g], (2 * tig + e) * 4);
      }
    }
  } else if (prepared) {
    uint4 w[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) w[c] = frags_first ? fw[c] : c < 2 + NG ? __ldcg(frag_src + 32 * c) : make_uint4(0u, 0u, 0u, 0u);
    const uint32_t* wv = reinterpret_cast<const uint32_t*>(w);
#pragma unroll
    for (int i = 0; i < 8; ++i) qb[i >> 2][(i >> 1) & 1][i & 1] = wv[i];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      qinv[e] = __uint_as_float(wv[8 + e]);
#pragma unroll
      for (int g = 0; g < NG; ++g) Q0i[e][g] = __uint_as_float(wv[10 + e + 2 * g]);
    }
  } else if constexpr (kW == kWarps) {
    Int8QueryFragments<G>(qrot, gqa, lane, qb, qinv, Q0i);
  }
  if (!prepared) __syncthreads();  // the query area becomes the W exchange
  // fp16 value product: the W row of query head h in its group (DecodeParams::linear_w_rows).
  auto wrow = [&](int h) { return p.linear_w_rows ? h : ((h & 1) << 2) | (h >> 1); };
  if (kPack && !kV8) {
    // Rows of query heads 4..7 are never written in packed mode: zero them once (the value
    // product reads them as padding columns).
    for (int i = lane; i < NG * 4 * kWStride; i += 32) {
      const int g = i / (4 * kWStride), rem = i % (4 * kWStride);
      wx[(g * 8 + wrow(4 + rem / kWStride)) * kWStride + rem % kWStride] = __float2half_rn(0.f);
    }
    __syncwarp();
  }
  // kV8: the value accumulators (int32; [mt][0/1]: high / low part of head tig, row gid;
  // [mt][2/3]: row gid + 8; in units 1/c of that head), the weight units c of this lane's
  // softmax heads (+inf until the first weights set them), the code-word offsets of the 4
  // slots, the transpose selectors, and the W word offsets this lane stores (high and low
  // part, per head e) and loads.
  int vacc[8][4];
  float cref[2] = {INFINITY, INFINITY};
  int voff[4] = {0, 0, 0, 0};
  int wsth[2] = {0, 0}, wstl[2] = {0, 0}, wld = 0;
  const int vsrc = (lane & ~3) | (tig >> 1);  // a lane whose softmax heads include head tig
  if constexpr (kV8) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) vacc[i][c] = 0;
    // This lane's ldmatrix row: matrix m = lane >> 3 (half m >> 1; tokens +32 if m is odd),
    // row rr = lane & 7 (quad of lane tig' = rr >> 1 in the mma, token +8 if rr is odd).
    const int m = lane >> 3, rr = lane & 7, tq = rr >> 1;
#pragma unroll
    for (int sl = 0; sl < 4; ++sl) {
      const int tok = 16 * (tq >> 1) + 4 * (tq & 1) + ((sl + tq) & 3) + 8 * (rr & 1) + 32 * (m & 1);
      voff[sl] = Opaque(tok * 32 + 16 * ((m >> 1) ^ ((tok >> 3) & 1)));
    }
    const int tr = 2 * (tig >> 1) + (gid >> 2), pos = 4 * tr + (((gid & 3) - tr) & 3);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      wsth[e] = Opaque(32 * (2 * (tig & 1) + e) + 16 * (e ^ (tig & 1)) + pos);
      wstl[e] = Opaque(32 * (2 * (tig & 1) + e) + 16 * (1 ^ e ^ (tig & 1)) + pos);
    }
    wld = Opaque(32 * (gid >> 1) + 16 * ((gid ^ (gid >> 1) ^ (gid >> 2)) & 1) + 4 * tig);
  }

  if (tid == 0) {
    MarkClock(p, kTlLoop);
    MarkNs(p, kTlLoopNs);
  }
  int stage_c = 0;                         // stage of the slice computed next
  int stage_i = kInt2WarpStages - 1;       // stage the next issue writes
  for (int k = 0; k < mine; ++k) {
    CpAsyncWait<kInt2WarpStages - 2>();
    __syncwarp();
    if (k + kInt2WarpStages - 1 < mine) issue(k + kInt2WarpStages - 1, stage_i);
    CpAsyncCommit();
    stage_i = stage_i + 1 == kInt2WarpStages ? 0 : stage_i + 1;
    const int sl = warp + kW * k;
    const uint8_t* slot = ring + stage_c * kInt2Slot;
    stage_c = stage_c + 1 == kInt2WarpStages ? 0 : stage_c + 1;
    const uint8_t* kc = slot;
    const uint8_t* kp = slot + Lay::kCodes;
    const uint8_t* vc = slot + Lay::kHalf;
    const uint8_t* vp = vc + Lay::kCodes;
    const int valid = tab.info[sl] & 0xffff;

    // Scores for the 64 tokens: sc[mt][c] (c: row half r = c/2, head e = c%2). The k-step
    // loop is outside the m-tile loop so the four accumulator chains interleave.
    float sc[4][4];
    constexpr int NT = kPack ? 2 : 4;
    float ps[NT][4];
    if constexpr (kI8) {
      int acc[4][NG][4];
      uint32_t wd[4][2][2];  // [m-tile][row gid / gid+8][word v]
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int g = 0; g < NG; ++g)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[mt][g][c] = 0;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint8_t* row = kc + (mt * 16 + gid + 8 * r) * 32;
          if (G == 128) {
            const uint2 w = *reinterpret_cast<const uint2*>(row + 8 * tig);
            wd[mt][r][0] = w.x;
            wd[mt][r][1] = w.y;
          } else {
#pragma unroll
            for (int v = 0; v < 2; ++v) wd[mt][r][v] = *reinterpret_cast<const uint32_t*>(row + Lay::KWordByte(tig, v));
          }
        }
      }
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int g = (G == 64) ? v : 0;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            const uint32_t x0 = hh ? wd[mt][0][v] >> 4 : wd[mt][0][v];
            const uint32_t x1 = hh ? wd[mt][1][v] >> 4 : wd[mt][1][v];
            MmaU8S8(acc[mt][g], And(x0, 0x03030303u), And(x1, 0x03030303u), And(x0, 0x0C0C0C0Cu),
                    And(x1, 0x0C0C0C0Cu), qb[v][hh][0], qb[v][hh][1]);
          }
        }
      }
      // The packed exchange: 256·high + low of each head (lanes tig 0, 1 hold the high parts
      // and keep the even m-tiles, tig 2, 3 the low parts and the odd m-tiles), then the
      // query scale 1 / (4·S), the K scale and Σ q·min per token.
      const bool upper = tig >= 2;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float tot[NG][4];
#pragma unroll
        for (int g = 0; g < NG; ++g)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const float a = static_cast<float>(acc[2 * j][g][c]);
            const float b = static_cast<float>(acc[2 * j + 1][g][c]);
            const float other = __shfl_xor_sync(0xffffffffu, upper ? a : b, 2);
            // upper: own low part b + 256 · the partner's high part; lower: 256 · a + low.
            tot[g][c] = upper ? fmaf(other, 256.f, b) : fmaf(a, 256.f, other);
          }
        const int mt = 2 * j + (tig >> 1);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int t = mt * 16 + gid + 8 * r;
          float sv[2];
#pragma unroll
          for (int g = 0; g < NG; ++g) {
            const float2 sm = __half22float2(*reinterpret_cast<const __half2*>(kp + (t * NG + g) * 4));
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float x = fmaf(sm.x * qinv[e], tot[g][2 * r + e], sm.y * Q0i[e][g]);
              sv[e] = g == 0 ? x : sv[e] + x;
            }
          }
#pragma unroll
          for (int e = 0; e < 2; ++e) ps[j][2 * r + e] = sv[e];
        }
      }
      if (valid < static_cast<int>(kSliceTokens)) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c)
            if ((2 * j + (tig >> 1)) * 16 + gid + 8 * (c >> 1) >= valid) ps[j][c] = -INFINITY;
      }
    } else {
      // Accumulators per m-tile: one per group, or (kSplit, G = 128) two for the two halves of
      // the channels, so each mma chain is half as long.
      constexpr int NA = (kSplit && NG == 1) ? 2 : NG;
      float acc[4][NA][4];
      uint32_t wd[4][2][2], w8[4][2][2];  // [m-tile][row gid / gid+8][word v], and >> 8
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int a = 0; a < NA; ++a) {
          acc[mt][a][0] = acc[mt][a][2] = a < NG ? Cinit[0][a] : 0.f;
          acc[mt][a][1] = acc[mt][a][3] = a < NG ? Cinit[1][a] : 0.f;
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint8_t* row = kc + (mt * 16 + gid + 8 * r) * 32;
          if (G == 128) {  // both words in one 8-byte load (no bank conflict)
            const uint2 w = *reinterpret_cast<const uint2*>(row + 8 * tig);
            wd[mt][r][0] = w.x;
            wd[mt][r][1] = w.y;
          } else {
#pragma unroll
            for (int v = 0; v < 2; ++v) wd[mt][r][v] = *reinterpret_cast<const uint32_t*>(row + Lay::KWordByte(tig, v));
          }
#pragma unroll
          for (int v = 0; v < 2; ++v) w8[mt][r][v] = wd[mt][r][v] >> 8;
        }
      }
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int g = (G == 64) ? v : 0;
#pragma unroll
        for (int uu = 0; uu < 4; ++uu) {
          const int s = 4 * v + uu;
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            uint32_t a[2][2];  // [row][even/odd register]
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              a[r][0] = CodeReg(2 * uu, wd[mt][r][v], w8[mt][r][v], magic);
              a[r][1] = CodeReg(2 * uu + 1, wd[mt][r][v], w8[mt][r][v], magic);
            }
            const int ai = NA == 2 ? v : 0;
            MmaF16(acc[mt][ai], a[0][0], a[1][0], a[0][1], a[1][1], qhi[s][0], qhi[s][1]);
            if (!kPack && p.precise_query) {
              MmaF16(acc[mt][ai], a[0][0], a[1][0], a[0][1], a[1][1], qlo[s][0], qlo[s][1]);
            }
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int t = mt * 16 + gid + 8 * r;
          float sv[2];
#pragma unroll
          for (int g = 0; g < NG; ++g) {
            const float2 sm = __half22float2(*reinterpret_cast<const __half2*>(kp + (t * NG + g) * 4));
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float av = NA > NG ? acc[mt][0][2 * r + e] + acc[mt][NA - 1][2 * r + e]
                                       : acc[mt][g][2 * r + e];
              const float x = fmaf(sm.x, av, sm.y * Q0[e][g]);
              sv[e] = g == 0 ? x : sv[e] + x;
            }
          }
#pragma unroll
          for (int e = 0; e < 2; ++e) sc[mt][2 * r + e] = sv[e];
        }
      }
    }
    if (!kI8 && valid < static_cast<int>(kSliceTokens)) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (mt * 16 + gid + 8 * (c >> 1) >= valid) sc[mt][c] = -INFINITY;
    }
    // Packed mode: lanes tig 0, 1 hold the high-part scores of heads 2·tig + e, lanes tig 2, 3
    // the low-part scores of heads 2·(tig - 2) + e. One exchange sums them so that lanes tig 0, 1
    // own the even m-tiles and lanes tig 2, 3 the odd ones: lane (gid, tig) then owns tiles
    // mt = 2j + (tig >> 1), heads 2·(tig & 1) + e.
    if constexpr (kI8) {
    } else if (kPack) {
      const bool upper = tig >= 2;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float send = upper ? sc[2 * j][c] : sc[2 * j + 1][c];
          const float other = __shfl_xor_sync(0xffffffffu, send, 2);
          ps[j][c] = (upper ? sc[2 * j + 1][c] : sc[2 * j][c]) + other;
        }
    } else {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) ps[j][c] = sc[j][c];
    }
    // Online softmax over the slice; rescale only when a running max grows.
    float cm[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float x = fmaxf(ps[0][e], ps[0][2 + e]);
#pragma unroll
      for (int j = 1; j < NT; ++j) x = fmaxf(x, fmaxf(ps[j][e], ps[j][2 + e]));
      cm[e] = WarpMaxOverGid(x);
      if (kPack) cm[e] = fmaxf(cm[e], __shfl_xor_sync(0xffffffffu, cm[e], 2));
    }
    if (__any_sync(0xffffffffu, cm[0] > st.m[0] || cm[1] > st.m[1])) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float f;
        if constexpr (kV8) {
          // The int32 value accumulators keep their units: c = 2^(m - R) follows the max.
          const float m_new = fmaxf(st.m[e], cm[e]);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;
          f = Ex2(st.m[e] - m_use);
          cref[e] *= Ex2(m_use - st.m[e]);
          st.m[e] = m_new;
          st.l[e] *= f;
        } else {
          Rescale(st, e, cm[e], &f);
        }
#pragma unroll
        for (int g = 0; g < NG; ++g) {
          pm[e][g] *= f;
          sw[g][e] *= f;
          sw[g][2 + e] *= f;
        }
      }
    }
    float mu[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) mu[e] = st.m[e] == -INFINITY ? 0.f : st.m[e];
    if constexpr (kV8) {
      // Weights of this lane's tokens (j, r) -> byte i = 2j + r, as 2^23 + round(p·scale·c).
      uint32_t y[NG][2][4];
      float prv[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = (2 * (i >> 1) + (tig >> 1)) * 16 + gid + 8 * (i & 1);
        float pc[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          prv[i][e] = Ex2(ps[i >> 1][2 * (i & 1) + e] - mu[e]);
          st.l[e] += prv[i][e];
          pc[e] = prv[i][e] * cref[e];
        }
#pragma unroll
        for (int g = 0; g < NG; ++g) {
          const float2 sm = __half22float2(*reinterpret_cast<const __half2*>(vp + (t * NG + g) * 4));
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            pm[e][g] = fmaf(prv[i][e], sm.y, pm[e][g]);
            y[g][e][i] = __float_as_uint(fmaf(pc[e], sm.x, kV8Magic));
          }
        }
      }
      uint32_t bits = 0;
#pragma unroll
      for (int g = 0; g < NG; ++g)
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
          for (int i = 0; i < 4; ++i) bits |= y[g][e][i];
      // A weight past 65535 (or the units not set yet: c = inf): new units for that head, the
      // accumulators shifted to them (once per warp item, then when a weight grows past 2x the
      // one that set the units).
      if (__any_sync(0xffffffffu, (bits & 0x00FF0000u) != 0)) {
        bool set = false, shifted = false;
        int d[2] = {0, 0};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float M = 0.f;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int t = (2 * (i >> 1) + (tig >> 1)) * 16 + gid + 8 * (i & 1);
#pragma unroll
            for (int g = 0; g < NG; ++g)
              M = fmaxf(M, prv[i][e] * __half2float(*reinterpret_cast<const __half*>(vp + (t * NG + g) * 4)));
          }
          M = WarpMaxOverGid(M);
          M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 2));  // the head's other tokens
          const float need = M * cref[e];
          if (M > 0.f && !(need <= 65535.f)) {
            d[e] = 64;
            if (!isinf(cref[e])) {
              d[e] = ((__float_as_int(need) >> 23) & 0xff) - 127 + 1 - kV8RefBits;
              shifted = true;
            } else {
              set = true;
            }
            if (d[e] >= 64) {
              d[e] = 64;
              cref[e] = static_cast<float>(1 << kV8RefBits) / M;
            } else {
              cref[e] *= __int_as_float((127 - d[e]) << 23);
            }
          }
          const float cu = M > 0.f ? cref[e] : 0.f;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int t = (2 * (i >> 1) + (tig >> 1)) * 16 + gid + 8 * (i & 1);
#pragma unroll
            for (int g = 0; g < NG; ++g) {
              const float sc = __half2float(*reinterpret_cast<const __half*>(vp + (t * NG + g) * 4));
              y[g][e][i] = __float_as_uint(fmaf(prv[i][e] * cu, sc, kV8Magic));
            }
          }
        }
        // Accumulators of head tig to the new units: floor((256·high + low) / 2^d), as a
        // canonical pair again (low < 256). A head's first units find them zero.
        if (__any_sync(0xffffffffu, shifted)) {
          const int d0 = __shfl_sync(0xffffffffu, d[0], vsrc), d1 = __shfl_sync(0xffffffffu, d[1], vsrc);
          const int dh = (tig & 1) ? d1 : d0;
          if (dh > 0) {
#pragma unroll
            for (int mt = 0; mt < 8; ++mt)
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                uint64_t v = (static_cast<uint64_t>(static_cast<uint32_t>(vacc[mt][2 * r])) << 8) +
                             static_cast<uint32_t>(vacc[mt][2 * r + 1]);
                v = dh >= 64 ? 0 : v >> dh;
                vacc[mt][2 * r] = static_cast<int>(v >> 8);
                vacc[mt][2 * r + 1] = static_cast<int>(v & 0xffu);
              }
          }
        }
        if (p.int8_value_stats != nullptr) {
          set = __any_sync(0xffffffffu, set);
          shifted = __any_sync(0xffffffffu, shifted);
          if (lane == 0 && set) atomicAdd(p.int8_value_stats, 1u);
          if (lane == 0 && shifted) atomicAdd(p.int8_value_stats + 1, 1u);
        }
      }
      uint32_t* wx32 = reinterpret_cast<uint32_t*>(wx);
#pragma unroll
      for (int g = 0; g < NG; ++g)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const uint32_t x01 = __byte_perm(y[g][e][0], y[g][e][1], 0x5410);
          const uint32_t x23 = __byte_perm(y[g][e][2], y[g][e][3], 0x5410);
          wx32[g * 128 + wsth[e]] = __byte_perm(x01, x23, 0x7531);  // high bytes
          wx32[g * 128 + wstl[e]] = __byte_perm(x01, x23, 0x6420);  // low bytes
        }
      __syncwarp();
      uint32_t wb[NG][4];
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        const uint4 x = *reinterpret_cast<const uint4*>(wx32 + g * 128 + wld);
        wb[g][0] = x.x;
        wb[g][1] = x.y;
        wb[g][2] = x.z;
        wb[g][3] = x.w;
      }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        uint32_t R[2][4];  // [register b of the k-step][byte b]
#pragma unroll
        for (int rb = 0; rb < 2; ++rb) {
          uint32_t x[4];
          LdMatrixX4Trans(x, SmemAddr(vc) + voff[2 * ks + rb]);
          R[rb][0] = __byte_perm(x[0], x[1], 0x6420);
          R[rb][1] = __byte_perm(x[0], x[1], 0x7531);
          R[rb][2] = __byte_perm(x[2], x[3], 0x6420);
          R[rb][3] = __byte_perm(x[2], x[3], 0x7531);
        }
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) {
          const int b = mt >> 1, g = G == 64 ? mt >> 2 : 0;
          const uint32_t m0 = 0x03030303u << (4 * (mt & 1)), m1 = m0 << 2;
          MmaU8U8(vacc[mt], And(R[0][b], m0), And(R[0][b], m1), And(R[1][b], m0),
                  And(R[1][b], m1), wb[g][2 * ks], wb[g][2 * ks + 1]);
        }
      }
    } else {
      // W columns are stored in the value product's token order (see below), so each lane's
      // B operand is one 32-bit load and its code loads hit 32 distinct banks.
      const int wcol0 = gid < 4 ? 2 * gid : 2 * gid - 7;
      const int head0 = kPack ? 2 * (tig & 1) : 2 * tig;
      const int wr0 = wrow(head0), wr1 = wrow(head0 + 1), wrl = wrow(gid);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int mt = kPack ? 2 * j + (tig >> 1) : j;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int t = mt * 16 + gid + 8 * r;
          const int wc = mt * 16 + wcol0 + 8 * r;
          float pr[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            pr[e] = Ex2(ps[j][2 * r + e] - mu[e]);
            st.l[e] += pr[e];
          }
#pragma unroll
          for (int g = 0; g < NG; ++g) {
            const float2 sm = __half22float2(*reinterpret_cast<const __half2*>(vp + (t * NG + g) * 4));
            const __half2 w2 = __floats2half2_rn(pr[0] * sm.x, pr[1] * sm.x);
            pm[0][g] = fmaf(pr[0], sm.y, pm[0][g]);
            pm[1][g] = fmaf(pr[1], sm.y, pm[1][g]);
            wx[(g * 8 + wr0) * kWStride + wc] = __low2half(w2);
            wx[(g * 8 + wr1) * kWStride + wc] = __high2half(w2);
          }
        }
      }
      __syncwarp();
      // Values: O^T[channel][head] += V^T (codes, 16 channels x 16 tokens per tile) · W.
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // k-slots 2·tig, 2·tig+1, 2·tig+8, 2·tig+9 of this 16-token step are tokens tig, tig+4,
        // tig+8, tig+12 (W columns were written in this order).
        const int ta = 16 * j + tig, tb = ta + 8;
        const int wcb = 16 * j + 2 * tig;
        uint32_t wa0, wa1, wb0, wb1;
        if (G == 128) {
          wa0 = *reinterpret_cast<const uint32_t*>(vc + ta * 32 + 4 * gid);
          wa1 = *reinterpret_cast<const uint32_t*>(vc + (ta + 4) * 32 + 4 * gid);
          wb0 = *reinterpret_cast<const uint32_t*>(vc + tb * 32 + 4 * gid);
          wb1 = *reinterpret_cast<const uint32_t*>(vc + (tb + 4) * 32 + 4 * gid);
        } else {
          auto ld = [&](int t) {
            const uint32_t lo = *reinterpret_cast<const uint16_t*>(vc + t * 32 + 2 * gid);
            const uint32_t hi = *reinterpret_cast<const uint16_t*>(vc + t * 32 + 16 + 2 * gid);
            return lo | (hi << 16);
          };
          wa0 = ld(ta);
          wa1 = ld(ta + 4);
          wb0 = ld(tb);
          wb1 = ld(tb + 4);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint32_t sel = half ? 0x7632u : 0x5410u;
          uint32_t ra[8], rb[8];
          UnpackCodesM(__byte_perm(wa0, wa1, sel), magic, ra);
          UnpackCodesM(__byte_perm(wb0, wb1, sel), magic, rb);
          const int g = (G == 64) ? half : 0;
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(wx + (g * 8 + wrl) * kWStride + wcb);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(wx + (g * 8 + wrl) * kWStride + wcb + 8);
#pragma unroll
          for (int ii = 0; ii < 4; ++ii) {
            const int i = half * 4 + ii;
            MmaF16(st.o[i], ra[2 * ii], ra[2 * ii + 1], rb[2 * ii], rb[2 * ii + 1], b0, b1);
          }
          // 1024·Σ W: the same product with every code 0 (exactly what the offsets added).
          if (G == 64 || half == 0) MmaF16(sw[g], magic, magic, magic, magic, b0, b1);
        }
      }
    }
    __syncwarp();
  }
  if constexpr (kW == kWarps) {
    if (lane == 0) MarkClock(p, kTlWarpEnd + warp);
  } else if (lane == 0) {
    MarkClock(p, warp < 4 ? kTlWarpEnd + warp : kTlWarpEnd4 + warp - 4);
  }
  CpAsyncWait<0>();
  // 4 warps: the states are written over the first rings (FinishItem), after every warp's loop.
  // More warps: each warp writes its state into its own ring; the first barrier is FinishItem's
  // after the states.
  if constexpr (kW == kWarps) __syncthreads();
  if (kW != kWarps && tid == 0) MarkClock(p, kTlLoopsDone);

  // Remove the code offsets and factors, add Σ p·min.
#pragma unroll
  for (int e = 0; e < 2; ++e) {
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      pm[e][g] = WarpSumOverGid(pm[e][g]);
      // Packed: lanes tig and tig ^ 2 hold the same head's partial sums (even / odd tiles).
      if (kPack) pm[e][g] += __shfl_xor_sync(0xffffffffu, pm[e][g], 2);
    }
    if (kPack) st.l[e] += __shfl_xor_sync(0xffffffffu, st.l[e], 2);
  }
  if constexpr (kV8) {
    // Σ W·code of head tig = (256·high + low) / c, each row times 4^-j; then lanes tig 0, 1
    // take heads 2·tig + e from lanes 2·tig + e (FinishItem's layout; lanes tig 2, 3 end up
    // with heads >= 4, which it ignores at GQA <= 4).
    if (p.int8_value_stats != nullptr && lane == 0) atomicAdd(p.int8_value_stats + 2, static_cast<uint32_t>(mine));
    const float c0 = __shfl_sync(0xffffffffu, cref[0], vsrc), c1 = __shfl_sync(0xffffffffu, cref[1], vsrc);
    // c = inf: no weights (unit 0; the fast division gives 0 for a divisor past 2^126 too).
    const float unit = FinishDiv<kW>(1.f, (tig & 1) ? c1 : c0);
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      const int g = (G == 64) ? mt >> 2 : 0;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float inv = 1.0f / static_cast<float>(1 << (2 * (2 * (mt & 1) + r)));
        const float v = fmaf(static_cast<float>(vacc[mt][2 * r]), 256.f, static_cast<float>(vacc[mt][2 * r + 1])) *
                        (unit * inv);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = __shfl_sync(0xffffffffu, v, (lane & ~3) | ((2 * tig + e) & 3));
          st.o[mt][2 * r + e] = x + pm[e][g];
        }
      }
    }
    if (kW == 8 && tid == 0) MarkClock(p, kTlEpilogue);
    FinishItem<kW, kW != kWarps>(p, item, it, st, smem,
                                 [&](int i, int r) { return 64 * (i >> 2) + 8 * gid + 2 * (i & 3) + r; });
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int half = i >> 2, ii = i & 3;
      const int g = (G == 64) ? half : 0;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int cidx = 2 * ii + r;
        const float inv = 1.0f / static_cast<float>(1 << CodeShift(cidx));
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& o = st.o[i][2 * r + e];
          o = (o - sw[g][e]) * inv + pm[e][g];
        }
      }
    }
    FinishItem<kW, kW != kWarps>(p, item, it, st, smem, [&](int i, int r) {
      const int half = i >> 2, cidx = 2 * (i & 3) + r;
      return G == 128 ? 16 * gid + 8 * half + cidx : 64 * half + 8 * gid + cidx;
    });
  }
}

// One CTA per work item; blockIdx.x indexes the plan's order (its first num_int2_items entries).
// kW warps per CTA (DecodeParams::int2_warps): 4 (3 CTAs per SM at most), or 8 for the
// rotation kernel's path (one CTA per SM: 142 registers per thread, no spills).
template <int kW>
constexpr int Int2MinBlocks() { return kW == 4 ? 3 : 1; }
template <int G, bool kPack, bool kSplit, bool kI8, bool kV8, int kW = kWarps>
__global__ void __launch_bounds__(32 * kW, Int2MinBlocks<kW>()) DecodeInt2Kernel(const DecodeParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  // The BF16 kernel or the merge kernel (launched next, programmatic serialization) may start
  // now (the BF16 kernel does not depend on this one: it starts as soon as SMs free up);
  // without them, each CTA lets the next kernel on the stream start after its main loop
  // (FinishItem), e.g. the next launch's rotation kernel (DecodeParams::early_rotation), whose
  // CTAs then wait on SMs that the last CTAs of this grid no longer need.
  if (!p.fused_merge || p.num_items > p.num_int2_items) asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0) {
    MarkNs(p, kTlEntryNs);
    MarkClock(p, kTlEntry);
  }
  int item;
  const DecodeWorkItem it = FetchItem(p, blockIdx.x, &item);
  const bool int2_item = it.kind == static_cast<int32_t>(PageKind::kInt2);
  PrefetchSharedRotation(p, it, item);
  int ticket = -1;
  if (kW == kWarps && int2_item && p.rotate_in_cta) {
    // INT2 items: the query rows (into Int2Item's query area) start loading, and the rotation
    // ticket is taken, before the slice table's dependent loads.
    StageQueries(p, it, reinterpret_cast<float*>(smem + kInt2StageArea) + 8 * 128);
    CpAsyncCommit();
    ticket = TakeRotationTicket(p, it);
  }
  uint8_t* t = smem + Int2StageArea<kW>() + kW * kWarpXchg;
  SliceTable tab{reinterpret_cast<const uint8_t**>(t), reinterpret_cast<int32_t*>(t + kMaxItemSlices * 8)};
  LoadSliceTable<kW>(p, it, tab);
  if (kW == kWarps && int2_item && threadIdx.x == 0) *reinterpret_cast<int*>(smem + kTicketSmemOffset) = ticket;
  __syncthreads();
  if (threadIdx.x == 0) {
    MarkClock(p, kTlTable);
    if (p.debug_timeline != nullptr) {
      const int pair = it.seq * static_cast<int>(p.shape.num_kv_heads) + it.kv_head;
      p.debug_timeline[size_t(blockIdx.x) * kDecodeTimelineWords + kTlMeta] =
          uint64_t(it.kind) << 8 | uint64_t(it.num_slices) << 16 |
          uint64_t(p.item_indptr[pair + 1] - p.item_indptr[pair]) << 40;
      MarkMeta(p, 0);
    }
  }
  // An INT2-dominated plan runs its few BF16 items (sink, recent tokens) here too, in the
  // 2-stage layout that fits this kernel's shared memory, instead of in a BF16 kernel whose
  // CTAs could start only as INT2 CTAs leave (a tail after the INT2 work).
  static_assert(2 * kBf16Stage + kW * 2 * 8 * 24 * 2 <= Int2StageArea<kW>() + kW * kWarpXchg,
                "2-stage BF16 layout must fit below the slice table");
  static_assert(kW == kWarps || kMergeStageBytes + 16 <= Int2StageArea<kW>(),
                "the merge's stage and mbarrier lie in the stage area");
  if (it.kind == static_cast<int32_t>(PageKind::kBf16)) {
    Bf16Item<2, kW>(p, item, it, smem, tab);
  } else {
    Int2Item<G, kPack, kSplit, kI8, kV8, kW>(p, item, it, smem, tab);
  }
  if (threadIdx.x == 0) {
    MarkClock(p, kTlEnd);
    MarkNs(p, kTlEndNs);
  }
}

// ---------------------------------------------------------------------------------------------
// The rotation kernel (DecodeParams::rotate_in_cta = false): one CTA of kPrepThreads per
// (sequence, KV head) rotates the pair's GQA queries once (q' = q·R_K·softmax_scale·log2 e) into
// the workspace (RotatedQueries, read by the BF16 items and the fp16-query variants) and, for
// the int8 score variants with prepared_fragments, builds the pair's int8 query fragments
// (QueryFragmentArea: 4 x 32 uint4, chunk c of lane l at [c][l]; the lane's words 4c..4c+3 of:
// 0..7 qb[v][hh][rr] at 4v + 2hh + rr, 8 + e qinv[e], 10 + e + 2g Q0i[e][g], so G = 128 needs
// chunks 0..2 only). The INT2 kernel is its
// programmatic dependent: its CTAs load their item and slice table and issue their first K/V
// copies while this grid runs.
constexpr int kPrepThreads = 256;

// early_rotation: the kernel before this one on the stream is done (its writes visible): only
// R_K is read before this. Then the INT2 kernel (programmatic dependent) may start.
__device__ __forceinline__ void PrepWait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
}

// The rotation for kHeads >= gqa heads: warp w sums input rows [16w, 16w+16) for output
// channels [4·lane, 4·lane+4) into part[w][h][128]; its 16 R rows are loaded at once, before the
// query rows (into qin, [gqa][128]), so both loads are in flight together.
template <int kHeads>
__device__ __forceinline__ void PrepRotate(const DecodeParams& p, int kv_head, const float* q, float* qin,
                                           float* part, uint64_t (&marks)[3]) {
  const int gqa = static_cast<int>(p.shape.gqa());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float4* r = reinterpret_cast<const float4*>(p.rot_k + size_t(kv_head) * 128 * 128 +
                                                    size_t(16 * warp) * 128) + lane;
  float4 rv[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) rv[i] = __ldg(r + 32 * i);
  // ptxas issued all but the first of these loads after griddepcontrol.wait, so R_K (64 KiB per
  // CTA) was read after the previous kernel ended instead of while it ran (H200, B=1 x 100K: the
  // rotation took 0.93 µs after the queries arrived). A branch on every loaded row keeps the
  // wait behind them: its store (into this CTA's shared memory, written again after the wait)
  // happens only for one NaN payload of the sum, which changes nothing.
  float probe = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) probe = fmaf(rv[i].x, 0.f, probe);
  if (__float_as_uint(probe) == 0x7fc00001u) qin[threadIdx.x] = probe;
  PrepWait();
  if (p.debug_timeline != nullptr) marks[0] = GlobalNs();
  for (int i = threadIdx.x; i < gqa * 32; i += kPrepThreads)
    reinterpret_cast<float4*>(qin)[i] = reinterpret_cast<const float4*>(q)[i];
  __syncthreads();
  if (p.debug_timeline != nullptr) marks[1] = GlobalNs();
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (h < gqa) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 x = *reinterpret_cast<const float4*>(qin + h * 128 + 16 * warp + 4 * j);
        const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float4 rr = rv[4 * j + u];
          acc.x = fmaf(xs[u], rr.x, acc.x);
          acc.y = fmaf(xs[u], rr.y, acc.y);
          acc.z = fmaf(xs[u], rr.z, acc.z);
          acc.w = fmaf(xs[u], rr.w, acc.w);
        }
      }
      reinterpret_cast<float4*>(part + (warp * gqa + h) * 128)[lane] = acc;
    }
  }
}

// The rotation kernel's int8 query fragments (the words Int8QueryFragments gives every lane,
// in QueryFragmentArea's layout), built by its 8 warps at once: each warp computes the heads'
// scales and sums (max |q| and Σ q: the same shuffle chains in every warp), warp w then word w
// (qb[w >> 2][(w >> 1) & 1][w & 1]) of every lane and warp 0 also the scale and sum words --
// one warp's chain of 32 element conversions becomes 4 per warp. Same bits.
static_assert(kPrepThreads == 256, "PrepFragments: one fragment word per warp");
template <int G>
__device__ __forceinline__ void PrepFragments(const float* qrot, int gqa, uint4* f) {
  constexpr int NG = Int2Layout<G>::NG;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float S[4], sum[4];
  Int8QueryScales<G>(qrot, gqa, lane, S, sum);
  uint32_t* fl = reinterpret_cast<uint32_t*>(f + lane);  // chunk c of this lane at f[32c + lane]
  fl[128 * (warp >> 2) + (warp & 3)] = Int8QueryWord<G>(qrot, gqa, lane, S, warp >> 2, (warp >> 1) & 1, warp & 1);
  if (warp == 0) {
    // Words 8..15: qinv[e] (8 + e), Q0i[e][g] (10 + e + 2g), zeros after.
    float qinv[2], Q0i[2][NG];
    Int8QueryHeadWords<G>(S, sum, lane, qinv, Q0i);
    uint32_t w[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      w[e] = __float_as_uint(qinv[e]);
#pragma unroll
      for (int g = 0; g < NG; ++g) w[2 + e + 2 * g] = __float_as_uint(Q0i[e][g]);
    }
    f[32 * 2 + lane] = make_uint4(w[0], w[1], w[2], w[3]);
    f[32 * 3 + lane] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

// Shared memory: (2 + kPrepThreads / 32) · gqa · 128 floats (query rows, rotated queries, the
// warps' partial sums). blockIdx.x = seq · num_kv_heads + kv head.
template <int G>
__global__ void __launch_bounds__(kPrepThreads) QueryPrepKernel(const DecodeParams p, bool fragments) {
  extern __shared__ __align__(16) float psm[];
  const int gqa = static_cast<int>(p.shape.gqa()), H = static_cast<int>(p.shape.num_kv_heads);
  const int seq = static_cast<int>(blockIdx.x) / H, h = static_cast<int>(blockIdx.x) % H;
  const int t = threadIdx.x;
  const size_t row0 = (size_t(seq) * p.shape.num_q_heads + size_t(h) * gqa) * 128;
  const float* q = p.q + row0;
  float* qin = psm;
  float* qs = psm + gqa * 128;
  float* part = qs + gqa * 128;
  float* dst = RotatedQueries(p) + row0;
  const float scale = (p.softmax_scale > 0 ? p.softmax_scale : 0.08838834764831845f) * kLog2e;
  uint64_t marks[3] = {0, 0, 0};  // diagnostics: wait returned, queries loaded, rotated
  if (p.rot_k == nullptr) {
    PrepWait();
    for (int i = t; i < gqa * 128; i += kPrepThreads) {
      qs[i] = q[i] * scale;
      dst[i] = qs[i];
    }
  } else {
    if (gqa <= 1) {
      PrepRotate<1>(p, h, q, qin, part, marks);
    } else if (gqa <= 2) {
      PrepRotate<2>(p, h, q, qin, part, marks);
    } else if (gqa <= 4) {
      PrepRotate<4>(p, h, q, qin, part, marks);
    } else {
      PrepRotate<8>(p, h, q, qin, part, marks);
    }
    __syncthreads();
    for (int i = t; i < gqa * 128; i += kPrepThreads) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kPrepThreads / 32; ++w) v += part[w * gqa * 128 + i];
      qs[i] = v * scale;
      dst[i] = v * scale;
    }
  }
  if (p.debug_timeline != nullptr) marks[2] = GlobalNs();
  if (fragments) {
    __syncthreads();
    PrepFragments<G>(qs, gqa, QueryFragmentArea(p) + size_t(blockIdx.x) * 128);
  }
  if (p.debug_timeline != nullptr && t == 0 && blockIdx.x < p.num_int2_items) {
    // Diagnostics, in INT2 CTA blockIdx.x's record: this CTA's end (%globaltimer) in word 22,
    // and how long before it the wait returned / the queries were loaded / rotated (ns, 21 bits
    // each) in word 23.
    const uint64_t end = GlobalNs();
    uint64_t* rec = p.debug_timeline + size_t(blockIdx.x) * kDecodeTimelineWords;
    rec[kTlRotationEndNs] = end;
    uint64_t packed = 0;
    for (int i = 0; i < 3; ++i) packed |= (std::min<uint64_t>(end - marks[i], 0x1fffff)) << (21 * i);
    rec[kTlRotationMarks] = packed;
  }
}

// Raises an INT2 kernel's dynamic shared-memory limit on its first launch (one static per
// instantiation: the kernel is a template argument, not a value of the shared pointer type).
// int2_ctas_per_sm: dynamic shared memory of 228 KiB / (cap + 1) per CTA keeps a (cap + 1)-th
// CTA (with its 1 KiB of reserved shared memory) off every SM.
constexpr int kSmPaddedSmem = 228 * 1024;
template <int G, bool kPack, bool kSplit, bool kI8 = false, bool kV8 = false, int kW = kWarps>
void LaunchInt2(const DecodeParams& p, int blocks, cudaStream_t stream) {
  constexpr int kSmem = Int2SmemBytes<kW>();
  static const bool once =
      SetSmem(DecodeInt2Kernel<G, kPack, kSplit, kI8, kV8, kW>, std::max(kSmem, kSmPaddedSmem / 2));
  (void)once;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(32 * kW);
  // 8 warps per CTA: the registers already keep a second CTA off an SM.
  const int cap = kW == kWarps ? p.int2_ctas_per_sm : 0;
  cfg.dynamicSmemBytes = cap == 1 || cap == 2 ? std::max(kSmem, kSmPaddedSmem / (cap + 1)) : kSmem;
  cfg.stream = stream;
  // A programmatic dependent of the rotation kernel (launched just before it unless
  // rotate_in_cta): CTAs start while it runs and wait for its output in CtaQueries.
  cudaLaunchAttribute attr;
  SetProgrammaticDependent(cfg, attr, !p.rotate_in_cta);
  cudaLaunchKernelEx(&cfg, DecodeInt2Kernel<G, kPack, kSplit, kI8, kV8, kW>, p);
}
}  // namespace

void LaunchDecodeInt2Kernels(const DecodeParams& p, int n2, cudaStream_t stream) {
  const bool pack = p.variant != DecodeVariant::kBaseline && p.shape.gqa() <= 4;
  const bool split = p.variant == DecodeVariant::kPackedSplitAcc;
  const bool v8 = p.variant == DecodeVariant::kPackedInt8Values;
  const bool i8 = p.variant == DecodeVariant::kPackedInt8 || v8;
  if (!p.rotate_in_cta) {
    const int gqa = static_cast<int>(p.shape.gqa());
    const int ctas = p.table.num_seqs * static_cast<int>(p.shape.num_kv_heads);
    const size_t smem = size_t(2 + kPrepThreads / 32) * gqa * 128 * sizeof(float);
    const bool fragments = pack && i8 && p.prepared_fragments;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(ctas);
    cfg.blockDim = dim3(kPrepThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr;
    SetProgrammaticDependent(cfg, attr, p.early_rotation);
    if (p.shape.group_size == 128) {
      cudaLaunchKernelEx(&cfg, QueryPrepKernel<128>, p, fragments);
    } else {
      cudaLaunchKernelEx(&cfg, QueryPrepKernel<64>, p, fragments);
    }
  }
  if (p.int2_warps != kWarps) {  // 8 warps: LaunchDecodeAttention checked the options
    if (p.shape.group_size == 128) {
      LaunchInt2<128, true, false, true, true, 8>(p, n2, stream);
    } else {
      LaunchInt2<64, true, false, true, true, 8>(p, n2, stream);
    }
  } else if (p.shape.group_size == 128) {
    if (!pack) {
      LaunchInt2<128, false, false>(p, n2, stream);
    } else if (v8) {
      LaunchInt2<128, true, false, true, true>(p, n2, stream);
    } else if (i8) {
      LaunchInt2<128, true, false, true>(p, n2, stream);
    } else {
      split ? LaunchInt2<128, true, true>(p, n2, stream) : LaunchInt2<128, true, false>(p, n2, stream);
    }
  } else if (!pack) {  // G = 64 already has two accumulator chains per m-tile (one per group)
    LaunchInt2<64, false, false>(p, n2, stream);
  } else {
    if (v8) {
      LaunchInt2<64, true, false, true, true>(p, n2, stream);
    } else {
      i8 ? LaunchInt2<64, true, false, true>(p, n2, stream) : LaunchInt2<64, true, false>(p, n2, stream);
    }
  }
}

int DecodeKernelOccupancy(int group_size) {
  int blocks = 0;
  if (group_size == 128) {
    cudaFuncSetAttribute(DecodeInt2Kernel<128, false, false, false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemBytes<true>());
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, DecodeInt2Kernel<128, false, false, false, false>, kThreads, SmemBytes<true>());
  } else {
    cudaFuncSetAttribute(DecodeInt2Kernel<64, false, false, false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemBytes<true>());
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, DecodeInt2Kernel<64, false, false, false, false>, kThreads, SmemBytes<true>());
  }
  return blocks;
}

}  // namespace oscarkv::cuda
