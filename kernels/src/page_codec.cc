#include "oscarkv/kernels/page_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/quantize.h"

namespace oscarkv {
namespace {

absl::Status CheckInputs(const CodecProfile& p, const RotationSet* rot, const KVSequenceView& kv,
                         uint32_t first_token, uint32_t token_count) {
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  if (kv.data == nullptr || kv.layers != p.num_layers || kv.kv_heads != p.num_kv_heads ||
      kv.head_dim != p.head_dim) {
    return absl::InvalidArgumentError("K/V view shape does not match the codec profile");
  }
  if (token_count > p.page_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_count ", token_count, " exceeds page_tokens ", p.page_tokens));
  }
  if (uint64_t{first_token} + token_count > kv.seq_tokens) {
    return absl::OutOfRangeError("page tokens run past the end of the sequence");
  }
  if (rot != nullptr && (rot->layers() != p.num_layers || rot->kv_heads() != p.num_kv_heads ||
                         rot->head_dim() != p.head_dim)) {
    return absl::InvalidArgumentError("rotation set shape does not match the codec profile");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EncodePage(const CodecProfile& p, const RotationSet* rot, PageKind kind,
                        const KVSequenceView& kv, uint32_t first_token, uint32_t token_count,
                        std::span<uint8_t> out) {
  if (absl::Status s = CheckInputs(p, rot, kv, first_token, token_count); !s.ok()) return s;
  const PageGeometry g = GeometryFor(p, kind);
  if (out.size() != g.page_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("output buffer is ", out.size(),
                                                   " bytes, a page is ", g.page_bytes()));
  }
  std::memset(out.data(), 0, out.size());
  const uint32_t d = p.head_dim;
  std::vector<float> row(d);
  for (uint32_t l = 0; l < p.num_layers; ++l) {
    for (uint32_t kvi = 0; kvi < 2; ++kvi) {
      for (uint32_t h = 0; h < p.num_kv_heads; ++h) {
        uint8_t* seg = out.data() + g.segment_offset(l, kvi, h);
        const float* r = rot ? rot->matrix(l, static_cast<KV>(kvi), h) : nullptr;
        const float clip = rot ? rot->clip(l, static_cast<KV>(kvi), h) : 1.0f;
        const RangeMode mode = rot ? rot->range_mode(l, static_cast<KV>(kvi), h) : RangeMode::kMinMax;
        for (uint32_t t = 0; t < token_count; ++t) {
          const float* src = kv.row(l, kvi, first_token + t, h);
          if (r) {
            RotateRow(src, r, d, row.data());
          } else {
            std::memcpy(row.data(), src, d * sizeof(float));
          }
          if (kind == PageKind::kBf16) {
            uint16_t* dst = reinterpret_cast<uint16_t*>(seg + g.bf16_row_offset(t));
            for (uint32_t i = 0; i < d; ++i) dst[i] = FloatToBf16(row[i]);
          } else {
            ClipRowAtQuantile(row, clip);
            QuantizeRowInt2(row.data(), d, p.group_size, mode, seg + g.code_row_offset(t),
                            reinterpret_cast<uint16_t*>(seg + g.scale_offset(t, 0)));
          }
        }
      }
    }
  }
  PageHeader hdr{};
  hdr.magic = kPageMagic;
  hdr.format_version = kPageFormatVersion;
  hdr.kind = static_cast<uint8_t>(kind);
  hdr.scale_dtype = static_cast<uint8_t>(p.scale_dtype);
  const CodecId id = p.Id();
  std::memcpy(hdr.codec_id, id.bytes.data(), 16);
  hdr.num_layers = static_cast<uint16_t>(p.num_layers);
  hdr.num_kv_heads = static_cast<uint16_t>(p.num_kv_heads);
  hdr.head_dim = static_cast<uint16_t>(p.head_dim);
  hdr.group_size = static_cast<uint16_t>(p.group_size);
  hdr.page_tokens = static_cast<uint16_t>(p.page_tokens);
  hdr.token_count = static_cast<uint16_t>(token_count);
  hdr.payload_bytes = g.payload_bytes();
  std::memcpy(out.data(), &hdr, sizeof(hdr));
  hdr.checksum = ComputePageChecksum(out);
  std::memcpy(out.data(), &hdr, sizeof(hdr));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> EncodePage(const CodecProfile& p, const RotationSet* rot,
                                                PageKind kind, const KVSequenceView& kv,
                                                uint32_t first_token, uint32_t token_count) {
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  std::vector<uint8_t> out(GeometryFor(p, kind).page_bytes());
  if (absl::Status s = EncodePage(p, rot, kind, kv, first_token, token_count, out); !s.ok()) {
    return s;
  }
  return out;
}

absl::StatusOr<DecodedPage> DecodePage(const CodecProfile& p, std::span<const uint8_t> page) {
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  auto hdr = ParsePageHeader(page, p);
  if (!hdr.ok()) return hdr.status();
  DecodedPage dp;
  dp.kind = static_cast<PageKind>(hdr->kind);
  dp.token_count = hdr->token_count;
  const PageGeometry g = GeometryFor(p, dp.kind);
  const uint32_t d = p.head_dim, n = dp.token_count;
  dp.rows.assign(size_t{p.num_layers} * 2 * n * p.num_kv_heads * d, 0.0f);
  for (uint32_t l = 0; l < p.num_layers; ++l) {
    for (uint32_t kvi = 0; kvi < 2; ++kvi) {
      for (uint32_t h = 0; h < p.num_kv_heads; ++h) {
        const uint8_t* seg = page.data() + g.segment_offset(l, kvi, h);
        for (uint32_t t = 0; t < n; ++t) {
          float* dst = dp.rows.data() + (((size_t{l} * 2 + kvi) * n + t) * p.num_kv_heads + h) * d;
          if (dp.kind == PageKind::kBf16) {
            uint16_t src[256];
            std::memcpy(src, seg + g.bf16_row_offset(t), d * 2);
            for (uint32_t i = 0; i < d; ++i) dst[i] = Bf16ToFloat(src[i]);
          } else {
            uint16_t sm[2 * 8];
            std::memcpy(sm, seg + g.scale_offset(t, 0), g.groups_per_row() * 4);
            DequantizeRowInt2(seg + g.code_row_offset(t), sm, d, p.group_size, dst);
          }
        }
      }
    }
  }
  return dp;
}

}  // namespace oscarkv
