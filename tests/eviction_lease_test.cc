// Pool pressure and leases against a real oscarkvd: eviction keeps the newest pages and never
// touches pinned ones; a client killed with SIGKILL loses its lease (it expires), not the cache.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "test_util.h"

namespace oscarkv::testing {
namespace {

using client::PageWrite;
using Clock = std::chrono::steady_clock;

struct Batch {
  std::vector<BlockKey> keys;
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes() const {
    std::vector<PageWrite> w;
    for (size_t i = 0; i < keys.size(); ++i) w.push_back({keys[i], PageKind::kInt2, pages[i]});
    return w;
  }
};

Batch MakeBatch(const client::Codec& codec, uint64_t seed, size_t n) {
  Batch b;
  b.keys = client::Client::BlockKeys(codec, Tokens(seed, n * codec.profile.page_tokens));
  for (size_t i = 0; i < n; ++i) b.pages.push_back(MakePage(codec.profile, PageKind::kInt2, seed * 131 + i));
  return b;
}

TEST(EvictionTest, SmallPoolEvictsOldPagesKeepsNewAndPinned) {
  auto daemon = StartDaemon({"--pool-mb", "8"});
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const uint64_t capacity_pages = daemon->pool_bytes() / codec.int2_page_bytes;
  ASSERT_GT(capacity_pages, 32u);
  ASSERT_LT(capacity_pages, 200u);

  Batch pinned = MakeBatch(codec, 1000, 4);
  ASSERT_EQ(c->Store(codec, pinned.writes())->stored, 4u);
  auto lease = c->Lookup(codec, pinned.keys, {.pin = true, .lease_ms = 60000});
  ASSERT_TRUE(lease.ok() && lease->matched == 4) << lease.status();

  const int batches = static_cast<int>(3 * capacity_pages / 16);  // 3x the pool
  Batch last, first;
  for (int b = 0; b < batches; ++b) {
    Batch batch = MakeBatch(codec, b, 16);
    auto r = c->Store(codec, batch.writes());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->stored, 16u) << "batch " << b << ": " << r->item_status[0];
    if (b == 0) first = batch;
    last = std::move(batch);
  }
  auto stats = c->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->evictions, 0u);
  EXPECT_LE(stats->pool_used_bytes, stats->pool_bytes);
  EXPECT_LE(stats->pages, capacity_pages);

  auto newest = c->Load(codec, last.keys);
  ASSERT_TRUE(newest.ok()) << newest.status();
  ASSERT_EQ(newest->matched, 16u);
  for (size_t i = 0; i < 16; ++i) EXPECT_TRUE(newest->pages[i] == last.pages[i]) << i;
  auto oldest = c->Lookup(codec, first.keys);
  ASSERT_TRUE(oldest.ok());
  EXPECT_LT(oldest->matched, 16u) << "the first batch should have been evicted";

  auto kept = c->Load(codec, pinned.keys);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->matched, 4u) << "pinned pages were evicted";
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(kept->pages[i] == pinned.pages[i]) << i;
  EXPECT_TRUE(c->Release(*lease).ok());
}

// A daemon without tenants: leases were unbounded (each one daemon heap, held up to
// leases.max_ms). Its one tenant may now hold 2^20 pins (kSingleTenantPinnedPages), which bounds
// its leases too: 256 leases pinning one page 4,096 times each fill it, the next pinning lookup is
// RESOURCE_EXHAUSTED naming the quota, a probe still works, and a released lease makes room.
TEST(LeaseTest, PinsOfADaemonWithoutTenantsAreBounded) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  Batch batch = MakeBatch(codec, 12, 1);
  ASSERT_EQ(c->Store(codec, batch.writes())->stored, 1u);
  const std::vector<BlockKey> same(4096, batch.keys[0]);  // a page pinned n times counts n
  std::vector<client::LookupResult> held;
  for (int i = 0; i < 256; ++i) {
    auto l = c->Lookup(codec, same, {.pin = true, .lease_ms = 60000});
    ASSERT_TRUE(l.ok()) << i << ": " << l.status();
    ASSERT_EQ(l->matched, 4096u);
    held.push_back(*std::move(l));
  }
  auto over = c->Lookup(codec, std::span<const BlockKey>(same.data(), 1), {.pin = true});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("pinned_pages quota (1048576"), absl::string_view::npos)
      << over.status();
  auto probe = c->Lookup(codec, batch.keys);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->matched, 1u);
  ASSERT_TRUE(c->Release(held.back()).ok());
  held.pop_back();
  auto again = c->Lookup(codec, batch.keys, {.pin = true});
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(c->Release(*again).ok());
  for (auto& l : held) ASSERT_TRUE(c->Release(l).ok());
  auto stats = c->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->leases, 0u);
}

// A renewed lease outlives its first deadline; an unknown lease cannot be renewed.
TEST(LeaseTest, RenewExtendsALease) {
  auto daemon = StartDaemon({"--reaper-interval-ms", "50"});
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  Batch batch = MakeBatch(codec, 8, 2);
  ASSERT_EQ(c->Store(codec, batch.writes())->stored, 2u);
  auto lease = c->Lookup(codec, batch.keys, {.pin = true, .lease_ms = 300});
  ASSERT_TRUE(lease.ok() && lease->lease_ids.size() == 1) << lease.status();
  auto deadline = c->RenewLease(lease->lease_ids[0], 5000);
  ASSERT_TRUE(deadline.ok()) << deadline.status();
  EXPECT_GE(*deadline, lease->lease_deadline_unix_ms + 4000);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past the first deadline
  auto stats = c->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->leases, 1u);
  EXPECT_EQ(stats->pinned_pages, 2u);
  EXPECT_TRUE(c->Release(*lease).ok());
  EXPECT_EQ(c->RenewLease(lease->lease_ids[0], 1000).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->GetStats()->leases, 0u);
}

// Spawns tests/lease_holder, returns its pid and the line it printed.
pid_t SpawnLeaseHolder(const std::string& addr, const std::vector<BlockKey>& keys,
                       std::string* line, client::LookupPath path) {
  std::vector<std::string> args = {OSCARKV_LEASE_HOLDER_PATH,
                                   std::string("--lookup-path=") + client::LookupPathName(path),
                                   addr};
  for (const auto& k : keys) args.push_back(k.Hex());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline && line->find('\n') == std::string::npos) {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    line->append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  return pid;
}

// The holder pins over the local socket or over gRPC: a lease is a lease either way.
class KilledHolderTest : public ::testing::TestWithParam<client::LookupPath> {};

TEST_P(KilledHolderTest, LeaseOfKilledClientExpiresAndPagesBecomeRemovable) {
  auto daemon = StartDaemon({"--default-lease-ms", "1000", "--reaper-interval-ms", "100"});
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  Batch batch = MakeBatch(codec, 7, 4);
  ASSERT_EQ(c->Store(codec, batch.writes())->stored, 4u);

  std::string line;
  const pid_t holder = SpawnLeaseHolder(daemon->address(), batch.keys, &line, GetParam());
  ASSERT_GT(holder, 0);
  ASSERT_EQ(line.rfind("pinned 4 lease=", 0), 0u) << "lease_holder said: '" << line << "'";
  EXPECT_NE(line.find(std::string(" path=") + client::LookupPathName(GetParam())),
            std::string::npos)
      << line;
  const auto pinned_at = Clock::now();

  auto stats = c->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->leases, 1u);
  EXPECT_EQ(stats->pinned_pages, 4u);
  auto cleared = c->Clear(&codec.id, /*include_pinned=*/false);
  ASSERT_TRUE(cleared.ok()) << cleared.status();
  EXPECT_EQ(*cleared, 0u) << "pinned pages must survive a clear without include_pinned";
  auto del = c->Delete(codec, std::span(batch.keys).first(1));
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ((*del)[0].code(), absl::StatusCode::kFailedPrecondition) << (*del)[0];

  ASSERT_EQ(::kill(holder, SIGKILL), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(holder, &st, 0), holder);
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);

  // The lease (1 s default) must expire; poll for at most 10 s.
  bool expired = false;
  while (Clock::now() - pinned_at < std::chrono::seconds(10)) {
    stats = c->GetStats();
    ASSERT_TRUE(stats.ok());
    if (stats->leases == 0 && stats->pinned_pages == 0) {
      expired = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(expired) << "lease of the killed client never expired";
  // Not at once: the 1 s lease runs out (slack for a slow read of the holder's line).
  EXPECT_GE(Clock::now() - pinned_at, std::chrono::milliseconds(500)) << "expired too early";

  // keys[0] was deleted when its pin went away; the rest are now ordinary, removable pages.
  cleared = c->Clear(&codec.id, false);
  ASSERT_TRUE(cleared.ok());
  auto after = c->GetStats();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->pages, 0u);
  EXPECT_EQ(after->pool_used_bytes, 0u);
  auto look = c->Lookup(codec, batch.keys);
  ASSERT_TRUE(look.ok());
  EXPECT_EQ(look->matched, 0u);
}

INSTANTIATE_TEST_SUITE_P(Paths, KilledHolderTest,
                         ::testing::Values(client::LookupPath::kLocal, client::LookupPath::kGrpc),
                         [](const auto& info) { return client::LookupPathName(info.param); });

}  // namespace
}  // namespace oscarkv::testing
