// Arguments and results of PageCache's calls (page_cache.h): plain structs, no protobuf. The
// front ends translate their wire messages to and from these (service/src/cache_wire.h), so
// wire-format checks (byte lengths of keys and codec ids, enum values) happen there and every
// rule of the cache lives in PageCache.
//
// Per-item results carry an absl::Status each (OK, or the item's own error); a call's own
// Status says whether the call as a whole ran. Keys are BlockKeys, codecs their CodecId.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "oscarkv/kernels/block_key.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/page_format.h"

namespace oscarkv::service {

// The wire version this daemon speaks (oscarkv.proto's WIRE_VERSION_1) and its version string.
inline constexpr uint32_t kWireVersion = 1;
inline constexpr const char* kServerVersion = "oscarkvd 0.1.0";

// Where one page lies in the pool: a pinned page to read, or a reserved slot to write.
struct PageRef {
  BlockKey key;
  uint64_t offset = 0;  // byte offset in the shared-memory pool
  uint64_t bytes = 0;   // page size
  PageKind kind = PageKind::kInt2;
  uint16_t token_count = 0;  // tokens in the page (0 for a reserved slot)
};

struct HandshakeArgs {
  uint32_t wire_version = 0;
};
struct HandshakeInfo {
  uint32_t wire_version = 0;
  std::string server_version;
  std::string node_id;
  std::string shm_path;  // "" when the pool is not shared memory (no fast path)
  uint64_t shm_bytes = 0;
  // Isolated shared memory (pool.shm_mode: isolated): shm_path is "" and clients get the pool
  // read-only over the local socket (AttachStaging), storing through staging.
  bool shm_isolated = false;
  uint32_t max_batch = 0;
};

struct CodecRegistration {
  CodecId id;
  uint64_t int2_page_bytes = 0;
  uint64_t bf16_page_bytes = 0;
};

// `keys` must stay valid for the call (the cache does not keep them).
struct LookupQuery {
  CodecId codec;
  std::span<const BlockKey> keys;
  bool pin = false;       // pin the matched prefix under a lease
  uint32_t lease_ms = 0;  // 0 = default lease; capped by max_lease_ms
};
struct LookupResult {
  uint32_t matched = 0;  // length of the matched prefix of `keys`
  uint64_t lease_id = 0;  // 0 when nothing was pinned
  uint64_t lease_deadline_unix_ms = 0;
  std::vector<PageRef> pages;  // the pinned pages (empty for a probe)
};

struct ReserveItem {
  BlockKey key;
  // Any value may arrive from the wire: one that is neither kInt2 nor kBf16 fails the item.
  PageKind kind = PageKind::kInt2;
};
struct ReserveArgs {
  CodecId codec;
  std::vector<ReserveItem> items;
  uint32_t ttl_ms = 0;  // 0 = default reservation ttl; capped by max_reservation_ttl_ms
};
struct ReserveItemResult {
  absl::Status status;  // OK: `slot` is the item's slot
  PageRef slot;
};
struct ReserveResult {
  uint64_t reservation_id = 0;  // 0 when no item got a slot
  std::vector<ReserveItemResult> items;  // one per ReserveArgs::items, same order
};

struct CommitArgs {
  uint64_t reservation_id = 0;
  bool all_items = false;      // commit every item of the reservation (then `keys` is ignored)
  std::vector<BlockKey> keys;  // else these items, in this order
  // The client hashed the shared-memory pages in its copy and commits only those that matched:
  // their checksums are not recomputed (pages written through WriteChunk always are).
  bool checksums_verified = false;
};

// One chunk of a page written through the cache (the gRPC WritePages stream).
struct WriteChunkArgs {
  uint64_t reservation_id = 0;
  BlockKey key;
  uint64_t offset = 0;  // byte offset in the page
  std::span<const uint8_t> data;
};

struct ReadArgs {
  uint64_t lease_id = 0;
  std::vector<BlockKey> keys;  // pages of the lease to read; empty = all of them
};

struct RenewLeaseArgs {
  uint64_t lease_id = 0;
  uint32_t lease_ms = 0;  // 0 = default lease; capped by max_lease_ms
};

struct DeleteArgs {
  CodecId codec;
  std::vector<BlockKey> keys;
};

struct ClearArgs {
  std::optional<CodecId> codec;  // none: every codec
  bool include_pinned = false;
};

struct UnregisterResult {
  uint32_t codecs = 0;         // registrations removed (an admin's call: one per namespace)
  uint64_t pages_removed = 0;  // with drop_pages: pool and SSD-tier pages deleted
};

struct PublishHandleArgs {
  std::string name;  // 1..256 bytes
  CodecId codec;
  std::vector<BlockKey> keys;  // committed pages, in the order OpenHandle returns them
  std::string metadata;        // opaque, at most 1 MiB
  uint32_t ttl_ms = 0;         // 0 = default handle ttl; capped by max_handle_ttl_ms
};
struct OpenHandleArgs {
  std::string name;
  uint32_t lease_ms = 0;
};
struct OpenedHandle {
  CodecId codec;
  std::string metadata;
  uint64_t handle_deadline_unix_ms = 0;
  std::vector<PageRef> pages;
  uint64_t lease_id = 0;  // a lease of its own pins the pages for the reader
  uint64_t lease_deadline_unix_ms = 0;
};

// Stats: the pool, the index, the counters, and the SSD tier (all 0 without one).
struct CacheStats {
  uint64_t pool_bytes = 0, pool_used_bytes = 0;
  uint64_t pages = 0, pinned_pages = 0, leases = 0, reservations = 0, handles = 0;
  uint64_t lookups = 0, hits = 0, misses = 0, evictions = 0;
  uint64_t bytes_written = 0, bytes_read = 0;
  uint32_t codecs = 0;
  std::string node_id;
  std::string server_version;
  uint64_t tier_capacity_bytes = 0, tier_bytes = 0, tier_pages = 0;
  uint64_t tier_demotions = 0, tier_promotions = 0, tier_hits = 0, tier_misses = 0;
  uint64_t tier_demote_drops = 0, tier_corruptions = 0, tier_evictions = 0;
  uint64_t tier_queued_bytes = 0;
};

}  // namespace oscarkv::service
