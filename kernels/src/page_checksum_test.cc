#include "oscarkv/kernels/page_checksum.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "oscarkv/kernels/page_format.h"
#include "page_checksum_fused.h"

namespace oscarkv {
namespace {

// Random bytes with a header whose checksum field holds the page's checksum.
std::vector<uint8_t> RandomPage(size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> page(bytes);
  for (auto& b : page) b = static_cast<uint8_t>(rng());
  const uint64_t c = ComputePageChecksum(page);
  std::memcpy(page.data() + offsetof(PageHeader, checksum), &c, sizeof(c));
  return page;
}

// Sizes around the chunk boundaries, and the real Qwen3-8B INT2 page size.
const size_t kSizes[] = {64, 65, 4096, kChecksumChunkBytes - 1, kChecksumChunkBytes,
                         kChecksumChunkBytes + 64, 3 * kChecksumChunkBytes + 7, 1327168};

TEST(PageChecksum, CopyHashesWhatItCopies) {
  for (size_t n : kSizes) {
    const auto src = RandomPage(n, static_cast<uint32_t>(n));
    std::vector<uint8_t> dst(n, 0xAB);
    EXPECT_EQ(CopyPageWithChecksum(dst, src), ComputePageChecksum(src)) << n;
    EXPECT_EQ(dst, src) << n;
    EXPECT_TRUE(CopyPageVerified(dst, src).ok()) << n;
  }
}

// Every length across several of XXH3's 1,024-byte blocks (the fused copy's block,
// tail-stripe and last-stripe edges), at unaligned source and destination addresses: the
// copy is exact and its checksum is the library's XXH3 of the page.
TEST(PageChecksum, FusedCopyMatchesTheLibraryAtEveryLength) {
  const auto base = RandomPage(4200, 11);
  for (size_t n = 1000; n <= 4200; ++n) {
    for (size_t shift : {size_t{0}, size_t{3}}) {
      std::vector<uint8_t> src(n + shift), dst(n + 5, 0xCD);
      std::copy(base.begin(), base.begin() + n, src.begin() + shift);
      const std::span<const uint8_t> s(src.data() + shift, n);
      const std::span<uint8_t> d(dst.data() + 5, n);
      ASSERT_EQ(CopyPageWithChecksum(d, s), ComputePageChecksum(s)) << n << " +" << shift;
      ASSERT_TRUE(std::equal(s.begin(), s.end(), d.begin())) << n << " +" << shift;
    }
  }
}

// Each fused loop this CPU runs (AVX-512F, AVX2; the public functions take the best one), at
// every length across several of XXH3's blocks and copied in random pieces, at unaligned
// addresses: the copy is exact and its checksum is the library's.
TEST(PageChecksum, EveryFusedIsaMatchesTheLibrary) {
  using checksum_internal::FusedIsa;
  const auto base = RandomPage(4200, 13);
  std::mt19937 rng(5);
  int ran = 0;
  for (const FusedIsa isa : {FusedIsa::kAvx512, FusedIsa::kAvx2}) {
    if (!checksum_internal::FusedIsaSupported(isa)) continue;
    ++ran;
    for (size_t n = checksum_internal::kFusedMinBytes; n <= 4200; ++n) {
      const std::span<const uint8_t> s(base.data(), n);
      std::vector<uint8_t> dst(n + 3, 0xCD);
      const std::span<uint8_t> d(dst.data() + 3, n);
      checksum_internal::FusedCopyState st;
      checksum_internal::FusedCopyBegin(&st, n, isa);
      for (size_t off = 0; off < n;) {
        const size_t len = std::min<size_t>(n - off, n % 3 == 0 ? n : 1 + rng() % 300);
        checksum_internal::FusedCopyNext(&st, d.data(), s.data() + off, len);
        off += len;
      }
      ASSERT_EQ(checksum_internal::FusedCopyDigest(st, d.data()), ComputePageChecksum(s))
          << static_cast<int>(isa) << " n=" << n;
      ASSERT_TRUE(std::equal(s.begin(), s.end(), d.begin())) << static_cast<int>(isa) << " n=" << n;
    }
  }
  if (ran == 0) GTEST_SKIP() << "this CPU runs neither AVX-512F nor AVX2";
}

TEST(PageChecksum, StreamingAnySplitMatches) {
  std::mt19937 rng(7);
  for (size_t n : kSizes) {
    const auto page = RandomPage(n, static_cast<uint32_t>(n) + 1);
    for (int trial = 0; trial < 20; ++trial) {
      PageChecksummer h;
      size_t off = 0;
      while (off < n) {
        // Small pieces near the header (so splits land inside the checksum field), larger after.
        const size_t max = off < 128 ? 9 : 200000;
        const size_t len = std::min<size_t>(n - off, 1 + rng() % max);
        h.Update(std::span<const uint8_t>(page).subspan(off, len));
        off += len;
      }
      EXPECT_EQ(h.offset(), n);
      EXPECT_EQ(h.Digest(), ComputePageChecksum(page)) << n << " trial " << trial;
    }
  }
}

// A page copied in pieces of any split (splits inside the header's checksum field, inside one
// stripe, a byte at a time near the end, 1 MiB chunks) is copied exactly and
// hashed to the library's checksum, at unaligned addresses, on both the fused and the portable
// path (pages under kFusedMinBytes take the portable one).
TEST(PageChecksum, CopyInPiecesAnySplitMatches) {
  std::mt19937 rng(9);
  std::vector<size_t> sizes(std::begin(kSizes), std::end(kSizes));
  for (size_t n = 1000; n <= 2200; n += 37) sizes.push_back(n);
  for (size_t n : sizes) {
    const auto page = RandomPage(n, static_cast<uint32_t>(n) + 2);
    for (int trial = 0; trial < 12; ++trial) {
      std::vector<uint8_t> dst(n + 3, 0xEE);
      const std::span<uint8_t> d(dst.data() + 3, n);
      PageCopyChecksummer h(n);
      size_t off = 0;
      while (off < n) {
        size_t len;
        if (trial == 0) {
          len = size_t{1} << 20;  // the staging chunk
        } else if (trial == 1) {
          len = n - off > 200 ? 1 + rng() % 97 : 1;  // within stripes, bytes at the end
        } else {
          const size_t max = off < 128 ? 9 : 1 + rng() % 200000;
          len = 1 + rng() % max;
        }
        len = std::min(len, n - off);
        h.Copy(d, std::span<const uint8_t>(page).subspan(off, len));
        off += len;
        ASSERT_EQ(h.offset(), off);
      }
      ASSERT_TRUE(std::equal(page.begin(), page.end(), d.begin())) << n << " trial " << trial;
      ASSERT_EQ(h.Digest(), ComputePageChecksum(page)) << n << " trial " << trial;
    }
  }
}

TEST(PageChecksum, AnyCorruptByteIsDataLoss) {
  const size_t n = 3 * kChecksumChunkBytes + 100;
  const auto good = RandomPage(n, 3);
  // A byte of the header, of the checksum field itself, of each chunk, and the last byte.
  for (size_t at : {size_t{0}, size_t{55}, size_t{56}, size_t{63}, size_t{64},
                    kChecksumChunkBytes + 5, 2 * kChecksumChunkBytes, n - 1}) {
    auto bad = good;
    bad[at] ^= 0x10;
    std::vector<uint8_t> dst(n);
    const absl::Status s = CopyPageVerified(dst, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "byte " << at << ": " << s;
    EXPECT_EQ(dst, bad) << "the copy is made either way";
  }
}

TEST(PageChecksum, SizeMismatchAndTruncationAreRefused) {
  const auto src = RandomPage(4096, 4);
  std::vector<uint8_t> small(4095);
  EXPECT_EQ(CopyPageVerified(small, src).code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> tiny_src(10), tiny_dst(10);
  EXPECT_EQ(CopyPageVerified(tiny_dst, tiny_src).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StoredPageChecksum(tiny_src), 0u);
}

}  // namespace
}  // namespace oscarkv
