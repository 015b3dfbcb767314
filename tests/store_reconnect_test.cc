// A Client outlives a restart of its daemon: with the default isolated pool, the staging
// connection (stores), the pool mapping (loads) and the local control channel (lookups) all
// belong to the instance that is gone. Against real oscarkvd processes restarted on the same
// address and pool name: the first store, and the first load, after a restart succeed on the
// new instance (the Client opens a new session on that call), byte-exact.
#include <chrono>
#include <string>
#include <thread>

#include "test_util.h"

namespace oscarkv::testing {
namespace {

using client::PageWrite;

class Restartable {
 public:
  // A daemon on a pool name of its own and (after the first start) a fixed gRPC address.
  bool Start() {
    LocalDaemonOptions o;
    o.binary = OSCARKVD_PATH;
    o.flags = {"--metrics-listen", "off", "--pool-mb", "64", "--shm-name", name_};
    if (!address_.empty()) o.flags.insert(o.flags.end(), {"--listen", address_});
    auto d = LocalDaemon::Start(o);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return false;
    daemon_ = *std::move(d);
    address_ = daemon_->address();
    return true;
  }
  bool Restart() {
    auto code = daemon_->Stop();
    EXPECT_TRUE(code.ok()) << code.status();
    daemon_.reset();
    return Start();
  }
  const std::string& address() const { return address_; }

 private:
  const std::string name_ = UniqueShmName("oscarkv-reconnect", 0);
  std::string address_;
  std::unique_ptr<LocalDaemon> daemon_;
};

// The restarted daemon keeps nothing (no tier): the codec is registered again, over gRPC, which
// reconnects by itself (retried while its channel backs off).
client::Codec RegisterAgain(client::Client& c) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  absl::StatusOr<client::Codec> codec = absl::UnavailableError("not tried");
  while (std::chrono::steady_clock::now() < until) {
    codec = c.RegisterCodec(*BuiltinProfile("refmodel"));
    if (codec.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(codec.ok()) << codec.status();
  return codec.ok() ? *codec : client::Codec{};
}

void ExpectLoads(client::Client& c, const client::Codec& codec, const PageBatch& b) {
  auto loaded = c.Load(codec, b.keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->matched, b.keys.size());
  for (size_t i = 0; i < b.keys.size(); ++i) EXPECT_TRUE(loaded->pages[i] == b.pages[i]) << i;
}

TEST(StoreReconnectTest, StoreAndLoadAfterADaemonRestartReconnect) {
  Restartable d;
  ASSERT_TRUE(d.Start());
  auto c = Connect(d.address());
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->server().data_path, client::DataPath::kSharedMemory);
  client::Codec codec = RegisterRefmodel(*c);
  const PageBatch a = MakeBatch(codec, 41, 6, 400);
  auto stored = c->Store(codec, a.writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->stored, a.keys.size());
  ExpectLoads(*c, codec, a);

  // Between two stores: the first store on the new instance stores every page.
  ASSERT_TRUE(d.Restart());
  codec = RegisterAgain(*c);
  const PageBatch b = MakeBatch(codec, 42, 6, 500);
  stored = c->Store(codec, b.writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, b.keys.size()) << stored->ToStatus();
  ExpectLoads(*c, codec, b);
  EXPECT_EQ(c->server().data_path, client::DataPath::kSharedMemory);

  // Between two loads: another client stores into the restarted daemon; this client's first
  // call after the restart is a load, which finds and reads those pages byte-exact (the new
  // pool, not the old mapping).
  ASSERT_TRUE(d.Restart());
  codec = RegisterAgain(*c);
  auto other = Connect(d.address());
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->RegisterCodec(*BuiltinProfile("refmodel")).ok());
  stored = other->Store(codec, a.writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->stored, a.keys.size());
  ExpectLoads(*c, codec, a);
  // Lookups go on over the new instance's local socket, and stores too.
  auto hit = c->Lookup(codec, a.keys, {});
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->matched, a.keys.size());
  stored = c->Store(codec, b.writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, b.keys.size()) << stored->ToStatus();
}

// A restart between two lookups: the first lookup after it is served by the new instance
// (never answered for the old one), over the new instance's local socket.
TEST(StoreReconnectTest, LookupAfterADaemonRestartReconnects) {
  Restartable d;
  ASSERT_TRUE(d.Start());
  auto c = Connect(d.address());
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->server().lookup_path, client::LookupPath::kLocal);
  client::Codec codec = RegisterRefmodel(*c);
  const PageBatch a = MakeBatch(codec, 43, 3, 600);
  ASSERT_TRUE(c->Store(codec, a.writes).ok());
  ASSERT_EQ(c->Lookup(codec, a.keys, {})->matched, a.keys.size());
  ASSERT_TRUE(d.Restart());
  codec = RegisterAgain(*c);
  auto first = c->Lookup(codec, a.keys, {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->matched, 0u) << "the restarted daemon holds nothing";
  ASSERT_TRUE(c->Store(codec, a.writes).ok());
  auto hit = c->Lookup(codec, a.keys, {});
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->matched, a.keys.size());
  EXPECT_EQ(c->server().lookup_path, client::LookupPath::kLocal);
}

// LookupAsync (pipelined on the local channel's async connection) across a restart: the first
// one after it may fail (UNAVAILABLE: its connection met another instance); from the next one
// on, the new instance answers.
TEST(StoreReconnectTest, AsyncLookupAfterADaemonRestartReconnects) {
  Restartable d;
  ASSERT_TRUE(d.Start());
  auto c = Connect(d.address());
  ASSERT_NE(c, nullptr);
  client::Codec codec = RegisterRefmodel(*c);
  const PageBatch a = MakeBatch(codec, 44, 3, 700);
  ASSERT_TRUE(c->Store(codec, a.writes).ok());
  auto before = c->LookupAsync(codec, a.keys, {}).get();
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->matched, a.keys.size());
  ASSERT_TRUE(d.Restart());
  codec = RegisterAgain(*c);
  auto first = c->LookupAsync(codec, a.keys, {}).get();
  if (!first.ok()) {
    EXPECT_TRUE(absl::IsUnavailable(first.status())) << first.status();
  } else {
    EXPECT_EQ(first->matched, 0u) << "the restarted daemon holds nothing";
  }
  auto second = c->LookupAsync(codec, a.keys, {}).get();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->matched, 0u);
  ASSERT_TRUE(c->Store(codec, a.writes).ok());
  auto next = c->LookupAsync(codec, a.keys, {}).get();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->matched, a.keys.size());
}

}  // namespace
}  // namespace oscarkv::testing
