// A mapping of the daemon's shared-memory pool segment (RAII): read-write for a trusted-mode
// pool file (Map), read-only for an isolated pool whose descriptor came over the local socket
// (MapReadOnlyFd). writable() says whether stores may write it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace oscarkv::client {

class ShmMapping {
 public:
  // Maps `path` (a /dev/shm file) read-write, shared. FAILED_PRECONDITION when the file cannot
  // be opened or is smaller than `bytes` (for example a daemon on another host).
  static absl::StatusOr<std::unique_ptr<ShmMapping>> Map(const std::string& path, uint64_t bytes);
  // Maps `bytes` of the read-only descriptor `fd` (not taken over) PROT_READ, shared.
  static absl::StatusOr<std::unique_ptr<ShmMapping>> MapReadOnlyFd(int fd, uint64_t bytes);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  // Writable only when writable(); an isolated pool's mapping faults on any write.
  uint8_t* data() const { return base_; }
  bool writable() const { return writable_; }
  uint64_t size() const { return size_; }
  // True when [offset, offset + bytes) lies inside the mapping.
  bool Contains(uint64_t offset, uint64_t bytes) const {
    return offset <= size_ && bytes <= size_ - offset;
  }

 private:
  ShmMapping(uint8_t* base, uint64_t size, bool writable)
      : base_(base), size_(size), writable_(writable) {}
  uint8_t* base_;
  uint64_t size_;
  bool writable_;
};

}  // namespace oscarkv::client
