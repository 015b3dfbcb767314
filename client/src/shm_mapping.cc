#include "shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace oscarkv::client {

absl::StatusOr<std::unique_ptr<ShmMapping>> ShmMapping::Map(const std::string& path,
                                                            uint64_t bytes) {
  if (path.empty() || bytes == 0) {
    return absl::FailedPreconditionError("the daemon offers no shared-memory segment");
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open shared-memory segment ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "shared-memory segment ", path, " is ", static_cast<int64_t>(st.st_size),
        " bytes, the daemon announced ", bytes, " (another host's daemon?)"));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the segment alive
  if (p == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map ", path, ": ", std::strerror(err)));
  }
  return std::unique_ptr<ShmMapping>(new ShmMapping(static_cast<uint8_t*>(p), bytes, true));
}

absl::StatusOr<std::unique_ptr<ShmMapping>> ShmMapping::MapReadOnlyFd(int fd, uint64_t bytes) {
  struct stat st {};
  if (bytes == 0 || ::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("the pool descriptor the daemon passed is smaller than ", bytes, " bytes"));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map the pool read-only: ", std::strerror(errno)));
  }
  return std::unique_ptr<ShmMapping>(new ShmMapping(static_cast<uint8_t*>(p), bytes, false));
}

ShmMapping::~ShmMapping() { ::munmap(base_, size_); }

}  // namespace oscarkv::client
