// PageCache: the daemon's state and the semantics of every KvCache RPC, independent of gRPC.
//
// * Index: (codec, 16-byte block key) -> page entry, split over lock shards (a key's shard is a
//   function of its hash). An entry is RESERVED (a slot handed to one reservation, invisible to
//   Lookup) or COMMITTED (verified and visible). Dedup: a key has at most one entry, so
//   concurrent stores of one key converge on one page -- the first Reserve wins. Others get
//   ALREADY_EXISTS only once the page is committed; while it is only reserved they get ABORTED
//   (in progress: retry), because a reservation may still fail. A Commit that fails
//   verification releases that item's slot and key at once.
// * Leases: a pinning Lookup pins the matched pages (entry pin count + a pool reference) until
//   Release, or until the lease deadline passes and Reap() expires it. Reservations expire the
//   same way, so a client that dies frees its pins and slots.
// * Eviction: when the pool has no free slot, CLOCK over COMMITTED pages with no pins (per-shard
//   clock hands, shards visited round-robin). Pinned and reserved pages are never evicted. When
//   the victim has another page size than the one needed, the unpinned pages of its whole span
//   go too, so memory moves between INT2 and BF16 slots without emptying the cache.
// * Pages stay readable while referenced: Delete/Clear/eviction drop the index entry's pool
//   reference; a lease or an in-flight ReadPages keeps its own until it ends.
//
// * Tenants (tenants.h): codec registrations belong to a namespace (Caller::ns), so an index key
//   (codec registration, block key) is never shared by two namespaces. Leases, reservations and
//   handles belong to the tenant that made them: another tenant's ids and handle names are
//   NOT_FOUND (Release/Abort/CloseHandle of them: a no-op). Pool bytes, pins, leases, handles and
//   codecs are charged to the caller's tenant; over a quota is RESOURCE_EXHAUSTED naming it. A
//   Reserve over the pool quota evicts the tenant's own unpinned pages first.
//
// Methods take plain structs (cache_types.h) and return absl::StatusOr<result> (or a Status
// where there is no result); the code is the gRPC code of the call, one to one, and per-item
// results carry their own codes. The front ends translate their wire messages (cache_wire.h).
// Every method is thread-safe and never crashes on any input. LookupInto takes one shard lock
// per key and allocates nothing once its result's vector has grown.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "oscarkv/allocator/page_pool.h"
#include "oscarkv/kernels/block_key.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/service/cache_types.h"
#include "oscarkv/service/caller.h"
#include "oscarkv/service/tenants.h"
#include "oscarkv/tiering/tier_store.h"
#include "oscarkv/util/clock.h"

namespace oscarkv::service {

struct CacheOptions {
  uint32_t max_batch = 4096;
  uint32_t default_lease_ms = 30000;
  uint32_t max_lease_ms = 600000;
  uint32_t reservation_ttl_ms = 30000;
  uint32_t max_reservation_ttl_ms = 600000;
  uint32_t index_shards = 64;
  uint32_t max_codecs = 32;
  uint32_t default_handle_ttl_ms = 60000;
  uint32_t max_handle_ttl_ms = 3600000;
  uint32_t max_handles = 65536;
  std::string node_id = "oscarkvd";
  // The daemon's tenants (must outlive the cache). nullptr: one default tenant, admin, whose
  // only quotas are max_codecs and max_handles (a daemon without `tenants:`, unit tests).
  const TenantRegistry* tenants = nullptr;
};

// Monotonic counters (exported as Prometheus counters) and live gauges.
struct CacheCounters {
  std::atomic<uint64_t> lookups{0}, hits{0}, misses{0}, evictions{0};
  std::atomic<uint64_t> bytes_written{0}, bytes_read{0};
  std::atomic<uint64_t> reserved{0}, dedup_rejects{0}, in_progress_rejects{0}, reserve_failures{0};
  std::atomic<uint64_t> commits{0}, commit_failures{0}, aborted_pages{0};
  // Pages whose checksum Commit computed by reading the slot again (a second pass): streamed
  // out of order, or shared-memory pages the client did not verify in its copy.
  std::atomic<uint64_t> commit_rehashes{0};
  std::atomic<uint64_t> leases_expired{0}, reservations_expired{0}, deletes{0};
  // gauges
  std::atomic<int64_t> pages{0}, reserved_pages{0}, pinned_pages{0}, leases{0};
};

// Page bytes of a pinned lease (or an in-flight ReadPages): pool references are dropped when the
// plan is destroyed.
class ReadPlan {
 public:
  struct Page {
    BlockKey key;
    const uint8_t* data;
    uint64_t bytes;
  };
  ReadPlan(PagePool* pool, std::vector<Page> pages, std::vector<uint64_t> offsets)
      : pool_(pool), pages_(std::move(pages)), offsets_(std::move(offsets)) {}
  ~ReadPlan();
  ReadPlan(const ReadPlan&) = delete;
  ReadPlan& operator=(const ReadPlan&) = delete;
  const std::vector<Page>& pages() const { return pages_; }

 private:
  PagePool* pool_;
  std::vector<Page> pages_;
  std::vector<uint64_t> offsets_;
};

class PageTier;

class PageCache {
 public:
  // `pool` and `clock` must outlive the cache.
  PageCache(PagePool* pool, const Clock* clock, CacheOptions options);
  ~PageCache();
  PageCache(const PageCache&) = delete;
  PageCache& operator=(const PageCache&) = delete;

  // Every call takes the Caller first (caller.h). Arguments and results: cache_types.h.
  absl::StatusOr<HandshakeInfo> Handshake(const Caller& caller, const HandshakeArgs& args);
  // Idempotent: registering a profile again returns the same id.
  absl::StatusOr<CodecRegistration> RegisterCodec(const Caller& caller,
                                                  const CodecProfile& profile);
  // Removes the caller's registration of `codec` (the proto's UnregisterCodec has the
  // contract): its table slot, its owner's codec quota and its entry in the SSD tier's codecs
  // file are free again. A tenant reaches the registration of its namespace (registered by
  // itself: another member of a shared namespace gets PERMISSION_DENIED); an admin the
  // registrations of `codec` in every namespace. Without `drop_pages`, FAILED_PRECONDITION
  // while it has pages (pool, reserved, or SSD tier) or transfer handles; with it they are
  // removed first (pinned pages too: their leases keep the memory until released).
  absl::StatusOr<UnregisterResult> UnregisterCodec(const Caller& caller, const CodecId& codec,
                                                   bool drop_pages);
  // Clear's `free_codecs`: unregisters the caller's registrations (an admin's: everyone's; of
  // `codec` only when set) that hold nothing any more -- no page, reservation or handle.
  // Returns how many it freed; one still in use stays, silently.
  absl::StatusOr<uint32_t> FreeUnusedCodecs(const Caller& caller,
                                            const std::optional<CodecId>& codec);
  absl::StatusOr<LookupResult> Lookup(const Caller& caller, const LookupQuery& query);
  // The same as Lookup, into `out` (cleared first; its vector's capacity is reused, so a caller
  // that keeps one LookupResult per thread allocates nothing per call).
  absl::Status LookupInto(const Caller& caller, const LookupQuery& query, LookupResult* out);
  absl::StatusOr<ReserveResult> Reserve(const Caller& caller, const ReserveArgs& args);
  // One result per committed item (every item of the reservation, or `keys` in order).
  absl::StatusOr<std::vector<absl::Status>> Commit(const Caller& caller, const CommitArgs& args);
  // Idempotent: OK for an unknown reservation.
  absl::Status Abort(const Caller& caller, uint64_t reservation_id);
  // One chunk of WritePages into a reserved slot; returns the bytes copied.
  absl::StatusOr<uint64_t> WriteChunk(const Caller& caller, const WriteChunkArgs& args);
  absl::StatusOr<std::unique_ptr<ReadPlan>> PrepareRead(const Caller& caller,
                                                        const ReadArgs& args);
  // Idempotent: OK for an unknown lease.
  absl::Status Release(const Caller& caller, uint64_t lease_id);
  // Returns the lease's new deadline (unix ms).
  absl::StatusOr<uint64_t> RenewLease(const Caller& caller, const RenewLeaseArgs& args);
  // One result per key: OK, NOT_FOUND, or FAILED_PRECONDITION (pinned: removed from the index,
  // its memory freed when the lease ends).
  absl::StatusOr<std::vector<absl::Status>> Delete(const Caller& caller, const DeleteArgs& args);
  // Returns the pages removed (an unknown codec removes none).
  absl::StatusOr<uint64_t> Clear(const Caller& caller, const ClearArgs& args);
  absl::StatusOr<CacheStats> Stats(const Caller& caller);
  // Transfer handles: see the proto for the contract. A handle pins its pages (entry pins and
  // pool references) until CloseHandle or its deadline (Reap); OpenHandle adds a lease.
  // Publish returns the handle's deadline (unix ms); publishing the same pages again is OK.
  absl::StatusOr<uint64_t> PublishHandle(const Caller& caller, const PublishHandleArgs& args);
  absl::StatusOr<OpenedHandle> OpenHandle(const Caller& caller, const OpenHandleArgs& args);
  // Idempotent: OK for an unknown handle.
  absl::Status CloseHandle(const Caller& caller, const std::string& name);
  size_t OpenHandles() const;

  // Expires leases and reservations whose deadline has passed (the reaper thread calls this).
  void Reap();

  // The SSD tier (tier.h), before the cache serves anything; `tier` must outlive the cache.
  // Re-registers the codecs the tier persisted (a restart), then: evicted pages are demoted to
  // the tier instead of dropped; a pinning Lookup whose matched prefix continues into the tier
  // promotes those pages into the pool first (a non-pinning Lookup counts them without reading
  // them); Reserve answers ALREADY_EXISTS for a key in the tier; Delete and Clear remove tier
  // pages too; every new codec registration is persisted.
  absl::Status AttachTier(PageTier* tier);
  // SIGTERM: queues every committed pool page the tier does not hold yet and waits for the
  // queue to drain, both until `deadline`. Returns the pages written.
  uint64_t DemoteAll(absl::Time deadline);
  PageTier* tier() const { return tier_; }

  const CacheCounters& counters() const { return counters_; }
  CacheCounters& mutable_counters() { return counters_; }
  const PagePool& pool() const { return *pool_; }
  const CacheOptions& options() const { return options_; }
  // INVALID_ARGUMENT when a batch of `n` `what`s exceeds max_batch.
  absl::Status CheckBatch(size_t n, const char* what) const;
  // Live codec registrations.
  size_t codecs() const { return live_codecs_.load(std::memory_order_acquire); }
  const TenantRegistry& tenants() const { return *tenants_; }
  // Reservations that still have uncommitted slots.
  size_t OpenReservations() const;

 private:
  struct Codec;
  struct IndexKey {
    uint32_t codec;
    BlockKey key;
    friend bool operator==(const IndexKey&, const IndexKey&) = default;
    template <typename H>
    friend H AbslHashValue(H h, const IndexKey& k) {
      uint64_t lo, hi;
      __builtin_memcpy(&lo, k.key.bytes.data(), 8);
      __builtin_memcpy(&hi, k.key.bytes.data() + 8, 8);
      return H::combine(std::move(h), lo, hi, k.codec);
    }
  };
  struct Entry {
    uint64_t offset = 0;
    uint64_t page_bytes = 0;
    uint64_t gen = 0;
    uint64_t reservation_id = 0;  // owner while reserved
    uint32_t owner = 0;           // tenant charged for its bytes (Quota::kPoolBytes)
    uint32_t pins = 0;
    uint16_t token_count = 0;
    PageKind kind = PageKind::kInt2;
    bool committed = false;
    bool has_slot = false;
    bool referenced = false;  // CLOCK bit
    bool in_tier = false;     // promoted from the SSD tier (a copy is still there)
  };
  struct alignas(64) Shard {
    absl::Mutex mu;
    absl::flat_hash_map<IndexKey, Entry> map ABSL_GUARDED_BY(mu);
    std::vector<std::pair<IndexKey, uint64_t>> ring ABSL_GUARDED_BY(mu);  // (key, gen) committed
    size_t hand ABSL_GUARDED_BY(mu) = 0;
  };
  struct PinnedPage {
    IndexKey key;
    uint64_t gen;
    uint64_t offset;
    uint64_t page_bytes;
  };
  struct Lease {
    uint32_t tenant = 0;
    int64_t deadline_ms = 0;
    std::vector<PinnedPage> pages;
  };
  struct alignas(64) LeaseShard {
    absl::Mutex mu;
    absl::flat_hash_map<uint64_t, Lease> map ABSL_GUARDED_BY(mu);
  };
  struct Handle {
    uint32_t tenant = 0;
    uint32_t codec = 0;
    CodecId codec_id;
    int64_t deadline_ms = 0;
    uint64_t deadline_unix_ms = 0;
    std::string metadata;
    std::vector<PinnedPage> pages;
    std::vector<std::pair<PageKind, uint16_t>> info;  // kind, token count per page
  };
  struct Reservation;
  struct alignas(64) ReservationShard {
    absl::Mutex mu;
    absl::flat_hash_map<uint64_t, std::shared_ptr<Reservation>> map ABSL_GUARDED_BY(mu);
  };

  // A codec registration in use by one call. Table slots are reused after UnregisterCodec,
  // which first takes the registration out of the table and then waits until no CodecRef of it
  // is held: a holder may read the Codec until it lets go. Move-only.
  class CodecRef {
   public:
    CodecRef() = default;
    CodecRef(CodecRef&& o) noexcept : c_(o.c_) { o.c_ = nullptr; }
    CodecRef& operator=(CodecRef&& o) noexcept;
    CodecRef(const CodecRef&) = delete;
    CodecRef& operator=(const CodecRef&) = delete;
    ~CodecRef() { Reset(); }
    const Codec* operator->() const { return c_; }
    const Codec* get() const { return c_; }
    void Reset();
    // A reference to `c` if it is live and (serial != 0) still the registration `serial`.
    static CodecRef Acquire(const Codec* c, uint64_t serial);

   private:
    const Codec* c_ = nullptr;
  };
  // The codec registration of `codec_id` in the caller's namespace.
  absl::StatusOr<CodecRef> FindCodec(const Caller& caller, const CodecId& codec_id) const;
  // UnregisterCodec of one live registration; codec_mu_ held.
  absl::StatusOr<uint64_t> UnregisterLocked(Codec& c, bool drop_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(codec_mu_);
  // The SSD tier's codecs file: every live registration, minus `except`.
  absl::Status SaveCodecsLocked(const Codec* except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(codec_mu_);
  // The caller's tenant; PERMISSION_DENIED when its ids name no tenant or a namespace it may not
  // use (front ends never build such a Caller).
  absl::StatusOr<Tenant*> TenantOf(const Caller& caller) const;
  // Charges `bytes` of pool quota to `t`, evicting t's own unpinned pages while it is over.
  absl::Status ChargePool(Tenant& t, uint64_t bytes);
  Shard& ShardFor(const IndexKey& k);
  LeaseShard& LeaseShardFor(uint64_t id) { return lease_shards_[id % kLeaseShards]; }
  ReservationShard& ResShardFor(uint64_t id) { return res_shards_[id % kLeaseShards]; }
  uint64_t NewId();
  absl::StatusOr<uint64_t> AllocateSlot(SizeClassId cls);
  // Evicts one CLOCK victim; if it belongs to another size class than `want`, also evicts the
  // unpinned pages sharing its span, so the span's chunks return to the pool for `want`.
  // With `owner`, only that tenant's pages are candidates.
  bool EvictOne(SizeClassId want, const uint32_t* owner = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(evict_mu_);
  void EvictSpanMates(const SpanInfo& span, uint64_t victim);
  // Before an evicted page's slot is freed: queue it for the SSD tier (when there is one and it
  // does not hold the page already).
  void DemoteEvicted(const IndexKey& key, uint64_t offset, uint64_t page_bytes, bool in_tier);
  // Reads `key` from the SSD tier into a new committed pool entry. OK when the key is in the
  // pool afterwards (also when another caller put it there first).
  // Charges `tenant` (its pool_mb quota) for the promoted page.
  absl::Status Promote(const IndexKey& key, Tenant& tenant);
  // The SSD tier's key of a page, and the label of namespace `ns` there ("" without tenants).
  tiering::TierKey TierKeyOf(const IndexKey& key) const;
  std::string TierNamespaceLabel(uint32_t ns) const;
  bool InTier(const IndexKey& key);
  // OK when the tier held the key, NOT_FOUND when not.
  absl::Status DeleteFromTier(const IndexKey& key);
  // Removes the tier's pages (of codec index `only`, all when < 0); returns how many.
  uint64_t ClearTier(int64_t only);
  void ReleaseLease(Lease& lease);
  void AbortReservation(Reservation& res, bool expired);
  // Frees item i's slot and key unless it is committed or already released; res.mu held.
  void ReleaseItemLocked(Reservation& res, uint32_t i);
  void UnpinPage(const PinnedPage& p);
  // Pins the committed entry of `k` (entry pin + pool reference); false when not committed.
  bool PinCommitted(const IndexKey& k, PinnedPage* out, PageKind* kind, uint16_t* tokens);
  // Adds a pin to a page another holder already pins (pool reference always; entry pin when the
  // entry is still the same generation).
  void RepinPage(const PinnedPage& p);
  uint64_t InsertLease(Lease lease);
  void ReapHandles();
  // Gives a closed or expired handle's handles and pinned_pages quota back to its tenant.
  void RefundHandle(const Handle& h);
  // Removes a committed entry (caller holds the shard lock); returns the offset to Unref.
  void EraseCommittedLocked(Shard& shard, absl::flat_hash_map<IndexKey, Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);

  static constexpr size_t kLeaseShards = 16;
  static constexpr size_t kMaxCodecs = 256;

  PagePool* const pool_;
  const Clock* const clock_;
  const CacheOptions options_;
  CacheCounters counters_;

  // Serializes RegisterCodec and UnregisterCodec; readers scan codecs_ lock-free (CodecRef).
  // Slots [0, num_codecs_) hold a Codec each, live or free; a Codec object lives as long as
  // the cache (a free slot's is reused in place), so a stale pointer is never dangling.
  absl::Mutex codec_mu_;
  std::unique_ptr<Codec> codecs_[kMaxCodecs];
  std::atomic<size_t> num_codecs_{0};
  std::atomic<size_t> live_codecs_{0};
  uint64_t next_codec_serial_ ABSL_GUARDED_BY(codec_mu_) = 1;

  std::unique_ptr<Shard[]> shards_;
  LeaseShard lease_shards_[kLeaseShards];
  ReservationShard res_shards_[kLeaseShards];
  std::atomic<uint64_t> next_id_;
  std::atomic<uint64_t> next_gen_{1};

  // Committed slot offset -> key, for evicting whole spans (a leaf lock, taken under shard locks).
  absl::Mutex offsets_mu_;
  absl::flat_hash_map<uint64_t, IndexKey> key_at_ ABSL_GUARDED_BY(offsets_mu_);

  mutable absl::Mutex handles_mu_;  // before shard locks
  absl::flat_hash_map<std::string, Handle> handles_ ABSL_GUARDED_BY(handles_mu_);

  absl::Mutex evict_mu_;
  size_t evict_shard_ ABSL_GUARDED_BY(evict_mu_) = 0;

  PageTier* tier_ = nullptr;
  std::unique_ptr<TenantRegistry> own_tenants_;  // when options_.tenants is null
  const TenantRegistry* tenants_ = nullptr;
};

}  // namespace oscarkv::service
