// The SSD tier: a capacity-capped store of whole pages keyed by (codec id, block key), that
// survives restarts. The daemon demotes pages evicted from its DRAM pool here instead of dropping
// them, and promotes them back on a lookup hit.
//
// TierStore is the seam: the segment store is the real one (page bytes appended to segment
// files in demotion order, RocksDB as the index only, so restart recovery never reads page
// bytes; layout in docs/FORMAT.md §5), MemoryTierStore a fake for unit tests of other
// modules, and FaultInjectingTierStore wraps either to inject I/O errors and corruption.
//
// Contract for every implementation:
// * Put stores a copy of a complete page (docs/FORMAT.md) and may drop other pages of the tier
//   to stay under capacity (the memory fake: least recently used; the segment store: whole
//   oldest segments, i.e. the least recently demoted pages); a page larger than the capacity
//   is rejected (RESOURCE_EXHAUSTED). Put of an existing key replaces it.
// * Get/GetInto return NOT_FOUND for absent keys and DATA_LOSS for a page whose header or
//   checksum does not verify (that entry is then removed): a corrupt page is never returned as
//   good data.
// * All methods are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oscarkv/kernels/block_key.h"
#include "oscarkv/kernels/codec_profile.h"

namespace oscarkv::tiering {

struct TierKey {
  CodecId codec;
  BlockKey block;
  // The owning namespace's tag (0: a daemon without tenants; else service::PageTier's tag of the
  // tenant's or shared namespace's name), so equal block keys of two namespaces never meet.
  uint64_t ns = 0;
  // 32 bytes (codec id, block key) when ns is 0 -- the format of old -- else 40 (then ns, LE).
  std::string Bytes() const;
  static absl::StatusOr<TierKey> FromBytes(std::string_view bytes);
  friend bool operator==(const TierKey&, const TierKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const TierKey& k) {
    return H::combine(std::move(h), k.codec.bytes, k.block, k.ns);
  }
};

struct TierStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;   // what counts against the capacity (segment store: file bytes)
  uint64_t pages = 0;
  uint64_t puts = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;    // removed to stay under capacity
  uint64_t corruptions = 0;  // pages found corrupt on Get and dropped
};

class TierStore {
 public:
  virtual ~TierStore() = default;
  virtual absl::Status Put(const TierKey& key, std::span<const uint8_t> page) = 0;
  // Several Puts, one status per item, in order (the segment store writes the pages that land
  // back to back with one write, and their index records in one batch).
  struct PutItem {
    TierKey key;
    std::span<const uint8_t> page;
  };
  virtual std::vector<absl::Status> PutMany(std::span<const PutItem> items);
  // Appends the page to *out (cleared first).
  virtual absl::Status Get(const TierKey& key, std::vector<uint8_t>* out) = 0;
  // Reads the page straight into `out`, which must be exactly SizeOf(key) bytes (else
  // FAILED_PRECONDITION, nothing read); verified like Get. On an error `out` holds garbage.
  virtual absl::Status GetInto(const TierKey& key, std::span<uint8_t> out);
  // The stored page's size; NOT_FOUND if absent. Reads no page bytes.
  virtual absl::StatusOr<uint64_t> SizeOf(const TierKey& key) = 0;
  virtual bool Contains(const TierKey& key) = 0;
  // True when the key is stored and its copy is not about to be dropped for capacity: a page
  // evicted again from the pool need not be written again. False means Put it again (the
  // segment store re-appends it, which is what keeps a reused page away from the drop end).
  virtual bool KeepsCopy(const TierKey& key) { return Contains(key); }
  // NOT_FOUND if absent.
  virtual absl::Status Delete(const TierKey& key) = 0;
  virtual TierStats Stats() = 0;
  // Calls fn for every stored key (order unspecified); used to rebuild indexes after restart.
  virtual void ForEachKey(const std::function<void(const TierKey&, uint64_t bytes)>& fn) = 0;
  // Makes every completed Put durable (on disk, fsynced) before returning.
  virtual absl::Status Sync() { return absl::OkStatus(); }
};

struct SegmentTierOptions {
  std::string path;  // directory; holds segments/ and index/ (created if missing)
  // Bytes of segment files on disk (headers and the dead space of deleted or replaced pages
  // included): the tier never holds more.
  uint64_t capacity_bytes = 64ull << 30;
  // Target size of one segment file; 0 = capacity/32 clamped to [64 KiB, 4 GiB]. The tier
  // drops whole segments, so this is the granularity of its approximation of LRU.
  uint64_t segment_bytes = 0;
  // false: a Put is written to the OS (page bytes, then its index record into RocksDB's
  // write-ahead log) before it returns -- it survives kill -9 -- and is on the device after
  // Sync() (fdatasync of the segments, then of the log). true: every Put is synced too.
  bool sync_writes = false;
};

// Opens (or recovers) the tier at options.path. Recovery reads the index and the segment
// files' sizes, never page bytes; index records that point past a segment's end (a torn tail)
// or into a missing segment are removed.
absl::StatusOr<std::unique_ptr<TierStore>> OpenSegmentTierStore(const SegmentTierOptions& options);

// In-memory fake with the same contract (capacity, LRU, verification).
std::unique_ptr<TierStore> NewMemoryTierStore(uint64_t capacity_bytes);

// Wraps `base`; the injector decides per call whether to fail it.
struct FaultPlan {
  double put_error_rate = 0;      // Put returns UNAVAILABLE
  double get_error_rate = 0;      // Get returns UNAVAILABLE
  double get_corrupt_rate = 0;    // Get flips a byte of the returned page, then verifies
  uint64_t seed = 1;
};
std::unique_ptr<TierStore> NewFaultInjectingTierStore(std::unique_ptr<TierStore> base,
                                                      FaultPlan plan);

}  // namespace oscarkv::tiering
