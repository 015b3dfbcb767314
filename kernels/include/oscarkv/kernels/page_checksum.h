// One pass over a page's bytes: its checksum (docs/FORMAT.md §1: XXH3-64, seed 0, over header
// bytes [0, 56) then the payload) computed while the page is copied, so that copying and
// verifying a page read it from memory once instead of twice.
//
// The copy runs in chunks of kChecksumChunkBytes; each chunk is hashed right after it was
// written, while it is still in the core's L2 cache, so the hash costs no memory traffic of
// its own. The hash is taken over the DESTINATION bytes: what it vouches for is the copy
// that was made, not only its source. On CPUs with AVX-512F or AVX2, CopyPageWithChecksum folds
// each 64-byte stripe into the hash from the very registers it stores to the destination
// (kernels/src/page_checksum_fused.h): still the bytes written, with no second read at all.
//
// Thread-safety: the functions are reentrant; a PageChecksummer is one caller's state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"

namespace oscarkv {

// Copy + hash granularity: small enough to stay in L2 between the copy and the hash, large
// enough that the per-chunk calls cost nothing.
inline constexpr size_t kChecksumChunkBytes = size_t{128} << 10;

// Streaming form of ComputePageChecksum for bytes that arrive in order (a gRPC stream, a copy
// in chunks). Update() takes the page's bytes from offset 0 on, in any split; the 8 bytes of
// the header's checksum field are skipped as the format says.
class PageChecksummer {
 public:
  PageChecksummer();
  ~PageChecksummer();
  PageChecksummer(const PageChecksummer&) = delete;
  PageChecksummer& operator=(const PageChecksummer&) = delete;

  void Reset();
  // The next `bytes.size()` bytes of the page (offset() advances by that much).
  void Update(std::span<const uint8_t> bytes);
  uint64_t offset() const { return offset_; }
  // The checksum of the bytes given so far (the page's checksum once all were given).
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  uint64_t offset_ = 0;
};

// CopyPageWithChecksum for a page that arrives in pieces, in order (a page staged in chunks):
// each Copy() writes the page's next bytes into the destination and folds the bytes written
// into the checksum in the same pass (the fused loop on AVX-512F or AVX2 CPUs, else a copy and a hash
// of each kChecksumChunkBytes piece while it is in L2). The hash is of the destination bytes.
// Contract: `page` is the same whole destination page on every call; its bytes before
// offset() must not change between calls (a stripe that straddles two pieces is read back
// from there).
class PageCopyChecksummer {
 public:
  explicit PageCopyChecksummer(uint64_t page_bytes);
  ~PageCopyChecksummer();
  PageCopyChecksummer(const PageCopyChecksummer&) = delete;
  PageCopyChecksummer& operator=(const PageCopyChecksummer&) = delete;

  // Writes page[offset(), offset() + src.size()) from `src`. Requires page.size() ==
  // page_bytes and src.size() <= page_bytes - offset(); src must not overlap page.
  void Copy(std::span<uint8_t> page, std::span<const uint8_t> src);
  uint64_t offset() const { return offset_; }
  uint64_t page_bytes() const { return page_bytes_; }
  // The page checksum of the bytes written, taken by the Copy() that wrote the page's last
  // byte (so later changes to the destination cannot alter it); 0 before that.
  uint64_t Digest() const { return digest_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  const uint64_t page_bytes_;
  uint64_t offset_ = 0;
  uint64_t digest_ = 0;
};

// Copies `src` to `dst` (same size) and returns the page checksum of the bytes written, in one
// pass. dst and src must not overlap.
uint64_t CopyPageWithChecksum(std::span<uint8_t> dst, std::span<const uint8_t> src);

// The checksum field of a page's header (0 for a page shorter than its header).
uint64_t StoredPageChecksum(std::span<const uint8_t> page);

// CopyPageWithChecksum, then compares with the checksum the copy's header carries: DATA_LOSS
// naming both when they differ. The copy is made either way (the caller decides what to do
// with a page that failed).
absl::Status CopyPageVerified(std::span<uint8_t> dst, std::span<const uint8_t> src);

}  // namespace oscarkv
