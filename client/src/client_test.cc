// Unit tests of the client pieces that need no daemon: block keys, option checks, connecting to
// nothing, the shared-memory mapping and the async worker pool. The daemon round trips are in
// tests/ (integration).
#include "oscarkv/client/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm_mapping.h"
#include "task_pool.h"

namespace oscarkv::client {
namespace {

TEST(ClientTest, BlockKeysMatchFormatGoldenVectors) {
  Codec codec;
  codec.profile = *BuiltinProfile("qwen3-8b");
  codec.id = codec.profile.Id();
  ASSERT_EQ(codec.id.Hex(), "4be25704bf3761cb7196d7029b0c67ed");
  std::vector<uint32_t> tokens(150);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i;
  auto keys = Client::BlockKeys(codec, tokens);  // 150 tokens: two full blocks of 64
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].Hex(), "5d55a8bf9ffbceec922d5a1b7acc1d7f");
  EXPECT_EQ(keys[1].Hex(), "10cb911c588a67c541fd440aa76e9779");
  auto salted = Client::BlockKeys(codec, std::span(tokens).first(128), "tenant-a");
  ASSERT_EQ(salted.size(), 2u);
  EXPECT_EQ(salted[0].Hex(), "db9f58cfc2462c86ab995409005f7b67");
  EXPECT_EQ(salted[1].Hex(), "7049ff28b9393592eaa46b861479f5dc");
}

TEST(ClientTest, ConnectRejectsBadOptions) {
  ConnectOptions o;
  o.address = "";
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.address = "127.0.0.1:1";
  o.rpc_timeout_ms = 0;
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClientTest, ConnectToNothingIsUnavailableAndQuick) {
  ConnectOptions o;
  o.address = "127.0.0.1:1";  // nothing listens on port 1
  o.rpc_timeout_ms = 3000;
  const auto t0 = std::chrono::steady_clock::now();
  auto c = Client::Connect(o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().code(), testing::AnyOf(absl::StatusCode::kUnavailable,
                                                absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(std::string(c.status().message()), testing::HasSubstr("127.0.0.1:1"));
  EXPECT_LT(s, 3.5);
}

TEST(ShmMappingTest, MapsSharedFileReadWrite) {
  const std::string name = "/oscarkv-client-test-" + std::to_string(::getpid());
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
  void* other = ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(other, MAP_FAILED);
  const std::string path = "/dev/shm" + name;

  auto m = ShmMapping::Map(path, 1 << 20);
  ASSERT_TRUE(m.ok()) << m.status();
  (*m)->data()[12345] = 0x5a;  // visible through the other mapping: same segment
  EXPECT_EQ(static_cast<uint8_t*>(other)[12345], 0x5a);
  EXPECT_TRUE((*m)->Contains(0, 1 << 20));
  EXPECT_FALSE((*m)->Contains(1, 1 << 20));
  EXPECT_FALSE((*m)->Contains(~0ull, 2));

  EXPECT_EQ(ShmMapping::Map(path, 2 << 20).status().code(),
            absl::StatusCode::kFailedPrecondition);  // smaller than announced
  EXPECT_EQ(ShmMapping::Map(path + "-missing", 1 << 20).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ShmMapping::Map("", 0).status().code(), absl::StatusCode::kFailedPrecondition);
  ::munmap(other, 1 << 20);
  ::close(fd);
  ::shm_unlink(name.c_str());
}

TEST(TaskPoolTest, RunsEveryQueuedTaskBeforeDestruction) {
  std::atomic<int> ran{0};
  {
    TaskPool pool(3);
    for (int i = 0; i < 1000; ++i) pool.Submit([&ran] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 1000);
}

}  // namespace
}  // namespace oscarkv::client
