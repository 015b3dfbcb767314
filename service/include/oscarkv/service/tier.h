// PageTier: the daemon's SSD tier -- a tiering::TierStore (RocksDB in the daemon) behind a
// bounded demotion queue, plus the persisted codec registrations the tier's pages need.
//
// * Demote copies a page evicted from the DRAM pool into the queue and returns; one writer thread
//   puts queued pages into the store. The queue holds at most `queue_bytes`: when it is full,
//   Demote waits for room (back-pressure on the evicting caller) up to `max_wait`, then drops the
//   page (counted in demote_drops) -- memory is never unbounded.
// * A queued page is already visible: Contains and Read find it before it reaches the store.
// * Read returns a verified page (header, codec id and XXH3 checksum: tiering::VerifyTierPage);
//   NOT_FOUND when absent; DATA_LOSS when what is on disk does not verify (the entry is removed,
//   so it is a miss from then on and never served).
// * Codec registrations live in <path>/codecs (rewritten atomically -- temp file, fsync,
//   rename -- on every new registration), the pages in <path>/pages (RocksDB). A restarted
//   daemon re-registers the codecs, then serves every page the store recovered; recovery reads
//   only RocksDB's small metadata records, never page bytes.
// * What survives: a page has reached the tier once the writer has put it and synced (a memtable
//   flush into RocksDB blob files, fsynced: page bytes are written once, there is no
//   write-ahead log copy). The writer syncs after `sync_interval` without new demotions, and
//   within a burst every `sync_interval` or `sync_bytes`; a page stays in the queue's map (so
//   visible) until its sync. Pages still queued or not yet synced (at most about the last
//   `sync_interval` or `sync_bytes` of demotions), and pages only in the DRAM pool, are lost
//   on kill -9 -- never served corrupt. `sync_writes` logs and fsyncs every put instead.
//   Flush() drains the queue and syncs (the daemon's SIGTERM path).
//
// Thread-safe. Latency histograms are in nanoseconds of one Put / one Read.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
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

struct TierOptions {
  std::string path;                   // directory (created if missing)
  uint64_t capacity_bytes = 0;        // page bytes the tier may hold (LRU beyond that)
  uint64_t queue_bytes = 64ull << 20;  // demotion queue bound
  absl::Duration max_wait = absl::Seconds(1);  // longest back-pressure wait of one Demote
  // Puts are made durable (RocksDB memtable flush into blob files, fsynced) once the writer has
  // been idle this long, and by Flush(); pages put since the last one are lost on kill -9.
  absl::Duration sync_interval = absl::Milliseconds(200);
  uint64_t sync_bytes = 16ull << 20;  // ... and after this many bytes within a burst
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
  // OK when something was removed, NOT_FOUND when the key was in neither queue nor store.
  absl::Status Delete(const tiering::TierKey& key);
  // Removes every page (of one codec when `codec` is set); returns how many.
  uint64_t Clear(const CodecId* codec);
  // Waits until every queued page is in the store, or the deadline; true when drained.
  bool Flush(absl::Time deadline);

  // Persisted codec registrations: serialized oscarkv.v1.CodecProfile messages, in order.
  absl::Status SaveCodecs(const std::vector<std::string>& profiles);
  absl::StatusOr<std::vector<std::string>> LoadCodecs() const;

  tiering::TierStats store_stats() { return store_->Stats(); }
  uint64_t queued_bytes() const;
  const TierCounters& counters() const { return counters_; }
  TierCounters& mutable_counters() { return counters_; }
  const TierOptions& options() const { return options_; }

 private:
  PageTier(TierOptions options, std::unique_ptr<tiering::TierStore> store);
  void WriterLoop();
  struct Pending {
    uint64_t seq = 0;
    std::shared_ptr<const std::vector<uint8_t>> bytes;
  };

  const TierOptions options_;
  std::unique_ptr<tiering::TierStore> store_;
  TierCounters counters_;

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
