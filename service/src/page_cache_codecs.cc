// PageCache: Handshake and codec registration (with its persistence in the SSD tier).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "oscarkv/proto/codec_convert.h"
#include "oscarkv/service/page_cache.h"
#include "oscarkv/service/tier.h"
#include "page_cache_internal.h"

namespace oscarkv::service {
namespace {

std::string KeyHexPrefix(const std::string& bytes) {
  return HexEncode(reinterpret_cast<const uint8_t*>(bytes.data()),
                   std::min<size_t>(bytes.size(), 16));
}

}  // namespace

absl::StatusOr<const PageCache::Codec*> PageCache::FindCodec(const std::string& codec_id) const {
  if (codec_id.size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec_id must be 16 bytes, got ", codec_id.size()));
  }
  const size_t n = num_codecs_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(codecs_[i]->id.bytes.data(), codec_id.data(), 16) == 0) return codecs_[i].get();
  }
  return absl::NotFoundError(absl::StrCat("unknown codec ", KeyHexPrefix(codec_id),
                                          "; register it with RegisterCodec first"));
}

absl::Status PageCache::Handshake(const pb::HandshakeRequest& req, pb::HandshakeResponse* resp) {
  if (req.wire_version() != kWireVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("wire version mismatch: client speaks ", req.wire_version(),
                     ", this daemon speaks ", kWireVersion, "; upgrade the older side"));
  }
  resp->set_wire_version(kWireVersion);
  resp->set_server_version(kServerVersion);
  resp->set_node_id(options_.node_id);
  resp->set_shm_path(pool_->arena().shm_path());
  resp->set_shm_bytes(resp->shm_path().empty() ? 0 : pool_->arena().size());
  resp->set_max_batch(options_.max_batch);
  return absl::OkStatus();
}

absl::Status PageCache::RegisterCodec(const pb::RegisterCodecRequest& req,
                                      pb::RegisterCodecResponse* resp) {
  auto converted = proto::FromProto(req.profile());
  if (!converted.ok()) return converted.status();
  CodecProfile prof = *std::move(converted);
  if (absl::Status s = prof.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported codec profile: ", s.message()));
  }
  const CodecId id = prof.Id();
  const uint64_t int2 = GeometryFor(prof, PageKind::kInt2).page_bytes();
  const uint64_t bf16 = GeometryFor(prof, PageKind::kBf16).page_bytes();
  resp->set_codec_id(std::string(reinterpret_cast<const char*>(id.bytes.data()), 16));
  resp->set_int2_page_bytes(int2);
  resp->set_bf16_page_bytes(bf16);

  absl::MutexLock lock(&codec_mu_);
  const size_t n = num_codecs_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    if (codecs_[i]->id == id) return absl::OkStatus();
  }
  if (n >= std::min<size_t>(kMaxCodecs, options_.max_codecs)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this daemon already holds ", n, " codecs (max_codecs)"));
  }
  auto c = std::make_unique<Codec>();
  c->index = static_cast<uint32_t>(n);
  c->id = id;
  c->id_bytes = resp->codec_id();
  c->profile = prof;
  c->profile_proto = req.profile().SerializeAsString();
  if (tier_ != nullptr) {
    // Persisted before it is usable: no page of a codec reaches the tier unregistered.
    std::vector<std::string> all;
    for (size_t i = 0; i < n; ++i) all.push_back(codecs_[i]->profile_proto);
    all.push_back(c->profile_proto);
    if (absl::Status s = tier_->SaveCodecs(all); !s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot persist the codec in the SSD tier: ", s.message()));
    }
  }
  c->page_bytes[1] = int2;
  c->page_bytes[2] = bf16;
  c->cls[1] = pool_->SizeClassFor(int2);
  c->cls[2] = pool_->SizeClassFor(bf16);
  codecs_[n] = std::move(c);
  num_codecs_.store(n + 1, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace oscarkv::service
