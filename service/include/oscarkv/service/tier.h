// PageTier: the daemon's SSD tier -- a tiering::TierStore (the segment store in the daemon)
// behind a bounded demotion queue, plus the persisted codec registrations the tier's pages need.
//
// * Demote copies a page evicted from the DRAM pool into the queue and returns; one writer thread
//   puts queued pages into the store, up to 64 pages / 16 MiB per TierStore::PutMany. The queue
//   holds at most `queue_bytes`: when it is full, Demote waits for room (back-pressure on the
//   evicting caller) up to `max_wait`, then drops the page (counted in demote_drops) -- memory
//   is never unbounded (the queue, plus at most a quarter of it in buffers kept for reuse).
// * A queued page is already visible: Contains, SizeOf and Read find it before it reaches the
//   store.
// * Read/ReadInto return a verified page (header, codec id and XXH3 checksum, computed while
//   the bytes are read); NOT_FOUND when absent; DATA_LOSS when what is on disk does not verify
//   (the entry is removed, so it is a miss from then on and never served). ReadInto reads
//   straight into the caller's buffer (a pool slot), which must be SizeOf bytes.
// * Codec registrations live in <path>/codecs (rewritten atomically -- temp file, fsync,
//   rename -- on every new registration), each with the namespace it belongs to ("" without
//   tenants, else "tenant:<name>" / "shared:<name>"); a page's key carries that namespace's
//   tag (NamespaceTag), so a restarted daemon gives every page back to its owner. The pages
//   are in <path>/segments with their index in <path>/index (RocksDB; docs/FORMAT.md §5). A
//   restarted daemon re-registers the codecs, then serves every page the store recovered;
//   recovery reads the index records and the segment files' sizes, never page bytes.
// * What survives: once the writer has put a page (its bytes and then its index record are
//   written to the OS) it survives kill -9. It is on the device after the next sync: the
//   writer syncs (fdatasync of segments and index log) after `sync_interval` without new
//   demotions, and within a burst every `burst_sync_interval` or `sync_bytes`. Pages still
//   queued, and pages only in the DRAM pool, are lost on kill -9; a power loss also loses what
//   was put since the last sync -- never served corrupt (checksums). `sync_writes` syncs every
//   put instead. Flush() drains the queue and syncs (the daemon's SIGTERM path).
//
// Thread-safe. Latency histograms are in nanoseconds of one Put / one Read.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "oscarkv/service/metrics.h"
#include "oscarkv/tiering/tier_store.h"

namespace oscarkv::service {

// Queued page bytes: 4096-aligned, so the tier's store can write them to the device directly
// (O_DIRECT) without copying them again.
template <typename T>
struct PageAlignedAllocator {
  using value_type = T;
  PageAlignedAllocator() = default;
  template <typename U>
  PageAlignedAllocator(const PageAlignedAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{4096}));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{4096}); }
  template <typename U>
  bool operator==(const PageAlignedAllocator<U>&) const { return true; }
};
using PageBytes = std::vector<uint8_t, PageAlignedAllocator<uint8_t>>;

struct TierOptions {
  std::string path;                   // directory (created if missing)
  uint64_t capacity_bytes = 0;        // page bytes the tier may hold (LRU beyond that)
  uint64_t queue_bytes = 64ull << 20;  // demotion queue bound
  absl::Duration max_wait = absl::Seconds(1);  // longest back-pressure wait of one Demote
  // Puts are synced to the device (fdatasync of segments and index log) once the writer has
  // been idle this long, and by Flush(); a power loss loses what was put since the last sync
  // (a kill -9 does not: a put page is already in the OS).
  absl::Duration sync_interval = absl::Milliseconds(200);
  // ... and within a burst after this many bytes or this long. A sync costs a journal commit
  // (tens of ms on a VM disk), so syncing a burst often costs demotion throughput.
  uint64_t sync_bytes = 256ull << 20;
  absl::Duration burst_sync_interval = absl::Seconds(1);
  bool sync_writes = false;           // log and fsync every put instead (survives anything)
};

struct TierCounters {
  std::atomic<uint64_t> demotions{0};       // pages put into the store
  std::atomic<uint64_t> demoted_bytes{0};
  std::atomic<uint64_t> demote_drops{0};    // dropped: queue full past max_wait, or put failed
  std::atomic<uint64_t> demote_waits{0};    // Demote calls that waited for queue room
  std::atomic<uint64_t> promotions{0};      // pages read back into the pool
  std::atomic<uint64_t> promoted_bytes{0};
  std::atomic<uint64_t> hits{0}, misses{0}, corruptions{0};
  Histogram demote_latency, promote_latency;
};

class PageTier {
 public:
  // Opens (or recovers) the tier at options.path with a RocksDB store.
  static absl::StatusOr<std::unique_ptr<PageTier>> Open(const TierOptions& options);
  // Over any store (unit tests: the in-memory or fault-injecting ones); `options.path` holds
  // the codecs file only.
  static absl::StatusOr<std::unique_ptr<PageTier>> OpenWith(
      const TierOptions& options, std::unique_ptr<tiering::TierStore> store);
  ~PageTier();  // stops the writer; pages still queued are dropped (call Flush first)
  PageTier(const PageTier&) = delete;
  PageTier& operator=(const PageTier&) = delete;

  // Queues a copy of `page`; false when it was dropped (see the contract above).
  bool Demote(const tiering::TierKey& key, std::span<const uint8_t> page);
  bool Contains(const tiering::TierKey& key);
  absl::Status Read(const tiering::TierKey& key, std::vector<uint8_t>* out);
  // The page's size (NOT_FOUND if absent), then the page straight into `out` of that size
  // (FAILED_PRECONDITION if the size no longer matches: the key was replaced meanwhile).
  absl::StatusOr<uint64_t> SizeOf(const tiering::TierKey& key);
  absl::Status ReadInto(const tiering::TierKey& key, std::span<uint8_t> out);
  // True when the tier holds the key and will not drop it soon: evicting the page from the pool
  // again need not demote it again (tiering::TierStore::KeepsCopy).
  bool KeepsCopy(const tiering::TierKey& key);
  // OK when something was removed, NOT_FOUND when the key was in neither queue nor store.
  absl::Status Delete(const tiering::TierKey& key);
  // Removes every page (of one codec in namespace tag `ns` when `codec` is set); returns how
  // many.
  uint64_t Clear(const CodecId* codec, uint64_t ns = 0);
  // Pages (queued or stored) of one codec in namespace tag `ns`; walks the store's keys.
  uint64_t Count(const CodecId& codec, uint64_t ns);
  // Waits until every queued page is in the store, or the deadline; true when drained.
  bool Flush(absl::Time deadline);

  // Persisted codec registrations, in order: the namespace label ("" without tenants,
  // "tenant:<name>", "shared:<name>") and the serialized oscarkv.v1.CodecProfile. A codecs file
  // written before namespaces (docs/FORMAT.md §5) loads with every label "".
  struct SavedCodec {
    std::string ns;
    std::string profile;
  };
  absl::Status SaveCodecs(const std::vector<SavedCodec>& codecs);
  absl::StatusOr<std::vector<SavedCodec>> LoadCodecs() const;
  // The tier key tag of a namespace label: 0 for "", else a fixed 64-bit hash (FNV-1a) of the
  // label that is never 0 -- stable across restarts and builds.
  static uint64_t NamespaceTag(std::string_view label);

  tiering::TierStats store_stats() { return store_->Stats(); }
  uint64_t queued_bytes() const;
  const TierCounters& counters() const { return counters_; }
  TierCounters& mutable_counters() { return counters_; }
  const TierOptions& options() const { return options_; }

 private:
  PageTier(TierOptions options, std::unique_ptr<tiering::TierStore> store);
  void WriterLoop();
  // A copy of `page` in a recycled buffer, returned to free_ when the last holder lets go.
  std::shared_ptr<const PageBytes> CopyToBuffer(std::span<const uint8_t> page);
  struct Pending {
    uint64_t seq = 0;
    std::shared_ptr<const PageBytes> bytes;
  };

  const TierOptions options_;
  std::unique_ptr<tiering::TierStore> store_;
  TierCounters counters_;
  // Buffers of pages that left the queue, reused by the next demotions (at most queue_bytes/4).
  // Declared before pending_, whose buffers return here as it is destroyed.
  absl::Mutex free_mu_;
  std::vector<std::unique_ptr<PageBytes>> free_ ABSL_GUARDED_BY(free_mu_);
  uint64_t free_bytes_ ABSL_GUARDED_BY(free_mu_) = 0;

  mutable absl::Mutex mu_;
  absl::CondVar room_, work_, drained_;
  absl::flat_hash_map<tiering::TierKey, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<tiering::TierKey, uint64_t>> queue_ ABSL_GUARDED_BY(mu_);  // (key, seq)
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unsynced_ ABSL_GUARDED_BY(mu_) = 0;  // bytes put since the last Sync
  uint64_t sync_errors_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_sync_ ABSL_GUARDED_BY(mu_) = absl::Now();
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Held by the writer around each Put and by Delete/Clear around theirs, so a delete can
  // never be overtaken by a put of the same key that was already in flight.
  absl::Mutex io_mu_;
  mutable absl::Mutex codecs_mu_;
  std::thread writer_;
};

}  // namespace oscarkv::service
