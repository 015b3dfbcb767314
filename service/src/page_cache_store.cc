// PageCache: storing pages -- Reserve, WritePages chunks, Commit (verification) and Abort.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "page_cache_internal.h"

namespace oscarkv::service {

absl::StatusOr<ReserveResult> PageCache::Reserve(const Caller& caller, const ReserveArgs& args) {
  auto tenant_or = TenantOf(caller);
  if (!tenant_or.ok()) return tenant_or.status();
  Tenant& tenant = **tenant_or;
  auto codec_or = FindCodec(caller, args.codec);
  if (!codec_or.ok()) return codec_or.status();
  const Codec* codec = codec_or->get();  // held (codec_or) until Reserve returns
  if (absl::Status s = CheckBatch(args.items.size(), "items"); !s.ok()) return s;
  ReserveResult result;
  result.items.resize(args.items.size());
  auto res = std::make_shared<Reservation>();
  res->id = NewId();
  res->tenant = tenant.id();
  res->codec = codec;
  res->codec_serial = codec->live.load(std::memory_order_relaxed);
  uint32_t ttl = args.ttl_ms == 0 ? options_.reservation_ttl_ms : args.ttl_ms;
  ttl = std::min(ttl, options_.max_reservation_ttl_ms);
  res->deadline_ms = clock_->NowMs() + ttl;
  // Not yet published, but Commit/WritePages/OpenReservations lock it once it is: fill it under
  // its own lock, and release that before taking the table lock (lock order: table, then
  // reservation).
  absl::ReleasableMutexLock res_lock(&res->mu);
  for (size_t i = 0; i < args.items.size(); ++i) {
    const ReserveItem& item = args.items[i];
    ReserveItemResult* out = &result.items[i];
    const IndexKey k{codec->index, item.key};
    if (item.kind != PageKind::kInt2 && item.kind != PageKind::kBf16) {
      out->status = absl::InvalidArgumentError(absl::StrCat(
          "page kind ", static_cast<int>(item.kind), " is not INT2 (1) or BF16 (2)"));
      continue;
    }
    const PageKind kind = item.kind;
    const int kind_index = static_cast<int>(kind);
    if (!codec->cls[kind_index].ok()) {
      out->status = absl::ResourceExhaustedError(
          absl::StrCat("a ", PageKindName(kind), " page of this codec does not fit in the pool: ",
                       codec->cls[kind_index].status().message()));
      counters_.reserve_failures.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // Claim the key with a slotless placeholder first: concurrent Reserves of the key converge
    // on whoever inserted it, and no shard lock is held while allocating (which may evict).
    if (tier_ != nullptr && InTier(k)) {
      out->status = absl::AlreadyExistsError("already stored (in the SSD tier)");
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
          out->status = absl::AlreadyExistsError("already stored");
          counters_.dedup_rejects.fetch_add(1, std::memory_order_relaxed);
        } else {
          // Only reserved: the page is not stored yet and may never be (its Commit can fail).
          // Never ALREADY_EXISTS here, which clients count as stored.
          out->status = absl::AbortedError(
              absl::StrCat("being stored by reservation ", it->second.reservation_id,
                           " (not committed yet); retry shortly: it commits, fails or expires"));
          counters_.in_progress_rejects.fetch_add(1, std::memory_order_relaxed);
        }
        continue;
      }
      it->second.gen = gen;
      it->second.reservation_id = res->id;
      it->second.owner = tenant.id();
      it->second.kind = kind;
      it->second.page_bytes = codec->page_bytes[kind_index];
    }
    // The tenant's pool quota first (which may evict its own pages), then a slot.
    const absl::Status charge = ChargePool(tenant, codec->page_bytes[kind_index]);
    const bool charged = charge.ok();
    absl::StatusOr<uint64_t> off =
        charged ? AllocateSlot(*codec->cls[kind_index]) : absl::StatusOr<uint64_t>(charge);
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
      if (charged) tenant.Refund(Quota::kPoolBytes, codec->page_bytes[kind_index]);
      out->status = off.status();
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
    res->items.push_back(std::move(ri));
    ++res->pending;
    counters_.reserved.fetch_add(1, std::memory_order_relaxed);
    counters_.reserved_pages.fetch_add(1, std::memory_order_relaxed);
    out->slot = {item.key, *off, ri.page_bytes, kind, 0};
  }
  const bool any = !res->items.empty();
  res_lock.Release();
  if (!any) return result;
  result.reservation_id = res->id;
  ReservationShard& rs = ResShardFor(res->id);
  absl::MutexLock lock(&rs.mu);
  rs.map.emplace(res->id, std::move(res));
  return result;
}

absl::StatusOr<std::vector<absl::Status>> PageCache::Commit(const Caller& caller,
                                                            const CommitArgs& args) {
  if (!args.all_items) {
    if (absl::Status s = CheckBatch(args.keys.size(), "keys"); !s.ok()) return s;
  }
  std::shared_ptr<Reservation> res;
  {
    ReservationShard& rs = ResShardFor(args.reservation_id);
    absl::MutexLock lock(&rs.mu);
    auto it = rs.map.find(args.reservation_id);
    if (it != rs.map.end() && it->second->tenant == caller.tenant_id) res = it->second;
  }
  if (res == nullptr) {
    return absl::NotFoundError(absl::StrCat("reservation ", args.reservation_id,
                                            " is unknown, expired or aborted"));
  }
  // Its codec is read below: held for the call (UnregisterCodec drops its reservations).
  const CodecRef codec_ref = CodecRef::Acquire(res->codec, res->codec_serial);
  if (codec_ref.get() == nullptr) {
    return absl::NotFoundError(absl::StrCat("reservation ", args.reservation_id,
                                            " is of a codec that was unregistered"));
  }
  absl::MutexLock res_lock(&res->mu);
  std::vector<absl::Status> results;
  auto commit_one = [&](uint32_t i) -> absl::Status {
    res->mu.AssertHeld();  // held by res_lock above; tells the thread-safety analysis
    Reservation::Item& item = res->items[i];
    if (item.committed) return absl::OkStatus();
    if (item.released) return absl::NotFoundError("slot was released (aborted or expired)");
    const std::span<const uint8_t> page(pool_->Data(item.offset), item.page_bytes);
    // One pass over the bytes per side: the client library hashes shared-memory pages in its
    // copy and commits only those that matched (checksums_verified), and WritePages hashed
    // streamed pages in its copy into the slot (item.hash) -- neither is read again here. A page
    // with neither (a stream out of order, a client that did not verify) is hashed now. The
    // header is checked either way, and every load verifies the checksum again on the reader's
    // side.
    // An isolated pool (sealed: clients map it read-only, pages arrive through StageWrite,
    // which is WritePages from the client's staging region) ignores checksums_verified: no
    // client wrote the slot, so none can vouch for it.
    const bool hashed_in_copy = item.streamed && !item.hash_broken && item.hash != nullptr &&
                                item.hash->offset() == item.page_bytes;
    const bool client_verified = args.checksums_verified && !pool_->arena().sealed();
    const bool verify = !hashed_in_copy && (!client_verified || item.streamed);
    if (verify) counters_.commit_rehashes.fetch_add(1, std::memory_order_relaxed);
    auto hdr = ParsePageHeader(page, res->codec->profile, verify);
    absl::Status bad;
    if (!hdr.ok()) {
      bad = hdr.status();
    } else if (hashed_in_copy && item.hash->Digest() != hdr->checksum) {
      bad = absl::DataLossError("page checksum mismatch: the page is corrupt");
    } else if (hdr->kind != static_cast<uint8_t>(item.kind)) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "page is ", PageKindName(static_cast<PageKind>(hdr->kind)),
          " but the slot was reserved for ", PageKindName(item.kind)));
    } else {
      bad = CheckUnusedSlotsZero(page, *hdr);
    }
    item.hash.reset();  // verified or not, the page is done with it
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
    if (Tenant* t = tenants_->tenant(it->second.owner)) {
      t->pages.fetch_add(1, std::memory_order_relaxed);
    }
    counters_.reserved_pages.fetch_sub(1, std::memory_order_relaxed);
    counters_.commits.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  };
  if (args.all_items) {
    results.reserve(res->items.size());
    for (uint32_t i = 0; i < res->items.size(); ++i) {
      absl::Status s = commit_one(i);
      if (!s.ok()) counters_.commit_failures.fetch_add(1, std::memory_order_relaxed);
      results.push_back(std::move(s));
    }
    return results;
  }
  results.reserve(args.keys.size());
  for (const BlockKey& key : args.keys) {
    absl::Status s;
    if (auto it = res->by_key.find(key); it == res->by_key.end()) {
      s = absl::NotFoundError(absl::StrCat("key ", key.Hex(), " is not in reservation ", res->id));
    } else {
      s = commit_one(it->second);
    }
    if (!s.ok()) counters_.commit_failures.fetch_add(1, std::memory_order_relaxed);
    results.push_back(std::move(s));
  }
  return results;
}

void PageCache::ReleaseItemLocked(Reservation& res, uint32_t i) {
  res.mu.AssertHeld();
  Reservation::Item& item = res.items[i];
  if (item.committed || item.released) return;
  item.released = true;
  item.hash.reset();
  --res.pending;
  bool erased = false;
  uint32_t owner = 0;
  {
    Shard& shard = ShardFor(item.key);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.map.find(item.key);
    if (it != shard.map.end() && it->second.gen == item.gen && !it->second.committed) {
      owner = it->second.owner;
      shard.map.erase(it);
      erased = true;
    }
  }
  if (erased) {
    if (Tenant* t = tenants_->tenant(owner)) t->Refund(Quota::kPoolBytes, item.page_bytes);
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

absl::Status PageCache::Abort(const Caller& caller, uint64_t reservation_id) {
  std::shared_ptr<Reservation> res;
  {
    ReservationShard& rs = ResShardFor(reservation_id);
    absl::MutexLock lock(&rs.mu);
    auto it = rs.map.find(reservation_id);
    // Another tenant's reservation is as unknown as an aborted one.
    if (it == rs.map.end() || it->second->tenant != caller.tenant_id) return absl::OkStatus();
    res = std::move(it->second);
    rs.map.erase(it);
  }
  AbortReservation(*res, /*expired=*/false);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PageCache::WriteChunk(const Caller& caller,
                                               const WriteChunkArgs& chunk) {
  const BlockKey& key = chunk.key;
  std::shared_ptr<Reservation> res;
  {
    ReservationShard& rs = ResShardFor(chunk.reservation_id);
    absl::MutexLock lock(&rs.mu);
    auto it = rs.map.find(chunk.reservation_id);
    if (it != rs.map.end() && it->second->tenant == caller.tenant_id) res = it->second;
  }
  if (res == nullptr) {
    return absl::NotFoundError(absl::StrCat("reservation ", chunk.reservation_id,
                                            " is unknown, expired or aborted"));
  }
  absl::MutexLock res_lock(&res->mu);
  auto it = res->by_key.find(key);
  if (it == res->by_key.end()) {
    return absl::NotFoundError(
        absl::StrCat("key ", key.Hex(), " is not in reservation ", chunk.reservation_id));
  }
  Reservation::Item& item = res->items[it->second];
  if (item.released) {
    return absl::NotFoundError(absl::StrCat("slot of key ", key.Hex(), " was released"));
  }
  if (item.committed) {
    return absl::FailedPreconditionError(
        absl::StrCat("key ", key.Hex(), " is already committed; committed pages are immutable"));
  }
  const uint64_t size = chunk.data.size();
  if (chunk.offset > item.page_bytes || size > item.page_bytes - chunk.offset) {
    return absl::OutOfRangeError(absl::StrCat("write of ", size, " bytes at offset ",
                                              chunk.offset, " runs past the ", item.page_bytes,
                                              "-byte page"));
  }
  item.streamed = true;
  if (size == 0) return size;
  uint8_t* dst = pool_->Data(item.offset) + chunk.offset;
  const uint64_t hashed = item.hash == nullptr ? 0 : item.hash->offset();
  if (!item.hash_broken && chunk.offset == hashed) {
    // In order: copied and hashed in one pass (the hash folds the very bytes it stores), with
    // the hash state carried from chunk to chunk, so the page is read from memory once.
    if (item.hash == nullptr) item.hash = std::make_unique<PageCopyChecksummer>(item.page_bytes);
    item.hash->Copy(std::span<uint8_t>(pool_->Data(item.offset), item.page_bytes), chunk.data);
  } else {
    item.hash_broken = true;  // Commit hashes the whole slot
    item.hash.reset();
    std::memcpy(dst, chunk.data.data(), size);
  }
  counters_.bytes_written.fetch_add(size, std::memory_order_relaxed);
  return size;
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


}  // namespace oscarkv::service
