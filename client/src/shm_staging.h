// ShmStaging: the client side of isolated shared memory (HandshakeResponse.shm_isolated). The
// daemon's pool is mapped read-only from a descriptor it passes over a connection of its local
// socket; pages are stored through a small staging region (a memfd of this process, mapped
// read-write here and read-only by the daemon) in chunks, pipelined: while the daemon copies
// chunk i into the page's slot and hashes it (StageWrite), this side copies chunk i + 1 into the
// next staging slot. The daemon's hash, of the bytes it copied, decides whether a page is
// stored; nothing this process writes can change a page after that.
//
// Thread-safe: stores through one ShmStaging are serialized (one staging region).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"
#include "shm_mapping.h"

namespace oscarkv::client {

class LocalChannel;

class ShmStaging {
 public:
  // Staging geometry: kSlots slots of kChunkBytes each (the pipeline's depth and grain).
  static constexpr uint64_t kChunkBytes = uint64_t{1} << 20;
  static constexpr uint32_t kSlots = 4;

  // Dials a connection of `local`, attaches a new staging region and maps the pool the daemon
  // passes back (its size must be `pool_bytes`); a tenant gets no pool (pool() is null: it loads
  // through ShmLoadStaging). FAILED_PRECONDITION when the daemon refuses (not isolated, staging
  // too large) or passes a pool of another size.
  static absl::StatusOr<std::unique_ptr<ShmStaging>> Open(LocalChannel& local,
                                                          uint64_t pool_bytes);
  ~ShmStaging();
  ShmStaging(const ShmStaging&) = delete;
  ShmStaging& operator=(const ShmStaging&) = delete;

  // The pool, read-only; null for a tenant (the pool holds every tenant's pages).
  const ShmMapping* pool() const { return pool_.get(); }

  // Stages pages[reserved[i]] into their slots of `reservation_id`, in order. (*status)[j] for
  // j in `reserved` ends OK (copied and verified by the daemon: ready to Commit) or why not
  // (DATA_LOSS: the bytes the daemon copied do not match the page's checksum). A non-OK return
  // means the connection broke; every page not yet confirmed got that status.
  absl::Status StagePages(uint64_t reservation_id, std::span<const PageWrite> pages,
                          std::span<const size_t> reserved, std::vector<absl::Status>* status);

 private:
  ShmStaging(int sock, uint8_t* staging, uint64_t staging_bytes,
             std::unique_ptr<ShmMapping> pool)
      : sock_(sock), staging_(staging), staging_bytes_(staging_bytes), pool_(std::move(pool)) {}

  std::mutex mu_;  // one store at a time: the staging slots and the connection
  const int sock_;
  uint8_t* const staging_;
  const uint64_t staging_bytes_;
  std::unique_ptr<ShmMapping> pool_;
  uint64_t next_id_ = 1;  // guarded by mu_
};

}  // namespace oscarkv::client
