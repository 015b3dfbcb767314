// Whole-page writer and reader: all layers, K and V, all KV heads of one block of tokens.
//
// Pages always hold ROTATED rows (BF16 pages too): keys by R_K, values by R_V, so attention
// rotates the query once and never inverse-rotates the cache. INT2 rows are clipped at their
// (layer, K|V, head) clip ratio before quantization; BF16 rows are not clipped.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/kernels/rotation.h"

namespace oscarkv {

// A read-only view of dense fp32 K/V for a sequence:
// element (layer, kv, token, head, i) at data[(((layer*2 + kv)*seq_tokens + token)*kv_heads +
// head)*head_dim + i].
struct KVSequenceView {
  const float* data = nullptr;
  uint32_t layers = 0, kv_heads = 0, head_dim = 0, seq_tokens = 0;
  const float* row(uint32_t layer, uint32_t kv, uint32_t token, uint32_t head) const {
    return data + (((size_t{layer} * 2 + kv) * seq_tokens + token) * kv_heads + head) * head_dim;
  }
};

// Encodes tokens [first_token, first_token + token_count) of `kv` into `out`, which must be
// exactly GeometryFor(profile, kind).page_bytes() long. Rows are rotated by `rotations` (which
// must match the profile's shape); pass nullptr when the rows are already rotated (then INT2
// rows are not clipped). Unused token slots are zero-filled so equal inputs give equal bytes.
absl::Status EncodePage(const CodecProfile& profile, const RotationSet* rotations, PageKind kind,
                        const KVSequenceView& kv, uint32_t first_token, uint32_t token_count,
                        std::span<uint8_t> out);
absl::StatusOr<std::vector<uint8_t>> EncodePage(const CodecProfile& profile,
                                                const RotationSet* rotations, PageKind kind,
                                                const KVSequenceView& kv, uint32_t first_token,
                                                uint32_t token_count);

// Decoded page content: rotated-space fp32 rows [layers][2][token_count][kv_heads][head_dim].
struct DecodedPage {
  PageKind kind = PageKind::kInt2;
  uint32_t token_count = 0;
  std::vector<float> rows;
  KVSequenceView view(const CodecProfile& p) const {
    return {rows.data(), p.num_layers, p.num_kv_heads, p.head_dim, token_count};
  }
};

// Validates the header against `profile` (and the checksum), then dequantizes.
absl::StatusOr<DecodedPage> DecodePage(const CodecProfile& profile, std::span<const uint8_t> page);

}  // namespace oscarkv
