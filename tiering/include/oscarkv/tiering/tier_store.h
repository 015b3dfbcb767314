// The SSD tier: a capacity-capped store of whole pages keyed by (codec id, block key), that
// survives restarts. The daemon demotes pages evicted from its DRAM pool here instead of dropping
// them, and promotes them back on a lookup hit.
//
// TierStore is the seam: RocksDbTierStore is the real one (RocksDB with blob files for the large
// page values, a separate column family of small metadata records so restart recovery never
// reads page bytes), MemoryTierStore a fake for unit tests of other modules, and
// FaultInjectingTierStore wraps either to inject I/O errors and corruption.
//
// Contract for every implementation:
// * Put stores a copy of a complete page (docs/FORMAT.md) and may evict the least recently used
//   pages of the tier to stay under capacity; a page larger than the capacity is rejected
//   (RESOURCE_EXHAUSTED). Put of an existing key replaces it.
// * Get returns NOT_FOUND for absent keys and DATA_LOSS for a page whose header or checksum does
//   not verify (that entry is then removed): a corrupt page is never returned as good data.
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
  std::string Bytes() const;  // 32 bytes: codec id then block key
  static absl::StatusOr<TierKey> FromBytes(std::string_view bytes);
  friend bool operator==(const TierKey&, const TierKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const TierKey& k) {
    return H::combine(std::move(h), k.codec.bytes, k.block);
  }
};

struct TierStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
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
  // Appends the page to *out (cleared first).
  virtual absl::Status Get(const TierKey& key, std::vector<uint8_t>* out) = 0;
  virtual bool Contains(const TierKey& key) = 0;
  // NOT_FOUND if absent.
  virtual absl::Status Delete(const TierKey& key) = 0;
  virtual TierStats Stats() = 0;
  // Calls fn for every stored key (order unspecified); used to rebuild indexes after restart.
  virtual void ForEachKey(const std::function<void(const TierKey&, uint64_t bytes)>& fn) = 0;
  // Makes every completed Put durable (on disk, fsynced) before returning.
  virtual absl::Status Sync() { return absl::OkStatus(); }
};

struct RocksDbTierOptions {
  std::string path;                // directory; created if missing
  uint64_t capacity_bytes = 64ull << 30;
  // false: Puts go to memtables only (no write-ahead log, so page bytes are written to disk
  // once, into blob files) and are durable after Sync() or an automatic memtable flush; a crash
  // loses what was put since. true: each Put is logged and fsynced before it returns.
  bool sync_writes = false;
  bool verify_on_get = true;       // verify header + checksum of every page read
};

// Opens (or recovers) the tier at options.path. Recovery reads only the metadata column family.
absl::StatusOr<std::unique_ptr<TierStore>> OpenRocksDbTierStore(const RocksDbTierOptions& options);

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
