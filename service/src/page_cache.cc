// PageCache: the index and its shards, Lookup and leases, eviction, Delete/Clear and Reap.
#include "oscarkv/service/page_cache.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "page_cache_internal.h"

namespace oscarkv::service {

ReadPlan::~ReadPlan() {
  for (uint64_t off : offsets_) pool_->Unref(off);
}

PageCache::PageCache(PagePool* pool, const Clock* clock, CacheOptions options)
    : pool_(pool), clock_(clock), options_(std::move(options)) {
  const uint32_t n = std::max<uint32_t>(1, options_.index_shards);
  const_cast<CacheOptions&>(options_).index_shards = n;
  shards_ = std::make_unique<Shard[]>(n);
  // Ids start at a random point so ids from a previous daemon process are not accepted.
  std::random_device rd;
  next_id_.store((uint64_t{rd()} << 24) | 1);
  if (options_.tenants == nullptr) {
    own_tenants_ = TenantRegistry::SingleTenant(options_.max_codecs, options_.max_handles);
    tenants_ = own_tenants_.get();
  } else {
    tenants_ = options_.tenants;
  }
}

PageCache::~PageCache() = default;

uint64_t PageCache::NewId() { return next_id_.fetch_add(1, std::memory_order_relaxed); }

PageCache::Shard& PageCache::ShardFor(const IndexKey& k) {
  uint64_t hi;
  std::memcpy(&hi, k.key.bytes.data() + 8, 8);
  const uint64_t h = (hi ^ (uint64_t{k.codec} * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
  return shards_[(h >> 32) % options_.index_shards];
}

absl::Status PageCache::CheckBatch(size_t n, const char* what) const {
  if (n > options_.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", n, " ", what, " exceeds max_batch ",
                                                   options_.max_batch, "; split the call"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LookupResult> PageCache::Lookup(const Caller& caller, const LookupQuery& query) {
  LookupResult out;
  if (absl::Status s = LookupInto(caller, query, &out); !s.ok()) return s;
  return out;
}

absl::Status PageCache::LookupInto(const Caller& caller, const LookupQuery& query,
                                  LookupResult* out) {
  out->matched = 0;
  out->lease_id = 0;
  out->lease_deadline_unix_ms = 0;
  out->pages.clear();
  auto tenant_or = TenantOf(caller);
  if (!tenant_or.ok()) return tenant_or.status();
  Tenant& tenant = **tenant_or;
  auto codec = FindCodec(caller, query.codec);
  if (!codec.ok()) return codec.status();
  if (absl::Status s = CheckBatch(query.keys.size(), "keys"); !s.ok()) return s;
  const bool pin = query.pin;
  if (pin) {
    if (absl::Status s = tenant.Charge(Quota::kLeases, 1); !s.ok()) return s;
  }
  counters_.lookups.fetch_add(1, std::memory_order_relaxed);
  tenant.lookups.fetch_add(1, std::memory_order_relaxed);
  const int n = static_cast<int>(query.keys.size());
  Lease lease;
  if (pin) lease.pages.reserve(n);
  IndexKey k{(*codec)->index, {}};
  int matched = 0, promoted = -1;
  for (; matched < n; ++matched) {
    k.key = query.keys[matched];
    Shard& shard = ShardFor(k);
    absl::ReleasableMutexLock lock(&shard.mu);
    auto it = shard.map.find(k);
    if (it == shard.map.end() || !it->second.committed) {
      // The prefix may continue in the SSD tier: a probe counts the page without reading it; a
      // pinning lookup promotes it into the pool first (a page that fails verification there is
      // a miss, and is removed from the tier).
      lock.Release();
      if (tier_ == nullptr || promoted == matched || !InTier(k)) break;
      if (!pin) continue;
      if (!Promote(k, tenant).ok()) break;
      promoted = matched--;  // the same key again, now from the pool (once)
      continue;
    }
    Entry& e = it->second;
    if (!pin) continue;
    e.referenced = true;
    if (e.pins++ == 0) counters_.pinned_pages.fetch_add(1, std::memory_order_relaxed);
    pool_->Ref(e.offset);
    lease.pages.push_back({k, e.gen, e.offset, e.page_bytes});
    out->pages.push_back({k.key, e.offset, e.page_bytes, e.kind, e.token_count});
  }
  counters_.hits.fetch_add(matched, std::memory_order_relaxed);
  counters_.misses.fetch_add(n - matched, std::memory_order_relaxed);
  tenant.hits.fetch_add(matched, std::memory_order_relaxed);
  tenant.misses.fetch_add(n - matched, std::memory_order_relaxed);
  if (pin && matched > 0) {
    if (absl::Status s = tenant.Charge(Quota::kPinnedPages, lease.pages.size()); !s.ok()) {
      for (const PinnedPage& p : lease.pages) UnpinPage(p);
      tenant.Refund(Quota::kLeases, 1);
      out->pages.clear();
      return s;
    }
  } else if (pin) {
    tenant.Refund(Quota::kLeases, 1);
  }
  out->matched = matched;
  if (pin && matched > 0) {
    lease.tenant = tenant.id();
    uint32_t ms = query.lease_ms == 0 ? options_.default_lease_ms : query.lease_ms;
    ms = std::min(ms, options_.max_lease_ms);
    const int64_t now = clock_->NowMs();
    lease.deadline_ms = now + ms;
    const uint64_t id = NewId();
    out->lease_id = id;
    out->lease_deadline_unix_ms = clock_->UnixMs() + ms;
    LeaseShard& ls = LeaseShardFor(id);
    absl::MutexLock lock(&ls.mu);
    ls.map.emplace(id, std::move(lease));
    counters_.leases.fetch_add(1, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

bool PageCache::EvictOne(SizeClassId want, const uint32_t* owner) {
  // Visit shards round-robin; in each, run its clock hand for at most one revolution. Two full
  // rounds without a victim mean nothing is evictable.
  const size_t nshards = options_.index_shards;
  for (size_t visited = 0; visited < 2 * nshards; ++visited) {
    Shard& shard = shards_[evict_shard_];
    evict_shard_ = (evict_shard_ + 1) % nshards;
    uint64_t victim = 0, victim_bytes = 0;
    IndexKey victim_key{};
    bool found = false, victim_in_tier = false;
    {
      absl::MutexLock lock(&shard.mu);
      size_t steps = shard.ring.size();
      while (steps-- > 0 && !shard.ring.empty()) {
        if (shard.hand >= shard.ring.size()) shard.hand = 0;
        auto [key, gen] = shard.ring[shard.hand];
        auto it = shard.map.find(key);
        if (it == shard.map.end() || it->second.gen != gen || !it->second.committed) {
          shard.ring[shard.hand] = shard.ring.back();  // stale: drop it
          shard.ring.pop_back();
          continue;
        }
        Entry& e = it->second;
        if (e.pins > 0 || (owner != nullptr && e.owner != *owner)) {
          ++shard.hand;
          continue;
        }
        if (e.referenced) {
          e.referenced = false;
          ++shard.hand;
          continue;
        }
        victim = e.offset;
        victim_key = key;
        victim_bytes = e.page_bytes;
        victim_in_tier = e.in_tier;
        EraseCommittedLocked(shard, it);
        found = true;
        break;
      }
    }
    if (found) {
      SpanInfo span;
      // Evicting for a tenant's quota frees bytes of that tenant, not memory of a size class.
      const bool other_class =
          owner == nullptr && pool_->SpanOfSlot(victim, &span).ok() && span.cls != want;
      DemoteEvicted(victim_key, victim, victim_bytes, victim_in_tier);
      pool_->Unref(victim);
      counters_.evictions.fetch_add(1, std::memory_order_relaxed);
      if (other_class) EvictSpanMates(span, victim);
      return true;
    }
  }
  return false;
}

void PageCache::EvictSpanMates(const SpanInfo& span, uint64_t victim) {
  for (uint32_t i = 0; i < span.slots; ++i) {
    const uint64_t off = span.start + uint64_t{i} * span.slot_bytes;
    if (off == victim) continue;
    IndexKey key;
    {
      absl::MutexLock lock(&offsets_mu_);
      auto it = key_at_.find(off);
      if (it == key_at_.end()) continue;  // free, reserved, or already gone
      key = it->second;
    }
    bool evicted = false, in_tier = false;
    uint64_t bytes = 0;
    {
      Shard& shard = ShardFor(key);
      absl::MutexLock lock(&shard.mu);
      auto it = shard.map.find(key);
      if (it != shard.map.end() && it->second.committed && it->second.offset == off &&
          it->second.pins == 0) {
        bytes = it->second.page_bytes;
        in_tier = it->second.in_tier;
        EraseCommittedLocked(shard, it);
        evicted = true;
      }
    }
    if (evicted) {
      DemoteEvicted(key, off, bytes, in_tier);
      pool_->Unref(off);
      counters_.evictions.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void PageCache::EraseCommittedLocked(Shard& shard,
                                     absl::flat_hash_map<IndexKey, Entry>::iterator it) {
  if (it->second.pins > 0) counters_.pinned_pages.fetch_sub(1, std::memory_order_relaxed);
  counters_.pages.fetch_sub(1, std::memory_order_relaxed);
  if (Tenant* t = tenants_->tenant(it->second.owner)) {
    t->Refund(Quota::kPoolBytes, it->second.page_bytes);
    t->pages.fetch_sub(1, std::memory_order_relaxed);
  }
  {
    absl::MutexLock lock(&offsets_mu_);
    auto k = key_at_.find(it->second.offset);
    if (k != key_at_.end() && k->second == it->first) key_at_.erase(k);
  }
  shard.map.erase(it);
  // The ring slot goes stale and is dropped when a hand passes it.
}

absl::StatusOr<uint64_t> PageCache::AllocateSlot(SizeClassId cls) {
  auto off = pool_->Allocate(cls);
  if (off.ok() || off.status().code() != absl::StatusCode::kResourceExhausted) return off;
  absl::MutexLock lock(&evict_mu_);
  for (;;) {
    off = pool_->Allocate(cls);
    if (off.ok()) return off;
    if (!EvictOne(cls)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "pool full: every page is pinned or being stored (", pool_->bytes_used(), " of ",
          pool_->capacity_bytes(), " bytes in use)"));
    }
  }
}

absl::Status PageCache::ChargePool(Tenant& t, uint64_t bytes) {
  absl::Status s = t.TryCharge(Quota::kPoolBytes, bytes);
  if (s.ok() || t.limit(Quota::kPoolBytes) == kUnlimited) return s;
  // Over its quota: make room among the tenant's own unpinned pages (each eviction refunds its
  // bytes), never another tenant's. Bounded: every round evicts one page or gives up.
  absl::MutexLock lock(&evict_mu_);
  const uint32_t owner = t.id();
  while (!s.ok()) {
    if (!EvictOne(SizeClassId{}, &owner)) {
      t.CountRefusal(Quota::kPoolBytes);
      return absl::ResourceExhaustedError(absl::StrCat(
          s.message(), ": every page of the tenant is pinned or being stored"));
    }
    s = t.TryCharge(Quota::kPoolBytes, bytes);
  }
  return s;
}

absl::StatusOr<std::unique_ptr<ReadPlan>> PageCache::PrepareRead(const Caller& caller,
                                                                  const ReadArgs& args) {
  if (absl::Status s = CheckBatch(args.keys.size(), "keys"); !s.ok()) return s;
  std::vector<ReadPlan::Page> pages;
  std::vector<uint64_t> offsets;
  LeaseShard& ls = LeaseShardFor(args.lease_id);
  absl::MutexLock lock(&ls.mu);
  auto it = ls.map.find(args.lease_id);
  if (it == ls.map.end() || it->second.deadline_ms < clock_->NowMs() ||
      it->second.tenant != caller.tenant_id) {
    return absl::NotFoundError(
        absl::StrCat("lease ", args.lease_id, " is unknown, expired or released"));
  }
  const Lease& lease = it->second;
  auto add = [&](const PinnedPage& p) {
    pages.push_back({p.key.key, pool_->Data(p.offset), p.page_bytes});
    offsets.push_back(p.offset);
  };
  if (args.keys.empty()) {
    for (const PinnedPage& p : lease.pages) add(p);
  } else {
    for (const BlockKey& key : args.keys) {
      auto p = std::find_if(lease.pages.begin(), lease.pages.end(),
                            [&](const PinnedPage& pp) { return pp.key.key == key; });
      if (p == lease.pages.end()) {
        return absl::NotFoundError(
            absl::StrCat("key ", key.Hex(), " is not pinned by lease ", args.lease_id));
      }
      add(*p);
    }
  }
  // The plan holds its own references: the pages stay valid even if the lease ends mid-stream.
  for (uint64_t off : offsets) pool_->Ref(off);
  return std::make_unique<ReadPlan>(pool_, std::move(pages), std::move(offsets));
}

void PageCache::UnpinPage(const PinnedPage& p) {
  {
    Shard& shard = ShardFor(p.key);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.map.find(p.key);
    if (it != shard.map.end() && it->second.gen == p.gen && it->second.pins > 0) {
      if (--it->second.pins == 0) counters_.pinned_pages.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  pool_->Unref(p.offset);
}

void PageCache::ReleaseLease(Lease& lease) {
  for (const PinnedPage& p : lease.pages) UnpinPage(p);
  counters_.leases.fetch_sub(1, std::memory_order_relaxed);
  if (Tenant* t = tenants_->tenant(lease.tenant)) {
    t->Refund(Quota::kLeases, 1);
    t->Refund(Quota::kPinnedPages, lease.pages.size());
  }
}

absl::Status PageCache::Release(const Caller& caller, uint64_t lease_id) {
  Lease lease;
  {
    LeaseShard& ls = LeaseShardFor(lease_id);
    absl::MutexLock lock(&ls.mu);
    auto it = ls.map.find(lease_id);
    // Another tenant's lease is as unknown as a released one: nothing to do.
    if (it == ls.map.end() || it->second.tenant != caller.tenant_id) return absl::OkStatus();
    lease = std::move(it->second);
    ls.map.erase(it);
  }
  ReleaseLease(lease);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PageCache::RenewLease(const Caller& caller,
                                               const RenewLeaseArgs& args) {
  LeaseShard& ls = LeaseShardFor(args.lease_id);
  absl::MutexLock lock(&ls.mu);
  auto it = ls.map.find(args.lease_id);
  const int64_t now = clock_->NowMs();
  if (it == ls.map.end() || it->second.deadline_ms < now ||
      it->second.tenant != caller.tenant_id) {
    return absl::NotFoundError(
        absl::StrCat("lease ", args.lease_id, " is unknown, expired or released"));
  }
  uint32_t ms = args.lease_ms == 0 ? options_.default_lease_ms : args.lease_ms;
  ms = std::min(ms, options_.max_lease_ms);
  it->second.deadline_ms = now + ms;
  return static_cast<uint64_t>(clock_->UnixMs() + ms);
}

absl::StatusOr<std::vector<absl::Status>> PageCache::Delete(const Caller& caller,
                                                            const DeleteArgs& args) {
  if (auto t = TenantOf(caller); !t.ok()) return t.status();
  auto codec = FindCodec(caller, args.codec);
  if (!codec.ok()) return codec.status();
  if (absl::Status s = CheckBatch(args.keys.size(), "keys"); !s.ok()) return s;
  std::vector<absl::Status> results;
  results.reserve(args.keys.size());
  for (const BlockKey& key : args.keys) {
    const IndexKey k{(*codec)->index, key};
    absl::Status s;
    uint64_t unref = 0;
    bool drop = false;
    {
      Shard& shard = ShardFor(k);
      absl::MutexLock lock(&shard.mu);
      auto it = shard.map.find(k);
      if (it == shard.map.end() || !it->second.committed) {
        s = absl::NotFoundError("not stored");
      } else {
        if (it->second.pins > 0) {
          s = absl::FailedPreconditionError(
              "pinned by a lease: removed from the index, its memory is freed when the lease "
              "ends");
        }
        unref = it->second.offset;
        drop = true;
        EraseCommittedLocked(shard, it);
      }
    }
    if (drop) {
      pool_->Unref(unref);
      counters_.deletes.fetch_add(1, std::memory_order_relaxed);
    }
    if (tier_ != nullptr) {  // the tier's copy goes too (outside the shard lock: disk I/O)
      const absl::Status t = DeleteFromTier(k);
      if (!drop && t.ok()) {
        s = absl::OkStatus();
        counters_.deletes.fetch_add(1, std::memory_order_relaxed);
      }
    }
    results.push_back(std::move(s));
  }
  return results;
}

absl::StatusOr<uint64_t> PageCache::Clear(const Caller& caller, const ClearArgs& args) {
  if (auto t = TenantOf(caller); !t.ok()) return t.status();
  // Which codec registrations go: a tenant's are those of its namespace; an admin's Clear reaches
  // every namespace (all codecs, or the registrations of one codec id in each).
  bool selected[kMaxCodecs] = {};
  bool any = false;
  std::vector<CodecRef> held;  // the selected registrations stay what they are until the end
  const size_t ncodecs = num_codecs_.load(std::memory_order_acquire);
  for (size_t i = 0; i < ncodecs; ++i) {
    CodecRef ref = CodecRef::Acquire(codecs_[i].get(), 0);
    if (ref.get() == nullptr) continue;  // a free slot
    const Codec& c = *ref.get();
    if (!caller.admin && c.ns != caller.ns) continue;
    if (args.codec.has_value() && c.id != *args.codec) continue;
    selected[i] = any = true;
    held.push_back(std::move(ref));
  }
  if (!any) return uint64_t{0};  // an unknown codec removes nothing
  const bool all = caller.admin && !args.codec.has_value();
  uint64_t removed = 0;
  std::vector<uint64_t> unref;
  for (uint32_t s = 0; s < options_.index_shards; ++s) {
    Shard& shard = shards_[s];
    unref.clear();
    {
      absl::MutexLock lock(&shard.mu);
      for (auto it = shard.map.begin(); it != shard.map.end();) {
        const Entry& e = it->second;
        auto cur = it++;
        if (!e.committed || !selected[cur->first.codec]) continue;
        if (e.pins > 0 && !args.include_pinned) continue;
        unref.push_back(e.offset);
        EraseCommittedLocked(shard, cur);
      }
      shard.ring.clear();
      shard.hand = 0;
      for (auto& [k, e] : shard.map) {
        if (e.committed) shard.ring.push_back({k, e.gen});
      }
    }
    for (uint64_t off : unref) pool_->Unref(off);
    removed += unref.size();
  }
  if (tier_ != nullptr) {
    if (all) {
      removed += ClearTier(-1);
    } else {
      for (size_t i = 0; i < ncodecs; ++i) {
        if (selected[i]) removed += ClearTier(static_cast<int64_t>(i));
      }
    }
  }
  return removed;
}

void PageCache::Reap() {
  ReapHandles();
  const int64_t now = clock_->NowMs();
  for (LeaseShard& ls : lease_shards_) {
    std::vector<Lease> expired;
    {
      absl::MutexLock lock(&ls.mu);
      for (auto it = ls.map.begin(); it != ls.map.end();) {
        auto cur = it++;
        if (cur->second.deadline_ms < now) {
          expired.push_back(std::move(cur->second));
          ls.map.erase(cur);
        }
      }
    }
    for (Lease& l : expired) {
      ReleaseLease(l);
      counters_.leases_expired.fetch_add(1, std::memory_order_relaxed);
    }
  }
  for (ReservationShard& rs : res_shards_) {
    std::vector<std::shared_ptr<Reservation>> expired;
    {
      absl::MutexLock lock(&rs.mu);
      for (auto it = rs.map.begin(); it != rs.map.end();) {
        auto cur = it++;
        if (cur->second->deadline_ms < now) {
          expired.push_back(std::move(cur->second));
          rs.map.erase(cur);
        }
      }
    }
    for (auto& r : expired) {
      bool pending;
      {
        absl::MutexLock rl(&r->mu);
        pending = r->pending > 0;
      }
      AbortReservation(*r, /*expired=*/pending);
    }
  }
}

}  // namespace oscarkv::service
