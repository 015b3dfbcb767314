// PageCache: Handshake, codec registration and unregistration (with their persistence in the
// SSD tier).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "oscarkv/proto/codec_convert.h"
#include "oscarkv/service/page_cache.h"
#include "oscarkv/service/tier.h"
#include "page_cache_internal.h"

namespace oscarkv::service {

namespace {

// The tag FindCodec compares before it takes a reference: never 0 (0 = a free slot).
uint64_t MatchTag(uint32_t ns, const CodecId& id) {
  uint64_t lo, hi;
  std::memcpy(&lo, id.bytes.data(), 8);
  std::memcpy(&hi, id.bytes.data() + 8, 8);
  return (lo ^ hi * 0x9E3779B97F4A7C15ull ^ (uint64_t{ns} + 1) * 0xBF58476D1CE4E5B9ull) | 1;
}

// How long UnregisterCodec waits for the calls using a registration to finish.
constexpr absl::Duration kUnregisterWait = absl::Seconds(10);

}  // namespace

// The protocol (with UnregisterLocked): a reader counts itself in `users`, then reads `live`;
// the unregistering writer clears `live`, then waits for `users` to read 0 -- both sequentially
// consistent, so either the reader sees the slot free (and lets go without reading more) or
// the writer sees the reader and waits for it. A slot is refilled only while `live` is 0, and
// `live` is set (release) after its fields.
PageCache::CodecRef& PageCache::CodecRef::operator=(CodecRef&& o) noexcept {
  if (this != &o) {
    Reset();
    c_ = o.c_;
    o.c_ = nullptr;
  }
  return *this;
}

void PageCache::CodecRef::Reset() {
  if (c_ != nullptr) c_->users.fetch_sub(1, std::memory_order_release);
  c_ = nullptr;
}

PageCache::CodecRef PageCache::CodecRef::Acquire(const Codec* c, uint64_t serial) {
  CodecRef r;
  if (c == nullptr) return r;
  c->users.fetch_add(1, std::memory_order_seq_cst);
  const uint64_t live = c->live.load(std::memory_order_seq_cst);
  if (live == 0 || (serial != 0 && live != serial)) {
    c->users.fetch_sub(1, std::memory_order_release);
    return r;
  }
  r.c_ = c;
  return r;
}

absl::StatusOr<PageCache::CodecRef> PageCache::FindCodec(const Caller& caller,
                                                         const CodecId& codec_id) const {
  const uint64_t want = MatchTag(caller.ns, codec_id);
  const size_t n = num_codecs_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    const Codec* c = codecs_[i].get();
    if (c->tag.load(std::memory_order_acquire) != want) continue;
    CodecRef r = CodecRef::Acquire(c, 0);
    if (r.get() != nullptr && c->ns == caller.ns && c->id == codec_id) return r;
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
  Codec* slot = nullptr;  // the first free slot, if any
  for (size_t i = 0; i < n; ++i) {
    Codec* c = codecs_[i].get();
    if (c->live.load(std::memory_order_relaxed) == 0) {
      if (slot == nullptr) slot = c;
    } else if (c->ns == caller.ns && c->id == id) {
      return reg;
    }
  }
  // Configured tenants' codec quotas add up to at most kMaxCodecs (config validation): a tenant
  // at its quota never leaves another without a slot.
  const size_t cap = tenants_->configured() ? kMaxCodecs
                                            : std::min<size_t>(kMaxCodecs, options_.max_codecs);
  const size_t live = live_codecs_.load(std::memory_order_relaxed);
  if (live >= cap || (slot == nullptr && n >= kMaxCodecs)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this daemon already holds ", live, " codecs (max_codecs); unregister unused ones "
        "(UnregisterCodec, or Clear with free_codecs)"));
  }
  if (absl::Status s = (*tenant)->Charge(Quota::kCodecs, 1); !s.ok()) return s;
  v1::CodecProfile wire;  // the tier persists registrations in their wire form
  proto::ToProto(prof, &wire);
  std::string profile_proto = wire.SerializeAsString();
  std::string tier_ns = TierNamespaceLabel(caller.ns);
  if (tier_ != nullptr) {
    // Persisted before it is usable: no page of a codec reaches the tier unregistered.
    std::vector<PageTier::SavedCodec> all;
    for (size_t i = 0; i < n; ++i) {
      const Codec& c = *codecs_[i];
      if (c.live.load(std::memory_order_relaxed) != 0) all.push_back({c.tier_ns, c.profile_proto});
    }
    all.push_back({tier_ns, profile_proto});
    if (absl::Status s = tier_->SaveCodecs(all); !s.ok()) {
      (*tenant)->Refund(Quota::kCodecs, 1);
      return absl::UnavailableError(
          absl::StrCat("cannot persist the codec in the SSD tier: ", s.message()));
    }
  }
  const bool fresh = slot == nullptr;
  std::unique_ptr<Codec> made;
  if (fresh) {
    made = std::make_unique<Codec>();
    made->index = static_cast<uint32_t>(n);
    slot = made.get();
  }
  // A reused slot is free (live == 0): no reader looks at these fields until `live` is set.
  Codec* c = slot;
  c->owner = (*tenant)->id();
  c->ns = caller.ns;
  c->id = id;
  c->profile = prof;
  c->profile_proto = std::move(profile_proto);
  c->tier_ns = std::move(tier_ns);
  c->tier_tag = PageTier::NamespaceTag(c->tier_ns);
  c->page_bytes[1] = int2;
  c->page_bytes[2] = bf16;
  c->cls[1] = pool_->SizeClassFor(int2);
  c->cls[2] = pool_->SizeClassFor(bf16);
  c->live.store(next_codec_serial_++, std::memory_order_seq_cst);
  c->tag.store(MatchTag(c->ns, c->id), std::memory_order_release);
  if (fresh) {
    codecs_[n] = std::move(made);
    num_codecs_.store(n + 1, std::memory_order_release);
  }
  live_codecs_.fetch_add(1, std::memory_order_relaxed);
  return reg;
}

namespace {

// What a registration still holds (UnregisterLocked).
struct CodecUsage {
  uint64_t pages = 0, pinned = 0, reserving = 0, handles = 0, tier_pages = 0;
  bool any() const { return pages + reserving + handles + tier_pages > 0; }
};

}  // namespace

absl::StatusOr<UnregisterResult> PageCache::UnregisterCodec(const Caller& caller,
                                                            const CodecId& codec,
                                                            bool drop_pages) {
  if (auto t = TenantOf(caller); !t.ok()) return t.status();
  absl::MutexLock lock(&codec_mu_);
  const size_t n = num_codecs_.load(std::memory_order_acquire);
  std::vector<Codec*> targets;
  for (size_t i = 0; i < n; ++i) {
    Codec* c = codecs_[i].get();
    if (c->live.load(std::memory_order_relaxed) == 0 || !(c->id == codec)) continue;
    if (!caller.admin && c->ns != caller.ns) continue;  // another namespace's: not ours to see
    if (!caller.admin && c->owner != caller.tenant_id) {
      return absl::PermissionDeniedError(absl::StrCat(
          "codec ", codec.Hex(), " of this shared namespace was registered by another tenant; "
          "only that tenant or an admin may unregister it"));
    }
    targets.push_back(c);
  }
  if (targets.empty()) {
    return absl::NotFoundError(absl::StrCat("codec ", codec.Hex(), " is not registered",
                                            caller.admin ? "" : " by this tenant"));
  }
  UnregisterResult out;
  for (Codec* c : targets) {
    auto removed = UnregisterLocked(*c, drop_pages);
    if (!removed.ok()) {
      if (out.codecs == 0) return removed.status();
      return absl::Status(removed.status().code(),
                          absl::StrCat(removed.status().message(), " (", out.codecs,
                                       " registration(s) of it in other namespaces were "
                                       "unregistered before this one)"));
    }
    ++out.codecs;
    out.pages_removed += *removed;
  }
  return out;
}

absl::StatusOr<uint32_t> PageCache::FreeUnusedCodecs(const Caller& caller,
                                                     const std::optional<CodecId>& codec) {
  if (auto t = TenantOf(caller); !t.ok()) return t.status();
  absl::MutexLock lock(&codec_mu_);
  const size_t n = num_codecs_.load(std::memory_order_acquire);
  uint32_t freed = 0;
  for (size_t i = 0; i < n; ++i) {
    Codec* c = codecs_[i].get();
    if (c->live.load(std::memory_order_relaxed) == 0) continue;
    if (codec.has_value() && !(c->id == *codec)) continue;
    if (!caller.admin && (c->ns != caller.ns || c->owner != caller.tenant_id)) continue;
    freed += UnregisterLocked(*c, /*drop_pages=*/false).ok();  // one in use stays
  }
  return freed;
}

absl::Status PageCache::SaveCodecsLocked(const Codec* except) {
  if (tier_ == nullptr) return absl::OkStatus();
  std::vector<PageTier::SavedCodec> all;
  const size_t n = num_codecs_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    const Codec& c = *codecs_[i];
    if (&c == except || c.live.load(std::memory_order_relaxed) == 0) continue;
    all.push_back({c.tier_ns, c.profile_proto});
  }
  return tier_->SaveCodecs(all);
}

absl::StatusOr<uint64_t> PageCache::UnregisterLocked(Codec& c, bool drop_pages) {
  const uint32_t idx = c.index;
  // What it holds: pool entries (committed or reserved), reservations with slots still to
  // commit, transfer handles, SSD-tier pages.
  auto usage = [&] {
    CodecUsage u;
    for (uint32_t s = 0; s < options_.index_shards; ++s) {
      Shard& shard = shards_[s];
      absl::MutexLock l(&shard.mu);
      for (const auto& [k, e] : shard.map) {
        if (k.codec != idx) continue;
        ++u.pages;
        u.pinned += e.pins > 0;
      }
    }
    for (ReservationShard& rs : res_shards_) {
      absl::MutexLock l(&rs.mu);
      for (const auto& [id, r] : rs.map) {
        if (r->codec != &c) continue;
        absl::MutexLock rl(&r->mu);
        u.reserving += r->pending > 0;
      }
    }
    {
      absl::MutexLock l(&handles_mu_);
      for (const auto& [name, h] : handles_) u.handles += h.codec == idx;
    }
    if (tier_ != nullptr) u.tier_pages = tier_->Count(c.id, c.tier_tag);
    return u;
  };
  auto in_use = [&](const CodecUsage& u) {
    return absl::FailedPreconditionError(absl::StrCat(
        "codec ", c.id.Hex(), " still holds ", u.pages, " pool pages (", u.pinned, " pinned), ",
        u.reserving, " reservations being stored, ", u.handles, " transfer handles and ",
        u.tier_pages, " SSD-tier pages; delete them (clear --codec ", c.id.Hex(),
        " --include-pinned, close the handles) or unregister with drop_pages"));
  };
  // Without drop_pages, a registration in use is refused before it leaves the table, so the
  // calls using it see no gap.
  if (!drop_pages) {
    if (CodecUsage u = usage(); u.any()) return in_use(u);
  }
  // Out of the table: FindCodec no longer returns it; then the calls holding it finish. From
  // then on no page, reservation or handle of it can appear (each starts from a CodecRef).
  const uint64_t serial = c.live.load(std::memory_order_relaxed);
  const uint64_t tag = c.tag.load(std::memory_order_relaxed);
  c.tag.store(0, std::memory_order_release);
  c.live.store(0, std::memory_order_seq_cst);
  auto restore = [&] {
    c.live.store(serial, std::memory_order_seq_cst);
    c.tag.store(tag, std::memory_order_release);
  };
  const absl::Time give_up = absl::Now() + kUnregisterWait;
  while (c.users.load(std::memory_order_seq_cst) != 0) {
    if (absl::Now() > give_up) {
      restore();
      return absl::UnavailableError(absl::StrCat(
          "codec ", c.id.Hex(), " is busy: calls using it did not finish within ",
          absl::FormatDuration(kUnregisterWait), "; retry"));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  // An eviction that already took one of its pages out of the index finishes demoting it.
  { absl::MutexLock ev(&evict_mu_); }
  if (!drop_pages) {
    if (CodecUsage u = usage(); u.any()) {
      restore();
      return in_use(u);
    }
  }
  // Persisted before anything is dropped: if the codecs file cannot be rewritten, nothing
  // changed (a restart would bring the registration back).
  if (absl::Status s = SaveCodecsLocked(&c); !s.ok()) {
    restore();
    return absl::UnavailableError(
        absl::StrCat("cannot remove the codec from the SSD tier's codecs file: ", s.message()));
  }
  uint64_t removed = 0;
  // Handles first (they pin pages), then reservations (their reserved slots), then pages.
  std::vector<Handle> handles;
  {
    absl::MutexLock l(&handles_mu_);
    for (auto it = handles_.begin(); it != handles_.end();) {
      auto cur = it++;
      if (cur->second.codec != idx) continue;
      handles.push_back(std::move(cur->second));
      handles_.erase(cur);
    }
  }
  for (const Handle& h : handles) {
    for (const PinnedPage& p : h.pages) UnpinPage(p);
    RefundHandle(h);
  }
  std::vector<std::shared_ptr<Reservation>> reservations;
  for (ReservationShard& rs : res_shards_) {
    absl::MutexLock l(&rs.mu);
    for (auto it = rs.map.begin(); it != rs.map.end();) {
      auto cur = it++;
      if (cur->second->codec != &c) continue;
      reservations.push_back(std::move(cur->second));
      rs.map.erase(cur);
    }
  }
  for (auto& r : reservations) AbortReservation(*r, /*expired=*/false);
  std::vector<uint64_t> unref;
  for (uint32_t s = 0; s < options_.index_shards; ++s) {
    Shard& shard = shards_[s];
    unref.clear();
    {
      absl::MutexLock l(&shard.mu);
      for (auto it = shard.map.begin(); it != shard.map.end();) {
        auto cur = it++;
        if (cur->first.codec != idx || !cur->second.committed) continue;
        unref.push_back(cur->second.offset);
        EraseCommittedLocked(shard, cur);
      }
    }
    for (uint64_t off : unref) pool_->Unref(off);  // a lease still holds its own reference
    removed += unref.size();
    counters_.deletes.fetch_add(unref.size(), std::memory_order_relaxed);
  }
  { absl::MutexLock ev(&evict_mu_); }  // as above, for evictions during the sweep
  if (tier_ != nullptr) removed += ClearTier(idx);
  if (Tenant* t = tenants_->tenant(c.owner)) t->Refund(Quota::kCodecs, 1);
  live_codecs_.fetch_sub(1, std::memory_order_relaxed);
  return removed;
}

}  // namespace oscarkv::service
