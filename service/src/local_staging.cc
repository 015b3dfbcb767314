#include "local_staging.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace oscarkv::service {

int TakeReceivedFd(msghdr& mh) {
  int first = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (first < 0) {
        first = fd;
      } else {
        ::close(fd);
      }
    }
  }
  return first;
}

bool SendFrameWithFd(int sock, const void* data, size_t n, int fd) {
  iovec iov{const_cast<void*>(data), n};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  for (;;) {
    const ssize_t r = ::sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    return r == static_cast<ssize_t>(n);
  }
}

absl::StatusOr<std::unique_ptr<StagingRegion>> StagingRegion::Map(int fd, uint64_t bytes,
                                                                  uint64_t max_bytes,
                                                                  const Arena& pool) {
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};  // the mapping outlives the descriptor
  if (bytes == 0) return absl::InvalidArgumentError("AttachStaging: staging_bytes is 0");
  if (bytes > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "AttachStaging: ", bytes, " staging bytes asked, this daemon allows at most ", max_bytes,
        " (pool.staging_max_mb)"));
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
    return absl::InvalidArgumentError(
        "AttachStaging: the staging descriptor must be a memfd sealed with F_SEAL_SHRINK");
  }
  struct stat st{}, pool_st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttachStaging: the staging memfd is smaller than the ", bytes, " bytes announced"));
  }
  if (auto pfd = pool.OpenReadOnly(); pfd.ok()) {
    const bool same = ::fstat(*pfd, &pool_st) == 0 && pool_st.st_dev == st.st_dev &&
                      pool_st.st_ino == st.st_ino;
    ::close(*pfd);
    if (same) return absl::InvalidArgumentError("AttachStaging: that is the pool, not staging");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat("AttachStaging: cannot map the staging memfd: ", std::strerror(errno)));
  }
  return std::unique_ptr<StagingRegion>(new StagingRegion(static_cast<const uint8_t*>(p), bytes));
}

absl::Status StageChunk(PageCache& cache, const Caller& caller,
                        const ::oscarkv::v1::StageWriteRequest& req,
                        std::span<const uint8_t> staging, ::oscarkv::v1::StageWriteResponse* resp) {
  resp->set_committed(false);
  if (staging.empty()) {
    return absl::FailedPreconditionError(
        "no staging region is attached to this connection (AttachStaging first)");
  }
  if (req.key().size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("key has ", req.key().size(), " bytes; keys are 16 bytes"));
  }
  if (req.staging_offset() > staging.size() ||
      req.length() > staging.size() - req.staging_offset()) {
    return absl::OutOfRangeError(absl::StrCat("staged chunk [", req.staging_offset(), ", +",
                                              req.length(), ") is outside the ", staging.size(),
                                              "-byte staging region"));
  }
  WriteChunkArgs chunk;
  chunk.reservation_id = req.reservation_id();
  std::memcpy(chunk.key.bytes.data(), req.key().data(), 16);
  chunk.offset = req.page_offset();
  chunk.data = staging.subspan(req.staging_offset(), req.length());
  auto written = cache.WriteChunk(caller, chunk);
  if (!written.ok()) return written.status();
  if (!req.commit()) return absl::OkStatus();
  CommitArgs commit;
  commit.reservation_id = req.reservation_id();
  commit.keys.push_back(chunk.key);
  auto results = cache.Commit(caller, commit);
  if (!results.ok()) return results.status();
  if (results->size() != 1) return absl::InternalError("Commit of one key gave no result");
  if (!(*results)[0].ok()) return (*results)[0];
  resp->set_committed(true);
  return absl::OkStatus();
}

StagingRegion::~StagingRegion() { ::munmap(const_cast<uint8_t*>(base_), size_); }

}  // namespace oscarkv::service
