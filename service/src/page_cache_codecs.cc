// PageCache: Handshake and codec registration (with its persistence in the SSD tier).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "oscarkv/proto/codec_convert.h"
#include "oscarkv/service/page_cache.h"
#include "oscarkv/service/tier.h"
#include "page_cache_internal.h"

namespace oscarkv::service {
absl::StatusOr<const PageCache::Codec*> PageCache::FindCodec(const Caller& caller,
                                                             const CodecId& codec_id) const {
  const size_t n = num_codecs_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    if (codecs_[i]->ns == caller.ns && codecs_[i]->id == codec_id) return codecs_[i].get();
  }
  return absl::NotFoundError(absl::StrCat("unknown codec ", codec_id.Hex(),
                                          "; register it with RegisterCodec first"));
}

absl::StatusOr<Tenant*> PageCache::TenantOf(const Caller& caller) const {
  Tenant* t = tenants_->tenant(caller.tenant_id);
  if (t == nullptr || !tenants_->MayUse(*t, caller.ns)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "caller of tenant id ", caller.tenant_id, " may not use namespace ", caller.ns));
  }
  return t;
}

absl::StatusOr<HandshakeInfo> PageCache::Handshake(const Caller& caller,
                                                   const HandshakeArgs& args) {
  if (auto t = TenantOf(caller); !t.ok()) return t.status();
  if (args.wire_version != kWireVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("wire version mismatch: client speaks ", args.wire_version,
                     ", this daemon speaks ", kWireVersion, "; upgrade the older side"));
  }
  HandshakeInfo info;
  info.wire_version = kWireVersion;
  info.server_version = kServerVersion;
  info.node_id = options_.node_id;
  info.shm_path = pool_->arena().shm_path();
  info.shm_isolated = pool_->arena().sealed();  // read-only to clients: staged writes
  info.shm_bytes = info.shm_path.empty() && !info.shm_isolated ? 0 : pool_->arena().size();
  info.max_batch = options_.max_batch;
  return info;
}

absl::StatusOr<CodecRegistration> PageCache::RegisterCodec(const Caller& caller,
                                                            const CodecProfile& prof) {
  auto tenant = TenantOf(caller);
  if (!tenant.ok()) return tenant.status();
  if (absl::Status s = prof.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported codec profile: ", s.message()));
  }
  const CodecId id = prof.Id();
  const uint64_t int2 = GeometryFor(prof, PageKind::kInt2).page_bytes();
  const uint64_t bf16 = GeometryFor(prof, PageKind::kBf16).page_bytes();
  const CodecRegistration reg{id, int2, bf16};

  absl::MutexLock lock(&codec_mu_);
  const size_t n = num_codecs_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    if (codecs_[i]->ns == caller.ns && codecs_[i]->id == id) return reg;
  }
  // Configured tenants' codec quotas add up to at most kMaxCodecs (config validation): a tenant
  // at its quota never leaves another without a slot.
  const size_t cap = tenants_->configured() ? kMaxCodecs
                                            : std::min<size_t>(kMaxCodecs, options_.max_codecs);
  if (n >= cap) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this daemon already holds ", n, " codecs (max_codecs)"));
  }
  if (absl::Status s = (*tenant)->Charge(Quota::kCodecs, 1); !s.ok()) return s;
  auto c = std::make_unique<Codec>();
  c->index = static_cast<uint32_t>(n);
  c->ns = caller.ns;
  c->id = id;
  c->profile = prof;
  v1::CodecProfile wire;  // the tier persists registrations in their wire form
  proto::ToProto(prof, &wire);
  c->profile_proto = wire.SerializeAsString();
  c->tier_ns = TierNamespaceLabel(caller.ns);
  c->tier_tag = PageTier::NamespaceTag(c->tier_ns);
  if (tier_ != nullptr) {
    // Persisted before it is usable: no page of a codec reaches the tier unregistered.
    std::vector<PageTier::SavedCodec> all;
    for (size_t i = 0; i < n; ++i) all.push_back({codecs_[i]->tier_ns, codecs_[i]->profile_proto});
    all.push_back({c->tier_ns, c->profile_proto});
    if (absl::Status s = tier_->SaveCodecs(all); !s.ok()) {
      (*tenant)->Refund(Quota::kCodecs, 1);
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
  return reg;
}

}  // namespace oscarkv::service
