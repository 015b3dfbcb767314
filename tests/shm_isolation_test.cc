// Isolated shared memory (pool.shm_mode: isolated, the default) against a real oscarkvd: a
// client of the daemon's own uid cannot write a committed page through any mapping it can get,
// and a page changed in its staging region is either refused (DATA_LOSS) or stored exactly as
// the daemon copied and hashed it -- never served differently.
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "oscarkv/v1/local_control.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_util.h"

namespace oscarkv {
namespace {

namespace pb = ::oscarkv::v1;
namespace local = ::oscarkv::v1::local;
using client::DataPath;
using client::PageWrite;
using testing::Connect;
using testing::MakePage;
using testing::RegisterRefmodel;
using testing::StartDaemon;
using testing::Tokens;

std::string KeyBytes(const BlockKey& k) {
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}

// The local-socket protocol spoken by hand (no client library: usable in a forked child).
class RawSession {
 public:
  ~RawSession() {
    if (staging_ != nullptr) munmap(staging_, staging_bytes_);
    if (pool_fd_ >= 0) close(pool_fd_);
    if (sock_ >= 0) close(sock_);
  }
  // Connects and handshakes.
  bool Dial(const std::string& path) {
    sock_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    int buf = local::kMaxFrameBytes + 4096;
    setsockopt(sock_, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    if (connect(sock_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return false;
    timeval tv{10, 0};
    setsockopt(sock_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    pb::HandshakeRequest req;
    req.set_wire_version(1);
    pb::HandshakeResponse resp;
    return Call(local::Method::kHandshake, req, &resp).ok();
  }
  // AttachStaging with `fd` (-2: a fresh shrink-sealed memfd of `bytes`, which is mapped here).
  absl::Status Attach(uint64_t bytes, int fd = -2) {
    if (fd == -2) {
      fd = memfd_create("test-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
          fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
        return absl::InternalError("staging memfd");
      }
      staging_ = static_cast<uint8_t*>(
          mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
      staging_bytes_ = bytes;
    }
    pb::AttachStagingRequest req;
    req.set_staging_bytes(bytes);
    pb::AttachStagingResponse resp;
    int got = -1;
    absl::Status s = Call(local::Method::kAttachStaging, req, &resp, fd, &got);
    if (got >= 0) pool_fd_ = got;
    pool_bytes_ = resp.pool_bytes();
    return s;
  }
  // StageWrite; with `commit` the daemon also commits the key (*committed: it did).
  absl::Status Stage(uint64_t reservation, const BlockKey& key, uint64_t page_offset,
                     uint64_t staging_offset, uint64_t length, bool commit = false,
                     bool* committed = nullptr) {
    pb::StageWriteRequest req;
    req.set_reservation_id(reservation);
    req.set_key(KeyBytes(key));
    req.set_page_offset(page_offset);
    req.set_staging_offset(staging_offset);
    req.set_length(length);
    req.set_commit(commit);
    pb::StageWriteResponse resp;
    absl::Status s = Call(local::Method::kStageWrite, req, &resp);
    if (committed != nullptr) *committed = s.ok() && resp.committed();
    return s;
  }
  absl::Status Call(local::Method m, const google::protobuf::MessageLite& req,
                    google::protobuf::MessageLite* resp, int send_fd = -1, int* recv_fd = nullptr) {
    local::RequestHeader h;
    h.method = static_cast<uint16_t>(m);
    h.id = next_id_++;
    std::string f(reinterpret_cast<const char*>(&h), sizeof(h));
    req.AppendToString(&f);
    iovec iov{f.data(), f.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (send_fd >= 0) {
      mh.msg_control = control;
      mh.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &send_fd, sizeof(int));
    }
    if (sendmsg(sock_, &mh, MSG_NOSIGNAL) != static_cast<ssize_t>(f.size())) {
      return absl::UnavailableError("send");
    }
    std::string in(local::kMaxFrameBytes, '\0');
    iovec riov{in.data(), in.size()};
    alignas(cmsghdr) char rcontrol[CMSG_SPACE(4 * sizeof(int))] = {};
    msghdr rm{};
    rm.msg_iov = &riov;
    rm.msg_iovlen = 1;
    rm.msg_control = rcontrol;
    rm.msg_controllen = sizeof(rcontrol);
    const ssize_t n = recvmsg(sock_, &rm, MSG_CMSG_CLOEXEC);
    if (n < static_cast<ssize_t>(sizeof(local::ResponseHeader))) {
      return absl::UnavailableError("recv");
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&rm); c != nullptr; c = CMSG_NXTHDR(&rm, c)) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
      if (recv_fd != nullptr && *recv_fd < 0) {
        *recv_fd = fd;
      } else {
        close(fd);
      }
    }
    local::ResponseHeader rh;
    std::memcpy(&rh, in.data(), sizeof(rh));
    if (rh.code != 0) {
      return absl::Status(static_cast<absl::StatusCode>(rh.code),
                          std::string(in.data() + sizeof(rh), rh.message_bytes));
    }
    const char* body = in.data() + sizeof(rh) + rh.message_bytes;
    resp->ParseFromArray(body, static_cast<int>(n - (body - in.data())));
    return absl::OkStatus();
  }
  uint8_t* staging() const { return staging_; }
  int pool_fd() const { return pool_fd_; }
  uint64_t pool_bytes() const { return pool_bytes_; }

 private:
  int sock_ = -1;
  uint64_t next_id_ = 1;
  uint8_t* staging_ = nullptr;
  uint64_t staging_bytes_ = 0;
  int pool_fd_ = -1;
  uint64_t pool_bytes_ = 0;
};

sigjmp_buf fault_jump;
void OnFault(int) { siglongjmp(fault_jump, 1); }

// Writes one byte at p; false when the write faulted (SIGSEGV / SIGBUS).
bool TryWrite(volatile uint8_t* p, uint8_t v) {
  if (sigsetjmp(fault_jump, 1) != 0) return false;
  *p = v;
  return true;
}

// In a forked child: every way a same-uid process may try to write the committed page at
// `offset` of the pool. Exits 0 when all of them failed, else 10 + the first that wrote.
// The attacker has the daemon's uid but no capabilities: when the test runs as root they are
// dropped first (root's CAP_SYS_PTRACE reaches into any process; nothing defends against that).
[[noreturn]] void AttackPool(const testing::LocalDaemon& d, uint64_t offset) {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct none[2] = {};
  if (syscall(SYS_capset, &hdr, none) != 0) _exit(2);
  signal(SIGSEGV, OnFault);
  signal(SIGBUS, OnFault);
  const uint64_t bytes = d.pool_bytes();
  // 1. The pool's file by its path, read-write (what clients did before isolation).
  if (int fd = open(d.shm_path().c_str(), O_RDWR); fd >= 0) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED && TryWrite(static_cast<uint8_t*>(p) + offset + 100, 0x5a)) _exit(11);
  }
  // 2. The descriptor the daemon hands out, every way round.
  RawSession s;
  if (!d.local_socket().empty() && s.Dial(d.local_socket()) && s.Attach(1 << 20).ok() &&
      s.pool_fd() >= 0) {
    if (mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.pool_fd(), 0) != MAP_FAILED) {
      _exit(12);
    }
    void* ro = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, s.pool_fd(), 0);
    if (ro == MAP_FAILED) _exit(13);  // a reader must be able to map it
    if (mprotect(ro, bytes, PROT_READ | PROT_WRITE) == 0) _exit(14);
    if (TryWrite(static_cast<uint8_t*>(ro) + offset + 100, 0x5a)) _exit(15);
    if (pwrite(s.pool_fd(), "Z", 1, static_cast<off_t>(offset + 100)) == 1) _exit(16);
    const std::string link = "/proc/self/fd/" + std::to_string(s.pool_fd());
    if (int rw = open(link.c_str(), O_RDWR); rw >= 0) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
      if (p != MAP_FAILED && TryWrite(static_cast<uint8_t*>(p) + offset + 100, 0x5a)) _exit(17);
      if (pwrite(rw, "Z", 1, static_cast<off_t>(offset + 100)) == 1) _exit(18);
      if (ftruncate(rw, 0) == 0) _exit(19);
      close(rw);
    }
  }
  // 3. The daemon's own memory and descriptors.
  const std::string proc = "/proc/" + std::to_string(d.pid());
  if (int fd = open((proc + "/mem").c_str(), O_RDWR); fd >= 0) _exit(20);
  for (int i = 3; i < 64; ++i) {
    const std::string link = proc + "/fd/" + std::to_string(i);
    if (int fd = open(link.c_str(), O_RDWR); fd >= 0) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED && TryWrite(static_cast<uint8_t*>(p) + offset + 100, 0x5a)) _exit(21);
      close(fd);
    }
  }
  _exit(0);
}

class ShmIsolationTest : public ::testing::TestWithParam<std::string> {};

// Isolated: every attempt fails and the page loads intact. Trusted (the control that shows the
// probe can fail): the attack writes the page, and the load catches it.
TEST_P(ShmIsolationTest, SameUidClientCannotWriteACommittedPage) {
  const bool isolated = GetParam() == "isolated";
  auto d = StartDaemon({"--shm-mode", GetParam()});
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address(), DataPath::kSharedMemory);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->server().shm_path.empty(), isolated);
  const client::Codec codec = RegisterRefmodel(*c);
  const auto keys = client::Client::BlockKeys(codec, Tokens(7, 2 * 64));
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (size_t i = 0; i < 2; ++i) pages.push_back(MakePage(codec.profile, PageKind::kInt2, 40 + i));
  for (size_t i = 0; i < 2; ++i) writes.push_back({keys[i], PageKind::kInt2, pages[i]});
  auto stored = c->Store(codec, writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->stored, 2u);
  auto pin = c->Lookup(codec, keys, {.pin = true});
  ASSERT_TRUE(pin.ok() && pin->matched == 2);
  const uint64_t offset = pin->pages[0].offset;
  ASSERT_TRUE(c->Release(*pin).ok());

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) AttackPool(*d, offset);
  int st = 0;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st)) << "the attacking child died of signal " << WTERMSIG(st);
  auto loaded = c->Load(codec, keys);
  if (isolated) {
    EXPECT_EQ(WEXITSTATUS(st), 0) << "attempt " << WEXITSTATUS(st) - 10 << " wrote the pool";
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_EQ(loaded->matched, 2u);
    EXPECT_TRUE(loaded->pages[0] == pages[0]);
  } else {
    EXPECT_EQ(WEXITSTATUS(st), 11) << "the trusted pool file should be writable";
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ShmIsolationTest, ::testing::Values("isolated", "trusted"));

struct Reserved {
  uint64_t reservation = 0;
  std::vector<BlockKey> keys;
};

Reserved Reserve(pb::KvCache::Stub& stub, const client::Codec& codec,
                 const std::vector<BlockKey>& keys) {
  grpc::ClientContext ctx;
  pb::ReserveRequest req;
  req.set_codec_id(std::string(reinterpret_cast<const char*>(codec.id.bytes.data()), 16));
  for (const BlockKey& k : keys) {
    auto* it = req.add_items();
    it->set_key(KeyBytes(k));
    it->set_kind(pb::PAGE_KIND_INT2);
  }
  pb::ReserveResponse resp;
  EXPECT_TRUE(stub.Reserve(&ctx, req, &resp).ok());
  for (const auto& r : resp.results()) EXPECT_EQ(r.status().code(), 0) << r.status().message();
  return {resp.reservation_id(), keys};
}

absl::Status Commit(pb::KvCache::Stub& stub, uint64_t reservation, const BlockKey& key,
                    bool client_says_verified = false) {
  grpc::ClientContext ctx;
  pb::CommitRequest req;
  req.set_reservation_id(reservation);
  req.add_keys(KeyBytes(key));
  req.set_checksums_verified(client_says_verified);
  pb::CommitResponse resp;
  grpc::Status s = stub.Commit(&ctx, req, &resp);
  if (!s.ok()) return absl::InternalError(s.error_message());
  return absl::Status(static_cast<absl::StatusCode>(resp.results(0).code()),
                      resp.results(0).message());
}

// A page changed in staging: before the daemon's copy (the header's checksum no longer matches:
// DATA_LOSS at Commit, whatever the client claims), after it (the committed page is what the
// daemon copied), and while it copies (either DATA_LOSS or exactly the original page -- never
// anything else).
TEST(ShmStagingTest, PageChangedInStagingIsRefusedOrStoredAsTheDaemonCopiedIt) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address(), DataPath::kSharedMemory);
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const std::vector<uint8_t> page = MakePage(codec.profile, PageKind::kInt2, 77);
  ASSERT_LT(page.size(), size_t{1} << 20);
  auto channel = grpc::CreateChannel(d->address(), grpc::InsecureChannelCredentials());
  auto stub = pb::KvCache::NewStub(channel);
  RawSession s;
  ASSERT_TRUE(s.Dial(d->local_socket()));
  ASSERT_TRUE(s.Attach(2 << 20).ok());
  const size_t flip = page.size() / 2;

  const auto keys = client::Client::BlockKeys(codec, Tokens(9, 2 * 64));
  Reserved r = Reserve(*stub, codec, keys);
  // Before: the staged bytes differ from what the header vouches for -- and the client claims
  // it verified them.
  std::memcpy(s.staging(), page.data(), page.size());
  s.staging()[flip] ^= 0x10;
  ASSERT_TRUE(s.Stage(r.reservation, keys[0], 0, 0, page.size()).ok());
  EXPECT_EQ(Commit(*stub, r.reservation, keys[0], true).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(c->Lookup(codec, std::span(keys).subspan(0, 1))->matched, 0u);
  // After: changing staging once the daemon answered changes nothing.
  std::memcpy(s.staging(), page.data(), page.size());
  ASSERT_TRUE(s.Stage(r.reservation, keys[1], 0, 0, page.size()).ok());
  s.staging()[flip] ^= 0x10;
  ASSERT_TRUE(Commit(*stub, r.reservation, keys[1]).ok());
  auto got = c->Load(codec, std::span(keys).subspan(1, 1));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->matched, 1u);
  EXPECT_TRUE(got->pages[0] == page);

  // During: a thread keeps flipping a byte while the daemon copies (bounded rounds).
  const auto race_keys = client::Client::BlockKeys(codec, Tokens(10, 16 * 64));
  Reserved rr = Reserve(*stub, codec, race_keys);
  int refused = 0, stored = 0;
  for (size_t i = 0; i < race_keys.size(); ++i) {
    std::memcpy(s.staging(), page.data(), page.size());
    std::atomic<bool> stop{false};
    std::thread flipper([&] {
      volatile uint8_t* b = s.staging() + flip;
      for (int n = 0; n < 2000000 && !stop.load(std::memory_order_relaxed); ++n) *b = *b ^ 0x01;
    });
    ASSERT_TRUE(s.Stage(rr.reservation, race_keys[i], 0, 0, page.size()).ok());
    stop = true;
    flipper.join();
    absl::Status st = Commit(*stub, rr.reservation, race_keys[i], true);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
      ++refused;
      continue;
    }
    auto l = c->Load(codec, std::span(race_keys).subspan(i, 1));
    ASSERT_TRUE(l.ok()) << l.status();
    ASSERT_EQ(l->matched, 1u);
    EXPECT_TRUE(l->pages[0] == page) << "round " << i << ": served bytes the daemon did not hash";
    ++stored;
  }
  EXPECT_EQ(refused + stored, static_cast<int>(race_keys.size()));
}

// A page staged in several chunks (odd sizes, so XXH3 stripes straddle them) and committed by
// its last StageWrite (`commit`, no Commit RPC): changed in staging before a chunk's copy ->
// DATA_LOSS from that StageWrite, the slot and key released (the key can be reserved again at
// once, never "in progress" or "already stored"); changed after each chunk's answer -> stored
// exactly as the daemon copied it; changed while the daemon copies -> DATA_LOSS or exactly the
// original page, never a mismatch served.
TEST(ShmStagingTest, PageCommittedWithItsLastChunkIsWhatTheDaemonHashed) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address(), DataPath::kSharedMemory);
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const std::vector<uint8_t> page = MakePage(codec.profile, PageKind::kInt2, 78);
  ASSERT_GT(page.size(), 4000u);
  auto channel = grpc::CreateChannel(d->address(), grpc::InsecureChannelCredentials());
  auto stub = pb::KvCache::NewStub(channel);
  RawSession s;
  ASSERT_TRUE(s.Dial(d->local_socket()));
  ASSERT_TRUE(s.Attach(2 << 20).ok());
  // Chunk boundaries: inside the header's first stripe, inside a later stripe, then the rest.
  const std::vector<uint64_t> cuts = {0, 61, 1000 + 29, page.size()};
  // Stages the page chunk by chunk (staging offset = page offset), `between(k)` running after
  // chunk k's answer; the last chunk commits. The last chunk's status, *committed as answered.
  auto stage = [&](uint64_t reservation, const BlockKey& key, auto&& between, bool* committed) {
    absl::Status last;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const bool final_chunk = k + 2 == cuts.size();
      std::memcpy(s.staging() + cuts[k], page.data() + cuts[k], cuts[k + 1] - cuts[k]);
      between(k, /*before_copy=*/true);
      last = s.Stage(reservation, key, cuts[k], cuts[k], cuts[k + 1] - cuts[k], final_chunk,
                     committed);
      if (!last.ok()) return last;
      between(k, /*before_copy=*/false);
    }
    return last;
  };
  const size_t flip = cuts[2] + 100;  // in the last chunk
  const auto keys = client::Client::BlockKeys(codec, Tokens(12, 2 * 64));

  // Before: the last chunk's staged bytes no longer match the header's checksum.
  Reserved r = Reserve(*stub, codec, keys);
  bool committed = true;
  absl::Status st = stage(r.reservation, keys[0], [&](size_t k, bool before) {
    if (k == 2 && before) s.staging()[flip] ^= 0x10;
  }, &committed);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_FALSE(committed);
  EXPECT_EQ(c->Lookup(codec, std::span(keys).subspan(0, 1))->matched, 0u);
  Reserved again = Reserve(*stub, codec, {keys[0]});  // expects OK: nothing left reserved
  EXPECT_NE(again.reservation, 0u);

  // After: every chunk's staging bytes changed once its answer came; the page is what the
  // daemon copied, and a Commit RPC after the fact changes nothing.
  st = stage(r.reservation, keys[1], [&](size_t k, bool before) {
    if (!before) s.staging()[cuts[k]] ^= 0x44;
  }, &committed);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(committed);
  EXPECT_TRUE(Commit(*stub, r.reservation, keys[1]).ok());  // already committed: OK
  auto got = c->Load(codec, std::span(keys).subspan(1, 1));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->matched, 1u);
  EXPECT_TRUE(got->pages[0] == page);

  // During: a thread flips a byte of the last chunk while the daemon copies it (bounded).
  const auto race_keys = client::Client::BlockKeys(codec, Tokens(13, 16 * 64));
  Reserved rr = Reserve(*stub, codec, race_keys);
  int refused = 0, stored = 0;
  for (size_t i = 0; i < race_keys.size(); ++i) {
    std::atomic<bool> stop{false};
    std::thread flipper;
    st = stage(rr.reservation, race_keys[i], [&](size_t k, bool before) {
      if (k != 2 || !before) return;
      flipper = std::thread([&] {
        volatile uint8_t* b = s.staging() + flip;
        for (int n = 0; n < 2000000 && !stop.load(std::memory_order_relaxed); ++n) *b = *b ^ 0x01;
      });
    }, &committed);
    stop = true;
    if (flipper.joinable()) flipper.join();
    if (!st.ok()) {
      EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
      EXPECT_FALSE(committed);
      ++refused;
      continue;
    }
    EXPECT_TRUE(committed);
    auto l = c->Load(codec, std::span(race_keys).subspan(i, 1));
    ASSERT_TRUE(l.ok()) << l.status();
    ASSERT_EQ(l->matched, 1u);
    EXPECT_TRUE(l->pages[0] == page) << "round " << i << ": served bytes the daemon did not hash";
    ++stored;
  }
  EXPECT_EQ(refused + stored, static_cast<int>(race_keys.size()));
}

// In isolated mode the daemon hashes every page itself: a Commit that claims the client
// verified a slot it never wrote publishes nothing unverified.
TEST(ShmStagingTest, IsolatedDaemonIgnoresClientVerifiedClaims) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address(), DataPath::kSharedMemory);
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  auto channel = grpc::CreateChannel(d->address(), grpc::InsecureChannelCredentials());
  auto stub = pb::KvCache::NewStub(channel);
  const auto keys = client::Client::BlockKeys(codec, Tokens(11, 64));
  Reserved r = Reserve(*stub, codec, keys);
  EXPECT_FALSE(Commit(*stub, r.reservation, keys[0], /*client_says_verified=*/true).ok());
  EXPECT_EQ(c->Lookup(codec, keys)->matched, 0u);
}

// AttachStaging refuses what the daemon could not safely map: no descriptor, a memfd that may
// shrink under the daemon's copy (SIGBUS), the pool itself, and more than the limit.
TEST(ShmStagingTest, AttachStagingRefusesUnsafeDescriptors) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  {
    RawSession s;
    ASSERT_TRUE(s.Dial(d->local_socket()));
    EXPECT_EQ(s.Attach(1 << 20, -1).code(), absl::StatusCode::kInvalidArgument);
  }
  {
    RawSession s;
    ASSERT_TRUE(s.Dial(d->local_socket()));
    const int fd = memfd_create("unsealed", MFD_CLOEXEC);
    ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
    EXPECT_EQ(s.Attach(1 << 20, fd).code(), absl::StatusCode::kInvalidArgument);
    close(fd);
  }
  RawSession good;
  ASSERT_TRUE(good.Dial(d->local_socket()));
  ASSERT_TRUE(good.Attach(1 << 20).ok());
  ASSERT_GE(good.pool_fd(), 0);
  {
    RawSession s;
    ASSERT_TRUE(s.Dial(d->local_socket()));
    EXPECT_EQ(s.Attach(good.pool_bytes(), good.pool_fd()).code(),
              absl::StatusCode::kInvalidArgument);
  }
  {
    RawSession s;
    ASSERT_TRUE(s.Dial(d->local_socket()));
    EXPECT_EQ(s.Attach(uint64_t{65} << 20).code(), absl::StatusCode::kResourceExhausted);
  }
  // Staging a chunk outside the region, or without one.
  RawSession none;
  ASSERT_TRUE(none.Dial(d->local_socket()));
  EXPECT_EQ(none.Stage(1, BlockKey{}, 0, 0, 10).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(good.Stage(1, BlockKey{}, 0, (1 << 20) - 5, 10).code(),
            absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace oscarkv
