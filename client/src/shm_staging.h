// ShmStaging: the client side of isolated shared memory (HandshakeResponse.shm_isolated). The
// daemon's pool is mapped read-only from a descriptor it passes over a connection of its local
// socket; pages are stored through a staging region (a memfd of this process, mapped
// read-write here and read-only by the daemon) in chunks, pipelined: while the daemon copies
// chunk i into the page's slot and hashes it in the same pass (StageWrite), this side copies
// chunks i + 1 .. i + kSlots - 1 into the next staging slots. A page of up to kChunkBytes is one
// chunk (one frame, one answer); the ring is deep enough that either side can run ahead by
// several pages while the other is off its CPU. The daemon's hash, of the bytes it copied,
// decides whether a page is stored; nothing this process writes can change a page after that.
//
// Thread-safe: stores through one ShmStaging are serialized (one staging region).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"
#include "oscarkv/v1/oscarkv.pb.h"
#include "shm_mapping.h"

namespace oscarkv::client {

class LocalChannel;

class ShmStaging {
 public:
  // Staging geometry: kSlots slots of kChunkBytes each (the pipeline's depth and grain): 16 MiB,
  // within the daemon's default pool.staging_max_mb (64). Larger pages go in equal pieces.
  static constexpr uint64_t kChunkBytes = uint64_t{2} << 20;
  static constexpr uint32_t kSlots = 8;

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
  // The staging connection is unusable: it broke during a store, or (checked without blocking
  // while no store runs) the daemon closed it -- between stores nothing may arrive on it, so
  // EOF, an error or a refusal frame all mean its daemon is gone (restarted). Never false again.
  bool Broken();
  // The daemon serves Reserve frames on this connection (AttachStagingResponse.reserve_frames).
  bool reserve_frames() const { return reserve_frames_; }

  // Given the Reserve answer: which pages of the batch were reserved (each with its status
  // left OK), the others' statuses set. A non-OK return stops the store with that status.
  using Admit =
      std::function<absl::StatusOr<std::vector<size_t>>(const ::oscarkv::v1::ReserveResponse&)>;

  // One batch without gRPC (needs reserve_frames()): sends `reserve` as a Reserve frame on this
  // connection, copies the first chunks of pages[candidates] into staging while the daemon
  // answers (so the pipeline starts full), hands the answer to `admit`, then stages the pages it
  // admitted as StagePages does (the chunks copied ahead are sent without copying again; those
  // of pages not reserved are dropped). The return is the Reserve's: non-OK when the daemon
  // refused it, `admit` failed or the connection broke before the answer (nothing is known to
  // be reserved then); a break while staging goes into the pages' statuses as in StagePages.
  absl::Status ReserveAndStage(const ::oscarkv::v1::ReserveRequest& reserve,
                               std::span<const PageWrite> pages,
                               std::span<const size_t> candidates, const Admit& admit,
                               std::vector<absl::Status>* status, std::vector<bool>* committed);

  // Stages pages[reserved[i]] into their slots of `reservation_id`, in order, asking the daemon
  // to commit each page with its last chunk. (*status)[j] for j in `reserved` ends OK (copied
  // and verified by the daemon) or why not (DATA_LOSS: the bytes the daemon copied do not match
  // the page's checksum; the slot is released). (*committed)[j] says the daemon also committed
  // it; an OK page that is not committed (a daemon without StageWriteRequest.commit) is ready
  // for a Commit RPC. A non-OK return means the connection broke; every page not yet confirmed
  // got that status.
  absl::Status StagePages(uint64_t reservation_id, std::span<const PageWrite> pages,
                          std::span<const size_t> reserved, std::vector<absl::Status>* status,
                          std::vector<bool>* committed);

 private:
  ShmStaging(int sock, uint8_t* staging, uint64_t staging_bytes,
             std::unique_ptr<ShmMapping> pool, std::string rx, bool reserve_frames)
      : sock_(sock),
        staging_(staging),
        staging_bytes_(staging_bytes),
        pool_(std::move(pool)),
        reserve_frames_(reserve_frames),
        rx_(std::move(rx)) {}

  // A chunk copied into staging slot `slot` before its page was known to be reserved.
  struct Prestaged {
    size_t page;  // index into `pages`
    uint64_t offset;
    uint32_t slot;
  };
  // StagePages under mu_, starting from the chunks `ahead` (in page order) already in staging.
  absl::Status StageLocked(uint64_t reservation_id, std::span<const PageWrite> pages,
                           std::span<const size_t> reserved, std::span<const Prestaged> ahead,
                           std::vector<absl::Status>* status, std::vector<bool>* committed);

  // Shuts the connection down for good (its answers can no longer be matched).
  void Break();

  std::mutex mu_;  // one store at a time: the staging slots and the connection
  std::atomic<bool> broken_{false};
  const int sock_;
  uint8_t* const staging_;
  const uint64_t staging_bytes_;
  std::unique_ptr<ShmMapping> pool_;
  const bool reserve_frames_;
  uint64_t next_id_ = 1;  // guarded by mu_
  std::string rx_;  // guarded by mu_: one answer frame (local::kMaxFrameBytes, reused)
};

}  // namespace oscarkv::client
