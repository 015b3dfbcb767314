// Canonical chained block keys (docs/FORMAT.md §3):
//   key_i = SHA-256(codec_id[16] || u32le(len(salt)) || salt || key_{i-1}[16] ||
//                   token ids of block i as u32le)[0:16],   key_{-1} = 16 zero bytes.
// Independent of process, language, and seed; a Python engine computes identical keys.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "oscarkv/kernels/codec_profile.h"

namespace oscarkv {

struct BlockKey {
  std::array<uint8_t, 16> bytes{};
  std::string Hex() const;
  static absl::StatusOr<BlockKey> FromHex(std::string_view hex);
  friend bool operator==(const BlockKey&, const BlockKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    uint64_t lo;
    __builtin_memcpy(&lo, k.bytes.data(), 8);
    return H::combine(std::move(h), lo);
  }
};

// The key of one block given the previous block's key (nullptr for the first block).
BlockKey ChainBlockKey(const CodecId& codec, std::string_view tenant_salt, const BlockKey* prev,
                       std::span<const uint32_t> block_tokens);

// Keys of every FULL block of `tokens` (a trailing partial block gets no key).
std::vector<BlockKey> ComputeBlockKeys(const CodecId& codec, std::string_view tenant_salt,
                                       std::span<const uint32_t> tokens, uint32_t page_tokens);

}  // namespace oscarkv
