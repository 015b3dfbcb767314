// Store / lookup / load round trips against a real oscarkvd, over both data paths; dedup;
// checksum verification on load; async variants; the C ABI against a daemon.
#include <fcntl.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "gmock/gmock.h"
#include "oscarkv/kernels/page_set.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

using client::DataPath;
using client::PageWrite;

class RoundTripTest : public ::testing::TestWithParam<DataPath> {};

// A whole sequence's pages (sink BF16, history INT2, tail BF16) stored under keys from its token
// ids, then looked up and loaded back byte for byte; a second request sharing only a prefix
// hits exactly that prefix.
TEST_P(RoundTripTest, SequenceStoreLookupLoadIsByteIdentical) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address(), GetParam());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->server().data_path,
            GetParam() == DataPath::kGrpc ? DataPath::kGrpc : DataPath::kSharedMemory);
  const client::Codec codec = RegisterRefmodel(*c);
  const CodecProfile& p = codec.profile;

  const uint32_t n_tokens = 1024;
  const auto tokens = Tokens(1, n_tokens);
  std::vector<float> kv(size_t{p.num_layers} * 2 * n_tokens * p.num_kv_heads * p.head_dim);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = float(SplitMix(i) % 2001) / 500.0f - 2.0f;
  const auto rot = RotationSet::Hadamard(p.num_layers, p.num_kv_heads, p.head_dim);
  auto seq = BuildSequencePages(p, rot, {kv.data(), p.num_layers, p.num_kv_heads, p.head_dim,
                                         n_tokens});
  ASSERT_TRUE(seq.ok()) << seq.status();
  const auto keys = client::Client::BlockKeys(codec, tokens);
  ASSERT_EQ(keys.size(), seq->pages.size());  // 1024 tokens: 16 full pages, one key each
  std::vector<PageWrite> writes;
  int int2 = 0, bf16 = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    writes.push_back({keys[i], seq->plan[i].kind, seq->pages[i]});
    (seq->plan[i].kind == PageKind::kInt2 ? int2 : bf16)++;
  }
  ASSERT_GT(int2, 0);
  ASSERT_GT(bf16, 0);

  auto stored = c->Store(codec, writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  for (const auto& s : stored->item_status) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(stored->stored, keys.size());

  auto hit = c->Lookup(codec, keys);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->matched, keys.size());
  EXPECT_TRUE(hit->lease_ids.empty());  // a probe pins nothing

  auto loaded = c->Load(codec, keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->matched, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(loaded->kinds[i], seq->plan[i].kind) << i;
    EXPECT_TRUE(loaded->pages[i] == seq->pages[i]) << "page " << i << " differs";
    EXPECT_TRUE(DecodePage(p, loaded->pages[i]).ok());
  }

  // Request 2: the same first 700 tokens (10 full blocks + 60 tokens), then different ones.
  auto tokens2 = tokens;
  for (size_t i = 700; i < tokens2.size(); ++i) tokens2[i] ^= 0x5555;
  const auto keys2 = client::Client::BlockKeys(codec, tokens2);
  auto hit2 = c->Lookup(codec, keys2, {.pin = true});
  ASSERT_TRUE(hit2.ok()) << hit2.status();
  EXPECT_EQ(hit2->matched, 10u);
  ASSERT_EQ(hit2->pages.size(), 10u);
  EXPECT_EQ(hit2->lease_ids.size(), 1u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(hit2->pages[i].key, keys[i]);
    EXPECT_EQ(hit2->pages[i].bytes, seq->pages[i].size());
  }
  EXPECT_TRUE(c->Release(*hit2).ok());

  // A different tenant salt shares nothing.
  auto other = c->Lookup(codec, client::Client::BlockKeys(codec, tokens, "tenant-b"));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->matched, 0u);

  auto stats = c->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pages, keys.size());
  EXPECT_EQ(stats->leases, 0u);
  EXPECT_GE(stats->hits, 2 * keys.size() + 10);
}

// Storing the same pages twice (and from a second client) keeps one copy.
TEST_P(RoundTripTest, DuplicateStoresAreDeduplicated) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto a = Connect(daemon->address(), GetParam());
  auto b = Connect(daemon->address(), GetParam());
  ASSERT_TRUE(a && b);
  const client::Codec codec = RegisterRefmodel(*a);
  ASSERT_TRUE(b->RegisterCodec(codec.profile).ok());
  const auto keys = client::Client::BlockKeys(codec, Tokens(2, 8 * 64));
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (size_t i = 0; i < keys.size(); ++i) pages.push_back(MakePage(codec.profile, PageKind::kInt2, i));
  for (size_t i = 0; i < keys.size(); ++i) writes.push_back({keys[i], PageKind::kInt2, pages[i]});

  auto first = a->Store(codec, writes);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->stored, 8u);
  auto again = a->Store(codec, writes);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stored, 0u);
  EXPECT_EQ(again->deduplicated, 8u);
  auto from_b = b->Store(codec, writes);
  ASSERT_TRUE(from_b.ok()) << from_b.status();
  EXPECT_EQ(from_b->deduplicated, 8u);
  auto stats = a->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pages, 8u);
  EXPECT_GE(stats->pool_used_bytes, 8 * codec.int2_page_bytes);
  EXPECT_LT(stats->pool_used_bytes, 16 * codec.int2_page_bytes);  // one copy, not three

  // Two clients racing to store the same new keys: exactly one copy of each.
  const auto keys2 = client::Client::BlockKeys(codec, Tokens(3, 8 * 64));
  std::vector<PageWrite> writes2;
  for (size_t i = 0; i < keys2.size(); ++i) writes2.push_back({keys2[i], PageKind::kInt2, pages[i]});
  auto fa = a->StoreAsync(codec, writes2);
  auto fb = b->StoreAsync(codec, writes2);
  auto ra = fa.get(), rb = fb.get();
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->stored + rb->stored, 8u);
  EXPECT_EQ(ra->failed + rb->failed, 0u);
  stats = a->GetStats();
  EXPECT_EQ(stats->pages, 16u);
}

INSTANTIATE_TEST_SUITE_P(Paths, RoundTripTest,
                         ::testing::Values(DataPath::kSharedMemory, DataPath::kGrpc),
                         [](const auto& info) { return client::DataPathName(info.param); });

// A page corrupted inside the pool after commit is caught by the load-side checksum; with
// verification off the (corrupt) bytes come through, which is what the switch means.
TEST(LoadVerificationTest, CorruptedPoolPageIsDataLossOnLoad) {
  // Trusted mode: the pool file can be written (an isolated pool cannot: shm_isolation_test).
  auto daemon = StartDaemon({"--shm-mode", "trusted"});
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address(), DataPath::kSharedMemory);
  auto unchecked = Connect(daemon->address(), DataPath::kGrpc, /*verify=*/false);
  ASSERT_TRUE(c && unchecked);
  const client::Codec codec = RegisterRefmodel(*c);
  const auto keys = client::Client::BlockKeys(codec, Tokens(4, 3 * 64));
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (size_t i = 0; i < 3; ++i) pages.push_back(MakePage(codec.profile, PageKind::kInt2, 10 + i));
  for (size_t i = 0; i < 3; ++i) writes.push_back({keys[i], PageKind::kInt2, pages[i]});
  ASSERT_TRUE(c->Store(codec, writes).ok());

  auto lease = c->Lookup(codec, keys, {.pin = true});
  ASSERT_TRUE(lease.ok() && lease->matched == 3);
  const uint64_t off = lease->pages[1].offset;
  ASSERT_TRUE(c->Release(*lease).ok());
  const int fd = ::open(daemon->shm_path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << daemon->shm_path();
  uint8_t byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(off + 5000)), 1);
  byte ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(off + 5000)), 1);
  ::close(fd);

  auto raw = unchecked->Load(codec, keys);
  ASSERT_TRUE(raw.ok()) << raw.status();
  ASSERT_EQ(raw->matched, 3u);
  EXPECT_TRUE(raw->pages[0] == pages[0]);
  EXPECT_FALSE(raw->pages[1] == pages[1]);
  auto bad = c->Load(codec, keys);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr(keys[1].Hex()));

  // The unreadable copy was dropped: the cache no longer claims the key, a store of the good
  // page stores it (not "deduplicated" against the corrupt one), and the load is whole again.
  EXPECT_EQ(c->Lookup(codec, keys)->matched, 1u);
  auto again = c->Store(codec, writes);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stored, 1u);
  EXPECT_EQ(again->deduplicated, 2u);
  auto good = c->Load(codec, keys);
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_EQ(good->matched, 3u);
  EXPECT_TRUE(good->pages[1] == pages[1]);
}

// Client-side checks: a page of the wrong size or of another codec never reaches the pool.
TEST(StoreValidationTest, WrongSizeAndForeignPagesAreRejectedPerItem) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const auto keys = client::Client::BlockKeys(codec, Tokens(5, 3 * 64));
  auto good = MakePage(codec.profile, PageKind::kInt2, 1);
  std::vector<uint8_t> short_page(good.begin(), good.end() - 64);
  CodecProfile other = codec.profile;
  other.model_revision = "v2";
  auto foreign = MakePage(other, PageKind::kInt2, 1);
  std::vector<PageWrite> writes = {{keys[0], PageKind::kInt2, good},
                                   {keys[1], PageKind::kInt2, short_page},
                                   {keys[2], PageKind::kInt2, foreign}};
  auto r = c->Store(codec, writes);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stored, 1u);
  EXPECT_EQ(r->failed, 2u);
  EXPECT_EQ(r->item_status[1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r->item_status[2].code(), absl::StatusCode::kInvalidArgument);
  auto stats = c->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pages, 1u);
  EXPECT_EQ(stats->reservations, 0u);
}

// Async variants: futures and callbacks deliver the same results as the blocking calls.
TEST(AsyncTest, FuturesAndCallbacks) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const auto keys = client::Client::BlockKeys(codec, Tokens(6, 4 * 64));
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (size_t i = 0; i < 4; ++i) pages.push_back(MakePage(codec.profile, PageKind::kBf16, 20 + i));
  for (size_t i = 0; i < 4; ++i) writes.push_back({keys[i], PageKind::kBf16, pages[i]});
  auto stored = c->StoreAsync(codec, writes).get();
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, 4u);
  auto looked = c->LookupAsync(codec, keys).get();
  ASSERT_TRUE(looked.ok());
  EXPECT_EQ(looked->matched, 4u);
  auto loaded = c->LoadAsync(codec, keys).get();
  ASSERT_TRUE(loaded.ok());
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(loaded->pages[i] == pages[i]);

  std::vector<std::vector<uint8_t>> bufs(4, std::vector<uint8_t>(codec.bf16_page_bytes));
  std::vector<std::span<uint8_t>> dst(bufs.begin(), bufs.end());
  std::promise<absl::StatusOr<uint32_t>> done;
  c->LoadIntoAsync(codec, keys, dst, [&done](absl::StatusOr<uint32_t> r) { done.set_value(r); });
  auto n = done.get_future().get();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(bufs[i] == pages[i]);
}

// LookupAsync recycles its call state (request, response, context) and the daemon recycles its
// Lookup messages: calls of different sizes and pin flags, back to back and from several threads,
// each get exactly their own answer.
TEST(AsyncTest, RecycledLookupsCarryNothingOver) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const auto keys = client::Client::BlockKeys(codec, Tokens(8, 4 * 64));
  const auto absent = client::Client::BlockKeys(codec, Tokens(9, 2 * 64));
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (size_t i = 0; i < 4; ++i) pages.push_back(MakePage(codec.profile, PageKind::kInt2, 40 + i));
  for (size_t i = 0; i < 4; ++i) writes.push_back({keys[i], PageKind::kInt2, pages[i]});
  ASSERT_EQ(c->Store(codec, writes)->stored, 4u);
  const std::span<const BlockKey> all(keys), two(keys.data(), 2);
  for (int round = 0; round < 3; ++round) {
    auto pinned = c->LookupAsync(codec, all, {.pin = true}).get();
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    EXPECT_EQ(pinned->matched, 4u);
    EXPECT_EQ(pinned->pages.size(), 4u);
    EXPECT_EQ(pinned->lease_ids.size(), 1u);
    EXPECT_TRUE(c->Release(*pinned).ok());
    auto probe = c->LookupAsync(codec, two).get();
    ASSERT_TRUE(probe.ok()) << probe.status();
    EXPECT_EQ(probe->matched, 2u);
    EXPECT_TRUE(probe->pages.empty());
    EXPECT_TRUE(probe->lease_ids.empty());
    auto miss = c->LookupAsync(codec, absent).get();
    ASSERT_TRUE(miss.ok()) << miss.status();
    EXPECT_EQ(miss->matched, 0u);
    auto sync = c->Lookup(codec, two);  // the blocking path reuses a per-thread request
    ASSERT_TRUE(sync.ok());
    EXPECT_EQ(sync->matched, 2u);
    auto sync_miss = c->Lookup(codec, absent);
    ASSERT_TRUE(sync_miss.ok());
    EXPECT_EQ(sync_miss->matched, 0u);
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const bool hit = (i + t) % 2 == 0;
        auto r = c->LookupAsync(codec, hit ? all : std::span<const BlockKey>(absent)).get();
        if (!r.ok() || r->matched != (hit ? 4u : 0u)) wrong++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  auto stats = c->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->leases, 0u);
}

// A daemon killed by a signal cannot remove its pool segment; its LocalDaemon does. One that
// stops cleanly removes its own.
TEST(LocalDaemonTest, NoPoolSegmentLeftBehind) {
  auto killed = StartDaemon();
  ASSERT_NE(killed, nullptr);
  const std::string path = killed->shm_path();
  ASSERT_EQ(path.rfind("/dev/shm/", 0), 0u) << path;
  ASSERT_EQ(::access(path.c_str(), F_OK), 0);
  killed->Kill(SIGKILL);
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << path << " left behind by a killed daemon";
  auto stopped = StartDaemon();
  ASSERT_NE(stopped, nullptr);
  const std::string path2 = stopped->shm_path();
  ASSERT_TRUE(stopped->Stop().ok());
  EXPECT_NE(::access(path2.c_str(), F_OK), 0) << path2;
}

// The C ABI test binary, pointed at a live daemon.
TEST(CAbiTest, RunsAgainstDaemon) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(OSCARKV_C_ABI_TEST_PATH, OSCARKV_C_ABI_TEST_PATH, daemon->address().c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
}

}  // namespace
}  // namespace oscarkv::testing
