#include "oscarkv/service/page_cache.h"

#include <cstddef>
#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "oscarkv/kernels/page_checksum.h"
#include "test_pages.h"

namespace oscarkv::service {
namespace {

using testing::BKey;
using testing::Bytes;
using testing::MakePage;
using testing::TinyProfile;
using Code = absl::StatusCode;

class PageCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { Init(1 << 20, 4); }

  void Init(size_t pool_bytes, uint32_t shards, uint32_t max_batch = 4096) {
    cache_.reset();
    auto arena = CreateHeapArena(pool_bytes);
    ASSERT_TRUE(arena.ok());
    PagePoolOptions po;
    po.chunk_bytes = 64 << 10;
    pool_ = std::move(*PagePool::Create(std::move(*arena), po));
    CacheOptions co;
    co.index_shards = shards;
    co.max_batch = max_batch;
    co.default_lease_ms = 1000;
    co.max_lease_ms = 5000;
    co.reservation_ttl_ms = 2000;
    co.node_id = "test-node";
    cache_ = std::make_unique<PageCache>(pool_.get(), &clock_, co);
    codec_ = Register(TinyProfile());
  }

  CodecId Register(const v1::CodecProfile& p) {
    auto reg = cache_->RegisterCodec(caller_, testing::ToProfile(p));
    EXPECT_TRUE(reg.ok()) << reg.status();
    return reg.ok() ? reg->id : CodecId{};
  }

  ReserveResult Reserve(const std::vector<BlockKey>& keys, PageKind kind = PageKind::kInt2) {
    ReserveArgs args;
    args.codec = codec_;
    for (const auto& k : keys) args.items.push_back({k, kind});
    auto r = cache_->Reserve(caller_, args);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : ReserveResult{};
  }

  absl::Status Write(uint64_t res, const BlockKey& key, const std::string& bytes,
                     uint64_t offset = 0) {
    return cache_->WriteChunk(caller_, {res, key, offset, Bytes(bytes)}).status();
  }

  // Commits `keys` of the reservation, or every item when `keys` is empty.
  std::vector<absl::Status> Commit(uint64_t res, const std::vector<BlockKey>& keys = {}) {
    CommitArgs args;
    args.reservation_id = res;
    args.all_items = keys.empty();
    args.keys = keys;
    auto r = cache_->Commit(caller_, args);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : std::vector<absl::Status>{};
  }

  // Reserve + write (in two chunks) + commit; page i gets seed i.
  void Store(const std::vector<uint32_t>& ids, uint32_t salt = 0) {
    std::vector<BlockKey> keys;
    for (uint32_t i : ids) keys.push_back(BKey(i, salt));
    auto r = Reserve(keys);
    for (size_t j = 0; j < ids.size(); ++j) {
      ASSERT_TRUE(r.items[j].status.ok()) << r.items[j].status;
      const std::string page = MakePage(TinyProfile(), PageKind::kInt2, ids[j]);
      ASSERT_TRUE(Write(r.reservation_id, keys[j], page.substr(0, 100)).ok());
      ASSERT_TRUE(Write(r.reservation_id, keys[j], page.substr(100), 100).ok());
    }
    auto c = Commit(r.reservation_id);
    ASSERT_EQ(c.size(), ids.size());
    for (auto& s : c) ASSERT_TRUE(s.ok()) << s;
  }

  LookupResult Lookup(const std::vector<BlockKey>& keys, bool pin, uint32_t ms = 0) {
    auto r = cache_->Lookup(caller_, {codec_, keys, pin, ms});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : LookupResult{};
  }

  void ReleaseLease(uint64_t id) { EXPECT_TRUE(cache_->Release(caller_, id).ok()); }

  CacheStats Stats() {
    auto st = cache_->Stats(caller_);
    EXPECT_TRUE(st.ok());
    return st.ok() ? *st : CacheStats{};
  }

  std::string PageAt(uint64_t offset, size_t bytes) {
    return std::string(reinterpret_cast<const char*>(pool_->Data(offset)), bytes);
  }

  const Caller caller_{};
  FakeClock clock_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<PageCache> cache_;
  CodecId codec_;
};

TEST_F(PageCacheTest, HandshakeChecksWireVersion) {
  auto bad = cache_->Handshake(caller_, {7});
  EXPECT_EQ(bad.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(bad.status().message().find("7"), absl::string_view::npos);
  EXPECT_NE(bad.status().message().find("1"), absl::string_view::npos);
  auto info = cache_->Handshake(caller_, {1});
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->wire_version, 1u);
  EXPECT_EQ(info->max_batch, 4096u);
  EXPECT_EQ(info->node_id, "test-node");
  EXPECT_EQ(info->shm_path, "");  // heap arena: no fast path
  EXPECT_EQ(info->shm_bytes, 0u);
}

TEST_F(PageCacheTest, RegisterCodecIsIdempotentAndValidates) {
  CodecProfile prof = testing::ToProfile(TinyProfile());
  auto a = cache_->RegisterCodec(caller_, prof);
  auto b = cache_->RegisterCodec(caller_, prof);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->id, b->id);
  EXPECT_EQ(a->id, codec_);
  EXPECT_EQ(a->int2_page_bytes, 832u);
  EXPECT_EQ(a->bf16_page_bytes, 4160u);
  EXPECT_EQ(a->id, prof.Id());
  EXPECT_EQ(cache_->codecs(), 1u);
  prof.head_dim = 100;
  EXPECT_EQ(cache_->RegisterCodec(caller_, prof).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(cache_->codecs(), 1u);
}

TEST_F(PageCacheTest, UnknownCodecsBatchLimitsAndBadKindsGetClearCodes) {
  CodecId unknown;
  unknown.bytes.fill('x');
  const std::vector<BlockKey> one = {BKey(1)};
  EXPECT_EQ(cache_->Lookup(caller_, {unknown, one, false, 0}).status().code(), Code::kNotFound);
  EXPECT_EQ(cache_->Reserve(caller_, {unknown, {{BKey(1), PageKind::kInt2}}, 0}).status().code(),
            Code::kNotFound);
  EXPECT_EQ(cache_->Delete(caller_, {unknown, one}).status().code(), Code::kNotFound);
  auto cleared = cache_->Clear(caller_, {unknown, false});
  ASSERT_TRUE(cleared.ok());  // an unknown codec has no pages
  EXPECT_EQ(*cleared, 0u);

  Init(1 << 20, 4, /*max_batch=*/8);
  std::vector<BlockKey> nine;
  for (uint32_t i = 0; i < 9; ++i) nine.push_back(BKey(i));
  EXPECT_EQ(cache_->Lookup(caller_, {codec_, nine, false, 0}).status().code(),
            Code::kInvalidArgument);
  CommitArgs many;
  many.keys = nine;
  EXPECT_EQ(cache_->Commit(caller_, many).status().code(), Code::kInvalidArgument);

  // A kind that is neither INT2 nor BF16 fails its item only.
  ReserveArgs rr;
  rr.codec = codec_;
  rr.items.push_back({BKey(1), static_cast<PageKind>(0)});
  rr.items.push_back({BKey(2), static_cast<PageKind>(3)});
  auto rresp = cache_->Reserve(caller_, rr);
  ASSERT_TRUE(rresp.ok());
  ASSERT_EQ(rresp->items.size(), 2u);
  EXPECT_EQ(rresp->items[0].status.code(), Code::kInvalidArgument);
  EXPECT_NE(rresp->items[0].status.message().find("page kind 0"), std::string::npos);
  EXPECT_EQ(rresp->items[1].status.code(), Code::kInvalidArgument);
  EXPECT_EQ(rresp->reservation_id, 0u);
}

TEST_F(PageCacheTest, StoreLookupReadRoundTrip) {
  Store({0, 1, 2});
  auto miss = Lookup({BKey(5), BKey(0)}, true);
  EXPECT_EQ(miss.matched, 0u);
  EXPECT_EQ(miss.lease_id, 0u);
  auto probe = Lookup({BKey(0), BKey(1), BKey(2), BKey(3), BKey(4)}, false);
  EXPECT_EQ(probe.matched, 3u);
  EXPECT_EQ(probe.pages.size(), 0u);
  EXPECT_EQ(probe.lease_id, 0u);

  auto hit = Lookup({BKey(0), BKey(1), BKey(2), BKey(3)}, true);
  ASSERT_EQ(hit.matched, 3u);
  ASSERT_NE(hit.lease_id, 0u);
  EXPECT_EQ(hit.lease_deadline_unix_ms, static_cast<uint64_t>(clock_.UnixMs() + 1000));
  ASSERT_EQ(hit.pages.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    const PageRef& ref = hit.pages[i];
    EXPECT_EQ(ref.key, BKey(i));
    EXPECT_EQ(ref.bytes, 832u);
    EXPECT_EQ(ref.kind, PageKind::kInt2);
    EXPECT_EQ(ref.token_count, 16u);
    EXPECT_EQ(ref.offset % 64, 0u);
    // The fast path: the bytes at the offset are the page.
    EXPECT_EQ(PageAt(ref.offset, ref.bytes), MakePage(TinyProfile(), PageKind::kInt2, i));
  }
  auto plan = cache_->PrepareRead(caller_, {hit.lease_id, {BKey(1)}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ((*plan)->pages().size(), 1u);
  const auto& pg = (*plan)->pages()[0];
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(pg.data), pg.bytes),
            MakePage(TinyProfile(), PageKind::kInt2, 1));
  auto all = cache_->PrepareRead(caller_, {hit.lease_id, {}});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)->pages().size(), 3u);
  EXPECT_EQ(cache_->PrepareRead(caller_, {hit.lease_id, {BKey(9)}}).status().code(),
            Code::kNotFound);

  // LookupInto reuses its result and clears what the previous call left.
  LookupResult reused;
  ASSERT_TRUE(cache_->LookupInto(caller_, {codec_, std::vector<BlockKey>{BKey(0)}, true, 0},
                                 &reused).ok());
  EXPECT_EQ(reused.pages.size(), 1u);
  ReleaseLease(reused.lease_id);
  ASSERT_TRUE(cache_->LookupInto(caller_, {codec_, std::vector<BlockKey>{BKey(7)}, true, 0},
                                 &reused).ok());
  EXPECT_EQ(reused.matched, 0u);
  EXPECT_EQ(reused.lease_id, 0u);
  EXPECT_TRUE(reused.pages.empty());

  CacheStats st = Stats();
  EXPECT_EQ(st.pages, 3u);
  EXPECT_EQ(st.pinned_pages, 3u);
  EXPECT_EQ(st.leases, 1u);
  EXPECT_EQ(st.hits, 7u);
  EXPECT_EQ(st.misses, 2u + 2u + 1u + 1u);
  ReleaseLease(hit.lease_id);
  ReleaseLease(hit.lease_id);  // idempotent
  st = Stats();
  EXPECT_EQ(st.pinned_pages, 0u);
  EXPECT_EQ(st.leases, 0u);
}

TEST_F(PageCacheTest, DedupConcurrentReservesConvergeOnOnePage) {
  auto a = Reserve({BKey(1), BKey(2), BKey(1)});
  EXPECT_TRUE(a.items[0].status.ok());
  // Only reserved, not stored: in progress (ABORTED), never ALREADY_EXISTS.
  EXPECT_EQ(a.items[2].status.code(), Code::kAborted);
  auto b = Reserve({BKey(1), BKey(3)});
  EXPECT_EQ(b.items[0].status.code(), Code::kAborted);
  EXPECT_NE(b.items[0].status.message().find("retry"), std::string::npos);
  EXPECT_TRUE(b.items[1].status.ok());
  // Reserved but not committed: invisible.
  EXPECT_EQ(Lookup({BKey(1)}, false).matched, 0u);
  ASSERT_TRUE(Write(a.reservation_id, BKey(1), MakePage(TinyProfile(), PageKind::kInt2, 1)).ok());
  auto c = Commit(a.reservation_id, {BKey(1)});
  EXPECT_TRUE(c[0].ok());
  EXPECT_EQ(Reserve({BKey(1)}).items[0].status.code(), Code::kAlreadyExists);
  EXPECT_EQ(Lookup({BKey(1)}, false).matched, 1u);
}

TEST_F(PageCacheTest, CommitVerifiesPagesAndReleasesBadSlots) {
  const size_t before = pool_->bytes_used();
  auto r = Reserve({BKey(1), BKey(2), BKey(3), BKey(4)});
  const uint64_t id = r.reservation_id;
  EXPECT_EQ(r.items[0].slot.key, BKey(1));
  EXPECT_EQ(r.items[0].slot.bytes, 832u);
  const size_t reserved4 = pool_->bytes_used();
  std::string good = MakePage(TinyProfile(), PageKind::kInt2, 1);
  std::string corrupt = good;
  corrupt[500] ^= 1;
  ASSERT_TRUE(Write(id, BKey(1), corrupt).ok());
  ASSERT_TRUE(Write(id, BKey(2), MakePage(TinyProfile("other-model"), PageKind::kInt2, 2)).ok());
  ASSERT_TRUE(Write(id, BKey(3), "garbage").ok());
  auto c = Commit(id, {BKey(1), BKey(2), BKey(3)});
  EXPECT_EQ(c[0].code(), Code::kDataLoss) << c[0];
  EXPECT_EQ(c[1].code(), Code::kInvalidArgument);
  EXPECT_EQ(c[2].code(), Code::kInvalidArgument);
  EXPECT_NE(c[0].message().find("released"), std::string::npos);
  EXPECT_EQ(Lookup({BKey(1)}, false).matched, 0u);
  // The failed slots are free at once (only Key(4) still holds one) ...
  EXPECT_EQ(pool_->bytes_used() - before, (reserved4 - before) / 4);
  // ... and the key is free: a rewrite into the released slot is refused, a new Reserve of the
  // key gets a slot (not ALREADY_EXISTS, not in progress) and stores the good page.
  EXPECT_EQ(Write(id, BKey(1), good).code(), Code::kNotFound);
  EXPECT_EQ(Commit(id, {BKey(1)})[0].code(), Code::kNotFound);
  auto again = Reserve({BKey(1)});
  ASSERT_TRUE(again.items[0].status.ok()) << again.items[0].status;
  ASSERT_TRUE(Write(again.reservation_id, BKey(1), good).ok());
  c = Commit(again.reservation_id, {BKey(1), BKey(1), BKey(7)});
  EXPECT_TRUE(c[0].ok());
  EXPECT_TRUE(c[1].ok());  // idempotent
  EXPECT_EQ(c[2].code(), Code::kNotFound);
  EXPECT_EQ(Lookup({BKey(1)}, false).matched, 1u);
  // A committed page is immutable.
  EXPECT_EQ(Write(again.reservation_id, BKey(1), good).code(), Code::kFailedPrecondition);
  // A BF16 page in a BF16 slot.
  auto r2 = Reserve({BKey(9)}, PageKind::kBf16);
  const std::string bf16 = MakePage(TinyProfile(), PageKind::kBf16, 9);
  ASSERT_TRUE(Write(r2.reservation_id, BKey(9), bf16).ok());
  EXPECT_TRUE(Commit(r2.reservation_id)[0].ok());
  auto look = Lookup({BKey(9)}, true);
  ASSERT_EQ(look.pages.size(), 1u);
  EXPECT_EQ(look.pages[0].kind, PageKind::kBf16);
  EXPECT_EQ(look.pages[0].bytes, bf16.size());
  // Out of range and unknown writes.
  EXPECT_EQ(Write(id, BKey(4), "xx", 831).code(), Code::kOutOfRange);
  EXPECT_EQ(Write(id, BKey(4), "x", ~uint64_t{0}).code(), Code::kOutOfRange);
  EXPECT_EQ(Write(id + 12345, BKey(2), "x").code(), Code::kNotFound);
  EXPECT_EQ(Write(id, BKey(77), "x").code(), Code::kNotFound);
  auto written = cache_->WriteChunk(caller_, {id, BKey(4), 0, Bytes("abc")});
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(*written, 3u);
  CommitArgs unknown;
  unknown.reservation_id = 424242;
  unknown.all_items = true;
  EXPECT_EQ(cache_->Commit(caller_, unknown).status().code(), Code::kNotFound);
}

TEST_F(PageCacheTest, AbortFreesSlotsAndIsIdempotent) {
  const size_t before = pool_->bytes_used();
  auto r = Reserve({BKey(1), BKey(2)});
  EXPECT_GT(pool_->bytes_used(), before);
  ASSERT_TRUE(cache_->Abort(caller_, r.reservation_id).ok());
  ASSERT_TRUE(cache_->Abort(caller_, r.reservation_id).ok());
  EXPECT_EQ(pool_->bytes_used(), before);
  EXPECT_TRUE(Reserve({BKey(1)}).items[0].status.ok());
}

TEST_F(PageCacheTest, LeasesAndReservationsExpireWithTheClock) {
  Store({1, 2});
  auto hit = Lookup({BKey(1), BKey(2)}, true, 500);
  ASSERT_EQ(hit.matched, 2u);
  auto r = Reserve({BKey(3)});
  clock_.Advance(400);
  // Asks for 100 s: capped at max_lease_ms 5000.
  auto renewed = cache_->RenewLease(caller_, {hit.lease_id, 100000});
  ASSERT_TRUE(renewed.ok());
  EXPECT_EQ(*renewed, static_cast<uint64_t>(clock_.UnixMs() + 5000));
  clock_.Advance(4000);
  cache_->Reap();
  CacheStats st = Stats();
  EXPECT_EQ(st.leases, 1u);
  EXPECT_EQ(st.reservations, 0u);  // the 2 s reservation expired
  EXPECT_TRUE(Reserve({BKey(3)}).items[0].status.ok());  // slot reclaimed, key free
  CommitArgs creq;
  creq.reservation_id = r.reservation_id;
  creq.all_items = true;
  EXPECT_EQ(cache_->Commit(caller_, creq).status().code(), Code::kNotFound);
  clock_.Advance(1001);
  // Expired but not yet reaped: already unusable.
  EXPECT_EQ(cache_->RenewLease(caller_, {hit.lease_id, 0}).status().code(), Code::kNotFound);
  EXPECT_EQ(cache_->PrepareRead(caller_, {hit.lease_id, {}}).status().code(), Code::kNotFound);
  cache_->Reap();
  st = Stats();
  EXPECT_EQ(st.leases, 0u);
  EXPECT_EQ(st.pinned_pages, 0u);
  EXPECT_EQ(cache_->counters().leases_expired.load(), 1u);
  EXPECT_EQ(cache_->counters().reservations_expired.load(), 1u);
  EXPECT_EQ(Lookup({BKey(1), BKey(2)}, false).matched, 2u);  // pages stay cached
}

TEST_F(PageCacheTest, EvictsUnpinnedPagesOnlyAndPrefersCold) {
  // 1 MiB pool of 832-byte INT2 slots.
  std::vector<uint32_t> ids;
  size_t capacity = 0;
  for (uint32_t i = 0;; ++i) {
    auto r = Reserve({BKey(i)});
    if (cache_->counters().evictions.load() > 0 || !r.items[0].status.ok()) {
      // The first eviction happened while reserving page i.
      ASSERT_TRUE(r.items[0].status.ok());
      capacity = i;
      ASSERT_TRUE(Write(r.reservation_id, BKey(i), MakePage(TinyProfile(), PageKind::kInt2, i)).ok());
      Commit(r.reservation_id);
      ids.push_back(i);
      break;
    }
    ASSERT_TRUE(Write(r.reservation_id, BKey(i), MakePage(TinyProfile(), PageKind::kInt2, i)).ok());
    ASSERT_TRUE(Commit(r.reservation_id)[0].ok());
    ids.push_back(i);
  }
  ASSERT_GT(capacity, 500u);
  // Which pages survive? Touch half of them (lookups set the clock bit), pin a few.
  std::vector<uint32_t> alive;
  for (uint32_t i : ids) {
    if (Lookup({BKey(i)}, false).matched == 1) alive.push_back(i);
  }
  ASSERT_EQ(alive.size(), capacity);
  std::set<uint32_t> hot, pinned;
  std::vector<uint64_t> leases;
  for (size_t j = 0; j < alive.size(); ++j) {
    if (j % 2 == 0) {
      auto l = Lookup({BKey(alive[j])}, true);
      ASSERT_EQ(l.matched, 1u);
      hot.insert(alive[j]);
      if (j % 20 == 0) {
        pinned.insert(alive[j]);
        leases.push_back(l.lease_id);
      } else {
        ReleaseLease(l.lease_id);
      }
    }
  }
  const uint64_t ev0 = cache_->counters().evictions.load();
  const size_t cold = alive.size() - hot.size();
  // Store cold/2 new pages (reserved only: they can't be evicted themselves).
  for (size_t j = 0; j < cold / 2; ++j) {
    auto r = Reserve({BKey(100000 + j)});
    ASSERT_TRUE(r.items[0].status.ok()) << r.items[0].status;
  }
  EXPECT_EQ(cache_->counters().evictions.load() - ev0, cold / 2);
  for (uint32_t i : hot) EXPECT_EQ(Lookup({BKey(i)}, false).matched, 1u) << "hot page evicted";
  // Now fill everything: only pinned pages must remain, then the pool is exhausted.
  for (size_t j = cold / 2;; ++j) {
    auto r = Reserve({BKey(100000 + j)});
    if (!r.items[0].status.ok()) {
      EXPECT_EQ(r.items[0].status.code(), Code::kResourceExhausted);
      break;
    }
    ASSERT_LT(j, 10 * capacity);
  }
  for (uint32_t i : pinned) {
    auto l = Lookup({BKey(i)}, true);
    ASSERT_EQ(l.matched, 1u) << "pinned page evicted";
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(pool_->Data(l.pages[0].offset)), 832),
              MakePage(TinyProfile(), PageKind::kInt2, i));
    ReleaseLease(l.lease_id);
  }
  EXPECT_EQ(Stats().pages, pinned.size());
}

TEST_F(PageCacheTest, AnotherPageSizeEvictsWholeSpansNotTheWholeCache) {
  // Fill the pool with INT2 pages, then store BF16 pages: each needs a span of its own size,
  // which only appears when a whole INT2 span is free.
  uint32_t n = 0;
  while (cache_->counters().evictions.load() == 0) {
    Store({n++});
    ASSERT_LT(n, 5000u);
  }
  const uint64_t int2_pages = n - 1;
  const PagePoolStats st = pool_->Stats();
  size_t int2_span_slots = 0;
  for (const auto& c : st.classes) {
    if (c.slot_bytes == 832) int2_span_slots = c.slots_per_span;
  }
  ASSERT_GT(int2_span_slots, 0u);
  // Make three of four pages hot, so cold pages are scattered over every span: evicting cold
  // pages one at a time would never free a span.
  for (uint32_t i = 0; i < n; ++i) {
    if (i % 4 == 0) continue;
    auto l = Lookup({BKey(i)}, true);
    if (l.lease_id != 0) ReleaseLease(l.lease_id);
  }
  const uint64_t ev0 = cache_->counters().evictions.load();
  for (uint32_t i = 0; i < 8; ++i) {
    auto r = Reserve({BKey(50000 + i)}, PageKind::kBf16);
    ASSERT_TRUE(r.items[0].status.ok()) << r.items[0].status;
    ASSERT_TRUE(Write(r.reservation_id, BKey(50000 + i),
                      MakePage(TinyProfile(), PageKind::kBf16, i)).ok());
    ASSERT_TRUE(Commit(r.reservation_id)[0].ok());
  }
  const uint64_t evicted = cache_->counters().evictions.load() - ev0;
  EXPECT_GT(evicted, 0u);
  // Eight 4160-byte pages fit in a span or two freed by INT2 evictions.
  EXPECT_LE(evicted, 2 * int2_span_slots) << "of " << int2_pages << " INT2 pages";
  const CacheStats stats = Stats();
  EXPECT_EQ(stats.pages, int2_pages - evicted + 8);
  EXPECT_EQ(pool_->slots_used(), stats.pages);
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(Lookup({BKey(50000 + i)}, false).matched, 1u);
}

TEST_F(PageCacheTest, DeleteAndClearRespectPins) {
  Store({1, 2, 3, 4});
  auto l = Lookup({BKey(1)}, true);
  const uint64_t off = l.pages[0].offset;
  auto dr = cache_->Delete(caller_, {codec_, {BKey(1), BKey(2), BKey(99)}});
  ASSERT_TRUE(dr.ok());
  ASSERT_EQ(dr->size(), 3u);
  EXPECT_EQ((*dr)[0].code(), Code::kFailedPrecondition);
  EXPECT_TRUE((*dr)[1].ok());
  EXPECT_EQ((*dr)[2].code(), Code::kNotFound);
  EXPECT_EQ(Lookup({BKey(1)}, false).matched, 0u);
  // The leased bytes stay valid until release.
  EXPECT_EQ(pool_->RefCount(off), 1u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(pool_->Data(off)), 832),
            MakePage(TinyProfile(), PageKind::kInt2, 1));
  ReleaseLease(l.lease_id);
  EXPECT_EQ(pool_->RefCount(off), 0u);

  auto l3 = Lookup({BKey(3)}, true);
  auto cr = cache_->Clear(caller_, {std::nullopt, false});
  ASSERT_TRUE(cr.ok());
  EXPECT_EQ(*cr, 1u);  // key 4; key 3 is pinned
  EXPECT_EQ(Lookup({BKey(3)}, false).matched, 1u);
  cr = cache_->Clear(caller_, {codec_, true});
  ASSERT_TRUE(cr.ok());
  EXPECT_EQ(*cr, 1u);
  ReleaseLease(l3.lease_id);
  EXPECT_EQ(pool_->bytes_used(), 0u);
}

TEST_F(PageCacheTest, ConcurrentStoresAndLookupsNeverLoseOrCorruptPages) {
  Init(4 << 20, 16);
  constexpr int kThreads = 8, kKeys = 200;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int iter = 0; iter < 300; ++iter) {
        std::vector<BlockKey> keys;
        std::vector<uint32_t> ids;
        const uint32_t start = rng() % kKeys;
        for (uint32_t i = start; i < std::min<uint32_t>(kKeys, start + 1 + rng() % 8); ++i) {
          keys.push_back(BKey(i));
          ids.push_back(i);
        }
        if (rng() % 2) {
          ReserveArgs rr;
          rr.codec = codec_;
          for (auto& k : keys) rr.items.push_back({k, PageKind::kInt2});
          auto resp = cache_->Reserve(caller_, rr);
          if (!resp.ok()) {
            ++errors;
            continue;
          }
          for (size_t j = 0; j < keys.size(); ++j) {
            if (!resp->items[j].status.ok()) continue;
            std::string page = MakePage(TinyProfile(), PageKind::kInt2, ids[j]);
            // The shared-memory path: write straight into the slot.
            std::memcpy(pool_->Data(resp->items[j].slot.offset), page.data(), page.size());
          }
          if (resp->reservation_id != 0) {
            CommitArgs cr;
            cr.reservation_id = resp->reservation_id;
            cr.all_items = true;
            auto cresp = cache_->Commit(caller_, cr);
            if (!cresp.ok()) {
              ++errors;
              continue;
            }
            for (auto& s : *cresp) errors += !s.ok();
          }
        } else {
          auto resp = cache_->Lookup(caller_, {codec_, keys, true, 0});
          if (!resp.ok()) {
            ++errors;
            continue;
          }
          for (size_t j = 0; j < resp->pages.size(); ++j) {
            const std::string page = MakePage(TinyProfile(), PageKind::kInt2, ids[j]);
            if (std::memcmp(pool_->Data(resp->pages[j].offset), page.data(), page.size()) != 0)
              ++errors;
          }
          if (resp->lease_id != 0 && !cache_->Release(caller_, resp->lease_id).ok()) ++errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  const CacheStats st = Stats();
  EXPECT_EQ(st.pinned_pages, 0u);
  EXPECT_EQ(st.leases, 0u);
  EXPECT_EQ(pool_->slots_used(), st.pages);
  EXPECT_LE(st.pages, static_cast<uint64_t>(kKeys));
}

}  // namespace
}  // namespace oscarkv::service

namespace oscarkv::service {
namespace {

// FORMAT.md §1.1, enforced at Commit: reserved header fields are zero, and so are the token
// slots at and past token_count.
TEST_F(PageCacheTest, CommitRefusesNonZeroReservedFieldsAndUnusedSlots) {
  auto fix_checksum = [](std::string& page) {
    PageHeader h;
    std::memcpy(&h, page.data(), sizeof(h));
    h.checksum = ComputePageChecksum(std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(page.data()), page.size()));
    std::memcpy(page.data(), &h, sizeof(h));
  };
  std::string reserved = MakePage(TinyProfile(), PageKind::kInt2, 1);
  reserved[36] = 1;  // reserved0
  fix_checksum(reserved);
  std::string tail = MakePage(TinyProfile(), PageKind::kInt2, 2, /*token_count=*/8);  // random tail
  std::string clean = tail;
  const PageGeometry g = GeometryFor(testing::ToProfile(TinyProfile()), PageKind::kInt2);
  for (uint32_t kv = 0; kv < 2; ++kv) {
    const size_t seg = g.segment_offset(0, kv, 0);
    for (size_t i = seg + g.code_row_offset(8); i < seg + g.code_row_offset(16); ++i) clean[i] = 0;
    for (size_t i = seg + g.scale_offset(8, 0); i < seg + g.segment_bytes(); ++i) clean[i] = 0;
  }
  fix_checksum(clean);
  auto r = Reserve({BKey(1), BKey(2), BKey(3)});
  ASSERT_TRUE(Write(r.reservation_id, BKey(1), reserved).ok());
  ASSERT_TRUE(Write(r.reservation_id, BKey(2), tail).ok());
  ASSERT_TRUE(Write(r.reservation_id, BKey(3), clean).ok());
  auto c = Commit(r.reservation_id);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].code(), Code::kInvalidArgument);
  EXPECT_NE(c[0].message().find("reserved"), std::string::npos) << c[0];
  EXPECT_EQ(c[1].code(), Code::kInvalidArgument);
  EXPECT_NE(c[1].message().find("unused token slots"), std::string::npos);
  EXPECT_TRUE(c[2].ok()) << c[2];
  EXPECT_EQ(Lookup({BKey(3)}, false).matched, 1u);
  EXPECT_EQ(Lookup({BKey(2)}, false).matched, 0u);
}

// WritePages hashes each chunk in its copy into the slot while the page arrives in order, and
// Commit compares that digest; out of order or rewritten, Commit hashes the slot itself. Either
// way a byte corrupted in any chunk is DATA_LOSS and the correct page then stores.
TEST_F(PageCacheTest, StreamedPagesAreHashedInTheirCopy) {
  Init(16 << 20, 4);
  v1::CodecProfile big = TinyProfile("big");
  big.set_num_layers(36);
  big.set_num_kv_heads(8);
  codec_ = Register(big);
  const std::string good = MakePage(big, PageKind::kInt2, 3);
  ASSERT_GT(good.size(), kChecksumChunkBytes);  // a one-chunk write is hashed in pieces
  // Writes `page` to key k in `parts` chunks taken in `order`, through a fresh reservation.
  auto store = [&](uint32_t k, std::string page, std::vector<int> order, int parts) {
    auto r = Reserve({BKey(k)});
    EXPECT_TRUE(r.items[0].status.ok()) << r.items[0].status;
    const size_t piece = (page.size() + parts - 1) / parts;
    for (int i : order) {
      const size_t off = i * piece;
      EXPECT_TRUE(Write(r.reservation_id, BKey(k), page.substr(off, piece), off).ok());
    }
    return Commit(r.reservation_id)[0];
  };
  std::string corrupt = good;
  corrupt[good.size() / 2 + 5] ^= 0x04;
  std::string bad_sum = good;
  bad_sum[offsetof(PageHeader, checksum)] ^= 0x01;
  auto rehashes = [&] { return cache_->counters().commit_rehashes.load(); };
  EXPECT_EQ(store(1, corrupt, {0, 1, 2}, 3).code(), Code::kDataLoss);  // in order
  EXPECT_EQ(store(1, bad_sum, {0, 1}, 2).code(), Code::kDataLoss);     // the stored sum
  EXPECT_EQ(rehashes(), 0u);  // both caught by the digest of the copy
  EXPECT_EQ(store(1, corrupt, {2, 0, 1}, 3).code(), Code::kDataLoss);  // out of order
  EXPECT_EQ(rehashes(), 1u);
  EXPECT_EQ(Lookup({BKey(1)}, false).matched, 0u);
  ASSERT_TRUE(store(1, good, {0, 1, 2}, 3).ok());
  ASSERT_TRUE(store(3, good, {0}, 1).ok());
  EXPECT_EQ(rehashes(), 1u);  // one pass each
  ASSERT_TRUE(store(2, good, {1, 0}, 2).ok());
  EXPECT_EQ(rehashes(), 2u);
  // In order, then a chunk rewritten with a flipped byte: the copy's digest no longer covers
  // the slot, so Commit hashes it, and refuses it.
  auto r = Reserve({BKey(4)});
  ASSERT_TRUE(Write(r.reservation_id, BKey(4), good).ok());
  ASSERT_TRUE(Write(r.reservation_id, BKey(4), corrupt.substr(1000), 1000).ok());
  EXPECT_EQ(Commit(r.reservation_id)[0].code(), Code::kDataLoss);
  // Corrupt first, then the whole page again from offset 0: the rewrite is what commits.
  r = Reserve({BKey(5)});
  ASSERT_TRUE(Write(r.reservation_id, BKey(5), corrupt).ok());
  ASSERT_TRUE(Write(r.reservation_id, BKey(5), good).ok());
  EXPECT_TRUE(Commit(r.reservation_id)[0].ok());
  auto hit = Lookup({BKey(1), BKey(2), BKey(3), BKey(4), BKey(5)}, true);
  ASSERT_EQ(hit.matched, 3u);
  for (const PageRef& p : hit.pages) EXPECT_EQ(PageAt(p.offset, p.bytes), good);
  EXPECT_EQ(Lookup({BKey(5)}, false).matched, 1u);
  ReleaseLease(hit.lease_id);
}

}  // namespace
}  // namespace oscarkv::service
