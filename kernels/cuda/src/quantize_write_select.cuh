// Range selection of the quantize-on-write kernel (quantize_write.cu; internal to
// kernels/cuda/src), per row of 128 channels held by the 4 lanes of a quad: the quantile clip's
// order statistics (QuadAbsQuantile), the RangeMode rules bit for bit with the CPU codec
// (SelectUnbiased, SelectRange), and QuantizeStore, which writes a row's codes and parameters.
#pragma once

#include "quantize_write_rotation.cuh"

namespace oscarkv::cuda {
namespace {

using namespace detail;

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

// Order statistics lo and lo + 1 (0-based, ascending) of the quad's 128 values when lo is near
// the top: walks the distinct values from the largest down (one quad max and one count per
// distinct value) until rank lo is reached. need = 127 - lo < kMaxTopWalk iterations at most,
// instead of 31 counting passes. Ties are counted with their multiplicity, as a sort would.
// `lo` is warp-uniform; quads that finish early keep taking part in the shuffles.
constexpr int kMaxTopWalk = 16;
__device__ __forceinline__ void QuadTopOrderStats(const uint32_t (&a)[32], int lo, uint32_t* rlo,
                                                  uint32_t* rhi) {
  const int need = 127 - lo;  // rank of order statistic lo counted from the top (0 = max)
  int above = 0;              // values strictly greater than the current level
  uint32_t level = 0xffffffffu;
  bool done = false;
  *rlo = 0;
  *rhi = 0;
  for (int it = 0; it < kMaxTopWalk; ++it) {
    if (__all_sync(0xffffffffu, done)) break;
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) m = a[i] < level ? max(m, a[i]) : m;
    m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
    int cnt = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) cnt += a[i] == m;
    cnt += __shfl_xor_sync(0xffffffffu, cnt, 1);
    cnt += __shfl_xor_sync(0xffffffffu, cnt, 2);
    // Values equal to m hold top ranks [above, above + cnt).
    if (!done) {
      if (need >= 1 && above <= need - 1 && need - 1 < above + cnt) *rhi = m;
      if (above <= need && need < above + cnt) {
        *rlo = m;
        if (need == 0) *rhi = m;
        done = true;
      }
      above += cnt;
      level = m;
    }
  }
}

// Sorting networks on |x| bits (non-negative floats order as unsigned integers). Cas leaves the
// larger value in `a`.
__device__ __forceinline__ void Cas(uint32_t& a, uint32_t& b) {
  const uint32_t hi = max(a, b);
  b = min(a, b);
  a = hi;
}
// Sorts v[0..8) descending (19 comparators).
__device__ __forceinline__ void Sort8Desc(uint32_t* v) {
  Cas(v[0], v[2]); Cas(v[1], v[3]); Cas(v[4], v[6]); Cas(v[5], v[7]);
  Cas(v[0], v[4]); Cas(v[1], v[5]); Cas(v[2], v[6]); Cas(v[3], v[7]);
  Cas(v[0], v[1]); Cas(v[2], v[3]); Cas(v[4], v[5]); Cas(v[6], v[7]);
  Cas(v[2], v[4]); Cas(v[3], v[5]);
  Cas(v[1], v[4]); Cas(v[3], v[6]);
  Cas(v[1], v[2]); Cas(v[3], v[4]); Cas(v[5], v[6]);
}
// a, b sorted descending: a becomes the top 8 of a ∪ b (as a multiset), sorted descending
// (max against the reversed b gives a bitonic sequence holding the top 8; a bitonic sorter
// orders it).
__device__ __forceinline__ void MergeTop8(uint32_t* a, const uint32_t* b) {
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = max(a[i], b[7 - i]);
  Cas(a[0], a[4]); Cas(a[1], a[5]); Cas(a[2], a[6]); Cas(a[3], a[7]);
  Cas(a[0], a[2]); Cas(a[1], a[3]); Cas(a[4], a[6]); Cas(a[5], a[7]);
  Cas(a[0], a[1]); Cas(a[2], a[3]); Cas(a[4], a[5]); Cas(a[6], a[7]);
}

// Sorts a bitonic sequence v[0..16) descending (32 comparators).
__device__ __forceinline__ void BitonicSort16Desc(uint32_t* v) {
#pragma unroll
  for (int half = 8; half >= 1; half /= 2) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if ((i & half) == 0) Cas(v[i], v[i + half]);
    }
  }
}

// Order statistics at top ranks need - 1 and need (0 = the quad's maximum; ties counted with
// their multiplicity, as a sort would) for need < 16. Every lane sorts its own top 8 (sorting
// networks); lane pairs (xor 1) merge their lists into a sorted 16, and the two pairs (xor 2)
// keep the top 16 of their 32: every lane ends with the top 16 of the union of the four lists.
// Those are the row's true top values down to rank `need` unless some lane's 8th value lies
// above rank need (its 9th, unknown, might too): such quads (*exact = false) take
// QuadTopOrderStats. Branch-free; `need` is warp-uniform.
__device__ __forceinline__ void QuadTopOrderStatsFast(const float (&y)[32], int need,
                                                      uint32_t* rlo, uint32_t* rhi, bool* exact) {
  uint32_t v[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = __float_as_uint(fabsf(y[i]));
#pragma unroll
  for (int b = 0; b < 4; ++b) Sort8Desc(v + 8 * b);
  MergeTop8(v, v + 8);
  MergeTop8(v + 16, v + 24);
  MergeTop8(v, v + 16);
  const uint32_t eighth = v[7];
  // Pair merge: mine descending, the partner's reversed (ascending) -> bitonic 16.
  uint32_t w[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    w[i] = v[i];
    w[15 - i] = __shfl_xor_sync(0xffffffffu, v[i], 1);
  }
  BitonicSort16Desc(w);
  // Quad: the top 16 of the two pairs' sorted 16s (max against the reversed other is bitonic).
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = __shfl_xor_sync(0xffffffffu, w[i], 2);
#pragma unroll
  for (int i = 0; i < 16; ++i) w[i] = max(w[i], v[15 - i]);
  BitonicSort16Desc(w);
  // Rank `need` and need - 1 by masks (an indexed read would go through local memory).
  uint32_t lo_v = 0, hi_v = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    lo_v |= w[i] & (0u - static_cast<uint32_t>(i == need));
    hi_v |= w[i] & (0u - static_cast<uint32_t>(i == need - 1));
  }
  uint32_t top_eighth = max(eighth, __shfl_xor_sync(0xffffffffu, eighth, 1));
  top_eighth = max(top_eighth, __shfl_xor_sync(0xffffffffu, top_eighth, 2));
  *rlo = lo_v;
  *rhi = need == 0 ? lo_v : hi_v;
  *exact = top_eighth <= lo_v;
}

// Where the c-quantile of a row's 128 |x| sits: order statistic `lo` (ascending, 0-based) and
// the interpolation weight `frac` (numpy's linear rule, as AbsQuantile computes them).
struct QuantilePos {
  int lo;
  float frac;
};
__device__ __forceinline__ QuantilePos QuantilePosition(float c) {
  const double pos = static_cast<double>(fmaxf(0.0f, c)) * 127.0;
  const int lo = static_cast<int>(pos);
  return {lo, static_cast<float>(pos - static_cast<double>(lo))};
}

// The c-quantile of |y| over the quad's 128 values, exactly as AbsQuantile (numpy linear).
// `qp` is warp-uniform.
__device__ float QuadAbsQuantile(const float (&y)[32], QuantilePos qp) {
  const int lo = qp.lo;
  const float frac = qp.frac;
  if (127 - lo < kMaxTopWalk) {  // the usual clips (c >= 0.89): top-8 lists merged
    uint32_t rlo, rhi;
    bool exact;
    QuadTopOrderStatsFast(y, 127 - lo, &rlo, &rhi, &exact);
    if (!__all_sync(0xffffffffu, exact)) {
      uint32_t a[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) a[i] = __float_as_uint(fabsf(y[i]));
      uint32_t wlo, whi;
      QuadTopOrderStats(a, lo, &wlo, &whi);
      if (!exact) {
        rlo = wlo;
        rhi = whi;
      }
    }
    const float a_lo = __uint_as_float(rlo), a_hi = __uint_as_float(rhi);
    return __fadd_rn(a_lo, __fmul_rn(frac, __fsub_rn(a_hi, a_lo)));
  }
  uint32_t a[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) a[i] = __float_as_uint(fabsf(y[i]));
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


__device__ __forceinline__ int CodeAt(const uint32_t (&c)[2], int i) {
  return static_cast<int>((c[i / 16] >> (2 * (i % 16))) & 3u);
}


// RangeMode::kUnbiased ("unbiased v2", docs/FORMAT.md §1.3.1), bit for bit with QuantizeRowInt2
// (SelectUnbiased below).
// The group's G/32 lanes each hold one 32-channel chunk. Per element: one level position
// v = floor(98304·sat(fma(x, 1/w, −mn/w))) (an FFMA.SAT and an FFMA rounding down onto 2^23,
// whose bits hold v), one shared-memory atomic add of (1 << 24) + v into the lane's private bin
// clamp(L, 7, 40) of level L = v >> 11 (34 bins: L <= 7, one per L = 8..39, L >= 40 -- two
// integer min/max),
// and v² into a 64-bit sum. Every candidate threshold (8..15, 24, 33..40) is a bin boundary, so
// its suffix sum is a suffix of bin sums. Bins are [bin][lane]: conflict-free. Then each lane
// reads and clears its bins, a reduce-scatter across the group leaves each candidate's sums on the lane that owns it, which refits and scores it in
// fp64; an (error, index) minimum across the group picks the first smallest, and the winner's
// codes follow from the levels. Exact integer sums: the order of the atomics does not matter.
constexpr int kBins = 34;
__device__ __forceinline__ void SharedRedAdd(uint32_t addr, uint32_t v) {
  asm volatile("red.shared.add.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t SharedLoad(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void SharedStoreZero(uint32_t addr) {
  asm volatile("st.shared.u32 [%0], 0;\n" ::"r"(addr) : "memory");
}
// The unbiased selection, with few instructions per element --
//   * the level comes from its own FFMA rounding down onto 2^23 (floor(48u) = floor(v / 2048)
//     exactly, checked for every float u in [0, 1]), so the bin address is one IMAD of the
//     clamped level (magic bits included, folded into the base);
//   * the bins accumulate the positions' bits vb = 2^23's bits + v as they are: a bin holds
//     n·0x4B000000 + Σv (mod 2^32) and, as 0x4B is odd, n = 99·(x >> 24) mod 256 (99 = 0x4B^-1
//     mod 256) while Σv < 2^24 stays in the low bits (G·98304 < 2^24);
//   * Σv² comes from Σvb² (mod 2^64): Σv² = Σvb² − 2M·Σv − G·M² with M = 0x4B000000;
//   * the clamped levels (7..40, one byte each) are kept packed four to a word instead of the 32
//     positions, and the winner's codes are computed four at a time: byte + (128 − T) has bit 7
//     set iff level >= T, code = b1 + b2 + b3 has bit 0 = b1 ^ b2 ^ b3 (the thresholds are
//     ordered) and bit 1 = b2, and two high-half multiplies gather the eight bits into the
//     stored order (exhaustively checked on the CPU for every candidate and level).
// The candidate's fp16 parameters are computed only when its refit does not apply.
__device__ __forceinline__ uint32_t PackLevelBytes(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}
template <int G>
__device__ DevParams SelectUnbiased(const float (&y)[32], int tig, float mn, float mx,
                                        uint32_t bins, uint32_t (&best)[2]) {
  constexpr int L = G / 32, kOwn = 8 / L;
  const int sub = tig & (L - 1);
  const float w = __fsub_rn(mx, mn);
  const float k = w > 0.f ? __frcp_rn(w) : 0.f;
  const float b = -__fmul_rn(mn, k);
  // `bins` points at (absent) bin -7; the clamped level's bits are
  // kMagic + 7..40 (mod 2^32 arithmetic).
  const uint32_t base = bins - (kMagic << 7);
  unsigned long long s2[4] = {0ull, 0ull, 0ull, 0ull};
  uint32_t lw[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    uint32_t lc[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = 4 * q + e;
      const float u = __saturatef(__fmaf_rn(y[j], k, b));
      const uint32_t vb = __float_as_uint(__fmaf_rd(u, 98304.0f, 8388608.0f));
      const uint32_t lm = __float_as_uint(__fmaf_rd(u, 48.0f, 8388608.0f));
      lc[e] = min(max(lm, kMagic + 7u), kMagic + 40u);
      SharedRedAdd(base + (lc[e] << 7), vb);
      s2[e] += static_cast<unsigned long long>(vb) * vb;
    }
    lw[q] = PackLevelBytes(lc[0], lc[1], lc[2], lc[3]);
  }
  unsigned long long sq = (s2[0] + s2[1]) + (s2[2] + s2[3]);
  __syncwarp();  // orders the atomics before the loads below
  // Suffix sums at the thresholds (raw bin words; counts decoded after the group reduction):
  // lo[i] = P(8+i) (bin 1+i), hi[i] = P(40-i) (bin 33-i), p24 = P(24) (bin 17), tot = all.
  uint32_t lo[8], hi[8], p24 = 0, tot = 0, run = 0;
#pragma unroll
  for (int bin = kBins - 1; bin >= 0; --bin) {
    const uint32_t at = bins + ((bin + 7) << 7);
    run += SharedLoad(at);
    SharedStoreZero(at);
    if (bin >= 26) hi[33 - bin] = run;
    if (bin == 17) p24 = run;
    if (bin >= 1 && bin <= 8) lo[bin - 1] = run;
    if (bin == 0) tot = run;
  }
  p24 += __shfl_xor_sync(0xffffffffu, p24, 1);
  tot += __shfl_xor_sync(0xffffffffu, tot, 1);
  sq += __shfl_xor_sync(0xffffffffu, sq, 1);
  if (L == 4) {
    p24 += __shfl_xor_sync(0xffffffffu, p24, 2);
    tot += __shfl_xor_sync(0xffffffffu, tot, 2);
    sq += __shfl_xor_sync(0xffffffffu, sq, 2);
  }
  uint32_t lo1[4], hi1[4];
  const bool b0 = tig & 1;
#pragma unroll
  for (int pr = 0; pr < 4; ++pr) {
    const uint32_t sl = b0 ? lo[2 * pr] : lo[2 * pr + 1], kl = b0 ? lo[2 * pr + 1] : lo[2 * pr];
    const uint32_t sh = b0 ? hi[2 * pr] : hi[2 * pr + 1], kh = b0 ? hi[2 * pr + 1] : hi[2 * pr];
    lo1[pr] = kl + __shfl_xor_sync(0xffffffffu, sl, 1);
    hi1[pr] = kh + __shfl_xor_sync(0xffffffffu, sh, 1);
  }
  uint32_t lo_own[kOwn], hi_own[kOwn];
  if constexpr (L == 4) {
    const bool b1 = tig & 2;
#pragma unroll
    for (int pr = 0; pr < 2; ++pr) {
      const uint32_t sl = b1 ? lo1[2 * pr] : lo1[2 * pr + 1], kl = b1 ? lo1[2 * pr + 1] : lo1[2 * pr];
      const uint32_t sh = b1 ? hi1[2 * pr] : hi1[2 * pr + 1], kh = b1 ? hi1[2 * pr + 1] : hi1[2 * pr];
      lo_own[pr] = kl + __shfl_xor_sync(0xffffffffu, sl, 2);
      hi_own[pr] = kh + __shfl_xor_sync(0xffffffffu, sh, 2);
    }
  } else {
#pragma unroll
    for (int pr = 0; pr < kOwn; ++pr) {
      lo_own[pr] = lo1[pr];
      hi_own[pr] = hi1[pr];
    }
  }
  const long long V1 = tot & 0xffffffu;
  constexpr unsigned long long kM = kMagic;
  const long long V2 = static_cast<long long>(sq - 2ull * kM * static_cast<unsigned long long>(V1) -
                                              static_cast<unsigned long long>(G) * kM * kM);
  const long long num = G * V2 - V1 * V1;
  const double gd = static_cast<double>(G), delta = __ddiv_rn(static_cast<double>(w), 98304.0);
  const double z1 = __dadd_rn(static_cast<double>(V1), gd / 2.0);
  const double z2 = __dadd_rn(__dadd_rn(static_cast<double>(V2), static_cast<double>(V1)), gd / 4.0);
  const long long n2 = DecodeCount(p24), y2 = p24 & 0xffffffu;
  double best_err = 0.0;
  int best_i = 0;
  uint32_t best_w = 0;
#pragma unroll
  for (int r = 0; r < kOwn; ++r) {
    const int i = sub + L * r;
    const long long n1 = DecodeCount(lo_own[r]), n3 = DecodeCount(hi_own[r]);
    const long long c1 = n1 + n2 + n3, c2 = n1 + 3 * n2 + 5 * n3;
    const long long y1 = (lo_own[r] & 0xffffffu) + y2 + (hi_own[r] & 0xffffffu);
    DevParams q;
    const long long det = G * y1 - c1 * V1;
    if (det > 0 && num > 0) {
      q = UnbiasedRefit<G>(num, det, z1, c1, delta, mn);
    } else {
      q = CandidateParams(i, mn, mx, w);
    }
    const double pm = __dsub_rn(static_cast<double>(H2F(q.min16)), static_cast<double>(mn));
    const double qs = H2F(q.scale16), dc1 = static_cast<double>(c1), dc2 = static_cast<double>(c2);
    const double zy = __dadd_rn(static_cast<double>(y1), dc1 / 2.0);
    double err = __dmul_rn(__dmul_rn(gd, pm), pm);
    err = __dadd_rn(err, __dmul_rn(__dmul_rn(__dmul_rn(2.0, pm), qs), dc1));
    err = __dadd_rn(err, __dmul_rn(__dmul_rn(qs, qs), dc2));
    err = __dsub_rn(err, __dmul_rn(__dmul_rn(__dmul_rn(2.0, pm), delta), z1));
    err = __dsub_rn(err, __dmul_rn(__dmul_rn(__dmul_rn(2.0, qs), delta), zy));
    err = __dadd_rn(err, __dmul_rn(__dmul_rn(delta, delta), z2));
    if (isnan(err)) err = __longlong_as_double(0x7ff0000000000000ll);  // +inf
    if (r == 0 || err < best_err) {
      best_err = err;
      best_i = i;
      best_w = PackParams(q);
    }
  }
#pragma unroll
  for (int off = 1; off < L; off *= 2) {
    const double oe = __shfl_xor_sync(0xffffffffu, best_err, off);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
    const uint32_t ow = __shfl_xor_sync(0xffffffffu, best_w, off);
    if (oe < best_err || (oe == best_err && oi < best_i)) {
      best_err = oe;
      best_i = oi;
      best_w = ow;
    }
  }
  // The winner's codes, four per word: thresholds T1 = 8+i, 24, T3 = 40-i on the level bytes.
  const uint32_t k1 = static_cast<uint32_t>(120 - best_i) * 0x01010101u;  // 128 - T1
  const uint32_t k2 = 104u * 0x01010101u;                                 // 128 - 24
  const uint32_t k3 = static_cast<uint32_t>(88 + best_i) * 0x01010101u;   // 128 - T3
  constexpr uint32_t kHi = 0x80808080u;
  constexpr uint32_t kMulA = (1u << 25) | (1u << 19) | (1u << 13) | (1u << 7), kMulB = kMulA << 1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t byte[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const uint32_t W = lw[4 * h + m];
      const uint32_t s1 = W + k1, s2w = W + k2, s3 = W + k3;
      const uint32_t bit0 = (s1 ^ s2w ^ s3) & kHi, bit1 = s2w & kHi;
      byte[m] = __umulhi(bit0, kMulA) + __umulhi(bit1, kMulB);
    }
    best[h] = __byte_perm(__byte_perm(byte[0], byte[1], 0x0040), __byte_perm(byte[2], byte[3], 0x0040), 0x5410);
  }
  return UnpackParams(best_w);
}

// RangeMode::kSearch, mirroring QuantizeRowInt2 bit for bit: the same 8 candidate ranges, the
// same integer error sums (exact, so any order), the same first-smallest choice. Returns the
// chosen parameters and the lane's codes.
template <int G>
__device__ DevParams SelectRange(float (&y)[32], int tig, float mn, float mx, RangeMode mode,
                                 uint32_t bins, uint32_t (&best)[2]) {
  if (IsUnbiasedFixed(mode)) return SelectUnbiasedFixed<G>(y, FixedCandidate(mode), mn, mx, best);
  if (mode == RangeMode::kUnbiased) {
    return SelectUnbiased<G>(y, tig, mn, mx, bins, best);
  }
  const float width = __fsub_rn(mx, mn);
  DevParams best_p = RangeParams(mn, mx);
  uint32_t cand[2];
  // kSearch.
  LaneCodes(y, best_p, best);
  const float s0 = H2F(best_p.scale16);
  // Groups with scale 0 keep min-max; they still run the loop (its shuffles span the warp).
  const bool search = s0 > 0.f;
  const float unit_inv = __fmul_rn(__frcp_rn(s0), 64.0f);
  unsigned long long best_err = ~0ull;
  for (int ci = 0; ci < static_cast<int>(kRangeSearchCandidates); ++ci) {
    const float f = static_cast<float>(ci) / 32.0f;
    const DevParams q = ci == 0 ? RangeParams(mn, mx)
                                : RangeParams(__fadd_rn(mn, __fmul_rn(f, width)),
                                              __fsub_rn(mx, __fmul_rn(f, width)));
    LaneCodes(y, q, cand);
    const float minf = H2F(q.min16), sf = H2F(q.scale16);
    unsigned long long err = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const float xhat = __fadd_rn(minf, __fmul_rn(static_cast<float>(CodeAt(cand, i)), sf));
      const float e = __fmul_rn(fabsf(__fsub_rn(y[i], xhat)), unit_inv);
      const unsigned long long qe = static_cast<unsigned long long>(fminf(floorf(e), 65535.0f));
      err += qe * qe;
    }
    err = GroupSum<G>(err);
    if (search && err < best_err) {
      best_err = err;
      best_p = q;
      best[0] = cand[0];
      best[1] = cand[1];
    }
  }
  return best_p;
}

// Quantizes this lane's 32 values of a row (group = G channels spread over G/32 lanes) and
// stores the codes (8 bytes) and, from the first lane of each group, the (scale, min) pair.
// kSelect: the CTA's mode (uniform) may be search / unbiased; false compiles min-max only.
template <int G, bool kSelect>
__device__ void QuantizeStore(float (&y)[32], int tig, uint8_t* codes_row, uint8_t* params_row,
                              RangeMode mode, uint32_t bins) {
  float mn = y[0], mx = y[0];
#pragma unroll
  for (int i = 1; i < 32; ++i) {
    mn = fminf(mn, y[i]);
    mx = fmaxf(mx, y[i]);
  }
  mn = GroupMin<G>(mn);
  mx = GroupMax<G>(mx);
  mn = fminf(fmaxf(mn, -65504.0f), 65504.0f);
  mx = fminf(fmaxf(mx, -65504.0f), 65504.0f);
  uint32_t packed[2] = {0u, 0u};
  DevParams q;
  if (!kSelect || mode == RangeMode::kMinMax) {
    q = RangeParams(mn, mx);
    LaneCodes(y, q, packed);
  } else {
    q = SelectRange<G>(y, tig, mn, mx, mode, bins, packed);
  }
  *reinterpret_cast<uint2*>(codes_row + 8 * tig) = make_uint2(packed[0], packed[1]);
  const int lanes_per_group = G / 32;
  if (tig % lanes_per_group == 0) {
    const int g = tig / lanes_per_group;
    *reinterpret_cast<uint32_t*>(params_row + 4 * g) =
        static_cast<uint32_t>(q.scale16) | (static_cast<uint32_t>(q.min16) << 16);
  }
}

}  // namespace
}  // namespace oscarkv::cuda
