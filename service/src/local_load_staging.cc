#include "local_load_staging.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace oscarkv::service {

bool LoadRegionLimiter::TryAcquire(uint32_t tenant_id, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  uint64_t& held = held_[tenant_id];
  if (bytes > per_tenant_bytes_ - held) {
    if (held == 0) held_.erase(tenant_id);
    return false;
  }
  held += bytes;
  return true;
}

void LoadRegionLimiter::Release(uint32_t tenant_id, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(tenant_id);
  if (it == held_.end()) return;
  it->second -= std::min(it->second, bytes);
  if (it->second == 0) held_.erase(it);
}

absl::StatusOr<std::unique_ptr<LoadStagingRegion>> LoadStagingRegion::Create(
    uint64_t bytes, uint64_t max_bytes, LoadRegionLimiter* limiter, uint32_t tenant_id) {
  if (bytes == 0) return absl::InvalidArgumentError("AttachLoadStaging: bytes is 0");
  if (bytes > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "AttachLoadStaging: ", bytes, " bytes asked, this daemon allows at most ", max_bytes,
        " (pool.staging_max_mb)"));
  }
  if (!limiter->TryAcquire(tenant_id, bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "AttachLoadStaging: ", bytes, " more bytes of load staging regions would put this "
        "tenant over its ", limiter->per_tenant_bytes() >> 20,
        " MiB (one region per local connection that loads); close a connection"));
  }
  std::unique_ptr<LoadStagingRegion> r(new LoadStagingRegion);
  r->limiter_ = limiter;  // from here on the destructor gives the bytes back
  r->tenant_id_ = tenant_id;
  r->charged_ = bytes;
  auto fail = [](const char* what) {
    return absl::InternalError(
        absl::StrCat("load staging region: ", what, ": ", std::strerror(errno)));
  };
  r->fd_ = ::memfd_create("oscarkv-load-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (r->fd_ < 0) return fail("memfd_create");
  if (::ftruncate(r->fd_, static_cast<off_t>(bytes)) != 0) return fail("ftruncate");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) return fail("mmap");
  r->base_ = static_cast<uint8_t*>(p);
  r->size_ = bytes;
  // Sealed after our own writable mapping exists: no one can resize the file or map it
  // writable from now on (F_SEAL_FUTURE_WRITE), whatever descriptor they hold.
  if (::fcntl(r->fd_, F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    return fail("sealing");
  }
  return r;
}

LoadStagingRegion::~LoadStagingRegion() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
  if (limiter_ != nullptr) limiter_->Release(tenant_id_, charged_);
}

absl::StatusOr<int> LoadStagingRegion::OpenReadOnly() const {
  // A new open file description, read-only: the client cannot write through it even if the
  // seals were gone (a dup() would share our O_RDWR one).
  const std::string self = absl::StrCat("/proc/self/fd/", fd_);
  const int fd = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("load staging region: reopening ", self, ": ", std::strerror(errno)));
  }
  return fd;
}

absl::Status StageReadChunk(PageCache& cache, const Caller& caller,
                            const ::oscarkv::v1::StageReadRequest& req,
                            std::span<uint8_t> region) {
  if (region.empty()) {
    return absl::FailedPreconditionError(
        "no load staging region is attached to this connection (AttachLoadStaging first)");
  }
  ReadArgs args;
  args.lease_id = req.lease_id();
  args.keys.resize(1);
  if (req.key().size() != args.keys[0].bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("key has ", req.key().size(), " bytes; keys are 16 bytes"));
  }
  std::memcpy(args.keys[0].bytes.data(), req.key().data(), args.keys[0].bytes.size());
  if (req.staging_offset() > region.size() ||
      req.length() > region.size() - req.staging_offset()) {
    return absl::OutOfRangeError(absl::StrCat("chunk [", req.staging_offset(), ", +",
                                              req.length(), ") is outside the ", region.size(),
                                              "-byte load staging region"));
  }
  // The plan holds its own pool references: the page stays valid during the copy even if the
  // lease ends meanwhile.
  auto plan = cache.PrepareRead(caller, args);
  if (!plan.ok()) return plan.status();
  const ReadPlan::Page& page = (*plan)->pages().front();
  if (req.page_offset() > page.bytes || req.length() > page.bytes - req.page_offset()) {
    return absl::OutOfRangeError(absl::StrCat("chunk [", req.page_offset(), ", +", req.length(),
                                              ") is outside the ", page.bytes, "-byte page"));
  }
  std::memcpy(region.data() + req.staging_offset(), page.data + req.page_offset(), req.length());
  cache.mutable_counters().bytes_read.fetch_add(req.length(), std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace oscarkv::service
