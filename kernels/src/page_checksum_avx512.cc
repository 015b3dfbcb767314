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

}  // namespace

bool FusedCopyAvailable() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

// The hashed input is the page without its checksum field: logical byte i is physical byte i
// for i < 56 and physical i + 8 after. Logical stripe 0 straddles the field (built in a
// buffer from the copied header); logical stripe k >= 1 is physical [64k + 8, 64k + 72).
__attribute__((target("avx512f"))) uint64_t FusedCopyWithChecksum(uint8_t* dst,
                                                                   const uint8_t* src,
                                                                   size_t n) {
  const uint8_t* secret = XXH3_kSecret;
  const size_t len = n - kSkipped;  // hashed bytes
  alignas(64) uint64_t init[8] = XXH3_INIT_ACC;
  __m512i acc = _mm512_load_si512(init);
  std::memcpy(dst, src, kStripe + kSkipped);
  alignas(64) uint8_t first[kStripe];
  std::memcpy(first, dst, kFieldBegin);
  std::memcpy(first + kFieldBegin, dst + kStripe, kSkipped);
  // XXH3's long loop: full blocks, each ending in a scramble; then the stripes of the last,
  // partial block; then the input's last 64 bytes with their own key.
  const size_t blocks = (len - 1) / kBlockBytes;
  const size_t tail_stripes = ((len - 1) - kBlockBytes * blocks) / kStripe;
  size_t k = 0;  // logical stripe
  auto stripe_at = [](size_t stripe) { return kStripe * stripe + kSkipped; };
  for (size_t b = 0; b <= blocks; ++b) {
    const size_t stripes = b < blocks ? kStripesPerBlock : tail_stripes;
    for (size_t s = 0; s < stripes; ++s, ++k) {
      __m512i data;
      if (k == 0) {
        data = _mm512_load_si512(first);
      } else {
        data = _mm512_loadu_si512(src + stripe_at(k));
        _mm512_storeu_si512(dst + stripe_at(k), data);
      }
      acc = Accumulate(acc, data, secret + 8 * s);
    }
    if (b < blocks) acc = Scramble(acc, secret + kSecretBytes - kStripe);
  }
  const size_t copied = k == 0 ? kStripe + kSkipped : stripe_at(k);
  std::memcpy(dst + copied, src + copied, n - copied);
  // The last stripe (logical [len - 64, len) = physical [n - 64, n)), read from the copy.
  acc = Accumulate(acc, _mm512_loadu_si512(dst + n - kStripe),
                   secret + kSecretBytes - kStripe - XXH_SECRET_LASTACC_START);
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, acc);
  return XXH3_mergeAccs(lanes, secret + XXH_SECRET_MERGEACCS_START,
                        static_cast<uint64_t>(len) * XXH_PRIME64_1);
}

#else  // not x86-64: the portable copy-then-hash path in page_checksum.cc is the only one

bool FusedCopyAvailable() { return false; }
uint64_t FusedCopyWithChecksum(uint8_t*, const uint8_t*, size_t) { return 0; }

#endif

}  // namespace oscarkv::checksum_internal
