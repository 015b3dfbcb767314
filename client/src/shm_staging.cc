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
#include "oscarkv/v1/local_control.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::client {
namespace {

namespace pb = ::oscarkv::v1;
namespace local = ::oscarkv::v1::local;

std::string Frame(local::Method method, uint64_t id, const google::protobuf::MessageLite& msg) {
  local::RequestHeader h;
  h.method = static_cast<uint16_t>(method);
  h.id = id;
  std::string f(reinterpret_cast<const char*>(&h), sizeof(h));
  msg.AppendToString(&f);
  return f;
}

// Sends one frame, with `fd` attached when >= 0.
absl::Status SendFrame(int sock, const std::string& f, int fd = -1) {
  iovec iov{const_cast<char*>(f.data()), f.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    mh.msg_control = control;
    mh.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  for (;;) {
    const ssize_t r = ::sendmsg(sock, &mh, MSG_NOSIGNAL);
    if (r == static_cast<ssize_t>(f.size())) return absl::OkStatus();
    if (r < 0 && errno == EINTR) continue;
    return absl::UnavailableError(
        absl::StrCat("staging connection: send: ", r < 0 ? std::strerror(errno) : "short"));
  }
}

struct Answer {
  absl::Status status;
  std::string body;
  int fd = -1;  // a descriptor that came with it (the caller owns it)
};

// Receives one answer frame, expecting request `id`, into `buf` (kMaxFrameBytes, reused: an
// answer per staged chunk must not cost an allocation and a clear of a frame's size).
absl::StatusOr<Answer> RecvAnswer(int sock, uint64_t id, std::vector<char>& buf) {
  iovec iov{buf.data(), buf.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  Answer a;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (a.fd < 0) {
        a.fd = fd;
      } else {
        ::close(fd);
      }
    }
  }
  auto fail = [&](absl::Status s) {
    if (a.fd >= 0) ::close(a.fd);
    return s;
  };
  if (n <= 0) {
    return fail(absl::UnavailableError(absl::StrCat(
        "staging connection: ", n == 0 ? "closed by the daemon" : std::strerror(errno))));
  }
  local::ResponseHeader h;
  if (static_cast<size_t>(n) < sizeof(h)) {
    return fail(absl::InternalError("staging connection: short answer"));
  }
  std::memcpy(&h, buf.data(), sizeof(h));
  if (h.magic != local::kMagic || sizeof(h) + h.message_bytes > static_cast<size_t>(n)) {
    return fail(absl::InternalError("staging connection: malformed answer"));
  }
  if (h.id != id && h.id != 0) {
    return fail(absl::InternalError(
        absl::StrCat("staging connection: answer ", h.id, " for request ", id)));
  }
  const std::string text(buf.data() + sizeof(h), h.message_bytes);
  a.status = h.code == 0 ? absl::OkStatus()
                         : absl::Status(static_cast<absl::StatusCode>(h.code), text);
  a.body.assign(buf.data() + sizeof(h) + h.message_bytes, n - sizeof(h) - h.message_bytes);
  if (h.id == 0 && !a.status.ok()) {  // the daemon refused the frame and closes
    return fail(a.status);
  }
  return a;
}

}  // namespace

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
  if (absl::Status s = SendFrame(*sock, Frame(local::Method::kAttachStaging, 1, req), mfd);
      !s.ok()) {
    return fail(s);
  }
  ::close(mfd);  // the mapping (and the daemon's) keep it alive
  mfd = -1;
  std::vector<char> rx(local::kMaxFrameBytes);
  auto a = RecvAnswer(*sock, 1, rx);
  if (!a.ok()) return fail(a.status());
  if (!a->status.ok()) {
    if (a->fd >= 0) ::close(a->fd);
    return fail(absl::FailedPreconditionError(
        absl::StrCat("AttachStaging refused: ", a->status.message())));
  }
  pb::AttachStagingResponse resp;
  if (a->fd < 0 && resp.ParseFromString(a->body) && resp.pool_bytes() == 0) {
    // A tenant: stores through staging, no pool mapping (shm_load_staging.h loads).
    return std::unique_ptr<ShmStaging>(
        new ShmStaging(*sock, staging, bytes, nullptr, std::move(rx)));
  }
  if (a->fd < 0 || !resp.ParseFromString(a->body) || resp.pool_bytes() != pool_bytes) {
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
    auto a = RecvAnswer(sock_, f.id, rx_);
    if (!a.ok()) {
      broken = a.status();
      return false;
    }
    if (a->fd >= 0) ::close(a->fd);
    if (!a->status.ok()) {
      if ((*status)[f.page].ok()) (*status)[f.page] = a->status;
    } else if (f.last) {
      pb::StageWriteResponse resp;
      if (resp.ParseFromString(a->body) && resp.committed()) {
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
      if (absl::Status s = SendFrame(sock_, Frame(local::Method::kStageWrite, id, req)); !s.ok()) {
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
