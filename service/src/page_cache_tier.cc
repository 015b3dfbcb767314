// PageCache and the SSD tier (tier.h): demotion of evicted pages, promotion on a pinning
// Lookup, the tier's part of Delete/Clear, the SIGTERM demotion, and Stats.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "oscarkv/proto/codec_convert.h"
#include "oscarkv/service/page_cache.h"
#include "oscarkv/service/tier.h"
#include "page_cache_internal.h"

namespace oscarkv::service {

std::string PageCache::TierNamespaceLabel(uint32_t ns) const {
  // Without tenants every page is the default tenant's: no label, the tier's format of old.
  if (!tenants_->configured()) return "";
  const Namespace* n = tenants_->ns(ns);
  if (n == nullptr) return "";
  return absl::StrCat(n->shared ? "shared:" : "tenant:", n->name);
}

tiering::TierKey PageCache::TierKeyOf(const IndexKey& key) const {
  const Codec& c = *codecs_[key.codec];
  return {c.id, key.key, c.tier_tag};
}

absl::Status PageCache::AttachTier(PageTier* tier) {
  if (tier_ != nullptr) return absl::FailedPreconditionError("a tier is already attached");
  auto saved = tier->LoadCodecs();
  if (!saved.ok()) return saved.status();
  // The namespace labels the daemon's tenants give (tenant:<name>, shared:<name>).
  absl::flat_hash_map<std::string, uint32_t> by_label;
  for (uint32_t i = 0; i < tenants_->namespaces(); ++i) by_label[TierNamespaceLabel(i)] = i;
  // Registered before tier_ is set, so they are not rewritten one by one.
  for (const PageTier::SavedCodec& rec : *saved) {
    if (rec.ns.empty() != !tenants_->configured()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the SSD tier at ", tier->options().path, " holds pages of a daemon ",
          rec.ns.empty() ? "without tenants: with tenants: configured they would have no owner"
                         : "with tenants: configure them again",
          "; or move the directory away to start an empty tier"));
    }
    auto ns = by_label.find(rec.ns);
    // A tenant or shared namespace no longer configured: its pages stay unreachable (no key
    // of another namespace carries its tag) until the tier drops them for capacity.
    if (ns == by_label.end()) continue;
    v1::CodecProfile wire;
    if (!wire.ParseFromString(rec.profile)) {
      return absl::DataLossError("the SSD tier's codecs file holds an unreadable profile");
    }
    absl::StatusOr<CodecProfile> profile = proto::FromProto(wire);
    absl::Status s = profile.status();
    if (s.ok()) {
      // Registered for the namespace's owner (a shared namespace: its first member), charged
      // to that tenant's codec quota as its own registration was.
      Caller owner;
      const Namespace* n = tenants_->ns(ns->second);
      owner.ns = ns->second;
      owner.tenant_id = n->members.empty() ? ns->second : n->members.front();
      if (const Tenant* t = tenants_->tenant(owner.tenant_id)) {
        owner.tenant = t->name();
        owner.admin = t->admin();
      }
      s = RegisterCodec(owner, *profile).status();
    }
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("re-registering a codec the SSD tier holds ",
                                                 "pages of (", rec.ns.empty() ? "-" : rec.ns,
                                                 "): ", s.message()));
    }
  }
  tier_ = tier;
  return absl::OkStatus();
}

bool PageCache::InTier(const IndexKey& key) { return tier_->Contains(TierKeyOf(key)); }

absl::Status PageCache::DeleteFromTier(const IndexKey& key) {
  return tier_->Delete(TierKeyOf(key));
}

uint64_t PageCache::ClearTier(int64_t only) {
  if (only < 0) return tier_->Clear(nullptr);
  const Codec& c = *codecs_[only];
  return tier_->Clear(&c.id, c.tier_tag);
}

void PageCache::DemoteEvicted(const IndexKey& key, uint64_t offset, uint64_t page_bytes,
                              bool in_tier) {
  if (tier_ == nullptr) return;
  const tiering::TierKey tk = TierKeyOf(key);
  if (in_tier && tier_->KeepsCopy(tk)) return;  // its copy is there and not about to go
  // Copies the bytes (or waits for queue room: back-pressure on this eviction) before the
  // caller frees the slot.
  tier_->Demote(tk, std::span<const uint8_t>(pool_->Data(offset), page_bytes));
}

absl::Status PageCache::Promote(const IndexKey& key, Tenant& tenant) {
  const Codec* codec = codecs_[key.codec].get();
  const tiering::TierKey tk = TierKeyOf(key);
  auto size = tier_->SizeOf(tk);
  if (!size.ok()) return size.status();
  // The size names the kind (an INT2 and a BF16 page of one codec differ in size); the header
  // read with the page must agree.
  const int kind = *size == codec->page_bytes[1] ? 1 : *size == codec->page_bytes[2] ? 2 : 0;
  auto unfit = [&] {
    (void)tier_->Delete(tk);
    tier_->mutable_counters().corruptions.fetch_add(1, std::memory_order_relaxed);
    return absl::DataLossError(absl::StrCat("SSD tier page ", key.key.Hex(),
                                            " does not fit its codec; removed"));
  };
  if (kind == 0) return unfit();
  if (!codec->cls[kind].ok()) return codec->cls[kind].status();
  // The promoting tenant holds the page from now on: charged first (over its pool_mb quota
  // this evicts its own pages, never another's), refunded if the promotion does not happen.
  if (absl::Status s = ChargePool(tenant, *size); !s.ok()) return s;
  // Claim the key with a slotless placeholder (as Reserve does): a concurrent store of the key
  // is told it is in progress, and no shard lock is held while allocating (which may evict).
  const uint64_t gen = next_gen_.fetch_add(1, std::memory_order_relaxed);
  Shard& shard = ShardFor(key);
  {
    absl::MutexLock lock(&shard.mu);
    auto [it, inserted] = shard.map.try_emplace(key);
    if (!inserted) {
      tenant.Refund(Quota::kPoolBytes, *size);
      return absl::OkStatus();  // in the pool already (or being stored)
    }
    it->second.gen = gen;
    it->second.kind = static_cast<PageKind>(kind);
    it->second.page_bytes = *size;
  }
  auto off = AllocateSlot(*codec->cls[kind]);
  absl::Status read = off.status();
  absl::StatusOr<PageHeader> hdr = absl::UnknownError("not read");
  if (off.ok()) {
    // Straight from the SSD into the slot, verified (checksum) on the way.
    const std::span<uint8_t> slot(pool_->Data(*off), *size);
    read = tier_->ReadInto(tk, slot);
    if (read.ok()) {
      hdr = ParsePageHeader(slot, codec->profile, /*verify_checksum=*/false);
      if (!hdr.ok() || hdr->kind != kind) read = unfit();
    }
  }
  {
    absl::MutexLock lock(&shard.mu);
    auto it = shard.map.find(key);
    const bool ours = it != shard.map.end() && it->second.gen == gen;
    if (!read.ok()) {
      if (ours) shard.map.erase(it);
      if (off.ok()) pool_->Unref(*off);
      tenant.Refund(Quota::kPoolBytes, *size);
      return read;
    }
    if (!ours) {
      pool_->Unref(*off);
      tenant.Refund(Quota::kPoolBytes, *size);
      return absl::OkStatus();
    }
    Entry& e = it->second;
    e.offset = *off;
    e.has_slot = true;
    e.committed = true;
    e.token_count = hdr->token_count;
    e.referenced = true;
    e.in_tier = true;
    e.owner = tenant.id();  // charged above; EraseCommittedLocked refunds it
    shard.ring.push_back({key, gen});
    {
      absl::MutexLock off_lock(&offsets_mu_);
      key_at_[*off] = key;
    }
  }
  counters_.pages.fetch_add(1, std::memory_order_relaxed);
  tenant.pages.fetch_add(1, std::memory_order_relaxed);
  TierCounters& tc = tier_->mutable_counters();
  tc.promotions.fetch_add(1, std::memory_order_relaxed);
  tc.promoted_bytes.fetch_add(*size, std::memory_order_relaxed);
  return absl::OkStatus();
}

uint64_t PageCache::DemoteAll(absl::Time deadline) {
  if (tier_ == nullptr) return 0;
  const uint64_t before = tier_->counters().demotions.load();
  for (uint32_t s = 0; s < options_.index_shards && absl::Now() < deadline; ++s) {
    Shard& shard = shards_[s];
    struct Page {
      IndexKey key;
      uint64_t offset, bytes;
      bool in_tier;
    };
    std::vector<Page> pages;
    {
      absl::MutexLock lock(&shard.mu);
      for (const auto& [k, e] : shard.map) {
        if (!e.committed) continue;
        pool_->Ref(e.offset);  // keeps the bytes valid while they are copied
        pages.push_back({k, e.offset, e.page_bytes, e.in_tier});
      }
    }
    for (const Page& p : pages) {
      if (absl::Now() < deadline) DemoteEvicted(p.key, p.offset, p.bytes, p.in_tier);
      pool_->Unref(p.offset);
    }
  }
  tier_->Flush(deadline);
  return tier_->counters().demotions.load() - before;
}

absl::StatusOr<CacheStats> PageCache::Stats(const Caller& caller) {
  auto tenant = TenantOf(caller);
  if (!tenant.ok()) return tenant.status();
  CacheStats st;
  if (!caller.admin) {
    // A tenant's own figures: what it holds and what its quota allows, nothing of the others.
    const Tenant& t = **tenant;
    st.pool_bytes = t.limit(Quota::kPoolBytes) == kUnlimited ? pool_->capacity_bytes()
                                                              : t.limit(Quota::kPoolBytes);
    st.pool_used_bytes = t.used(Quota::kPoolBytes);
    st.pages = t.pages.load();
    st.pinned_pages = t.used(Quota::kPinnedPages);
    st.leases = t.used(Quota::kLeases);
    st.handles = t.used(Quota::kHandles);
    st.codecs = static_cast<uint32_t>(t.used(Quota::kCodecs));
    st.lookups = t.lookups.load();
    st.hits = t.hits.load();
    st.misses = t.misses.load();
    st.node_id = options_.node_id;
    st.server_version = kServerVersion;
    return st;
  }
  st.pool_bytes = pool_->capacity_bytes();
  st.pool_used_bytes = pool_->bytes_used();
  st.pages = std::max<int64_t>(0, counters_.pages.load());
  st.pinned_pages = std::max<int64_t>(0, counters_.pinned_pages.load());
  st.leases = std::max<int64_t>(0, counters_.leases.load());
  st.reservations = OpenReservations();
  st.lookups = counters_.lookups.load();
  st.hits = counters_.hits.load();
  st.misses = counters_.misses.load();
  st.evictions = counters_.evictions.load();
  st.bytes_written = counters_.bytes_written.load();
  st.bytes_read = counters_.bytes_read.load();
  st.codecs = static_cast<uint32_t>(codecs());
  st.node_id = options_.node_id;
  st.server_version = kServerVersion;
  st.handles = OpenHandles();
  if (tier_ != nullptr) {
    const tiering::TierStats ts = tier_->store_stats();
    const TierCounters& tc = tier_->counters();
    st.tier_capacity_bytes = ts.capacity_bytes;
    st.tier_bytes = ts.used_bytes;
    st.tier_pages = ts.pages;
    st.tier_demotions = tc.demotions.load();
    st.tier_promotions = tc.promotions.load();
    st.tier_hits = tc.hits.load();
    st.tier_misses = tc.misses.load();
    st.tier_demote_drops = tc.demote_drops.load();
    st.tier_corruptions = tc.corruptions.load();
    st.tier_evictions = ts.evictions;
    st.tier_queued_bytes = tier_->queued_bytes();
  }
  return st;
}

}  // namespace oscarkv::service
