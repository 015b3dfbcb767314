// The page format (docs/FORMAT.md §1): a 64-byte header, then one segment per
// (layer, K|V, KV head), each a contiguous run of packed 2-bit codes followed by the
// (fp16 scale, fp16 min) pairs of every (token, group) -- or, for BF16 pages, bf16 rows.
// PageGeometry is a POD with __host__ __device__ offset math so kernels and the CPU reference
// compute the same offsets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/hd.h"

namespace oscarkv {

inline constexpr uint32_t kPageMagic = 0x50564B4F;  // "OKVP" little-endian
inline constexpr uint16_t kPageFormatVersion = 1;
inline constexpr size_t kPageHeaderBytes = 64;

enum class PageKind : uint8_t { kInt2 = 1, kBf16 = 2 };
const char* PageKindName(PageKind kind);

// On-disk/wire header, little-endian, 64 bytes. Checksum = XXH3-64 (seed 0) over header bytes
// [0, 56) followed by the payload.
struct PageHeader {
  uint32_t magic;
  uint16_t format_version;
  uint8_t kind;
  uint8_t scale_dtype;
  uint8_t codec_id[16];
  uint16_t num_layers;
  uint16_t num_kv_heads;
  uint16_t head_dim;
  uint16_t group_size;
  uint16_t page_tokens;
  uint16_t token_count;
  uint32_t reserved0;
  uint64_t payload_bytes;
  uint64_t reserved1;
  uint64_t checksum;
};
static_assert(sizeof(PageHeader) == kPageHeaderBytes, "PageHeader must be 64 bytes");

struct PageGeometry {
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t group_size;
  uint32_t page_tokens;
  PageKind kind;

  OSCARKV_HD uint32_t groups_per_row() const { return head_dim / group_size; }
  // Bytes of packed codes of one token row (4 codes per byte).
  OSCARKV_HD uint32_t code_row_bytes() const { return head_dim / 4; }
  OSCARKV_HD size_t codes_bytes() const { return size_t{page_tokens} * code_row_bytes(); }
  OSCARKV_HD size_t scales_bytes() const { return size_t{page_tokens} * groups_per_row() * 4; }
  OSCARKV_HD size_t segment_bytes() const {
    return kind == PageKind::kInt2 ? codes_bytes() + scales_bytes()
                                   : size_t{page_tokens} * head_dim * 2;
  }
  OSCARKV_HD size_t num_segments() const { return size_t{num_layers} * 2 * num_kv_heads; }
  OSCARKV_HD size_t payload_bytes() const { return num_segments() * segment_bytes(); }
  OSCARKV_HD size_t page_bytes() const { return kPageHeaderBytes + payload_bytes(); }
  // Byte offset (from the page start) of the segment of (layer, kv: 0=K 1=V, head).
  OSCARKV_HD size_t segment_offset(uint32_t layer, uint32_t kv, uint32_t head) const {
    return kPageHeaderBytes + ((size_t{layer} * 2 + kv) * num_kv_heads + head) * segment_bytes();
  }
  // Within a segment: packed codes of token t; (scale, min) fp16 pair of (t, group g).
  OSCARKV_HD size_t code_row_offset(uint32_t t) const { return size_t{t} * code_row_bytes(); }
  OSCARKV_HD size_t scale_offset(uint32_t t, uint32_t g) const {
    return codes_bytes() + (size_t{t} * groups_per_row() + g) * 4;
  }
  // Within a BF16 segment: row of token t.
  OSCARKV_HD size_t bf16_row_offset(uint32_t t) const { return size_t{t} * head_dim * 2; }
};

PageGeometry GeometryFor(const CodecProfile& profile, PageKind kind);

// Reads and checks a page header: size, magic, version, kind, shape against `profile`, codec id,
// payload size, and (if verify_checksum) the checksum. Errors are InvalidArgument / DataLoss
// with a message naming what is wrong.
absl::StatusOr<PageHeader> ParsePageHeader(std::span<const uint8_t> page,
                                           const CodecProfile& profile,
                                           bool verify_checksum = true);

// Profile-free check (the daemon's view): magic, version, kind, supported shape, payload size
// consistent with the header's own geometry and with page.size(), and the checksum.
absl::StatusOr<PageHeader> ParsePageHeaderStandalone(std::span<const uint8_t> page,
                                                     bool verify_checksum = true);

// FORMAT.md §1.1: the token slots at and past header.token_count hold zero bytes (codes and
// (scale, min) pairs of an INT2 page, rows of a BF16 page). INVALID_ARGUMENT naming the first
// non-zero slot. `page` must already have passed ParsePageHeader*; reads only the unused slots.
absl::Status CheckUnusedSlotsZero(std::span<const uint8_t> page, const PageHeader& header);

// Computes the checksum of a page whose header fields (other than checksum) are filled in.
uint64_t ComputePageChecksum(std::span<const uint8_t> page);

}  // namespace oscarkv
