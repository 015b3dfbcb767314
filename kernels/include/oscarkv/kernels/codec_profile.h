// CodecProfile: everything that determines how a page's bytes are laid out and what they mean.
// Its CodecId (a digest of every field, docs/FORMAT.md §2) tags every page and every block key,
// so pages written under different models, shapes, windows or rotations never mix.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace oscarkv {

// 16-byte digest identifying a codec profile.
struct CodecId {
  std::array<uint8_t, 16> bytes{};
  std::string Hex() const;
  static absl::StatusOr<CodecId> FromHex(std::string_view hex);
  friend bool operator==(const CodecId&, const CodecId&) = default;
};

// A 32-byte SHA-256 digest (rotation artifacts, generic content digests).
using Sha256Digest = std::array<uint8_t, 32>;
Sha256Digest Sha256(const void* data, size_t size);
std::string HexEncode(const uint8_t* data, size_t size);

enum class ScaleDtype : uint32_t { kFp16 = 1 };

struct CodecProfile {
  std::string model_id;        // e.g. "Qwen/Qwen3-8B"
  std::string model_revision;  // e.g. a commit hash or "main"
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;   // KV heads of this TP shard
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  uint32_t head_dim = 128;
  uint32_t page_tokens = 64;
  uint32_t group_size = 128;
  ScaleDtype scale_dtype = ScaleDtype::kFp16;
  uint32_t sink_tokens = 64;
  uint32_t recent_tokens = 256;
  Sha256Digest rotation_digest{};  // all zero: no rotation artifact (identity)

  // OK, or InvalidArgument naming the first unsupported field. Supported: head_dim 64/128/256;
  // group 32/64/128 dividing head_dim; page_tokens 16..256, a multiple of 16; 1..4096 layers;
  // 1..256 KV heads; tp_rank < tp_size.
  absl::Status Validate() const;

  // The canonical digest of all fields (docs/FORMAT.md §2).
  CodecId Id() const;
  // The exact bytes hashed by Id(); exposed for golden tests and other-language engines.
  std::string CanonicalBytes() const;
};

// Built-in shapes. "qwen3-8b": 36 layers, 8 KV heads, head_dim 128 (one TP shard holding all
// heads); "refmodel": ../shared/refmodel (8 layers, 2 KV heads, head_dim 128).
absl::StatusOr<CodecProfile> BuiltinProfile(std::string_view shape);

}  // namespace oscarkv
