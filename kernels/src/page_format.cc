#include "oscarkv/kernels/page_format.h"

#include <xxhash.h>
#include <xxh_x86dispatch.h>  // the widest vector unit this CPU has

#include <cstring>

#include "absl/strings/str_cat.h"

namespace oscarkv {

const char* PageKindName(PageKind kind) {
  switch (kind) {
    case PageKind::kInt2:
      return "int2";
    case PageKind::kBf16:
      return "bf16";
  }
  return "unknown";
}

PageGeometry GeometryFor(const CodecProfile& p, PageKind kind) {
  return PageGeometry{p.num_layers, p.num_kv_heads, p.head_dim, p.group_size, p.page_tokens, kind};
}

uint64_t ComputePageChecksum(std::span<const uint8_t> page) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update_dispatch(state, page.data(), offsetof(PageHeader, checksum));
  XXH3_64bits_update_dispatch(state, page.data() + kPageHeaderBytes,
                              page.size() - kPageHeaderBytes);
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

namespace {

absl::StatusOr<PageHeader> ParseCommon(std::span<const uint8_t> page, bool verify_checksum) {
  if (page.size() < kPageHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated page: ", page.size(), " bytes, the header alone is 64"));
  }
  PageHeader h;
  std::memcpy(&h, page.data(), sizeof(h));  // the format is little-endian, as is every target
  if (h.magic != kPageMagic) {
    return absl::InvalidArgumentError(absl::StrCat("not an oscarkv page: bad magic 0x",
                                                   absl::Hex(h.magic, absl::kZeroPad8)));
  }
  if (h.format_version != kPageFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported page format version ",
                                                   h.format_version, " (this build reads ",
                                                   kPageFormatVersion, ")"));
  }
  if (h.kind != static_cast<uint8_t>(PageKind::kInt2) &&
      h.kind != static_cast<uint8_t>(PageKind::kBf16)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown page kind ", h.kind));
  }
  if (h.scale_dtype != static_cast<uint8_t>(ScaleDtype::kFp16)) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported scale dtype ", h.scale_dtype));
  }
  // Shape checks reuse the profile validator so the rules live in one place.
  CodecProfile shape;
  shape.model_id = "-";
  shape.num_layers = h.num_layers;
  shape.num_kv_heads = h.num_kv_heads;
  shape.head_dim = h.head_dim;
  shape.group_size = h.group_size;
  shape.page_tokens = h.page_tokens;
  if (absl::Status s = shape.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("page header: ", s.message()));
  }
  if (h.reserved0 != 0 || h.reserved1 != 0) {
    return absl::InvalidArgumentError("page header: reserved fields must be zero");
  }
  if (h.token_count > h.page_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("page header: token_count ", h.token_count,
                                                   " exceeds page_tokens ", h.page_tokens));
  }
  const PageGeometry g = GeometryFor(shape, static_cast<PageKind>(h.kind));
  if (h.payload_bytes != g.payload_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("page header: payload_bytes ", h.payload_bytes,
                                                   " does not match its shape (",
                                                   g.payload_bytes(), ")"));
  }
  if (page.size() != g.page_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        page.size() < g.page_bytes() ? "truncated page: " : "oversized page: ", page.size(),
        " bytes, expected ", g.page_bytes()));
  }
  if (verify_checksum && ComputePageChecksum(page) != h.checksum) {
    return absl::DataLossError("page checksum mismatch: the page is corrupt");
  }
  return h;
}

}  // namespace

absl::Status CheckUnusedSlotsZero(std::span<const uint8_t> page, const PageHeader& h) {
  if (h.token_count >= h.page_tokens) return absl::OkStatus();
  PageGeometry g{h.num_layers, h.num_kv_heads, h.head_dim, h.group_size, h.page_tokens,
                 static_cast<PageKind>(h.kind)};
  auto zero = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      if (page[i] != 0) return false;
    }
    return true;
  };
  const uint32_t tc = h.token_count, T = h.page_tokens;
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t head = 0; head < g.num_kv_heads; ++head) {
        const size_t seg = g.segment_offset(l, kv, head);
        const bool ok =
            g.kind == PageKind::kInt2
                ? zero(seg + g.code_row_offset(tc), seg + g.code_row_offset(T)) &&
                      zero(seg + g.scale_offset(tc, 0), seg + g.codes_bytes() + g.scales_bytes())
                : zero(seg + g.bf16_row_offset(tc), seg + g.bf16_row_offset(T));
        if (!ok) {
          return absl::InvalidArgumentError(absl::StrCat(
              "page has token_count ", tc, " but non-zero bytes in the unused token slots of ",
              "layer ", l, kv == 0 ? " K" : " V", " head ", head,
              " (FORMAT.md: slots >= token_count are zero bytes)"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PageHeader> ParsePageHeaderStandalone(std::span<const uint8_t> page,
                                                     bool verify_checksum) {
  return ParseCommon(page, verify_checksum);
}

absl::StatusOr<PageHeader> ParsePageHeader(std::span<const uint8_t> page,
                                           const CodecProfile& profile, bool verify_checksum) {
  auto h = ParseCommon(page, verify_checksum);
  if (!h.ok()) return h;
  const CodecId id = profile.Id();
  if (std::memcmp(h->codec_id, id.bytes.data(), 16) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page belongs to codec ", HexEncode(h->codec_id, 16), ", expected ", id.Hex()));
  }
  if (h->num_layers != profile.num_layers || h->num_kv_heads != profile.num_kv_heads ||
      h->head_dim != profile.head_dim || h->group_size != profile.group_size ||
      h->page_tokens != profile.page_tokens) {
    return absl::InvalidArgumentError("page shape does not match the codec profile");
  }
  return h;
}

}  // namespace oscarkv
