// The INT2 decode kernel's operands (decode_int2.cu; internal to kernels/cuda/src): the slice
// layout in shared memory, INT2 codes as tensor-core operands in registers, the mma wrappers and
// the int8 query fragments.
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
#pragma once

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

// The int8 score product of kV8 (DecodeVariant::kPackedInt8Values). Lane (gid, tig) of an m-tile holds
// code words x = word v of rows gid and gid+8 (bytes KWordByte(tig, v)..+3) and x >> 4. One
// IMMA per (word v, shift h): A registers 0/1 (k = 4·tig + i) are x_h & 0x03030303, i.e. the
// codes of channels 4·(byte i) + 2h as u8 (weight 1); registers 2/3 (k = 16 + 4·tig + i) are
// x_h & 0x0C0C0C0C, the codes of channels 4·(byte i) + 2h + 1 times 4 (weight 4). The B
// operand carries 4·Q for weight-1 channels and Q for weight-4 ones, so every product is
// 4·code·Q; its column n is the high (n < 4) or low (n >= 4) int8 part of head n & 3
// (value = 256·high + low).
constexpr float kI8QMax = 8128.f;  // |Q| <= 8128: 4·Q splits into int8 high/low parts

// kV8 (DecodeVariant::kPackedInt8Values), the value product on int8 tensor cores.
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

// kV8: the int8 query fragments of lane `lane` from the rotated queries qrot ([gqa][128]):
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

// kV8, per head h < 4 (zero past gqa): S[h] = kI8QMax / max |q| (1 for a zero row) and Σ q in
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

// kV8: fragment word qb[v][hh][rr] of lane (gid, tig): bytes i = 0..3 from channel
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

// kV8: for the heads lane (gid, tig) owns after the packed exchange (2·(tig & 1) + e), 1 / (4·S)
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

}  // namespace
}  // namespace oscarkv::cuda
