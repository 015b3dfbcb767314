#include "shm_staging.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <string>

#include "absl/strings/str_cat.h"
#include "local_channel.h"
#include "local_frames.h"
#include "oscarkv/v1/local_control.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::client {
namespace pb = ::oscarkv::v1;
namespace local = ::oscarkv::v1::local;

absl::StatusOr<std::unique_ptr<ShmStaging>> ShmStaging::Open(LocalChannel& local,
                                                            uint64_t pool_bytes) {
  auto sock = local.DialDedicated();
  if (!sock.ok()) return sock.status();
  const uint64_t bytes = kChunkBytes * kSlots;
  int mfd = ::memfd_create("oscarkv-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  uint8_t* staging = nullptr;
  auto fail = [&](absl::Status s) {
    if (staging != nullptr) ::munmap(staging, bytes);
    if (mfd >= 0) ::close(mfd);
    ::close(*sock);
    return s;
  };
  if (mfd < 0) return fail(absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno))));
  // Sealed against shrinking: the daemon maps it, and a shrunk file would fault its copies.
  if (::ftruncate(mfd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return fail(absl::InternalError(absl::StrCat("staging memfd: ", std::strerror(errno))));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  if (p == MAP_FAILED) {
    return fail(absl::InternalError(absl::StrCat("staging mmap: ", std::strerror(errno))));
  }
  staging = static_cast<uint8_t*>(p);
  std::memset(staging, 0, bytes);  // first touch now, not in the first store
  pb::AttachStagingRequest req;
  req.set_staging_bytes(bytes);
  if (absl::Status s = SendLocalFrame(*sock, local::Method::kAttachStaging, 1, req, mfd);
      !s.ok()) {
    return fail(s);
  }
  ::close(mfd);  // the mapping (and the daemon's) keep it alive
  mfd = -1;
  std::string rx;
  auto a = RecvLocalAnswer(*sock, 1, &rx);
  if (!a.ok()) return fail(a.status());
  if (!a->status.ok()) {
    if (a->fd >= 0) ::close(a->fd);
    return fail(absl::FailedPreconditionError(
        absl::StrCat("AttachStaging refused: ", a->status.message())));
  }
  pb::AttachStagingResponse resp;
  if (a->fd < 0 && resp.ParseFromArray(a->body, static_cast<int>(a->body_bytes)) && resp.pool_bytes() == 0) {
    // A tenant: stores through staging, no pool mapping (shm_load_staging.h loads).
    return std::unique_ptr<ShmStaging>(
        new ShmStaging(*sock, staging, bytes, nullptr, std::move(rx)));
  }
  if (a->fd < 0 || !resp.ParseFromArray(a->body, static_cast<int>(a->body_bytes)) || resp.pool_bytes() != pool_bytes) {
    if (a->fd >= 0) ::close(a->fd);
    return fail(absl::FailedPreconditionError(
        "AttachStaging: the daemon passed no pool descriptor of the announced size"));
  }
  auto pool = ShmMapping::MapReadOnlyFd(a->fd, pool_bytes);
  ::close(a->fd);
  if (!pool.ok()) return fail(pool.status());
  return std::unique_ptr<ShmStaging>(
      new ShmStaging(*sock, staging, bytes, std::move(*pool), std::move(rx)));
}

ShmStaging::~ShmStaging() {
  ::munmap(staging_, staging_bytes_);
  ::close(sock_);
}

absl::Status ShmStaging::StagePages(uint64_t reservation_id, std::span<const PageWrite> pages,
                                    std::span<const size_t> reserved,
                                    std::vector<absl::Status>* status,
                                    std::vector<bool>* committed) {
  std::lock_guard<std::mutex> lock(mu_);
  committed->assign(pages.size(), false);
  struct InFlight {
    uint64_t id;
    size_t page;  // index into `pages`
    bool last;    // completes the page: its answer is the page's verdict
  };
  std::deque<InFlight> inflight;
  std::vector<bool> confirmed(pages.size(), false);
  absl::Status broken;
  // One answer, oldest first: a failed chunk decides its page (the first failure is kept).
  auto settle = [&]() -> bool {
    const InFlight f = inflight.front();
    inflight.pop_front();
    auto a = RecvLocalAnswer(sock_, f.id, &rx_);
    if (!a.ok()) {
      broken = a.status();
      return false;
    }
    if (a->fd >= 0) ::close(a->fd);
    if (!a->status.ok()) {
      if ((*status)[f.page].ok()) (*status)[f.page] = a->status;
    } else if (f.last) {
      pb::StageWriteResponse resp;
      if (resp.ParseFromArray(a->body, static_cast<int>(a->body_bytes)) && resp.committed()) {
        // The daemon verified and published the page: that is the page's truth, whatever an
        // earlier chunk's answer said.
        (*status)[f.page] = absl::OkStatus();
        (*committed)[f.page] = true;
        confirmed[f.page] = true;
      } else if ((*status)[f.page].ok()) {
        confirmed[f.page] = true;
      }
    }
    return true;
  };
  pb::StageWriteRequest req;
  req.set_reservation_id(reservation_id);
  uint64_t seq = 0;
  for (size_t i : reserved) (*status)[i] = absl::OkStatus();
  for (size_t r = 0; r < reserved.size() && broken.ok(); ++r) {
    const size_t i = reserved[r];
    const std::span<const uint8_t> src = pages[i].bytes;
    req.set_key(reinterpret_cast<const char*>(pages[i].key.bytes.data()), pages[i].key.bytes.size());
    // The page in equal pieces of at most a slot each: one piece (one frame) for a page of up
    // to kChunkBytes, and no short straggler that costs a round trip of its own.
    const uint64_t pieces = std::max<uint64_t>(1, (src.size() + kChunkBytes - 1) / kChunkBytes);
    const uint64_t piece =
        std::min(kChunkBytes, ((src.size() + pieces - 1) / pieces + 63) / 64 * 64);
    for (uint64_t off = 0; off < src.size() && broken.ok(); off += piece, ++seq) {
      if (inflight.size() == kSlots && !settle()) break;
      const uint64_t len = std::min<uint64_t>(piece, src.size() - off);
      const uint64_t slot = (seq % kSlots) * kChunkBytes;
      std::memcpy(staging_ + slot, src.data() + off, len);
      req.set_page_offset(off);
      req.set_staging_offset(slot);
      req.set_length(len);
      req.set_commit(off + len == src.size());  // the last chunk commits the page
      const uint64_t id = next_id_++;
      if (absl::Status s = SendLocalFrame(sock_, local::Method::kStageWrite, id, req); !s.ok()) {
        broken = s;
        break;
      }
      inflight.push_back({id, i, off + len == src.size()});
    }
  }
  while (!inflight.empty() && broken.ok()) settle();
  if (!broken.ok()) {
    // Answers still owed cannot be matched any more: the connection is unusable.
    ::shutdown(sock_, SHUT_RDWR);
  }
  // A page is staged only when the daemon confirmed its last chunk.
  for (size_t i : reserved) {
    if ((*status)[i].ok() && !confirmed[i]) {
      (*status)[i] = broken.ok() ? absl::InternalError("page was not staged") : broken;
    }
  }
  return broken;
}

}  // namespace oscarkv::client
