#include "page_checksum_fused.h"

#include <cstring>

#if defined(__x86_64__)
// The library's own constants and final merge (inlined from the installed xxhash.h): the
// default secret, the initial accumulators and the 64-bit merge, so the fused loop below
// computes exactly XXH3-64.
#define XXH_STATIC_LINKING_ONLY
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics leave an "undefined" operand that -Wuninitialized reports
// inside the intrinsic headers (a false positive of those headers, not of this file).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace oscarkv::checksum_internal {

#if defined(__x86_64__)
namespace {

constexpr size_t kStripe = 64;
constexpr size_t kSecretBytes = sizeof(XXH3_kSecret);
constexpr size_t kStripesPerBlock = (kSecretBytes - kStripe) / 8;  // XXH3: 16 for the default
constexpr size_t kBlockBytes = kStripesPerBlock * kStripe;
constexpr size_t kFieldBegin = 56;  // the header's checksum field [56, 64) is not hashed
constexpr size_t kSkipped = 8;
static_assert(kStripesPerBlock == 16);
constexpr size_t StripeAt(size_t stripe) { return kStripe * stripe + kSkipped; }

}  // namespace

// AVX-512F: a stripe is one zmm register.
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
namespace {
using V = __m512i;
inline V Load(const void* p) { return _mm512_loadu_si512(p); }
inline V LoadAligned(const void* p) { return _mm512_load_si512(p); }
inline void Store(void* p, V v) { _mm512_storeu_si512(p, v); }
inline void StoreAligned(void* p, V v) { _mm512_store_si512(p, v); }
inline V Xor(V a, V b) { return _mm512_xor_si512(a, b); }
inline V Add64(V a, V b) { return _mm512_add_epi64(a, b); }
inline V MulLo32(V a, V b) { return _mm512_mul_epu32(a, b); }
inline V Shr32(V a) { return _mm512_srli_epi64(a, 32); }
inline V Shr47(V a) { return _mm512_srli_epi64(a, 47); }
inline V Shl32(V a) { return _mm512_slli_epi64(a, 32); }
inline V Swap64Pairs(V a) { return _mm512_shuffle_epi32(a, static_cast<_MM_PERM_ENUM>(0x4E)); }
inline V Set1x32(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
}  // namespace
#include "page_checksum_fused_loop.inc"
}  // namespace avx512
#pragma GCC pop_options

// AVX2: a stripe is two ymm registers (XXH3's lanes 0-3 and 4-7).
#pragma GCC push_options
#pragma GCC target("avx2")
namespace avx2 {
namespace {
struct V {
  __m256i lo, hi;
};
inline V Load(const void* p) {
  const auto* q = static_cast<const __m256i*>(p);
  return {_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)};
}
inline V LoadAligned(const void* p) {
  const auto* q = static_cast<const __m256i*>(p);
  return {_mm256_load_si256(q), _mm256_load_si256(q + 1)};
}
inline void Store(void* p, V v) {
  auto* q = static_cast<__m256i*>(p);
  _mm256_storeu_si256(q, v.lo);
  _mm256_storeu_si256(q + 1, v.hi);
}
inline void StoreAligned(void* p, V v) {
  auto* q = static_cast<__m256i*>(p);
  _mm256_store_si256(q, v.lo);
  _mm256_store_si256(q + 1, v.hi);
}
inline V Xor(V a, V b) { return {_mm256_xor_si256(a.lo, b.lo), _mm256_xor_si256(a.hi, b.hi)}; }
inline V Add64(V a, V b) { return {_mm256_add_epi64(a.lo, b.lo), _mm256_add_epi64(a.hi, b.hi)}; }
inline V MulLo32(V a, V b) { return {_mm256_mul_epu32(a.lo, b.lo), _mm256_mul_epu32(a.hi, b.hi)}; }
inline V Shr32(V a) { return {_mm256_srli_epi64(a.lo, 32), _mm256_srli_epi64(a.hi, 32)}; }
inline V Shr47(V a) { return {_mm256_srli_epi64(a.lo, 47), _mm256_srli_epi64(a.hi, 47)}; }
inline V Shl32(V a) { return {_mm256_slli_epi64(a.lo, 32), _mm256_slli_epi64(a.hi, 32)}; }
inline V Swap64Pairs(V a) {
  return {_mm256_shuffle_epi32(a.lo, 0x4E), _mm256_shuffle_epi32(a.hi, 0x4E)};
}
inline V Set1x32(uint32_t x) {
  const __m256i v = _mm256_set1_epi32(static_cast<int>(x));
  return {v, v};
}
}  // namespace
#include "page_checksum_fused_loop.inc"
}  // namespace avx2
#pragma GCC pop_options

bool FusedIsaSupported(FusedIsa isa) {
  switch (isa) {
    case FusedIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
    case FusedIsa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case FusedIsa::kNone:
      return true;
  }
  return false;
}

FusedIsa BestFusedIsa() {
  static const FusedIsa best = FusedIsaSupported(FusedIsa::kAvx512) ? FusedIsa::kAvx512
                               : FusedIsaSupported(FusedIsa::kAvx2) ? FusedIsa::kAvx2
                                                                    : FusedIsa::kNone;
  return best;
}

void FusedCopyBegin(FusedCopyState* st, size_t n, FusedIsa isa) {
  const uint64_t init[8] = XXH3_INIT_ACC;
  std::memcpy(st->acc, init, sizeof(init));
  const size_t len = n - kSkipped;  // hashed bytes
  const size_t blocks = (len - 1) / kBlockBytes;
  st->page_bytes = n;
  st->stripes = blocks * kStripesPerBlock + ((len - 1) - kBlockBytes * blocks) / kStripe;
  st->next_stripe = 0;
  st->copied = 0;
  st->isa = isa;
}

void FusedCopyNext(FusedCopyState* st, uint8_t* page, const uint8_t* src, size_t len) {
  if (st->isa == FusedIsa::kAvx512) {
    avx512::Next(st, page, src, len);
  } else {
    avx2::Next(st, page, src, len);
  }
}

uint64_t FusedCopyDigest(const FusedCopyState& st, const uint8_t* page) {
  return st.isa == FusedIsa::kAvx512 ? avx512::Digest(st, page) : avx2::Digest(st, page);
}

#else  // not x86-64: the portable copy-then-hash path in page_checksum.cc is the only one

bool FusedIsaSupported(FusedIsa isa) { return isa == FusedIsa::kNone; }
FusedIsa BestFusedIsa() { return FusedIsa::kNone; }
void FusedCopyBegin(FusedCopyState*, size_t, FusedIsa) {}
void FusedCopyNext(FusedCopyState*, uint8_t*, const uint8_t*, size_t) {}
uint64_t FusedCopyDigest(const FusedCopyState&, const uint8_t*) { return 0; }

#endif

bool FusedCopyAvailable() { return BestFusedIsa() != FusedIsa::kNone; }

uint64_t FusedCopyWithChecksum(uint8_t* dst, const uint8_t* src, size_t n) {
  FusedCopyState st;
  FusedCopyBegin(&st, n);
  FusedCopyNext(&st, dst, src, n);
  return FusedCopyDigest(st, dst);
}

}  // namespace oscarkv::checksum_internal
