#include "oscarkv/kernels/page_checksum.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t's definition, for a state held by value
#include <xxhash.h>
#include <xxh_x86dispatch.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "oscarkv/kernels/page_format.h"
#include "page_checksum_fused.h"

namespace oscarkv {
namespace {

constexpr size_t kChecksumFieldBegin = offsetof(PageHeader, checksum);
constexpr size_t kChecksumFieldEnd = kChecksumFieldBegin + sizeof(uint64_t);
static_assert(kChecksumFieldEnd == kPageHeaderBytes, "the checksum ends the header");

}  // namespace

struct PageChecksummer::State {
  XXH3_state_t xxh;
};

PageChecksummer::PageChecksummer() : state_(std::make_unique<State>()) { Reset(); }
PageChecksummer::~PageChecksummer() = default;

void PageChecksummer::Reset() {
  XXH3_64bits_reset(&state_->xxh);
  offset_ = 0;
}

void PageChecksummer::Update(std::span<const uint8_t> bytes) {
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  // Skip whatever part of [56, 64) -- the checksum field itself -- these bytes cover.
  if (offset_ < kChecksumFieldEnd && n > 0) {
    if (offset_ < kChecksumFieldBegin) {
      const size_t head = std::min<size_t>(n, kChecksumFieldBegin - offset_);
      XXH3_64bits_update_dispatch(&state_->xxh, p, head);
      p += head;
      n -= head;
      offset_ += head;
    }
    const size_t skip = std::min<size_t>(n, kChecksumFieldEnd - offset_);
    p += skip;
    n -= skip;
    offset_ += skip;
  }
  if (n > 0) XXH3_64bits_update_dispatch(&state_->xxh, p, n);
  offset_ += n;
}

uint64_t PageChecksummer::Digest() const { return XXH3_64bits_digest(&state_->xxh); }

uint64_t CopyPageWithChecksum(std::span<uint8_t> dst, std::span<const uint8_t> src) {
  const size_t n = std::min(dst.size(), src.size());
  if (n >= checksum_internal::kFusedMinBytes && checksum_internal::FusedCopyAvailable()) {
    return checksum_internal::FusedCopyWithChecksum(dst.data(), src.data(), n);
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  const size_t head = std::min(n, kPageHeaderBytes);
  std::memcpy(dst.data(), src.data(), head);
  XXH3_64bits_update_dispatch(&state, dst.data(), std::min(head, kChecksumFieldBegin));
  for (size_t off = head; off < n; off += kChecksumChunkBytes) {
    const size_t len = std::min(kChecksumChunkBytes, n - off);
    std::memcpy(dst.data() + off, src.data() + off, len);
    XXH3_64bits_update_dispatch(&state, dst.data() + off, len);  // still in L2
  }
  return XXH3_64bits_digest(&state);
}

// Either the fused loop's state or, where it does not run, the streaming hash of the copy.
struct PageCopyChecksummer::State {
  bool fused = false;
  checksum_internal::FusedCopyState fused_state;
  PageChecksummer hash;
};

PageCopyChecksummer::PageCopyChecksummer(uint64_t page_bytes)
    : state_(std::make_unique<State>()), page_bytes_(page_bytes) {
  state_->fused =
      page_bytes >= checksum_internal::kFusedMinBytes && checksum_internal::FusedCopyAvailable();
  if (state_->fused) checksum_internal::FusedCopyBegin(&state_->fused_state, page_bytes);
}

PageCopyChecksummer::~PageCopyChecksummer() = default;

void PageCopyChecksummer::Copy(std::span<uint8_t> page, std::span<const uint8_t> src) {
  const size_t n = std::min<size_t>(src.size(), page_bytes_ - offset_);
  uint8_t* dst = page.data() + offset_;
  if (state_->fused) {
    checksum_internal::FusedCopyNext(&state_->fused_state, page.data(), src.data(), n);
  } else {
    for (size_t done = 0; done < n;) {
      const size_t len = std::min(kChecksumChunkBytes, n - done);
      std::memcpy(dst + done, src.data() + done, len);
      state_->hash.Update(std::span<const uint8_t>(dst + done, len));  // still in L2
      done += len;
    }
  }
  offset_ += n;
  if (n > 0 && offset_ == page_bytes_) {
    digest_ = state_->fused ? checksum_internal::FusedCopyDigest(state_->fused_state, page.data())
                            : state_->hash.Digest();
  }
}

uint64_t StoredPageChecksum(std::span<const uint8_t> page) {
  if (page.size() < kPageHeaderBytes) return 0;
  uint64_t c;
  std::memcpy(&c, page.data() + kChecksumFieldBegin, sizeof(c));
  return c;
}

absl::Status CopyPageVerified(std::span<uint8_t> dst, std::span<const uint8_t> src) {
  if (dst.size() != src.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("copying a ", src.size(), "-byte page into ", dst.size(), " bytes"));
  }
  if (src.size() < kPageHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated page: ", src.size(), " bytes, the header alone is 64"));
  }
  const uint64_t got = CopyPageWithChecksum(dst, src);
  const uint64_t want = StoredPageChecksum(dst);
  if (got != want) {
    return absl::DataLossError(absl::StrCat("page checksum mismatch: the page is corrupt (header ",
                                            absl::Hex(want, absl::kZeroPad16), ", bytes ",
                                            absl::Hex(got, absl::kZeroPad16), ")"));
  }
  return absl::OkStatus();
}

}  // namespace oscarkv
