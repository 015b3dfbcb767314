#include "page_checksum_avx512.h"

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

// One XXH3 stripe: acc += swap32(data) + lo32(data ^ key) * hi32(data ^ key), per 64-bit lane.
__attribute__((target("avx512f"))) inline __m512i Accumulate(__m512i acc, __m512i data,
                                                              const uint8_t* key) {
  const __m512i keyed = _mm512_xor_si512(data, _mm512_loadu_si512(key));
  const __m512i product = _mm512_mul_epu32(keyed, _mm512_srli_epi64(keyed, 32));
  const __m512i swapped = _mm512_shuffle_epi32(data, static_cast<_MM_PERM_ENUM>(0x4E));
  return _mm512_add_epi64(product, _mm512_add_epi64(acc, swapped));
}

// XXH3's end-of-block scramble: acc = (acc ^ (acc >> 47) ^ key) * PRIME32_1, per lane.
__attribute__((target("avx512f"))) inline __m512i Scramble(__m512i acc, const uint8_t* key) {
  __m512i a = _mm512_xor_si512(acc, _mm512_srli_epi64(acc, 47));
  a = _mm512_xor_si512(a, _mm512_loadu_si512(key));
  const __m512i prime = _mm512_set1_epi32(static_cast<int>(XXH_PRIME32_1));
  const __m512i lo = _mm512_mul_epu32(a, prime);
  const __m512i hi = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), prime);
  return _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32));
}

// Logical stripe k into the accumulators, and the scramble that ends each block of 16.
__attribute__((target("avx512f"))) inline __m512i Fold(__m512i acc, __m512i data, size_t k) {
  acc = Accumulate(acc, data, XXH3_kSecret + 8 * (k % kStripesPerBlock));
  if (k % kStripesPerBlock == kStripesPerBlock - 1) {
    acc = Scramble(acc, XXH3_kSecret + kSecretBytes - kStripe);
  }
  return acc;
}

}  // namespace

bool FusedCopyAvailable() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

// The hashed input is the page without its checksum field: logical byte i is physical byte i
// for i < 56 and physical i + 8 after. Logical stripe 0 straddles the field (built in a
// buffer from the copied header); logical stripe k >= 1 is physical [64k + 8, 64k + 72).
// XXH3's long loop folds stripes 0 .. stripes-1 (full blocks of 16, each ending in a scramble,
// then the stripes of the last, partial block); the input's last 64 bytes follow with their
// own key (FusedCopyDigest).
__attribute__((target("avx512f"))) void FusedCopyBegin(FusedCopyState* st, size_t n) {
  const uint64_t init[8] = XXH3_INIT_ACC;
  std::memcpy(st->acc, init, sizeof(init));
  const size_t len = n - kSkipped;  // hashed bytes
  const size_t blocks = (len - 1) / kBlockBytes;
  st->page_bytes = n;
  st->stripes = blocks * kStripesPerBlock + ((len - 1) - kBlockBytes * blocks) / kStripe;
  st->next_stripe = 0;
  st->copied = 0;
}

__attribute__((target("avx512f"))) void FusedCopyNext(FusedCopyState* st, uint8_t* page,
                                                      const uint8_t* src, size_t len) {
  const size_t begin = st->copied;
  const size_t end = begin + len;
  const uint8_t* from = src - begin;  // from[i] is page byte i, for i in [begin, end)
  size_t cursor = begin;              // page[begin, cursor) is written
  size_t k = st->next_stripe;
  __m512i acc = _mm512_load_si512(st->acc);
  auto stripe_at = [](size_t stripe) { return kStripe * stripe + kSkipped; };
  // The header's stripe, or one that began in the previous piece: complete it in the copy,
  // then read it back from there.
  if (k < st->stripes && stripe_at(k) + kStripe <= end && (k == 0 || stripe_at(k) < begin)) {
    const size_t stripe_end = k == 0 ? kStripe + kSkipped : stripe_at(k) + kStripe;
    std::memcpy(page + cursor, from + cursor, stripe_end - cursor);
    cursor = stripe_end;
    if (k == 0) {
      alignas(64) uint8_t first[kStripe];
      std::memcpy(first, page, kFieldBegin);
      std::memcpy(first + kFieldBegin, page + kStripe, kSkipped);
      acc = Fold(acc, _mm512_load_si512(first), k);
    } else {
      acc = Fold(acc, _mm512_loadu_si512(page + stripe_at(k)), k);
    }
    ++k;
  }
  // Every stripe wholly inside this piece (each starts where the last ended): loaded once,
  // stored, and folded from the same register.
  while (k < st->stripes && k > 0 && stripe_at(k) + kStripe <= end) {
    const __m512i data = _mm512_loadu_si512(from + stripe_at(k));
    _mm512_storeu_si512(page + stripe_at(k), data);
    cursor = stripe_at(k) + kStripe;
    acc = Fold(acc, data, k);
    ++k;
  }
  if (end > cursor) std::memcpy(page + cursor, from + cursor, end - cursor);
  _mm512_store_si512(st->acc, acc);
  st->next_stripe = k;
  st->copied = end;
}

__attribute__((target("avx512f"))) uint64_t FusedCopyDigest(const FusedCopyState& st,
                                                            const uint8_t* page) {
  const uint8_t* secret = XXH3_kSecret;
  const size_t n = st.page_bytes;
  // The last stripe (logical [len - 64, len) = physical [n - 64, n)), read from the copy.
  __m512i acc = _mm512_load_si512(st.acc);
  acc = Accumulate(acc, _mm512_loadu_si512(page + n - kStripe),
                   secret + kSecretBytes - kStripe - XXH_SECRET_LASTACC_START);
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, acc);
  return XXH3_mergeAccs(lanes, secret + XXH_SECRET_MERGEACCS_START,
                        static_cast<uint64_t>(n - kSkipped) * XXH_PRIME64_1);
}

uint64_t FusedCopyWithChecksum(uint8_t* dst, const uint8_t* src, size_t n) {
  FusedCopyState st;
  FusedCopyBegin(&st, n);
  FusedCopyNext(&st, dst, src, n);
  return FusedCopyDigest(st, dst);
}

#else  // not x86-64: the portable copy-then-hash path in page_checksum.cc is the only one

bool FusedCopyAvailable() { return false; }
uint64_t FusedCopyWithChecksum(uint8_t*, const uint8_t*, size_t) { return 0; }
void FusedCopyBegin(FusedCopyState*, size_t) {}
void FusedCopyNext(FusedCopyState*, uint8_t*, const uint8_t*, size_t) {}
uint64_t FusedCopyDigest(const FusedCopyState&, const uint8_t*) { return 0; }

#endif

}  // namespace oscarkv::checksum_internal
