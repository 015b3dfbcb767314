// The one load path of the client library. Client::Load / LoadInto, HandleClient::Load and
// UcxLoader's loads all end here once their pages are pinned (a Lookup lease or an OpenHandle
// lease): FetchVerified checks each pinned page's size against the codec and its destination,
// has a PageSource move the bytes into caller memory, and verifies every page (size, magic,
// version, codec id, shape, kind, and the XXH3 checksum when asked) before any is reported as
// loaded. No page that failed is ever reported as loaded: the whole call fails.
//
// One pass per page: a source that copies bytes with the CPU (shared memory, gRPC chunks, the
// UCX staging buffer) hashes each page in the same pass as its copy (page_checksum.h) and hands
// the checksum to FetchVerified; only pages placed by someone else (UCX RMA straight into
// caller memory) are hashed after they landed.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::client {

class RpcCore;
class ShmMapping;

// Where the bytes of pinned pages come from.
class PageSource {
 public:
  virtual ~PageSource() = default;
  // Copies page i of `pages` (pinned under `lease_id`) into dst[i], which is exactly
  // pages[i].bytes long. With `hash`, (*digests)[i] may receive the checksum of the bytes the
  // source wrote into dst[i], computed in the same pass; pages left without one are hashed by
  // FetchVerified. `digests` has one entry per page, all empty on entry.
  virtual absl::Status Fetch(uint64_t lease_id, std::span<const PageRef> pages,
                             std::span<const std::span<uint8_t>> dst, bool hash,
                             std::vector<std::optional<uint64_t>>* digests) = 0;
  // True when this source can never fetch again (a connection of its own to a daemon that is
  // gone); the Client then reconnects. Sources without a connection of their own: false.
  virtual bool Broken() { return false; }
};

// Copies out of the daemon's pool mapped in this process.
class ShmPageSource final : public PageSource {
 public:
  explicit ShmPageSource(const ShmMapping& shm) : shm_(shm) {}
  absl::Status Fetch(uint64_t lease_id, std::span<const PageRef> pages,
                     std::span<const std::span<uint8_t>> dst, bool hash,
                     std::vector<std::optional<uint64_t>>* digests) override;

 private:
  const ShmMapping& shm_;
};

// gRPC ReadPages. `by_key`: ask for exactly `pages` by key (a Lookup lease, possibly a part of
// it); otherwise the whole lease, whose pages arrive in lease order (an OpenHandle lease, in
// publish order -- keys may repeat there).
class StreamPageSource final : public PageSource {
 public:
  StreamPageSource(const RpcCore& rpc, bool by_key) : rpc_(rpc), by_key_(by_key) {}
  absl::Status Fetch(uint64_t lease_id, std::span<const PageRef> pages,
                     std::span<const std::span<uint8_t>> dst, bool hash,
                     std::vector<std::optional<uint64_t>>* digests) override;

 private:
  const RpcCore& rpc_;
  const bool by_key_;
};

// The pages of a lease fetched into dst[i] (each at least pages[i].bytes; only that prefix is
// written) and verified. INVALID_ARGUMENT for a destination too small; DATA_LOSS for a page
// the daemon describes with the wrong size, or whose bytes fail verification -- the message
// names the page (its index plus `first_index`) and its key.
// `corrupt` (optional) receives the index in `pages` of the page whose bytes failed
// verification, when that is why the call failed.
absl::Status FetchVerified(const Codec& codec, uint64_t lease_id, std::span<const PageRef> pages,
                           std::span<const std::span<uint8_t>> dst, PageSource& source,
                           bool verify_checksums, size_t first_index = 0,
                           std::optional<size_t>* corrupt = nullptr);

// Allocates one buffer per page (its size) in *owned and returns spans over them.
std::vector<std::span<uint8_t>> OwnedBuffers(std::span<const PageRef> pages,
                                             std::vector<std::vector<uint8_t>>* owned);

// A PageRef of the wire's PageRef: INTERNAL for a malformed key or an unknown kind.
absl::StatusOr<PageRef> PageRefFromProto(const v1::PageRef& r);

}  // namespace oscarkv::client
