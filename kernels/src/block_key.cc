#include "oscarkv/kernels/block_key.h"

#include <openssl/evp.h>

#include <cstring>

namespace oscarkv {

std::string BlockKey::Hex() const { return HexEncode(bytes.data(), bytes.size()); }

absl::StatusOr<BlockKey> BlockKey::FromHex(std::string_view hex) {
  // Reuse CodecId's strict 16-byte hex parser; the encodings are the same.
  auto id = CodecId::FromHex(hex);
  if (!id.ok()) return absl::InvalidArgumentError("block key must be 32 hex characters");
  BlockKey k;
  k.bytes = id->bytes;
  return k;
}

BlockKey ChainBlockKey(const CodecId& codec, std::string_view tenant_salt, const BlockKey* prev,
                       std::span<const uint32_t> block_tokens) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, codec.bytes.data(), codec.bytes.size());
  uint8_t len[4];
  const uint32_t n = static_cast<uint32_t>(tenant_salt.size());
  for (int i = 0; i < 4; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  EVP_DigestUpdate(ctx, len, 4);
  EVP_DigestUpdate(ctx, tenant_salt.data(), tenant_salt.size());
  static const BlockKey kZero{};
  EVP_DigestUpdate(ctx, (prev ? prev : &kZero)->bytes.data(), 16);
  // Token ids as little-endian u32; convert explicitly so big-endian hosts agree.
  uint8_t buf[4 * 256];
  size_t i = 0;
  while (i < block_tokens.size()) {
    const size_t chunk = std::min<size_t>(256, block_tokens.size() - i);
    for (size_t j = 0; j < chunk; ++j) {
      const uint32_t t = block_tokens[i + j];
      for (int b = 0; b < 4; ++b) buf[4 * j + b] = static_cast<uint8_t>(t >> (8 * b));
    }
    EVP_DigestUpdate(ctx, buf, 4 * chunk);
    i += chunk;
  }
  uint8_t digest[32];
  unsigned int out_len = 0;
  EVP_DigestFinal_ex(ctx, digest, &out_len);
  EVP_MD_CTX_free(ctx);
  BlockKey key;
  std::memcpy(key.bytes.data(), digest, 16);
  return key;
}

std::vector<BlockKey> ComputeBlockKeys(const CodecId& codec, std::string_view tenant_salt,
                                       std::span<const uint32_t> tokens, uint32_t page_tokens) {
  std::vector<BlockKey> keys;
  if (page_tokens == 0) return keys;
  const size_t blocks = tokens.size() / page_tokens;
  keys.reserve(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    keys.push_back(ChainBlockKey(codec, tenant_salt, b ? &keys.back() : nullptr,
                                 tokens.subspan(b * page_tokens, page_tokens)));
  }
  return keys;
}

}  // namespace oscarkv
