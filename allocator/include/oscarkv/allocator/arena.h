// Arena: one contiguous block of memory that a PagePool carves into page slots.
//
// Two implementations:
//  * ShmArena  -- a POSIX shared-memory file (/dev/shm/<name>) mapped MAP_SHARED, so a client
//                 on the same host can map the same bytes and load pages with a plain copy.
//                 Huge pages are requested (madvise MADV_HUGEPAGE) and silently skipped when the
//                 kernel refuses; when built with CUDA and a GPU is present the mapping is
//                 registered with cudaHostRegister so GPU copies from it run at pinned speed.
//                 The destructor unmaps, unregisters and unlinks the file.
//                 A *sealed* ShmArena (ShmArenaOptions::sealed) keeps its bytes in a memfd
//                 instead: no path can be opened to map it, the file is sealed against new
//                 writable mappings and writes (F_SEAL_FUTURE_WRITE) once the owner mapped it,
//                 and clients get read-only descriptors from OpenReadOnly(), passed to them over
//                 a unix socket (SCM_RIGHTS). /dev/shm/<name> then only holds the owner lock.
//  * HeapArena -- private anonymous memory, for unit tests and benchmarks.
//
// An Arena is owned by exactly one PagePool; base() and size() never change and are safe to call
// from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace oscarkv {

class Arena {
 public:
  virtual ~Arena() = default;
  virtual uint8_t* base() const = 0;
  virtual size_t size() const = 0;
  // The file a client maps (e.g. "/dev/shm/oscarkvd-50051"), or "" when not shareable.
  virtual std::string shm_path() const { return ""; }
  // True when huge pages were advised and the kernel's THP setting lets them back the arena.
  virtual bool huge_pages() const { return false; }
  virtual bool cuda_registered() const { return false; }
  // True when a shared-memory arena reused the file of a dead owner (see CreateShmArena).
  virtual bool took_over_stale() const { return false; }
  // /dev/shm/<name> of a shared-memory arena (the mappable file, or for a sealed arena the
  // owner-lock file), "" for private memory.
  virtual std::string owner_path() const { return shm_path(); }
  // True for a sealed arena: only this process can write it; others map it read-only.
  virtual bool sealed() const { return false; }
  // A new read-only descriptor of the arena's memory (the caller owns it), for a client to map
  // PROT_READ. FAILED_PRECONDITION for private memory.
  virtual absl::StatusOr<int> OpenReadOnly() const {
    return absl::FailedPreconditionError("this arena cannot be shared");
  }
};

// Private memory (mmap anonymous). Bytes are zero.
absl::StatusOr<std::unique_ptr<Arena>> CreateHeapArena(size_t bytes);

struct ShmArenaOptions {
  // Name under /dev/shm: letters, digits, '.', '_' and '-' only, at most 200 characters.
  std::string name;
  size_t bytes = 0;
  bool try_huge_pages = true;
  bool try_cuda_register = true;
  // Fail when /dev/shm has less free space than `bytes` (touching pages past the tmpfs limit
  // would otherwise kill the process with SIGBUS), or when the machine has less memory
  // available (MemAvailable + SwapFree) than `bytes`.
  bool check_free_space = true;
  // If the file already exists: replace it unconditionally (true), or (false) take it over when
  // its owner is dead and fail with ALREADY_EXISTS "in use by pid N" when it is alive.
  bool replace_existing = false;
  // Bytes in a sealed memfd instead of the /dev/shm file (see the file comment).
  bool sealed = false;
};

// Creates /dev/shm/<name> (mode 0600; empty when sealed), sizes and maps it, and holds an owner lock on it (a POSIX
// write lock on the file, released by the kernel when this process dies) until the arena is
// destroyed. A file left by a dead owner (kill -9) is taken over: emptied and reused
// (took_over_stale()). Errors: INVALID_ARGUMENT (bad name or size), ALREADY_EXISTS (a live
// process owns the file: the message names its pid), RESOURCE_EXHAUSTED (not enough space in
// /dev/shm, or more than the machine's available memory), INTERNAL (syscalls).
absl::StatusOr<std::unique_ptr<Arena>> CreateShmArena(const ShmArenaOptions& options);

}  // namespace oscarkv
