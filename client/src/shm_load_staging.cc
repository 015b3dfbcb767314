#include "shm_load_staging.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "local_channel.h"
#include "local_frames.h"
#include "oscarkv/kernels/page_checksum.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::client {

namespace pb = ::oscarkv::v1;
namespace local = ::oscarkv::v1::local;

absl::StatusOr<std::unique_ptr<ShmLoadStaging>> ShmLoadStaging::Open(LocalChannel& ch) {
  auto sock = ch.DialDedicated();
  if (!sock.ok()) return sock.status();
  return Attach(*sock);
}

absl::StatusOr<std::unique_ptr<ShmLoadStaging>> ShmLoadStaging::Attach(int sock) {
  const uint64_t bytes = kSlotBytes * kSlots;
  auto fail = [sock](absl::Status s) {
    ::close(sock);
    return absl::FailedPreconditionError(absl::StrCat("load staging: ", s.message()));
  };
  pb::AttachLoadStagingRequest req;
  req.set_bytes(bytes);
  if (absl::Status s = SendLocalFrame(sock, local::Method::kAttachLoadStaging, 1, req); !s.ok()) {
    return fail(s);
  }
  std::string buf;
  auto a = RecvLocalAnswer(sock, 1, &buf);
  if (!a.ok()) return fail(a.status());
  struct FdCloser {
    int fd;
    ~FdCloser() {
      if (fd >= 0) ::close(fd);
    }
  } fd{a->fd};  // the mapping outlives the descriptor
  if (!a->status.ok()) return fail(a->status);
  pb::AttachLoadStagingResponse resp;
  struct stat st{};
  if (fd.fd < 0 || !resp.ParseFromArray(a->body, static_cast<int>(a->body_bytes)) ||
      resp.bytes() != bytes || ::fstat(fd.fd, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < bytes) {
    return fail(absl::InternalError("the daemon passed no region of the size asked for"));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.fd, 0);
  if (p == MAP_FAILED) {
    return fail(absl::InternalError(absl::StrCat("mmap: ", std::strerror(errno))));
  }
  return std::unique_ptr<ShmLoadStaging>(
      new ShmLoadStaging(sock, static_cast<const uint8_t*>(p), bytes));
}

ShmLoadStaging::~ShmLoadStaging() {
  ::munmap(const_cast<uint8_t*>(region_), region_bytes_);
  ::close(sock_);
}

bool ShmLoadStaging::Broken() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;  // a load is running: it finds out itself
  if (!broken_.ok()) return true;
  pollfd p{sock_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) == 0) return false;
  ::shutdown(sock_, SHUT_RDWR);
  broken_ = absl::UnavailableError("load staging connection: the daemon closed it");
  return true;
}

absl::Status ShmLoadStaging::Fetch(uint64_t lease_id, std::span<const PageRef> pages,
                                   std::span<const std::span<uint8_t>> dst, bool hash,
                                   std::vector<std::optional<uint64_t>>* digests) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  struct InFlight {
    uint64_t id;
    size_t page;
    uint64_t page_offset, slot_offset, length;
  };
  std::deque<InFlight> inflight;
  // Pages larger than a slot are hashed chunk by chunk, in order (their chunks are answered in
  // request order).
  std::vector<std::unique_ptr<PageCopyChecksummer>> hashers(pages.size());
  absl::Status failed;  // the daemon refused a chunk: finish the answers owed, then report it
  auto settle = [&]() -> absl::Status {
    const InFlight f = inflight.front();
    inflight.pop_front();
    auto a = RecvLocalAnswer(sock_, f.id, &buf_);
    if (!a.ok()) return a.status();
    if (a->fd >= 0) ::close(a->fd);
    if (!a->status.ok()) {
      if (failed.ok()) failed = a->status;
      return absl::OkStatus();
    }
    if (!failed.ok()) return absl::OkStatus();
    const std::span<const uint8_t> src(region_ + f.slot_offset, f.length);
    const std::span<uint8_t> out = dst[f.page].subspan(f.page_offset, f.length);
    if (hash && f.length == dst[f.page].size()) {
      (*digests)[f.page] = CopyPageWithChecksum(out, src);  // one fused pass
    } else if (hash) {
      // A page over several chunks: the same fused copy + hash, its state carried across them.
      if (f.page_offset == 0) {
        hashers[f.page] = std::make_unique<PageCopyChecksummer>(dst[f.page].size());
      }
      if (hashers[f.page] == nullptr || hashers[f.page]->offset() != f.page_offset) {
        return absl::InternalError("load staging: chunks of a page answered out of order");
      }
      hashers[f.page]->Copy(dst[f.page], src);
      if (f.page_offset + f.length == dst[f.page].size()) {
        (*digests)[f.page] = hashers[f.page]->Digest();
        hashers[f.page].reset();
      }
    } else {
      std::memcpy(out.data(), src.data(), src.size());
    }
    return absl::OkStatus();
  };
  pb::StageReadRequest req;
  req.set_lease_id(lease_id);
  uint64_t seq = 0;
  absl::Status broken;
  for (size_t i = 0; i < pages.size() && broken.ok() && failed.ok(); ++i) {
    req.set_key(reinterpret_cast<const char*>(pages[i].key.bytes.data()),
                pages[i].key.bytes.size());
    const uint64_t page_bytes = dst[i].size();
    for (uint64_t off = 0; off < page_bytes && broken.ok() && failed.ok(); off += kSlotBytes) {
      if (inflight.size() == kSlots) {
        broken = settle();
        if (!broken.ok()) break;
      }
      const uint64_t len = std::min<uint64_t>(kSlotBytes, page_bytes - off);
      const uint64_t slot = (seq++ % kSlots) * kSlotBytes;
      req.set_page_offset(off);
      req.set_staging_offset(slot);
      req.set_length(len);
      const uint64_t id = next_id_++;
      broken = SendLocalFrame(sock_, local::Method::kStageRead, id, req);
      if (broken.ok()) inflight.push_back({id, i, off, slot, len});
    }
  }
  while (!inflight.empty() && broken.ok()) broken = settle();
  if (!broken.ok()) {
    // Answers still owed cannot be matched any more: the connection is unusable.
    ::shutdown(sock_, SHUT_RDWR);
    broken_ = absl::UnavailableError(
        absl::StrCat("load staging connection broke: ", broken.message()));
    return broken_;
  }
  return failed;
}

}  // namespace oscarkv::client
