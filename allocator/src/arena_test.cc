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
