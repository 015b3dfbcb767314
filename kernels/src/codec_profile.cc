#include "oscarkv/kernels/codec_profile.h"

#include <openssl/evp.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace oscarkv {
namespace {

void AppendU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void AppendString(std::string* out, std::string_view s) {
  AppendU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}

int HexNibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

template <size_t N>
absl::StatusOr<std::array<uint8_t, N>> DecodeHex(std::string_view hex, const char* what) {
  if (hex.size() != 2 * N) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be ", 2 * N, " hex characters, got ", hex.size()));
  }
  std::array<uint8_t, N> out{};
  for (size_t i = 0; i < N; ++i) {
    const int hi = HexNibble(hex[2 * i]), lo = HexNibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return absl::InvalidArgumentError(absl::StrCat(what, " is not hex"));
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return out;
}

bool IsPowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

Sha256Digest Sha256(const void* data, size_t size) {
  Sha256Digest out{};
  unsigned int len = 0;
  EVP_Digest(data, size, out.data(), &len, EVP_sha256(), nullptr);
  return out;
}

std::string HexEncode(const uint8_t* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * size, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 15];
  }
  return out;
}

std::string CodecId::Hex() const { return HexEncode(bytes.data(), bytes.size()); }

absl::StatusOr<CodecId> CodecId::FromHex(std::string_view hex) {
  auto b = DecodeHex<16>(hex, "codec id");
  if (!b.ok()) return b.status();
  CodecId id;
  id.bytes = *b;
  return id;
}

absl::Status CodecProfile::Validate() const {
  if (num_layers < 1 || num_layers > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("num_layers must be 1..4096, got ", num_layers));
  }
  if (num_kv_heads < 1 || num_kv_heads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads must be 1..256, got ", num_kv_heads));
  }
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported head_dim ", head_dim, " (supported: 64, 128, 256)"));
  }
  if ((group_size != 32 && group_size != 64 && group_size != 128) || group_size > head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported group_size ", group_size, " (supported: 32, 64, 128, at most head_dim)"));
  }
  if (page_tokens < 16 || page_tokens > 256 || page_tokens % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported page_tokens ", page_tokens, " (supported: 16..256, a multiple of 16)"));
  }
  if (tp_size < 1 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_rank ", tp_rank, " must be below tp_size ", tp_size));
  }
  if (scale_dtype != ScaleDtype::kFp16) {
    return absl::InvalidArgumentError("unsupported scale dtype (supported: fp16)");
  }
  if (model_id.empty()) return absl::InvalidArgumentError("model_id must not be empty");
  if (!IsPowerOfTwo(head_dim)) return absl::InvalidArgumentError("head_dim must be a power of two");
  return absl::OkStatus();
}

std::string CodecProfile::CanonicalBytes() const {
  std::string out = "OSCARKV-CODEC-V1";
  AppendString(&out, model_id);
  AppendString(&out, model_revision);
  for (uint32_t v : {num_layers, num_kv_heads, tp_rank, tp_size, head_dim, page_tokens, group_size,
                     static_cast<uint32_t>(scale_dtype), sink_tokens, recent_tokens}) {
    AppendU32(&out, v);
  }
  out.append(reinterpret_cast<const char*>(rotation_digest.data()), rotation_digest.size());
  return out;
}

CodecId CodecProfile::Id() const {
  const std::string bytes = CanonicalBytes();
  const Sha256Digest d = Sha256(bytes.data(), bytes.size());
  CodecId id;
  std::memcpy(id.bytes.data(), d.data(), id.bytes.size());
  return id;
}

absl::StatusOr<CodecProfile> BuiltinProfile(std::string_view shape) {
  CodecProfile p;
  if (shape == "qwen3-8b") {
    p.model_id = "Qwen/Qwen3-8B";
    p.model_revision = "main";
    p.num_layers = 36;
    p.num_kv_heads = 8;
  } else if (shape == "refmodel") {
    p.model_id = "oscarkv/refmodel";
    p.model_revision = "v1";
    p.num_layers = 8;
    p.num_kv_heads = 2;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown shape '", std::string(shape), "' (known: qwen3-8b, refmodel)"));
  }
  p.head_dim = 128;
  p.page_tokens = 64;
  p.group_size = 128;
  p.sink_tokens = 64;
  p.recent_tokens = 256;
  return p;
}

}  // namespace oscarkv
