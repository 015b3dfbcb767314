#include "oscarkv/service/page_cache.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "oscarkv/proto/codec_convert.h"
#include "page_cache_internal.h"

namespace oscarkv::service {

struct PageCache::Reservation {
  struct Item {
    IndexKey key;
    uint64_t gen = 0;
    uint64_t offset = 0;
    uint64_t page_bytes = 0;
    PageKind kind = PageKind::kInt2;
    bool committed = false;
    bool released = false;  // aborted, expired or failed
    bool streamed = false;  // bytes came through WritePages: always verified here at Commit
  };
  uint64_t id = 0;
  const Codec* codec = nullptr;
  int64_t deadline_ms = 0;
  // Serializes WritePages copies, Commit verification and Abort/expiry of this reservation, so a
  // page can never change between its checksum check and its publication.
  absl::Mutex mu;
  std::vector<Item> items ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<BlockKey, uint32_t> by_key ABSL_GUARDED_BY(mu);
  size_t pending ABSL_GUARDED_BY(mu) = 0;
};

namespace {

bool ToBlockKey(const std::string& bytes, BlockKey* key) {
  if (bytes.size() != 16) return false;
  std::memcpy(key->bytes.data(), bytes.data(), 16);
  return true;
}

void SetItem(pb::ItemStatus* st, const absl::Status& s) {
  st->set_code(static_cast<int32_t>(s.code()));
  if (!s.ok()) st->set_message(std::string(s.message()));
}

}  // namespace

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

absl::Status PageCache::Lookup(const pb::LookupRequest& req, pb::LookupResponse* resp) {
  auto codec = FindCodec(req.codec_id());
  if (!codec.ok()) return codec.status();
  if (absl::Status s = CheckBatch(req.keys_size(), "keys"); !s.ok()) return s;
  for (int i = 0; i < req.keys_size(); ++i) {
    if (req.keys(i).size() != 16) {
      return absl::InvalidArgumentError(
          absl::StrCat("keys[", i, "] has ", req.keys(i).size(), " bytes; keys are 16 bytes"));
    }
  }
  counters_.lookups.fetch_add(1, std::memory_order_relaxed);
  const bool pin = req.pin();
  Lease lease;
  if (pin) lease.pages.reserve(req.keys_size());
  IndexKey k{(*codec)->index, {}};
  int matched = 0, promoted = -1;
  for (; matched < req.keys_size(); ++matched) {
    std::memcpy(k.key.bytes.data(), req.keys(matched).data(), 16);
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
      if (!Promote(k).ok()) break;
      promoted = matched--;  // the same key again, now from the pool (once)
      continue;
    }
    Entry& e = it->second;
    if (!pin) continue;
    e.referenced = true;
    if (e.pins++ == 0) counters_.pinned_pages.fetch_add(1, std::memory_order_relaxed);
    pool_->Ref(e.offset);
    lease.pages.push_back({k, e.gen, e.offset, e.page_bytes});
    pb::PageRef* ref = resp->add_pages();
    ref->set_key(req.keys(matched));
    ref->set_offset(e.offset);
    ref->set_bytes(e.page_bytes);
    ref->set_kind(proto::ToProto(e.kind));
    ref->set_token_count(e.token_count);
  }
  counters_.hits.fetch_add(matched, std::memory_order_relaxed);
  counters_.misses.fetch_add(req.keys_size() - matched, std::memory_order_relaxed);
  resp->set_matched(matched);
  if (pin && matched > 0) {
    uint32_t ms = req.lease_ms() == 0 ? options_.default_lease_ms : req.lease_ms();
    ms = std::min(ms, options_.max_lease_ms);
    const int64_t now = clock_->NowMs();
    lease.deadline_ms = now + ms;
    const uint64_t id = NewId();
    resp->set_lease_id(id);
    resp->set_lease_deadline_unix_ms(clock_->UnixMs() + ms);
    LeaseShard& ls = LeaseShardFor(id);
    absl::MutexLock lock(&ls.mu);
    ls.map.emplace(id, std::move(lease));
    counters_.leases.fetch_add(1, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

bool PageCache::EvictOne(SizeClassId want) {
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
        if (e.pins > 0) {
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
      const bool other_class = pool_->SpanOfSlot(victim, &span).ok() && span.cls != want;
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

absl::Status PageCache::Reserve(const pb::ReserveRequest& req, pb::ReserveResponse* resp) {
  auto codec_or = FindCodec(req.codec_id());
  if (!codec_or.ok()) return codec_or.status();
  const Codec* codec = *codec_or;
  if (absl::Status s = CheckBatch(req.items_size(), "items"); !s.ok()) return s;
  auto res = std::make_shared<Reservation>();
  res->id = NewId();
  res->codec = codec;
  uint32_t ttl = req.ttl_ms() == 0 ? options_.reservation_ttl_ms : req.ttl_ms();
  ttl = std::min(ttl, options_.max_reservation_ttl_ms);
  res->deadline_ms = clock_->NowMs() + ttl;
  // Not yet published, but Commit/WritePages/OpenReservations lock it once it is: fill it under
  // its own lock, and release that before taking the table lock (lock order: table, then
  // reservation).
  absl::ReleasableMutexLock res_lock(&res->mu);
  for (int i = 0; i < req.items_size(); ++i) {
    const pb::ReserveItem& item = req.items(i);
    pb::ReserveResult* out = resp->add_results();
    IndexKey k{codec->index, {}};
    if (!ToBlockKey(item.key(), &k.key)) {
      SetItem(out->mutable_status(),
              absl::InvalidArgumentError(absl::StrCat("key has ", item.key().size(),
                                                      " bytes; keys are 16 bytes")));
      continue;
    }
    if (item.kind() != pb::PAGE_KIND_INT2 && item.kind() != pb::PAGE_KIND_BF16) {
      SetItem(out->mutable_status(),
              absl::InvalidArgumentError(absl::StrCat("page kind ", static_cast<int>(item.kind()),
                                                      " is not INT2 (1) or BF16 (2)")));
      continue;
    }
    const auto kind = static_cast<PageKind>(item.kind());
    const int kind_index = static_cast<int>(kind);
    if (!codec->cls[kind_index].ok()) {
      SetItem(out->mutable_status(),
              absl::ResourceExhaustedError(absl::StrCat(
                  "a ", PageKindName(kind), " page of this codec does not fit in the pool: ",
                  codec->cls[kind_index].status().message())));
      counters_.reserve_failures.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // Claim the key with a slotless placeholder first: concurrent Reserves of the key converge
    // on whoever inserted it, and no shard lock is held while allocating (which may evict).
    if (tier_ != nullptr && InTier(k)) {
      SetItem(out->mutable_status(), absl::AlreadyExistsError("already stored (in the SSD tier)"));
      counters_.dedup_rejects.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const uint64_t gen = next_gen_.fetch_add(1, std::memory_order_relaxed);
    Shard& shard = ShardFor(k);
    {
      absl::MutexLock lock(&shard.mu);
      auto [it, inserted] = shard.map.try_emplace(k);
      if (!inserted) {
        if (it->second.committed) {
          SetItem(out->mutable_status(), absl::AlreadyExistsError("already stored"));
          counters_.dedup_rejects.fetch_add(1, std::memory_order_relaxed);
        } else {
          // Only reserved: the page is not stored yet and may never be (its Commit can fail).
          // Never ALREADY_EXISTS here, which clients count as stored.
          SetItem(out->mutable_status(),
                  absl::AbortedError(absl::StrCat(
                      "being stored by reservation ", it->second.reservation_id,
                      " (not committed yet); retry shortly: it commits, fails or expires")));
          counters_.in_progress_rejects.fetch_add(1, std::memory_order_relaxed);
        }
        continue;
      }
      it->second.gen = gen;
      it->second.reservation_id = res->id;
      it->second.kind = kind;
      it->second.page_bytes = codec->page_bytes[kind_index];
    }
    auto off = AllocateSlot(*codec->cls[kind_index]);
    {
      absl::MutexLock lock(&shard.mu);
      auto it = shard.map.find(k);
      // Placeholders are only removed by their own reservation, which is not published yet.
      const bool ours = it != shard.map.end() && it->second.gen == gen;
      if (!off.ok()) {
        if (ours) shard.map.erase(it);
      } else if (ours) {
        it->second.offset = *off;
        it->second.has_slot = true;
      } else {
        pool_->Unref(*off);
        off = absl::InternalError("reservation placeholder vanished");
      }
    }
    if (!off.ok()) {
      SetItem(out->mutable_status(), off.status());
      counters_.reserve_failures.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    Reservation::Item ri;
    ri.key = k;
    ri.gen = gen;
    ri.offset = *off;
    ri.page_bytes = codec->page_bytes[kind_index];
    ri.kind = kind;
    res->by_key.emplace(k.key, static_cast<uint32_t>(res->items.size()));
    res->items.push_back(ri);
    ++res->pending;
    counters_.reserved.fetch_add(1, std::memory_order_relaxed);
    counters_.reserved_pages.fetch_add(1, std::memory_order_relaxed);
    SetItem(out->mutable_status(), absl::OkStatus());
    pb::PageRef* slot = out->mutable_slot();
    slot->set_key(item.key());
    slot->set_offset(*off);
    slot->set_bytes(ri.page_bytes);
    slot->set_kind(item.kind());
  }
  const bool any = !res->items.empty();
  res_lock.Release();
  if (!any) return absl::OkStatus();
  resp->set_reservation_id(res->id);
  ReservationShard& rs = ResShardFor(res->id);
  absl::MutexLock lock(&rs.mu);
  rs.map.emplace(res->id, std::move(res));
  return absl::OkStatus();
}

absl::Status PageCache::Commit(const pb::CommitRequest& req, pb::CommitResponse* resp) {
  if (absl::Status s = CheckBatch(req.keys_size(), "keys"); !s.ok()) return s;
  std::shared_ptr<Reservation> res;
  {
    ReservationShard& rs = ResShardFor(req.reservation_id());
    absl::MutexLock lock(&rs.mu);
    auto it = rs.map.find(req.reservation_id());
    if (it != rs.map.end()) res = it->second;
  }
  if (res == nullptr) {
    return absl::NotFoundError(absl::StrCat("reservation ", req.reservation_id(),
                                            " is unknown, expired or aborted"));
  }
  absl::MutexLock res_lock(&res->mu);
  std::vector<uint32_t> todo;
  if (req.keys_size() == 0) {
    for (uint32_t i = 0; i < res->items.size(); ++i) todo.push_back(i);
  }
  auto commit_one = [&](uint32_t i) -> absl::Status {
    res->mu.AssertHeld();  // held by res_lock above; tells the thread-safety analysis
    Reservation::Item& item = res->items[i];
    if (item.committed) return absl::OkStatus();
    if (item.released) return absl::NotFoundError("slot was released (aborted or expired)");
    const std::span<const uint8_t> page(pool_->Data(item.offset), item.page_bytes);
    // The client library hashes shared-memory pages in its copy and commits only those that
    // matched (checksums_verified): no second pass over the bytes here. The header is checked
    // either way, and every load verifies the checksum again on the reader's side.
    const bool verify = !req.checksums_verified() || item.streamed;
    auto hdr = ParsePageHeader(page, res->codec->profile, verify);
    absl::Status bad;
    if (!hdr.ok()) {
      bad = hdr.status();
    } else if (hdr->kind != static_cast<uint8_t>(item.kind)) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "page is ", PageKindName(static_cast<PageKind>(hdr->kind)),
          " but the slot was reserved for ", PageKindName(item.kind)));
    } else {
      bad = CheckUnusedSlotsZero(page, *hdr);
    }
    if (!bad.ok()) {
      // A page that fails verification frees its slot and key at once: nothing of it stays
      // behind for a later Reserve of the key to mistake for a stored page.
      ReleaseItemLocked(*res, i);
      return absl::Status(bad.code(),
                          absl::StrCat(bad.message(), " (the slot was released; store the page ",
                                       "again with a new Reserve)"));
    }
    Shard& shard = ShardFor(item.key);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.map.find(item.key);
    if (it == shard.map.end() || it->second.gen != item.gen) {
      item.released = true;
      return absl::NotFoundError("slot no longer reserved");
    }
    it->second.committed = true;
    it->second.token_count = hdr->token_count;
    it->second.referenced = true;
    it->second.reservation_id = 0;
    shard.ring.push_back({item.key, item.gen});
    {
      absl::MutexLock off_lock(&offsets_mu_);
      key_at_[item.offset] = item.key;
    }
    item.committed = true;
    --res->pending;
    counters_.pages.fetch_add(1, std::memory_order_relaxed);
    counters_.reserved_pages.fetch_sub(1, std::memory_order_relaxed);
    counters_.commits.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  };
  if (req.keys_size() == 0) {
    for (uint32_t i : todo) {
      absl::Status s = commit_one(i);
      if (!s.ok()) counters_.commit_failures.fetch_add(1, std::memory_order_relaxed);
      SetItem(resp->add_results(), s);
    }
    return absl::OkStatus();
  }
  for (const std::string& kb : req.keys()) {
    BlockKey key;
    absl::Status s;
    if (!ToBlockKey(kb, &key)) {
      s = absl::InvalidArgumentError(
          absl::StrCat("key has ", kb.size(), " bytes; keys are 16 bytes"));
    } else if (auto it = res->by_key.find(key); it == res->by_key.end()) {
      s = absl::NotFoundError(absl::StrCat("key ", key.Hex(), " is not in reservation ", res->id));
    } else {
      s = commit_one(it->second);
    }
    if (!s.ok()) counters_.commit_failures.fetch_add(1, std::memory_order_relaxed);
    SetItem(resp->add_results(), s);
  }
  return absl::OkStatus();
}

void PageCache::ReleaseItemLocked(Reservation& res, uint32_t i) {
  res.mu.AssertHeld();
  Reservation::Item& item = res.items[i];
  if (item.committed || item.released) return;
  item.released = true;
  --res.pending;
  bool erased = false;
  {
    Shard& shard = ShardFor(item.key);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.map.find(item.key);
    if (it != shard.map.end() && it->second.gen == item.gen && !it->second.committed) {
      shard.map.erase(it);
      erased = true;
    }
  }
  if (erased) {
    pool_->Unref(item.offset);
    counters_.reserved_pages.fetch_sub(1, std::memory_order_relaxed);
    counters_.aborted_pages.fetch_add(1, std::memory_order_relaxed);
  }
}

void PageCache::AbortReservation(Reservation& res, bool expired) {
  absl::MutexLock res_lock(&res.mu);
  for (uint32_t i = 0; i < res.items.size(); ++i) ReleaseItemLocked(res, i);
  if (expired) counters_.reservations_expired.fetch_add(1, std::memory_order_relaxed);
}

absl::Status PageCache::Abort(const pb::AbortRequest& req, pb::AbortResponse*) {
  std::shared_ptr<Reservation> res;
  {
    ReservationShard& rs = ResShardFor(req.reservation_id());
    absl::MutexLock lock(&rs.mu);
    auto it = rs.map.find(req.reservation_id());
    if (it == rs.map.end()) return absl::OkStatus();
    res = std::move(it->second);
    rs.map.erase(it);
  }
  AbortReservation(*res, /*expired=*/false);
  return absl::OkStatus();
}

absl::Status PageCache::WriteChunk(const pb::WriteChunk& chunk, uint64_t* written) {
  *written = 0;
  BlockKey key;
  if (!ToBlockKey(chunk.key(), &key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key has ", chunk.key().size(), " bytes; keys are 16 bytes"));
  }
  std::shared_ptr<Reservation> res;
  {
    ReservationShard& rs = ResShardFor(chunk.reservation_id());
    absl::MutexLock lock(&rs.mu);
    auto it = rs.map.find(chunk.reservation_id());
    if (it != rs.map.end()) res = it->second;
  }
  if (res == nullptr) {
    return absl::NotFoundError(absl::StrCat("reservation ", chunk.reservation_id(),
                                            " is unknown, expired or aborted"));
  }
  absl::MutexLock res_lock(&res->mu);
  auto it = res->by_key.find(key);
  if (it == res->by_key.end()) {
    return absl::NotFoundError(
        absl::StrCat("key ", key.Hex(), " is not in reservation ", chunk.reservation_id()));
  }
  Reservation::Item& item = res->items[it->second];
  if (item.released) {
    return absl::NotFoundError(absl::StrCat("slot of key ", key.Hex(), " was released"));
  }
  if (item.committed) {
    return absl::FailedPreconditionError(
        absl::StrCat("key ", key.Hex(), " is already committed; committed pages are immutable"));
  }
  const uint64_t size = chunk.data().size();
  if (chunk.offset() > item.page_bytes || size > item.page_bytes - chunk.offset()) {
    return absl::OutOfRangeError(absl::StrCat("write of ", size, " bytes at offset ",
                                              chunk.offset(), " runs past the ", item.page_bytes,
                                              "-byte page"));
  }
  std::memcpy(pool_->Data(item.offset) + chunk.offset(), chunk.data().data(), size);
  item.streamed = true;
  *written = size;
  counters_.bytes_written.fetch_add(size, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ReadPlan>> PageCache::PrepareRead(const pb::ReadRequest& req) {
  if (absl::Status s = CheckBatch(req.keys_size(), "keys"); !s.ok()) return s;
  std::vector<ReadPlan::Page> pages;
  std::vector<uint64_t> offsets;
  LeaseShard& ls = LeaseShardFor(req.lease_id());
  absl::MutexLock lock(&ls.mu);
  auto it = ls.map.find(req.lease_id());
  if (it == ls.map.end() || it->second.deadline_ms < clock_->NowMs()) {
    return absl::NotFoundError(
        absl::StrCat("lease ", req.lease_id(), " is unknown, expired or released"));
  }
  const Lease& lease = it->second;
  auto add = [&](const PinnedPage& p) {
    pages.push_back({p.key.key, pool_->Data(p.offset), p.page_bytes});
    offsets.push_back(p.offset);
  };
  if (req.keys_size() == 0) {
    for (const PinnedPage& p : lease.pages) add(p);
  } else {
    for (const std::string& kb : req.keys()) {
      BlockKey key;
      if (!ToBlockKey(kb, &key)) {
        return absl::InvalidArgumentError(
            absl::StrCat("key has ", kb.size(), " bytes; keys are 16 bytes"));
      }
      auto p = std::find_if(lease.pages.begin(), lease.pages.end(),
                            [&](const PinnedPage& pp) { return pp.key.key == key; });
      if (p == lease.pages.end()) {
        return absl::NotFoundError(
            absl::StrCat("key ", key.Hex(), " is not pinned by lease ", req.lease_id()));
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
}

absl::Status PageCache::Release(const pb::ReleaseRequest& req, pb::ReleaseResponse*) {
  Lease lease;
  {
    LeaseShard& ls = LeaseShardFor(req.lease_id());
    absl::MutexLock lock(&ls.mu);
    auto it = ls.map.find(req.lease_id());
    if (it == ls.map.end()) return absl::OkStatus();
    lease = std::move(it->second);
    ls.map.erase(it);
  }
  ReleaseLease(lease);
  return absl::OkStatus();
}

absl::Status PageCache::RenewLease(const pb::RenewLeaseRequest& req,
                                   pb::RenewLeaseResponse* resp) {
  LeaseShard& ls = LeaseShardFor(req.lease_id());
  absl::MutexLock lock(&ls.mu);
  auto it = ls.map.find(req.lease_id());
  const int64_t now = clock_->NowMs();
  if (it == ls.map.end() || it->second.deadline_ms < now) {
    return absl::NotFoundError(
        absl::StrCat("lease ", req.lease_id(), " is unknown, expired or released"));
  }
  uint32_t ms = req.lease_ms() == 0 ? options_.default_lease_ms : req.lease_ms();
  ms = std::min(ms, options_.max_lease_ms);
  it->second.deadline_ms = now + ms;
  resp->set_lease_deadline_unix_ms(clock_->UnixMs() + ms);
  return absl::OkStatus();
}

absl::Status PageCache::Delete(const pb::DeleteRequest& req, pb::DeleteResponse* resp) {
  auto codec = FindCodec(req.codec_id());
  if (!codec.ok()) return codec.status();
  if (absl::Status s = CheckBatch(req.keys_size(), "keys"); !s.ok()) return s;
  for (const std::string& kb : req.keys()) {
    IndexKey k{(*codec)->index, {}};
    if (!ToBlockKey(kb, &k.key)) {
      SetItem(resp->add_results(),
              absl::InvalidArgumentError(
                  absl::StrCat("key has ", kb.size(), " bytes; keys are 16 bytes")));
      continue;
    }
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
    SetItem(resp->add_results(), s);
  }
  return absl::OkStatus();
}

absl::Status PageCache::Clear(const pb::ClearRequest& req, pb::ClearResponse* resp) {
  int64_t only = -1;
  if (!req.codec_id().empty()) {
    auto codec = FindCodec(req.codec_id());
    if (!codec.ok()) {
      if (codec.status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
      return codec.status();
    }
    only = (*codec)->index;
  }
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
        if (!e.committed || (only >= 0 && cur->first.codec != only)) continue;
        if (e.pins > 0 && !req.include_pinned()) continue;
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
  if (tier_ != nullptr) removed += ClearTier(only);
  resp->set_pages_removed(removed);
  return absl::OkStatus();
}

size_t PageCache::OpenReservations() const {
  size_t n = 0;
  for (const ReservationShard& rs : res_shards_) {
    absl::MutexLock lock(const_cast<absl::Mutex*>(&rs.mu));
    for (const auto& [id, r] : rs.map) {
      // Never wait behind a long Commit (Stats runs on a callback thread): a reservation that
      // is busy is being written or committed, so it counts as open.
      if (!r->mu.TryLock()) {
        ++n;
        continue;
      }
      n += r->pending > 0;
      r->mu.Unlock();
    }
  }
  return n;
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
