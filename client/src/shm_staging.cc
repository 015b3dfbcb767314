#include "shm_staging.h"

#include <fcntl.h>
#include <poll.h>
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
        new ShmStaging(*sock, staging, bytes, nullptr, std::move(rx), resp.reserve_frames()));
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
      new ShmStaging(*sock, staging, bytes, std::move(*pool), std::move(rx),
                     resp.reserve_frames()));
}

ShmStaging::~ShmStaging() {
  ::munmap(staging_, staging_bytes_);
  ::close(sock_);
}

void ShmStaging::Break() {
  broken_.store(true, std::memory_order_relaxed);
  ::shutdown(sock_, SHUT_RDWR);
}

bool ShmStaging::Broken() {
  if (broken_.load(std::memory_order_relaxed)) return true;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;  // a store is running: it finds out itself
  pollfd p{sock_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) == 0) return false;
  Break();
  return true;
}

namespace {

// A page in equal pieces of at most a slot each: one piece (one frame) for a page of up to
// kChunkBytes, and no short straggler that costs a round trip of its own.
uint64_t PieceBytes(uint64_t page_bytes) {
  const uint64_t pieces =
      std::max<uint64_t>(1, (page_bytes + ShmStaging::kChunkBytes - 1) / ShmStaging::kChunkBytes);
  return std::min(ShmStaging::kChunkBytes, ((page_bytes + pieces - 1) / pieces + 63) / 64 * 64);
}

// True when a frame is waiting on `sock` (without taking it).
bool Readable(int sock) {
  pollfd p{sock, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

}  // namespace

absl::Status ShmStaging::StagePages(uint64_t reservation_id, std::span<const PageWrite> pages,
                                    std::span<const size_t> reserved,
                                    std::vector<absl::Status>* status,
                                    std::vector<bool>* committed) {
  std::lock_guard<std::mutex> lock(mu_);
  return StageLocked(reservation_id, pages, reserved, {}, status, committed);
}

absl::Status ShmStaging::ReserveAndStage(const pb::ReserveRequest& reserve,
                                         std::span<const PageWrite> pages,
                                         std::span<const size_t> candidates, const Admit& admit,
                                         std::vector<absl::Status>* status,
                                         std::vector<bool>* committed) {
  std::lock_guard<std::mutex> lock(mu_);
  committed->assign(pages.size(), false);
  if (!reserve_frames_) {
    return absl::FailedPreconditionError("this daemon serves no Reserve frames");
  }
  const uint64_t id = next_id_++;
  if (absl::Status s = SendLocalFrame(sock_, local::Method::kReserve, id, reserve); !s.ok()) {
    Break();
    return s;
  }
  // While the daemon reserves: the first chunks into staging, until its answer is here or the
  // slots are full (at least one, so the first StageWrite goes out with the answer).
  std::vector<Prestaged> ahead;
  for (size_t i : candidates) {
    const std::span<const uint8_t> src = pages[i].bytes;
    const uint64_t piece = PieceBytes(src.size());
    for (uint64_t off = 0; off < src.size() && ahead.size() < kSlots; off += piece) {
      const uint32_t slot = static_cast<uint32_t>(ahead.size());
      std::memcpy(staging_ + uint64_t{slot} * kChunkBytes, src.data() + off,
                  std::min<uint64_t>(piece, src.size() - off));
      ahead.push_back({i, off, slot});
      if (Readable(sock_)) break;
    }
    if (ahead.size() == kSlots || Readable(sock_)) break;
  }
  auto a = RecvLocalAnswer(sock_, id, &rx_);
  if (!a.ok()) {
    Break();  // the answer may still come: the connection is unusable
    return a.status();
  }
  if (a->fd >= 0) ::close(a->fd);
  if (!a->status.ok()) return absl::Status(a->status.code(), absl::StrCat("Reserve: ", a->status.message()));
  pb::ReserveResponse resp;
  if (!resp.ParseFromArray(a->body, static_cast<int>(a->body_bytes))) {
    Break();
    return absl::InternalError("Reserve: unparsable answer on the local connection");
  }
  absl::StatusOr<std::vector<size_t>> reserved = admit(resp);
  if (!reserved.ok()) return reserved.status();
  if (reserved->empty()) return absl::OkStatus();
  (void)StageLocked(resp.reservation_id(), pages, *reserved, ahead, status, committed);
  return absl::OkStatus();
}

absl::Status ShmStaging::StageLocked(uint64_t reservation_id, std::span<const PageWrite> pages,
                                     std::span<const size_t> reserved,
                                     std::span<const Prestaged> ahead,
                                     std::vector<absl::Status>* status,
                                     std::vector<bool>* committed) {
  committed->assign(pages.size(), false);
  struct InFlight {
    uint64_t id;
    size_t page;    // index into `pages`
    bool last;      // completes the page: its answer is the page's verdict
    uint32_t slot;  // free again once answered
  };
  std::deque<InFlight> inflight;
  std::vector<bool> confirmed(pages.size(), false);
  std::vector<bool> is_reserved(pages.size(), false);
  for (size_t i : reserved) is_reserved[i] = true;
  // Slots holding a chunk copied ahead for a reserved page stay taken until it is sent; the
  // rest are free. Those chunks are a prefix of the chunks below, in the same order.
  std::vector<uint32_t> free_slots;
  std::vector<bool> held(kSlots, false);
  size_t next_ahead = 0;
  std::vector<Prestaged> kept;
  for (const Prestaged& p : ahead) {
    if (is_reserved[p.page]) {
      held[p.slot] = true;
      kept.push_back(p);
    }
  }
  for (uint32_t slot = kSlots; slot-- > 0;) {
    if (!held[slot]) free_slots.push_back(slot);
  }
  absl::Status broken;
  // One answer, oldest first: a failed chunk decides its page (the first failure is kept).
  auto settle = [&]() -> bool {
    const InFlight f = inflight.front();
    inflight.pop_front();
    free_slots.push_back(f.slot);
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
  for (size_t i : reserved) (*status)[i] = absl::OkStatus();
  for (size_t r = 0; r < reserved.size() && broken.ok(); ++r) {
    const size_t i = reserved[r];
    const std::span<const uint8_t> src = pages[i].bytes;
    req.set_key(reinterpret_cast<const char*>(pages[i].key.bytes.data()), pages[i].key.bytes.size());
    const uint64_t piece = PieceBytes(src.size());
    for (uint64_t off = 0; off < src.size() && broken.ok(); off += piece) {
      const uint64_t len = std::min<uint64_t>(piece, src.size() - off);
      uint32_t slot;
      if (next_ahead < kept.size() && kept[next_ahead].page == i &&
          kept[next_ahead].offset == off) {
        slot = kept[next_ahead++].slot;  // copied while the daemon reserved
      } else {
        if (free_slots.empty() && !settle()) break;
        slot = free_slots.back();
        free_slots.pop_back();
        std::memcpy(staging_ + uint64_t{slot} * kChunkBytes, src.data() + off, len);
      }
      req.set_page_offset(off);
      req.set_staging_offset(uint64_t{slot} * kChunkBytes);
      req.set_length(len);
      req.set_commit(off + len == src.size());  // the last chunk commits the page
      const uint64_t id = next_id_++;
      if (absl::Status s = SendLocalFrame(sock_, local::Method::kStageWrite, id, req); !s.ok()) {
        broken = s;
        break;
      }
      inflight.push_back({id, i, off + len == src.size(), slot});
    }
  }
  while (!inflight.empty() && broken.ok()) settle();
  if (!broken.ok()) {
    // Answers still owed cannot be matched any more: the connection is unusable.
    Break();
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
