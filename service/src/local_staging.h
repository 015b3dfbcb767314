// Isolated shared memory on the local control socket: descriptors passed with SCM_RIGHTS and
// the staging region a client attaches (AttachStaging, proto/oscarkv/v1/oscarkv.proto).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "oscarkv/allocator/arena.h"
#include "oscarkv/service/caller.h"
#include "oscarkv/service/page_cache.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::service {

// Space for the control message of one received frame (up to 4 descriptors; more are truncated
// by the kernel, and MSG_CTRUNC refuses the frame).
inline constexpr size_t kFdControlBytes = CMSG_SPACE(4 * sizeof(int));

// The first descriptor of the SCM_RIGHTS message(s) in `mh` (-1 if none); every other one is
// closed.
int TakeReceivedFd(msghdr& mh);

// Sends one frame with `fd` attached (SCM_RIGHTS), without blocking. false when it could not be
// sent whole.
bool SendFrameWithFd(int sock, const void* data, size_t n, int fd);

// A client's staging region, mapped read-only by the daemon for the life of its connection.
class StagingRegion {
 public:
  // Takes ownership of `fd`. INVALID_ARGUMENT unless it is a memfd sealed against shrinking
  // (so the client cannot truncate it under the daemon's copy: SIGBUS) of at least `bytes`,
  // other than the pool itself; RESOURCE_EXHAUSTED over `max_bytes`.
  static absl::StatusOr<std::unique_ptr<StagingRegion>> Map(int fd, uint64_t bytes,
                                                            uint64_t max_bytes, const Arena& pool);
  ~StagingRegion();
  StagingRegion(const StagingRegion&) = delete;
  StagingRegion& operator=(const StagingRegion&) = delete;
  std::span<const uint8_t> bytes() const { return {base_, size_}; }

 private:
  StagingRegion(const uint8_t* base, uint64_t size) : base_(base), size_(size) {}
  const uint8_t* base_;
  uint64_t size_;
};

// StageWrite: the chunk [staging_offset, +length) of the connection's staging region written
// into the reserved slot as a WritePages chunk would be (PageCache::WriteChunk copies it into
// the slot and, in order from offset 0, hashes the slot's bytes in the same pass; Commit checks
// that hash). The client may change its staging bytes at any time: only what was copied into
// the slot -- memory no client can write -- is hashed and published. With req.commit() the key
// is then committed (PageCache::Commit of that one key: its status is the answer's) and
// resp->committed says it was.
absl::Status StageChunk(PageCache& cache, const Caller& caller,
                        const ::oscarkv::v1::StageWriteRequest& req,
                        std::span<const uint8_t> staging, ::oscarkv::v1::StageWriteResponse* resp);

}  // namespace oscarkv::service
