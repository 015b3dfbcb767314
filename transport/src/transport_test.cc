// In-process checks of the transport API's argument and blob validation, capability queries and
// RAII teardown, on real UCX (tcp over loopback). Peer-to-peer transfers are in
// transport_peer_test.cc (separate processes).
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "oscarkv/testing/bootstrap.h"
#include "oscarkv/transport/transport.h"

namespace oscarkv::transport {
namespace {

using ::oscarkv::testing::PeerProcess;
using ::oscarkv::testing::RecvBlob;
using ::oscarkv::testing::SendBlob;
using ::oscarkv::testing::ParseControlFd;
using ::oscarkv::testing::UniqueFd;

ContextOptions Loopback(const std::string& tls) {
  ContextOptions o;
  o.tls = tls;
  o.net_devices = "lo";
  return o;
}

TEST(UcsStatusTest, MapsConnectionErrorsToUnavailable) {
  EXPECT_TRUE(FromUcs(UCS_OK, "x").ok());
  EXPECT_EQ(FromUcs(UCS_ERR_CONNECTION_RESET, "get").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FromUcs(UCS_ERR_ENDPOINT_TIMEOUT, "get").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FromUcs(UCS_ERR_INVALID_PARAM, "get").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(FromUcs(UCS_ERR_NO_MEMORY, "map").message()),
              ::testing::HasSubstr("map"));
}

TEST(ContextTest, ReportsTheTransportsItGot) {
  auto tcp = Context::Create(Loopback("tcp"));
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  const Capabilities& caps = (*tcp)->capabilities();
  EXPECT_TRUE(caps.HasTransport("tcp")) << caps.ToString();
  EXPECT_FALSE(caps.HasTransport("posix")) << caps.ToString();
  EXPECT_EQ(caps.tls_requested, "tcp");
  EXPECT_EQ(caps.needs_gpu_staging(), !caps.cuda_memory);

  auto shm = Context::Create(Loopback("shm"));
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_TRUE((*shm)->capabilities().HasTransport("posix") ||
              (*shm)->capabilities().HasTransport("sysv"))
      << (*shm)->capabilities().ToString();
  EXPECT_FALSE((*shm)->capabilities().HasTransport("tcp"));
  EXPECT_TRUE(caps.peer_failure_detection);
  EXPECT_FALSE((*shm)->capabilities().peer_failure_detection);
  // An shm-only context refuses a peer-failure endpoint up front, with advice.
  auto w = Worker::Create(**shm);
  ASSERT_TRUE(w.ok());
  auto ep = (*w)->Connect((*w)->address());
  EXPECT_EQ(ep.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ep.status().message()), ::testing::HasSubstr("kNone"));
}

TEST(ContextTest, UnknownTransportIsAnError) {
  auto ctx = Context::Create(Loopback("no_such_transport"));
  EXPECT_FALSE(ctx.ok());
}

TEST(RegisterTest, RejectsBadBuffers) {
  auto ctx = Context::Create(Loopback("tcp"));
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_EQ((*ctx)->Register(nullptr, 4096).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> buf(4096);
  EXPECT_EQ((*ctx)->Register(buf.data(), 0).status().code(), absl::StatusCode::kInvalidArgument);

  // A range that was mapped and is not any more.
  const size_t len = 1 << 20;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(munmap(p, len), 0);
  auto unmapped = (*ctx)->Register(p, len);
  EXPECT_EQ(unmapped.status().code(), absl::StatusCode::kInvalidArgument) << unmapped.status();

  if (!(*ctx)->capabilities().cuda_memory) {
    EXPECT_EQ((*ctx)->Register(buf.data(), buf.size(), MemoryType::kCuda).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  auto ok = (*ctx)->Register(buf.data(), buf.size());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE((*ok)->Contains(buf.data() + 100, 100));
  EXPECT_FALSE((*ok)->Contains(buf.data() + 4000, 100));
  EXPECT_GT((*ok)->exported().size(), 28u);
}

TEST(RegisterTest, AllocatesThroughUcx) {
  auto ctx = Context::Create(Loopback("shm"));
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_EQ((*ctx)->Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  auto region = (*ctx)->Allocate(3 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  ASSERT_NE((*region)->base(), nullptr);
  EXPECT_GE((*region)->length(), size_t{3} << 20);
  (*region)->base()[(3 << 20) - 1] = 7;  // writable to its end
  EXPECT_GT((*region)->exported().size(), 28u);
}

class EndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ctx = Context::Create(Loopback("tcp"));
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    ctx_ = std::move(*ctx);
    auto a = Worker::Create(*ctx_);
    auto b = Worker::Create(*ctx_);
    ASSERT_TRUE(a.ok() && b.ok());
    server_ = std::move(*a);
    client_ = std::move(*b);
    auto region = ctx_->Register(remote_buf_.data(), remote_buf_.size());
    ASSERT_TRUE(region.ok()) << region.status();
    remote_region_ = std::move(*region);
    region = ctx_->Register(local_buf_.data(), local_buf_.size());
    ASSERT_TRUE(region.ok()) << region.status();
    local_region_ = std::move(*region);
    EndpointOptions eo;
    eo.peer_timeout = absl::Milliseconds(200);
    auto ep = client_->Connect(server_->address(), eo);
    ASSERT_TRUE(ep.ok()) << ep.status();
    ep_ = std::move(*ep);
  }

  std::vector<uint8_t> remote_buf_ = std::vector<uint8_t>(1 << 16, 0x5a);
  std::vector<uint8_t> local_buf_ = std::vector<uint8_t>(1 << 16, 0);
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Worker> server_, client_;
  std::unique_ptr<MemoryRegion> remote_region_, local_region_;
  std::unique_ptr<Endpoint> ep_;
};

TEST_F(EndpointTest, RejectsMalformedBlobs) {
  EXPECT_EQ(client_->Connect("garbage").status().code(), absl::StatusCode::kInvalidArgument);
  std::string truncated = server_->address().substr(0, server_->address().size() - 3);
  EXPECT_EQ(client_->Connect(truncated).status().code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(ep_->ImportRemote("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ep_->ImportRemote(std::string(64, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string& good = remote_region_->exported();
  EXPECT_EQ(ep_->ImportRemote(good.substr(0, good.size() - 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A worker address is not a memory blob and vice versa.
  EXPECT_EQ(ep_->ImportRemote(server_->address()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Connect(good).status().code(), absl::StatusCode::kInvalidArgument);
  auto remote = ep_->ImportRemote(good);
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ((*remote)->base(), reinterpret_cast<uint64_t>(remote_buf_.data()));
  EXPECT_EQ((*remote)->length(), remote_buf_.size());
}

TEST_F(EndpointTest, RejectsOutOfBoundsDescriptorsBeforePosting) {
  auto remote = ep_->ImportRemote(remote_region_->exported());
  ASSERT_TRUE(remote.ok()) << remote.status();
  const uint64_t rbase = (*remote)->base();
  EXPECT_EQ(ep_->Post(Direction::kGet, *local_region_, **remote, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<TransferDesc> past_remote = {{local_buf_.data(), rbase + 65000, 1000}};
  EXPECT_EQ(ep_->Post(Direction::kGet, *local_region_, **remote, past_remote).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<TransferDesc> past_local = {{local_buf_.data() + 65000, rbase, 1000}};
  EXPECT_EQ(ep_->Post(Direction::kPut, *local_region_, **remote, past_local).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<TransferDesc> wrap = {{local_buf_.data(), ~uint64_t{0} - 10, 100}};
  EXPECT_EQ(ep_->Post(Direction::kGet, *local_region_, **remote, wrap).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EndpointTest, SilentPeerFailsWithinPeerTimeout) {
  // The "server" worker is never progressed: over tcp its RMA is emulated by active messages,
  // so a get can never complete. The watchdog must fail the endpoint, not hang.
  auto remote = ep_->ImportRemote(remote_region_->exported());
  ASSERT_TRUE(remote.ok()) << remote.status();
  std::vector<TransferDesc> d = {{local_buf_.data(), (*remote)->base(), 4096}};
  const absl::Time start = absl::Now();
  absl::Status s = ep_->Run(Direction::kGet, *local_region_, **remote, d, absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  if (s.ok()) GTEST_SKIP() << "UCX completed the get without the peer progressing";
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(took, absl::Seconds(2)) << s;
  EXPECT_TRUE(ep_->failed());
  EXPECT_EQ(ep_->Post(Direction::kGet, *local_region_, **remote, d).status().code(),
            absl::StatusCode::kUnavailable);
  remote->reset();
}

TEST(BootstrapTest, BlobsRoundTripAndTimeOut) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  ASSERT_TRUE(SendBlob(a.get(), "hello").ok());
  ASSERT_TRUE(SendBlob(a.get(), std::string(100000, 'z')).ok());
  EXPECT_EQ(*RecvBlob(b.get(), absl::Seconds(1)), "hello");
  EXPECT_EQ(RecvBlob(b.get(), absl::Seconds(1))->size(), 100000u);
  EXPECT_EQ(RecvBlob(b.get(), absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  a.Reset();
  EXPECT_EQ(RecvBlob(b.get(), absl::Seconds(1)).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(ParseControlFd("x").ok());
  EXPECT_FALSE(ParseControlFd("987654").ok());
}

}  // namespace
}  // namespace oscarkv::transport
