// Test helpers: small codec profiles and well-formed pages (header + checksum) for them.
#pragma once

#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "oscarkv/kernels/block_key.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/proto/codec_convert.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::service::testing {

// 1 layer, 1 KV head, head_dim 64, group 32, 16-token pages: INT2 page 832 bytes, BF16 4160.
inline v1::CodecProfile TinyProfile(const std::string& model = "tiny") {
  v1::CodecProfile p;
  p.set_model_id(model);
  p.set_model_revision("r1");
  p.set_num_layers(1);
  p.set_num_kv_heads(1);
  p.set_tp_rank(0);
  p.set_tp_size(1);
  p.set_head_dim(64);
  p.set_page_tokens(16);
  p.set_group_size(32);
  p.set_scale_dtype(1);
  p.set_sink_tokens(16);
  p.set_recent_tokens(32);
  return p;
}

// The one conversion (proto/codec_convert.h); the test profiles always convert.
inline CodecProfile ToProfile(const v1::CodecProfile& p) { return *proto::FromProto(p); }

// A valid page of `kind` for `profile` with payload derived from `seed`.
inline std::string MakePage(const v1::CodecProfile& proto_profile, PageKind kind, uint32_t seed,
                            uint16_t token_count = 16) {
  const CodecProfile profile = ToProfile(proto_profile);
  const PageGeometry g = GeometryFor(profile, kind);
  std::string page(g.page_bytes(), '\0');
  PageHeader h{};
  h.magic = kPageMagic;
  h.format_version = kPageFormatVersion;
  h.kind = static_cast<uint8_t>(kind);
  h.scale_dtype = 1;
  const CodecId id = profile.Id();
  std::memcpy(h.codec_id, id.bytes.data(), 16);
  h.num_layers = profile.num_layers;
  h.num_kv_heads = profile.num_kv_heads;
  h.head_dim = profile.head_dim;
  h.group_size = profile.group_size;
  h.page_tokens = profile.page_tokens;
  h.token_count = token_count;
  h.payload_bytes = g.payload_bytes();
  std::mt19937 rng(seed);
  for (size_t i = kPageHeaderBytes; i < page.size(); ++i) page[i] = static_cast<char>(rng());
  std::memcpy(page.data(), &h, sizeof(h));
  h.checksum = ComputePageChecksum(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(page.data()), page.size()));
  std::memcpy(page.data(), &h, sizeof(h));
  return page;
}

inline std::string Key(uint32_t i, uint32_t salt = 0) {
  std::string k(16, '\0');
  uint64_t a = (uint64_t{salt} << 32 | i) * 0x9E3779B97F4A7C15ull;
  uint64_t b = a ^ 0xD1B54A32D192ED03ull * (i + 1);
  std::memcpy(k.data(), &a, 8);
  std::memcpy(k.data() + 8, &b, 8);
  return k;
}

// Key(i, salt) as a BlockKey (the struct API's key type).
inline BlockKey BKey(uint32_t i, uint32_t salt = 0) {
  BlockKey b;
  const std::string k = Key(i, salt);
  std::memcpy(b.bytes.data(), k.data(), 16);
  return b;
}

inline std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace oscarkv::service::testing
