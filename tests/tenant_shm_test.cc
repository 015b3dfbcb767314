// Shared memory for tenants against a real daemon (isolated pool, tenants mapped by uid): a
// tenant stores through its staging region and loads through a load staging region of its own
// connection (AttachLoadStaging, StageRead), never mapping the pool. Checked: tenant A stores
// and loads over shared memory; tenant B (a second uid) cannot read A's pages through StageRead
// and its region never holds A's bytes; a shared namespace is readable by both over shared
// memory; a corrupted page is DATA_LOSS at the client; bad offsets and sizes are refused.
// Tests that need a second uid (or to write the daemon's memory) run only as root.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "oscarkv/v1/local_control.h"
#include "oscarkv/v1/oscarkv.pb.h"
#include "run_tool.h"
#include "tenant_pki.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

namespace pb = ::oscarkv::v1;
namespace local = ::oscarkv::v1::local;
using absl::StatusCode;

constexpr uint32_t kUidB = 64012;
constexpr uint64_t kRegionBytes = 8 << 20;

std::string TenantsYaml(const TenantPki& pki) {
  return "tls:\n  cert: " + pki.path("server.pem") + "\n  key: " + pki.path("server.key") +
         "\n  client_ca: " + pki.path("ca.pem") +
         "\ntenants:\n"
         "  - name: tenant-a\n"
         "    uids: [" + std::to_string(::getuid()) + "]\n"
         "  - name: tenant-b\n"
         "    uids: [" + std::to_string(kUidB) + "]\n"
         "  - name: admin\n"
         "    role: admin\n"
         "shared_namespaces:\n"
         "  - {name: common, tenants: [tenant-a, tenant-b]}\n";
}

std::string KeyBytes(const BlockKey& k) {
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}

// A raw connection of the local socket (this process's uid: tenant-a), for the frames a Client
// never sends.
class RawConn {
 public:
  explicit RawConn(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  // Sends one frame (with `send_fd` when >= 0), reads its answer; *fd receives a passed
  // descriptor (or -1).
  uint32_t Call(local::Method m, const google::protobuf::MessageLite& msg, int* fd = nullptr,
                std::string* body = nullptr, int send_fd = -1) {
    local::RequestHeader h;
    h.method = static_cast<uint16_t>(m);
    h.id = ++id_;
    std::string f(reinterpret_cast<const char*>(&h), sizeof(h));
    f += msg.SerializeAsString();
    iovec out{f.data(), f.size()};
    alignas(cmsghdr) char out_control[CMSG_SPACE(sizeof(int))] = {};
    msghdr om{};
    om.msg_iov = &out;
    om.msg_iovlen = 1;
    if (send_fd >= 0) {
      om.msg_control = out_control;
      om.msg_controllen = sizeof(out_control);
      cmsghdr* c = CMSG_FIRSTHDR(&om);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &send_fd, sizeof(int));
    }
    if (::sendmsg(fd_, &om, MSG_NOSIGNAL) != static_cast<ssize_t>(f.size())) return 99;
    static char buf[local::kMaxFrameBytes];
    iovec iov{buf, sizeof(buf)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd_, &mh, MSG_CMSG_CLOEXEC);
    if (fd != nullptr) *fd = -1;
    if (n < static_cast<ssize_t>(sizeof(local::ResponseHeader))) return 98;
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_type != SCM_RIGHTS) continue;
      int got;
      std::memcpy(&got, CMSG_DATA(c), sizeof(int));
      if (fd != nullptr) {
        *fd = got;
      } else {
        ::close(got);
      }
    }
    local::ResponseHeader rh;
    std::memcpy(&rh, buf, sizeof(rh));
    if (body != nullptr) {
      body->assign(buf + sizeof(rh) + rh.message_bytes, n - sizeof(rh) - rh.message_bytes);
    }
    return rh.code;
  }

 private:
  int fd_ = -1;
  uint64_t id_ = 0;
};

pb::StageReadRequest Chunk(uint64_t lease, const BlockKey& key, uint64_t page_offset,
                           uint64_t staging_offset, uint64_t length) {
  pb::StageReadRequest r;
  r.set_lease_id(lease);
  r.set_key(KeyBytes(key));
  r.set_page_offset(page_offset);
  r.set_staging_offset(staging_offset);
  r.set_length(length);
  return r;
}

class TenantShmTest : public TenantPkiTest<TenantShmTest> {
 public:
  static constexpr const char* kPkiTag = "tenant_shm_test";

 protected:
  void SetUp() override {
    TenantPkiTest::SetUp();
    if (HasFatalFailure()) return;
    const std::string cfg = pki_->path("tenants.yaml");
    std::ofstream(cfg) << TenantsYaml(*pki_);
    daemon_ = StartDaemon({"--config", cfg});
    ASSERT_NE(daemon_, nullptr);
    ASSERT_FALSE(daemon_->local_socket().empty());
  }

  std::unique_ptr<client::Client> As(const std::string& cert, const std::string& ns = "") {
    client::ConnectOptions o;
    o.address = daemon_->address();
    o.rpc_timeout_ms = 5000;
    o.tls_ca_file = pki_->path("ca.pem");
    o.tls_cert_file = pki_->path(cert + ".pem");
    o.tls_key_file = pki_->path(cert + ".key");
    o.shared_namespace = ns;
    o.data_path = client::DataPath::kSharedMemory;
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok()) << cert << ": " << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // tenant_shm_probe as uid kUidB with tenant-b's certificate: loads `keys`; returns its
  // "data_path=... code=... matched=..." line and the pages it loaded in *pages.
  std::string ProbeAsB(const std::string& ns, std::span<const BlockKey> keys,
                       std::string* pages) {
    const std::string dir = pki_->path("probe-b");
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(pki_->path("ca.pem"), dir + "/ca.pem",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(pki_->path("tenant-b.pem"), dir + "/client.pem",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(pki_->path("tenant-b.key"), dir + "/client.key",
                               std::filesystem::copy_options::overwrite_existing);
    const std::string out = dir + "/pages.bin";
    for (const std::string f : {"", "/ca.pem", "/client.pem", "/client.key"}) {
      EXPECT_EQ(::chown((dir + f).c_str(), kUidB, kUidB), 0) << dir + f;
    }
    std::string args = absl::StrCat(kUidB, " ", daemon_->address(), " ", dir, " ",
                                    ns.empty() ? "-" : ns, " ", out);
    for (const BlockKey& k : keys) absl::StrAppend(&args, " ", absl::BytesToHexString(KeyBytes(k)));
    std::string log;
    const int rc = RunTool(TENANT_SHM_PROBE_PATH, args, &log);
    EXPECT_EQ(rc, 0) << log;
    *pages = ReadTextFile(out);
    std::filesystem::remove(out);
    return log;
  }

  std::unique_ptr<testing::LocalDaemon> daemon_;
};

TEST_F(TenantShmTest, TenantStoresAndLoadsOverSharedMemoryWithoutThePool) {
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->server().data_path, client::DataPath::kSharedMemory);
  EXPECT_TRUE(a->server().shm_path.empty());  // isolated: no pool file to open
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 100, 6);
  auto stored = a->Store(codec, p.writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->stored, 6u);
  auto loaded = a->Load(codec, p.keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->matched, 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(loaded->pages[i], p.bytes[i]) << i;
  // Through the C++ API's caller-buffer load too (the same data path).
  std::vector<std::vector<uint8_t>> bufs(6, std::vector<uint8_t>(p.bytes[0].size()));
  std::vector<std::span<uint8_t>> dst(bufs.begin(), bufs.end());
  auto into = a->LoadInto(codec, p.keys, dst);
  ASSERT_TRUE(into.ok()) << into.status();
  EXPECT_EQ(bufs[5], p.bytes[5]);
}

// A tenant's Client outlives a restart of the daemon: its staging and load staging connections
// belong to the instance that is gone; the next store and the next load open new ones (the
// Client reconnects on that call) and move the pages byte-exact, still without the pool.
// Tests/store_reconnect_test.cc does the same for a daemon without tenants (the pool mapped).
TEST_F(TenantShmTest, TenantStoresAndLoadsAgainAfterADaemonRestart) {
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 700, 3);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  ASSERT_EQ(a->Load(codec, p.keys)->matched, 3u);

  const std::string address = daemon_->address();
  const std::string shm_name = std::filesystem::path(daemon_->shm_path()).filename();
  ASSERT_TRUE(daemon_->Stop().ok());
  daemon_.reset();
  testing::LocalDaemonOptions o;
  o.binary = OSCARKVD_PATH;
  o.flags = {"--metrics-listen", "off", "--pool-mb", "64", "--shm-name", shm_name,
             "--config", pki_->path("tenants.yaml"), "--listen", address};
  auto restarted = testing::LocalDaemon::Start(o);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  daemon_ = *std::move(restarted);
  // No tier: the codec is registered again (over TLS, which reconnects by itself).
  absl::StatusOr<client::Codec> again = absl::UnavailableError("not tried");
  for (int i = 0; i < 400 && !again.ok(); ++i) {
    again = a->RegisterCodec(*BuiltinProfile("refmodel"));
    if (!again.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(again.ok()) << again.status();
  codec = *again;

  // The first data call after the restart is a load (through the new load staging region):
  // the restarted daemon holds nothing, and says so (not UNAVAILABLE).
  auto empty = a->Load(codec, p.keys);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->matched, 0u);
  TenantPages q = MakeTenantPages(codec, 800, 3);
  auto stored = a->Store(codec, q.writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, 3u) << stored->ToStatus();
  auto loaded = a->Load(codec, q.keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->matched, 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(loaded->pages[i], q.bytes[i]) << i;
  EXPECT_EQ(a->server().data_path, client::DataPath::kSharedMemory);
  EXPECT_TRUE(a->server().shm_path.empty());
}

// A shared-namespace client reserves over gRPC for the namespace and stages as its uid's tenant
// on the socket (the same tenant: Connect checks it). The page lands where it was reserved --
// the reservation carries the namespace; the socket's caller only has to be its tenant -- so it
// is in the shared namespace and not in the tenant's own, and quotas are charged to one tenant.
TEST_F(TenantShmTest, SharedNamespaceStoreThroughStagingLandsInTheNamespace) {
  auto shared = As("tenant-a", "common");
  ASSERT_NE(shared, nullptr);
  auto own = As("tenant-a");
  ASSERT_NE(own, nullptr);
  const client::Codec codec = RegisterRefmodel(*shared);
  const client::Codec own_codec = RegisterRefmodel(*own);
  TenantPages p = MakeTenantPages(codec, 900, 2);
  auto stored = shared->Store(codec, p.writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, 2u) << stored->ToStatus();
  auto there = shared->Load(codec, p.keys);
  ASSERT_TRUE(there.ok()) << there.status();
  ASSERT_EQ(there->matched, 2u);
  EXPECT_EQ(there->pages[1], p.bytes[1]);
  auto mine = own->Lookup(own_codec, p.keys, {});
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->matched, 0u) << "the socket's caller (own namespace) published the page";
}

// Pages larger than a load staging slot (2 MiB) move in several chunks, copied and hashed with
// one fused state across them: Qwen3-8B BF16 pages are 9.4 MB. A wrong digest would be DATA_LOSS.
TEST_F(TenantShmTest, PagesLargerThanASlotLoadInChunks) {
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  auto codec = a->RegisterCodec(*BuiltinProfile("qwen3-8b"));
  ASSERT_TRUE(codec.ok()) << codec.status();
  ASSERT_GT(codec->page_bytes(PageKind::kBf16), 4u << 20);
  const auto keys = client::Client::BlockKeys(*codec, Tokens(9, 2 * codec->profile.page_tokens));
  std::vector<std::vector<uint8_t>> pages;
  std::vector<client::PageWrite> writes;
  for (size_t i = 0; i < 2; ++i) pages.push_back(MakePage(codec->profile, PageKind::kBf16, 60 + i));
  for (size_t i = 0; i < 2; ++i) writes.push_back({keys[i], PageKind::kBf16, pages[i]});
  auto stored = a->Store(*codec, writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->stored, 2u);
  auto loaded = a->Load(*codec, keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->matched, 2u);
  EXPECT_TRUE(loaded->pages[0] == pages[0]);
  EXPECT_TRUE(loaded->pages[1] == pages[1]);
}

TEST_F(TenantShmTest, TenantGetsNoPoolAndBadLoadStagingRequestsAreRefused) {
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 200, 1);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  auto lease = a->Lookup(codec, p.keys, {.pin = true});
  ASSERT_TRUE(lease.ok() && lease->matched == 1) << lease.status();
  const uint64_t id = lease->lease_ids[0];
  const uint64_t page = p.bytes[0].size();

  RawConn c(daemon_->local_socket());
  ASSERT_TRUE(c.ok());
  pb::HandshakeRequest hs;
  hs.set_wire_version(pb::WIRE_VERSION_1);
  ASSERT_EQ(c.Call(local::Method::kHandshake, hs), 0u);
  // A tenant's AttachStaging accepts its staging memfd and passes back no pool descriptor.
  const int staging = ::memfd_create("tenant-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(staging, 0);
  ASSERT_EQ(::ftruncate(staging, 1 << 20), 0);
  ASSERT_EQ(::fcntl(staging, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  pb::AttachStagingRequest store_staging;
  store_staging.set_staging_bytes(1 << 20);
  int pool_fd = -2;
  std::string body;
  ASSERT_EQ(c.Call(local::Method::kAttachStaging, store_staging, &pool_fd, &body, staging), 0u);
  ::close(staging);
  EXPECT_EQ(pool_fd, -1) << "a tenant was passed a descriptor (the pool?)";
  pb::AttachStagingResponse attached;
  ASSERT_TRUE(attached.ParseFromString(body));
  EXPECT_EQ(attached.pool_bytes(), 0u);
  // No load region yet.
  EXPECT_EQ(c.Call(local::Method::kStageRead, Chunk(id, p.keys[0], 0, 0, 64)),
            static_cast<uint32_t>(StatusCode::kFailedPrecondition));
  pb::AttachLoadStagingRequest attach;
  attach.set_bytes(0);
  EXPECT_EQ(c.Call(local::Method::kAttachLoadStaging, attach),
            static_cast<uint32_t>(StatusCode::kInvalidArgument));
  attach.set_bytes(uint64_t{65} << 20);  // over pool.staging_max_mb (64)
  EXPECT_EQ(c.Call(local::Method::kAttachLoadStaging, attach),
            static_cast<uint32_t>(StatusCode::kResourceExhausted));
  attach.set_bytes(kRegionBytes);
  int fd = -1;
  ASSERT_EQ(c.Call(local::Method::kAttachLoadStaging, attach, &fd), 0u);
  ASSERT_GE(fd, 0);
  // The descriptor is read-only and sealed: no writable mapping, no resize.
  EXPECT_EQ(::mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  EXPECT_NE(::ftruncate(fd, 4096), 0);
  const int seals = ::fcntl(fd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
  void* m = ::mmap(nullptr, kRegionBytes, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  EXPECT_NE(::mprotect(m, kRegionBytes, PROT_READ | PROT_WRITE), 0);
  const auto* region = static_cast<const uint8_t*>(m);

  const uint32_t range = static_cast<uint32_t>(StatusCode::kOutOfRange);
  EXPECT_EQ(c.Call(local::Method::kStageRead, Chunk(id, p.keys[0], 0, kRegionBytes - 63, 64)),
            range);
  EXPECT_EQ(c.Call(local::Method::kStageRead, Chunk(id, p.keys[0], 0, ~uint64_t{0}, 64)), range);
  EXPECT_EQ(c.Call(local::Method::kStageRead, Chunk(id, p.keys[0], page - 63, 0, 64)), range);
  EXPECT_EQ(c.Call(local::Method::kStageRead, Chunk(id, p.keys[0], ~uint64_t{0} - 8, 0, 64)),
            range);
  EXPECT_EQ(c.Call(local::Method::kStageRead, Chunk(id + 1, p.keys[0], 0, 0, 64)),
            static_cast<uint32_t>(StatusCode::kNotFound));
  pb::StageReadRequest short_key = Chunk(id, p.keys[0], 0, 0, 64);
  short_key.set_key("short");
  EXPECT_EQ(c.Call(local::Method::kStageRead, short_key),
            static_cast<uint32_t>(StatusCode::kInvalidArgument));
  // Nothing was copied by the refused requests; a good one copies exactly its chunk.
  for (uint64_t i = 0; i < kRegionBytes; ++i) ASSERT_EQ(region[i], 0) << i;
  ASSERT_EQ(c.Call(local::Method::kStageRead, Chunk(id, p.keys[0], 64, 4096, page - 64)), 0u);
  EXPECT_EQ(std::memcmp(region + 4096, p.bytes[0].data() + 64, page - 64), 0);
  EXPECT_EQ(region[4095], 0);
  ::munmap(m, kRegionBytes);
  ::close(fd);
  EXPECT_TRUE(a->Release(*lease).ok());
}

// Load staging regions are daemon memory: one tenant holds at most 512 MiB of them (64 of the
// client library's 8 MiB, one per connection that loads); closing a connection gives its region
// back.
TEST_F(TenantShmTest, LoadStagingRegionsPerTenantAreBounded) {
  pb::HandshakeRequest hs;
  hs.set_wire_version(pb::WIRE_VERSION_1);
  pb::AttachLoadStagingRequest attach;
  attach.set_bytes(kRegionBytes);
  std::vector<std::unique_ptr<RawConn>> conns;
  for (int i = 0; i < 64; ++i) {
    conns.push_back(std::make_unique<RawConn>(daemon_->local_socket()));
    ASSERT_TRUE(conns.back()->ok());
    ASSERT_EQ(conns.back()->Call(local::Method::kHandshake, hs), 0u);
    int fd = -1;
    ASSERT_EQ(conns.back()->Call(local::Method::kAttachLoadStaging, attach, &fd), 0u) << i;
    ::close(fd);
  }
  RawConn extra(daemon_->local_socket());
  ASSERT_EQ(extra.Call(local::Method::kHandshake, hs), 0u);
  EXPECT_EQ(extra.Call(local::Method::kAttachLoadStaging, attach),
            static_cast<uint32_t>(StatusCode::kResourceExhausted));
  // A second region on the same connection replaces the first (no second slot).
  int fd = -1;
  EXPECT_EQ(conns[0]->Call(local::Method::kAttachLoadStaging, attach, &fd), 0u);
  ::close(fd);
  conns.pop_back();  // closed: its slot is free again (the daemon notices the close first)
  uint32_t code = 1;
  for (int tries = 0; tries < 100 && code != 0; ++tries) {
    code = extra.Call(local::Method::kAttachLoadStaging, attach, &fd);
    if (code == 0) ::close(fd);
    if (code != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(code, 0u);
}

// The root-only part: a second tenant on the same host is a second uid.
TEST_F(TenantShmTest, TenantBCannotReadTenantAsPagesThroughItsLoadStaging) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as a second uid";
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 300, 3);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());

  // B's own client (shared memory, its uid): A's keys are not found in B's namespace.
  std::string pages;
  std::string line = ProbeAsB("", p.keys, &pages);
  EXPECT_NE(line.find("data_path=shm code=0 matched=0"), std::string::npos) << line;
  EXPECT_TRUE(pages.empty());

  // B with A's own lease and keys, straight on the socket: refused, and its region stays empty.
  auto lease = a->Lookup(codec, p.keys, {.pin = true});
  ASSERT_TRUE(lease.ok() && lease->matched == 3) << lease.status();
  const uint64_t id = lease->lease_ids[0];
  std::vector<std::string> frames;
  auto frame = [](local::Method m, uint64_t fid, const google::protobuf::MessageLite& msg) {
    local::RequestHeader h;
    h.method = static_cast<uint16_t>(m);
    h.id = fid;
    return std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + msg.SerializeAsString();
  };
  pb::HandshakeRequest hs;
  hs.set_wire_version(pb::WIRE_VERSION_1);
  pb::AttachLoadStagingRequest attach;
  attach.set_bytes(kRegionBytes);
  frames.push_back(frame(local::Method::kHandshake, 1, hs));
  frames.push_back(frame(local::Method::kAttachLoadStaging, 2, attach));
  for (size_t i = 0; i < 3; ++i) {
    frames.push_back(frame(local::Method::kStageRead, 3 + i,
                           Chunk(id, p.keys[i], 0, i << 20, p.bytes[i].size())));
  }
  const std::string path = daemon_->local_socket();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // system calls only, as kUidB; the exit code says what happened
    if (::setgid(kUidB) != 0 || ::setuid(kUidB) != 0) ::_exit(3);
    const int s = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path.c_str());
    timeval tv{5, 0};
    ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (::connect(s, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) ::_exit(4);
    static char buf[local::kMaxFrameBytes];
    int region_fd = -1;
    for (size_t f = 0; f < frames.size(); ++f) {
      if (::send(s, frames[f].data(), frames[f].size(), MSG_NOSIGNAL) < 0) ::_exit(5);
      iovec iov{buf, sizeof(buf)};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
      msghdr mh{};
      mh.msg_iov = &iov;
      mh.msg_iovlen = 1;
      mh.msg_control = control;
      mh.msg_controllen = sizeof(control);
      if (::recvmsg(s, &mh, 0) < static_cast<ssize_t>(sizeof(local::ResponseHeader))) ::_exit(6);
      local::ResponseHeader rh;
      std::memcpy(&rh, buf, sizeof(rh));
      if (f < 2 && rh.code != 0) ::_exit(7);  // B may attach a region of its own
      if (f >= 2 && rh.code != static_cast<uint32_t>(StatusCode::kNotFound)) ::_exit(8);
      if (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr && c->cmsg_type == SCM_RIGHTS) {
        std::memcpy(&region_fd, CMSG_DATA(c), sizeof(int));
      }
    }
    if (region_fd < 0) ::_exit(9);
    void* m = ::mmap(nullptr, kRegionBytes, PROT_READ, MAP_SHARED, region_fd, 0);
    if (m == MAP_FAILED) ::_exit(10);
    const auto* r = static_cast<const uint8_t*>(m);
    for (uint64_t i = 0; i < kRegionBytes; ++i) {
      if (r[i] != 0) ::_exit(11);  // some byte reached B's region
    }
    ::_exit(0);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "tenant-b's probe failed at step " << WEXITSTATUS(st);
  // A's lease and pages are untouched.
  EXPECT_TRUE(a->RenewLease(id, 5000).ok());
  EXPECT_TRUE(a->Release(*lease).ok());
  auto mine = a->Load(codec, p.keys);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->matched, 3u);
}

TEST_F(TenantShmTest, SharedNamespaceIsReadableByBothTenantsOverSharedMemory) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as a second uid";
  auto a = As("tenant-a", "common");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->server().data_path, client::DataPath::kSharedMemory);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 400, 2);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  auto mine = a->Load(codec, p.keys);
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_EQ(mine->matched, 2u);
  EXPECT_EQ(mine->pages[1], p.bytes[1]);
  std::string pages;
  const std::string line = ProbeAsB("common", p.keys, &pages);
  EXPECT_NE(line.find("data_path=shm code=0 matched=2"), std::string::npos) << line;
  std::string want;
  for (const auto& b : p.bytes) want.append(reinterpret_cast<const char*>(b.data()), b.size());
  EXPECT_TRUE(pages == want) << "tenant-b loaded other bytes than tenant-a stored";
}

// Corruption a client cannot cause (the pool is read-only to everyone but the daemon): root
// writes a committed page through /proc/<daemon>/mem, and the tenant's load, which hashes what
// it copied out of its load staging region, fails with DATA_LOSS.
TEST_F(TenantShmTest, CorruptPageIsDataLossAtTheTenant) {
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 500, 2);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  auto pin = a->Lookup(codec, p.keys, {.pin = true});
  ASSERT_TRUE(pin.ok() && pin->matched == 2) << pin.status();
  const uint64_t offset = pin->pages[1].offset;
  ASSERT_TRUE(a->Release(*pin).ok());
  // The pool is the daemon's mapping of its memfd "oscarkv-pool-...".
  const std::string proc = "/proc/" + std::to_string(daemon_->pid());
  uint64_t base = 0;
  std::ifstream maps(proc + "/maps");
  for (std::string l; std::getline(maps, l);) {
    if (l.find("memfd:oscarkv-pool-") != std::string::npos) {
      base = std::stoull(l.substr(0, l.find('-')), nullptr, 16);
      break;
    }
  }
  ASSERT_NE(base, 0u) << "no pool mapping in " << proc << "/maps";
  const int mem = ::open((proc + "/mem").c_str(), O_RDWR);
  if (mem < 0) GTEST_SKIP() << "cannot write the daemon's memory: " << std::strerror(errno);
  uint8_t byte = 0;
  const off_t at = static_cast<off_t>(base + offset + 4096);
  ASSERT_EQ(::pread(mem, &byte, 1, at), 1);
  byte ^= 0x5a;
  ASSERT_EQ(::pwrite(mem, &byte, 1, at), 1);
  ::close(mem);
  auto loaded = a->Load(codec, p.keys);
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss) << loaded.status();
  // The first page is intact and still loads.
  auto first = a->Load(codec, std::span<const BlockKey>(p.keys.data(), 1));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->pages[0], p.bytes[0]);
}

}  // namespace
}  // namespace oscarkv::testing
