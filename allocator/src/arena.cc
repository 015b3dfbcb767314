#include "oscarkv/allocator/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

#if defined(OSCARKV_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace oscarkv {
namespace {

std::string Errno(int err) { return std::strerror(err); }

// The kernel's transparent-huge-page mode from a sysfs file such as
// /sys/kernel/mm/transparent_hugepage/shmem_enabled ("always within_size [advise] never deny
// force"): the bracketed word, or "" when unreadable.
std::string ThpMode(const char* path) {
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return "";
  char buf[256] = {0};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const std::string s(buf, n);
  const size_t open = s.find('['), close = s.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  return s.substr(open + 1, close - open - 1);
}

// Maps the memory and, if asked, advises huge pages. *huge reports whether they can actually
// back the mapping: the advice succeeded and the kernel's THP mode for this kind of memory
// honours it. Returns MAP_FAILED on failure.
void* MapAdvised(size_t bytes, int prot, int flags, int fd, bool try_huge, bool* huge) {
  *huge = false;
  void* p = mmap(nullptr, bytes, prot, flags, fd, 0);
  if (p == MAP_FAILED) return p;
  if (try_huge && madvise(p, bytes, MADV_HUGEPAGE) == 0) {
    const std::string mode =
        ThpMode(fd >= 0 ? "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
                        : "/sys/kernel/mm/transparent_hugepage/enabled");
    *huge = mode == "always" || mode == "madvise" || mode == "advise" ||
            mode == "within_size" || mode == "force";
  }
  return p;
}

class HeapArena final : public Arena {
 public:
  HeapArena(uint8_t* base, size_t size) : base_(base), size_(size) {}
  ~HeapArena() override { munmap(base_, size_); }
  uint8_t* base() const override { return base_; }
  size_t size() const override { return size_; }

 private:
  uint8_t* base_;
  size_t size_;
};

bool TryCudaRegister(void* p, size_t bytes) {
#if defined(OSCARKV_HAVE_CUDA)
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
#else
  (void)p;
  (void)bytes;
  return false;
#endif
}

void CudaUnregister(void* p) {
#if defined(OSCARKV_HAVE_CUDA)
  cudaHostUnregister(p);
#else
  (void)p;
#endif
}

// The owner lock of a pool file: an open-file-description lock (F_OFD_SETLK: it conflicts
// within one process too, and the kernel drops it when the owner dies, kill -9 included), held
// through the arena's fd for its lifetime. It covers the one byte at offset <owner pid>, so
// F_OFD_GETLK on the whole file tells a second daemon who owns it. It is taken as a whole-file
// lock first and then narrowed, so two daemons starting at once cannot both get one.
bool LockOwner(int fd) {
  struct flock l{};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  if (fcntl(fd, F_OFD_SETLK, &l) != 0) return false;
  const off_t pid = getpid();
  struct flock below{};
  below.l_type = F_UNLCK;
  below.l_whence = SEEK_SET;
  below.l_len = pid;
  struct flock above = below;
  above.l_start = pid + 1;
  above.l_len = 0;
  return fcntl(fd, F_OFD_SETLK, &below) == 0 && fcntl(fd, F_OFD_SETLK, &above) == 0;
}
// The pid of the live owner of the file's lock, or 0.
pid_t OwnerPid(int fd) {
  struct flock l{};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  if (fcntl(fd, F_OFD_GETLK, &l) != 0 || l.l_type == F_UNLCK || l.l_len != 1) return 0;
  return static_cast<pid_t>(l.l_start);
}

// Bytes this machine can back with memory right now: MemAvailable + SwapFree (/proc/meminfo);
// 0 when unknown.
uint64_t MemoryAvailableBytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t avail = 0, swap = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long long kb = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = kb << 10;
    if (std::sscanf(line, "SwapFree: %llu kB", &kb) == 1) swap = kb << 10;
  }
  std::fclose(f);
  return avail == 0 ? 0 : avail + swap;
}

class ShmArena final : public Arena {
 public:
  // `mem_fd` is the sealed memfd holding the bytes, or -1 when they are in the file of `fd`.
  ShmArena(std::string name, int fd, int mem_fd, uint8_t* base, size_t size, bool huge,
           bool cuda)
      : name_(std::move(name)), fd_(fd), mem_fd_(mem_fd), base_(base), size_(size), huge_(huge),
        cuda_(cuda) {}
  ~ShmArena() override {
    if (cuda_) CudaUnregister(base_);
    munmap(base_, size_);
    if (mem_fd_ >= 0) close(mem_fd_);
    shm_unlink(name_.c_str());  // while still holding the owner lock
    close(fd_);
  }
  bool took_over_stale() const override { return took_over_; }
  void set_took_over(bool v) { took_over_ = v; }
  uint8_t* base() const override { return base_; }
  size_t size() const override { return size_; }
  std::string shm_path() const override { return mem_fd_ >= 0 ? "" : owner_path(); }
  std::string owner_path() const override { return absl::StrCat("/dev/shm", name_); }
  bool sealed() const override { return mem_fd_ >= 0; }
  absl::StatusOr<int> OpenReadOnly() const override {
    // A new open file description, read-only: a dup() would share the owner's O_RDWR one.
    const std::string self = absl::StrCat("/proc/self/fd/", mem_fd_ >= 0 ? mem_fd_ : fd_);
    const int fd = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("shm arena: reopening ", self, ": ", Errno(errno)));
    }
    return fd;
  }
  bool huge_pages() const override { return huge_; }
  bool cuda_registered() const override { return cuda_; }

 private:
  std::string name_;  // "/<name>", as shm_open wants it
  int fd_;            // holds the owner lock
  int mem_fd_;        // sealed memfd, or -1
  uint8_t* base_;
  size_t size_;
  bool huge_;
  bool cuda_;
  bool took_over_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Arena>> CreateHeapArena(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("heap arena: size 0");
  bool huge = false;
  void* p = MapAdvised(bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, true, &huge);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("heap arena: mmap of ", bytes, " bytes failed: ", Errno(errno)));
  }
  return std::unique_ptr<Arena>(new HeapArena(static_cast<uint8_t*>(p), bytes));
}

absl::StatusOr<std::unique_ptr<Arena>> CreateShmArena(const ShmArenaOptions& o) {
  if (o.name.empty() || o.name.size() > 200) {
    return absl::InvalidArgumentError("shm arena: the name must have 1..200 characters");
  }
  for (char c : o.name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok || o.name == "." || o.name == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          "shm arena: bad name '", o.name, "' (letters, digits, '.', '_' and '-' only)"));
    }
  }
  if (o.bytes == 0) return absl::InvalidArgumentError("shm arena: size 0");
  const std::string shm_name = absl::StrCat("/", o.name);
  const int flags = O_RDWR | O_CREAT | O_EXCL;
  int fd = shm_open(shm_name.c_str(), flags, 0600);
  if (fd < 0 && errno == EEXIST && o.replace_existing) {
    shm_unlink(shm_name.c_str());
    fd = shm_open(shm_name.c_str(), flags, 0600);
  }
  bool created = fd >= 0;
  if (fd < 0 && errno == EEXIST) {
    // Someone's pool file: a live daemon's (its owner lock is held) or a dead one's (kill -9,
    // OOM kill): take that one over instead of refusing to start.
    fd = shm_open(shm_name.c_str(), O_RDWR, 0600);
    if (fd < 0 && errno == ENOENT) {  // removed meanwhile: create it after all
      fd = shm_open(shm_name.c_str(), flags, 0600);
      created = fd >= 0;
    }
  }
  if (fd < 0) {
    const int err = errno;
    return absl::InternalError(
        absl::StrCat("shm arena: shm_open /dev/shm/", o.name, ": ", Errno(err)));
  }
  auto fail = [&](absl::Status s) {
    close(fd);
    if (created) shm_unlink(shm_name.c_str());
    return s;
  };
  if (!LockOwner(fd)) {
    const pid_t owner = OwnerPid(fd);
    close(fd);  // never unlink a live daemon's file
    return absl::AlreadyExistsError(absl::StrCat(
        "shm arena: /dev/shm/", o.name, " is in use by pid ",
        owner > 0 ? absl::StrCat(owner) : std::string("unknown"),
        " (a running oscarkvd); stop it or choose another pool.shm_name"));
  }
  // Ours now. A taken-over file is emptied first (its old pages are not trusted, and its space
  // counts as free below).
  if (!created && ftruncate(fd, 0) != 0) {
    return fail(absl::InternalError(
        absl::StrCat("shm arena: cannot reset stale /dev/shm/", o.name, ": ", Errno(errno))));
  }
  if (o.check_free_space) {
    struct statvfs vfs;
    // A sealed arena's memfd is not charged to /dev/shm's size limit; memory is checked below.
    if (!o.sealed && statvfs("/dev/shm", &vfs) == 0) {
      const unsigned long long avail =
          static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize;
      if (avail < o.bytes) {
        return fail(absl::ResourceExhaustedError(
            absl::StrCat("shm arena: /dev/shm has ", avail >> 20, " MiB free, the pool needs ",
                         o.bytes >> 20, " MiB (use a smaller pool or enlarge /dev/shm)")));
      }
    }
    // tmpfs may be larger than the memory behind it: a pool the machine cannot back would be
    // killed (SIGBUS / OOM) once it fills.
    const uint64_t mem = MemoryAvailableBytes();
    if (mem != 0 && mem < o.bytes) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "shm arena: the pool needs ", o.bytes >> 20, " MiB but this machine has only ",
          mem >> 20, " MiB of memory available (MemAvailable + SwapFree); use a smaller pool")));
    }
  }
  // Sealed: the bytes live in a memfd that no path leads to; the /dev/shm file stays empty.
  int mem_fd = -1;
  if (o.sealed) {
    mem_fd = memfd_create(absl::StrCat("oscarkv-pool-", o.name).c_str(),
                          MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (mem_fd < 0) {
      return fail(absl::InternalError(absl::StrCat("shm arena: memfd_create: ", Errno(errno))));
    }
  }
  const int data_fd = o.sealed ? mem_fd : fd;
  auto fail_mem = [&](absl::Status s) {
    if (mem_fd >= 0) close(mem_fd);
    return fail(std::move(s));
  };
  if (ftruncate(data_fd, static_cast<off_t>(o.bytes)) != 0) {
    const int err = errno;
    return fail_mem(absl::ResourceExhaustedError(
        absl::StrCat("shm arena: ftruncate to ", o.bytes, " bytes: ", Errno(err))));
  }
  bool huge = false;
  void* p =
      MapAdvised(o.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, data_fd, o.try_huge_pages, &huge);
  const int map_err = errno;
  if (p == MAP_FAILED) {
    return fail_mem(absl::ResourceExhaustedError(
        absl::StrCat("shm arena: mmap of ", o.bytes, " bytes: ", Errno(map_err))));
  }
  if (o.sealed) {
    // From here on only this mapping can change the bytes: no new writable mapping, no write(),
    // no resize, and the seals themselves cannot be lifted -- whoever holds a descriptor.
    const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
    if (fcntl(mem_fd, F_ADD_SEALS, seals) != 0) {
      const int err = errno;
      munmap(p, o.bytes);
      return fail_mem(absl::InternalError(
          absl::StrCat("shm arena: sealing the pool memfd (Linux >= 5.1 needed): ", Errno(err))));
    }
  }
  const bool cuda = o.try_cuda_register && TryCudaRegister(p, o.bytes);
  auto arena = std::make_unique<ShmArena>(shm_name, fd, mem_fd, static_cast<uint8_t*>(p),
                                          o.bytes, huge, cuda);
  arena->set_took_over(!created);
  return std::unique_ptr<Arena>(std::move(arena));
}

}  // namespace oscarkv
