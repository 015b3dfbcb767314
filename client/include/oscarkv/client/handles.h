// Transfer handles: the prefill -> decode handoff (docs/ARCHITECTURE.md §4, flow 3).
//
// A prefill worker stores a request's pages (BF16 sink, INT2 history, BF16 tail) and publishes
// them under a handle name; a decode worker (same host or not) opens the handle by name, copies
// the pages out (shared memory when the daemon's pool segment is mappable here, else gRPC
// ReadPages), every page verified (size, header, codec, kind, XXH3 checksum), then releases its
// lease. The daemon pins a handle's pages until CloseHandle or the handle's ttl.
//
// Keys. History pages use their canonical chained block keys (Client::BlockKeys). A partial tail
// page (fewer than page_tokens tokens) or any page without a canonical key uses
// HandleTailKey(codec, handle, i) = ChainBlockKey(codec.id, "oscarkv.handle/" + handle, nullptr,
// {i}): the FORMAT.md §3 chain hash with the tenant salt "oscarkv.handle/<name>" and the single
// "token" i. Canonical keys never use that salt, so derived keys do not collide with them, and two
// handles never share a derived key.
//
// Thread-safety: every method may be called concurrently. Errors are the daemon's codes passed
// through (NOT_FOUND: unknown/expired handle, ALREADY_EXISTS: the name holds other pages), plus
// DATA_LOSS for a page that fails verification (no page of such a load is returned).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"

namespace oscarkv::client {

struct HandleInfo {
  std::string name;
  CodecId codec_id;
  uint64_t lease_id = 0;  // this opener's lease on the pages (0 once released)
  uint64_t lease_deadline_unix_ms = 0;
  uint64_t handle_deadline_unix_ms = 0;
  std::string metadata;         // as published
  std::vector<PageRef> pages;   // in publish order
};

struct HandlePages {
  HandleInfo info;  // lease already released
  std::vector<std::vector<uint8_t>> pages;  // page i of info.pages, verified
  uint64_t bytes = 0;
  // OK unless releasing the lease after the copy failed (the pages are verified and returned
  // either way; the lease expires by itself). ClusterClient marks the owner down on a transport
  // failure here, as for LoadResult::release_status.
  absl::Status release_status;
};

class HandleClient {
 public:
  // Connects its own Client (see Client::Connect) plus the handle RPCs.
  static absl::StatusOr<std::unique_ptr<HandleClient>> Connect(const ConnectOptions& options);
  virtual ~HandleClient() = default;

  // The plain client of the same daemon (RegisterCodec, Store, Load, ...).
  virtual Client& client() = 0;

  // Derived key of page `index` of a handle (see the header comment).
  static BlockKey HandleTailKey(const Codec& codec, const std::string& handle, uint32_t index);

  // Stores `pages` (deduplicated like Store) and publishes them, in this order, under `handle`
  // with `metadata`, pinned for `ttl_ms` (0 = daemon default). Fails (and publishes nothing)
  // when a page could not be stored. Returns the handle's deadline (unix ms). Idempotent.
  virtual absl::StatusOr<uint64_t> Publish(const Codec& codec, const std::string& handle,
                                           std::span<const PageWrite> pages,
                                           const std::string& metadata, uint32_t ttl_ms = 0) = 0;
  // Publishes already-committed keys.
  virtual absl::StatusOr<uint64_t> PublishKeys(const Codec& codec, const std::string& handle,
                                               std::span<const BlockKey> keys,
                                               const std::string& metadata,
                                               uint32_t ttl_ms = 0) = 0;
  // Pins the handle's pages under a new lease for this caller (release with client().Release).
  virtual absl::StatusOr<HandleInfo> Open(const std::string& handle, uint32_t lease_ms = 0) = 0;
  // Open + copy every page out + verify + release the lease.
  virtual absl::StatusOr<HandlePages> Load(const Codec& codec, const std::string& handle) = 0;
  // Unpins the handle (idempotent). Pages already opened stay readable until their lease ends.
  virtual absl::Status Close(const std::string& handle) = 0;
};

}  // namespace oscarkv::client
