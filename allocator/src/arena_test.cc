#include "oscarkv/allocator/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"

#if defined(OSCARKV_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace oscarkv {
namespace {

std::string UniqueName(const char* tag) {
  return std::string("oscarkv-test-") + tag + "-" + std::to_string(getpid());
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

TEST(HeapArena, ZeroedWritable) {
  auto a = CreateHeapArena(1 << 20);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->size(), 1u << 20);
  EXPECT_EQ((*a)->shm_path(), "");
  EXPECT_EQ((*a)->base()[12345], 0);
  (*a)->base()[12345] = 7;
  EXPECT_EQ((*a)->base()[12345], 7);
  EXPECT_FALSE(CreateHeapArena(0).ok());
}

TEST(ShmArena, SharedWithASecondMappingAndUnlinkedOnDestroy) {
  ShmArenaOptions o;
  o.name = UniqueName("shared");
  o.bytes = 4 << 20;
  auto a = CreateShmArena(o);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string path = (*a)->shm_path();
  EXPECT_EQ(path, "/dev/shm/" + o.name);
  ASSERT_TRUE(FileExists(path));
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), o.bytes);

  // What a client does: open the path and map it; bytes written on one side show on the other.
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  void* p = mmap(nullptr, o.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  auto* client = static_cast<uint8_t*>(p);
  std::memcpy((*a)->base() + 1000, "hello", 5);
  EXPECT_EQ(std::memcmp(client + 1000, "hello", 5), 0);
  client[(4 << 20) - 1] = 42;
  EXPECT_EQ((*a)->base()[(4 << 20) - 1], 42);
  munmap(p, o.bytes);

  // A second daemon cannot take the name of a live one, and is told who owns it.
  auto dup = CreateShmArena(o);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists) << dup.status();
  EXPECT_NE(dup.status().message().find("in use by pid " + std::to_string(getpid())),
            std::string::npos)
      << dup.status();
  EXPECT_TRUE(FileExists(path));  // and the live one's file is untouched
  a->reset();
  EXPECT_FALSE(FileExists(path));
}

// Whatever a client does with the descriptor it is given (or with the paths it can find), it
// cannot write a sealed arena; the owner's mapping stays writable and the client sees its bytes.
TEST(ShmArena, SealedArenaIsReadOnlyForEveryoneButItsOwner) {
  ShmArenaOptions o;
  o.name = UniqueName("sealed");
  o.bytes = 2 << 20;
  o.sealed = true;
  auto a = CreateShmArena(o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->sealed());
  EXPECT_EQ((*a)->shm_path(), "");  // nothing to open by path
  const std::string lock_path = (*a)->owner_path();
  EXPECT_EQ(lock_path, "/dev/shm/" + o.name);
  struct stat st;
  ASSERT_EQ(stat(lock_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);  // the owner lock only: mapping it gives nothing
  EXPECT_EQ(st.st_mode & 077, 0u);

  auto fd = (*a)->OpenReadOnly();
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(fcntl(*fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  EXPECT_EQ(mmap(nullptr, o.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0), MAP_FAILED);
  void* ro = mmap(nullptr, o.bytes, PROT_READ, MAP_SHARED, *fd, 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_NE(mprotect(ro, o.bytes, PROT_READ | PROT_WRITE), 0);
  // Re-opening the descriptor's /proc link read-write is possible (same uid), but the seal
  // refuses every writable mapping and write() through it.
  const std::string link = "/proc/self/fd/" + std::to_string(*fd);
  const int rw = open(link.c_str(), O_RDWR);
  if (rw >= 0) {
    errno = 0;
    EXPECT_EQ(mmap(nullptr, o.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0), MAP_FAILED);
    EXPECT_EQ(errno, EPERM);
    EXPECT_LT(pwrite(rw, "x", 1, 0), 0);
    EXPECT_NE(ftruncate(rw, 0), 0);
    EXPECT_NE(fcntl(rw, F_ADD_SEALS, 0), 0);
    close(rw);
  }
  EXPECT_LT(pwrite(*fd, "x", 1, 0), 0);
  // The owner writes; the reader sees it.
  std::memcpy((*a)->base() + 4096, "page", 4);
  EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(ro) + 4096, "page", 4), 0);
  munmap(ro, o.bytes);
  close(*fd);

  // The name is owned like an unsealed arena's.
  auto dup = CreateShmArena(o);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists) << dup.status();
  a->reset();
  EXPECT_FALSE(FileExists(lock_path));
}

TEST(ShmArena, TakesOverAFileWhoseOwnerIsDead) {
  ShmArenaOptions o;
  o.name = UniqueName("stale");
  o.bytes = 1 << 20;
  const std::string path = "/dev/shm/" + o.name;
  // A dead daemon's file: bytes in it, nobody holding its owner lock.
  int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 2 << 20), 0);
  ASSERT_EQ(pwrite(fd, "old", 3, 100), 3);
  close(fd);
  auto a = CreateShmArena(o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->took_over_stale());
  EXPECT_EQ((*a)->size(), size_t{1} << 20);
  EXPECT_EQ((*a)->base()[100], 0);  // emptied: a dead daemon's bytes are not trusted
  a->reset();
  EXPECT_FALSE(FileExists(path));
  o.replace_existing = true;  // still accepted: replaces unconditionally
  fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
  close(fd);
  auto b = CreateShmArena(o);
  ASSERT_TRUE(b.ok()) << b.status();
  b->reset();
  EXPECT_FALSE(FileExists(path));
}

TEST(ShmArena, RejectsBadNamesAndSizes) {
  for (const char* bad : {"", "a/b", "..", "x y", "ä"}) {
    ShmArenaOptions o;
    o.name = bad;
    o.bytes = 1 << 20;
    EXPECT_EQ(CreateShmArena(o).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  ShmArenaOptions o;
  o.name = UniqueName("zero");
  o.bytes = 0;
  EXPECT_EQ(CreateShmArena(o).status().code(), absl::StatusCode::kInvalidArgument);
  // More than /dev/shm can hold: a clear error instead of a SIGBUS later.
  o.bytes = size_t{1} << 50;
  EXPECT_EQ(CreateShmArena(o).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(FileExists("/dev/shm/" + o.name));
}

TEST(ShmArena, RegisteredWithCudaWhenAGpuIsPresent) {
#if defined(OSCARKV_HAVE_CUDA)
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no GPU: the arena is plain shared memory";
  }
  ShmArenaOptions o;
  o.name = UniqueName("cuda");
  o.bytes = 64 << 20;
  auto a = CreateShmArena(o);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->cuda_registered());
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, (*a)->base()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  // A device-to-host copy lands in the shared pages.
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaMemset(dev, 0x5A, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaMemcpy((*a)->base() + (8 << 20), dev, 1 << 20, cudaMemcpyDeviceToHost),
            cudaSuccess);
  cudaFree(dev);
  EXPECT_EQ((*a)->base()[(8 << 20) + 12345], 0x5A);
  o.name = UniqueName("nocuda");
  o.try_cuda_register = false;
  auto b = CreateShmArena(o);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE((*b)->cuda_registered());
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

}  // namespace
}  // namespace oscarkv
