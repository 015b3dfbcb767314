// ShmLoadStaging: the load side of isolated shared memory for a tenant, which may not map the
// daemon's pool (it holds every tenant's pages). A dedicated connection of the local socket
// attaches a load staging region (AttachLoadStaging: a sealed memfd the daemon creates for this
// connection only and passes read-only); each page is loaded in chunks (StageRead): the daemon
// checks this tenant's lease and copies the chunk into a slot of the region, and this side
// copies the chunk into the caller's buffer and hashes it in the same pass while the daemon
// fills the next slot (kSlots requests in flight). The checksum is of the bytes copied into
// the caller's buffer, so a corrupt page is DATA_LOSS here whatever the region held.
//
// Thread-safe: loads through one ShmLoadStaging are serialized (one region, one connection).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "page_fetch.h"

namespace oscarkv::client {

class LocalChannel;

class ShmLoadStaging final : public PageSource {
 public:
  // Region geometry: kSlots slots of kSlotBytes (the pipeline's depth and grain). A page of at
  // most kSlotBytes moves in one chunk (copied and hashed in one fused pass); a larger page in
  // kSlotBytes chunks, copied and hashed by one PageCopyChecksummer (still one fused pass).
  static constexpr uint64_t kSlotBytes = uint64_t{2} << 20;
  static constexpr uint32_t kSlots = 4;

  // Dials a connection of `local` and attaches a region. FAILED_PRECONDITION when the daemon
  // refuses (not isolated, over its limits).
  static absl::StatusOr<std::unique_ptr<ShmLoadStaging>> Open(LocalChannel& local);
  // The same on `sock`, a handshaken connection this object takes over (tests).
  static absl::StatusOr<std::unique_ptr<ShmLoadStaging>> Attach(int sock);
  ~ShmLoadStaging() override;
  ShmLoadStaging(const ShmLoadStaging&) = delete;
  ShmLoadStaging& operator=(const ShmLoadStaging&) = delete;

  // The connection is unusable (see ShmStaging::Broken: a break seen by a load, or, while no
  // load runs, EOF or anything else arriving on it). Never false again.
  bool Broken() override;

  // PageSource: pages[i] (pinned by `lease_id`, asked for by key) into dst[i]. UNAVAILABLE when
  // the connection broke (later calls fail the same way); the daemon's per-chunk refusal
  // (NOT_FOUND: not this tenant's lease or key) otherwise.
  absl::Status Fetch(uint64_t lease_id, std::span<const PageRef> pages,
                     std::span<const std::span<uint8_t>> dst, bool hash,
                     std::vector<std::optional<uint64_t>>* digests) override;

 private:
  ShmLoadStaging(int sock, const uint8_t* region, uint64_t bytes)
      : sock_(sock), region_(region), region_bytes_(bytes) {}

  std::mutex mu_;  // one load at a time: the region and the connection
  const int sock_;
  const uint8_t* const region_;  // PROT_READ
  const uint64_t region_bytes_;
  uint64_t next_id_ = 1;  // guarded by mu_
  std::string buf_;       // receive buffer, guarded by mu_
  absl::Status broken_;   // guarded by mu_
};

}  // namespace oscarkv::client
