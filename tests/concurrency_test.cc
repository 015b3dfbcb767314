// 64 concurrent clients (half on shared memory, half on gRPC streaming; half on their own
// connection, half multiplexed on one; half looking up over the local socket, half over gRPC)
// doing mixed stores,
// lookups, loads, racing duplicate stores and deletes against one real oscarkvd. Every page a
// client reads must be byte-identical to what was stored under its key, and every page stored
// and not deleted must still be there at the end: zero lost, zero corrupt.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "test_util.h"

namespace oscarkv::testing {
namespace {

using client::PageWrite;

constexpr int kClients = 64;
constexpr int kRounds = 6;
constexpr int kPagesPerRound = 4;
constexpr int kSharedPages = 8;
constexpr int kContents = 128;

struct World {
  client::Codec codec;
  std::vector<std::vector<uint8_t>> contents;  // distinct page bodies
  std::vector<BlockKey> shared_keys;
  // keys[client][round] and the content index of each page
  std::vector<std::vector<std::vector<BlockKey>>> keys;
  size_t content(int client, int round, int i) const {
    return static_cast<size_t>(client * 7 + round * 13 + i * 29 + 5) % kContents;
  }
};

struct Tally {
  std::atomic<int> lost{0}, corrupt{0}, errors{0}, loads{0}, foreign_hits{0}, shared_waits{0};
};

// Store counts a key as deduplicated only once it is committed (a key another client has only
// reserved is retried, oscarkv.proto ReserveResult), so the shared prefix should be visible
// right after this client's Store. Waits (bounded) anyway; a page that never shows up is lost.
bool WaitForSharedPrefix(client::Client& c, const World& w, Tally* t) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (bool waited = false;; waited = true) {
    auto hit = c.Lookup(w.codec, w.shared_keys);
    if (hit.ok() && hit->matched == kSharedPages) {
      if (waited) t->shared_waits++;
      return true;
    }
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void RunClient(const std::string& addr, const World& w, int id, Tally* t) {
  client::ConnectOptions o;
  o.address = addr;
  o.client_name = "concurrency-" + std::to_string(id);
  o.data_path = id % 2 ? client::DataPath::kGrpc : client::DataPath::kSharedMemory;
  o.dedicated_connection = id % 4 < 2;  // half on their own TCP connection, half sharing one
  // Half look up and release over the daemon's local socket, half over gRPC.
  o.lookup_path = (id / 4) % 2 ? client::LookupPath::kGrpc : client::LookupPath::kLocal;
  auto c = client::Client::Connect(o);
  if (!c.ok()) {
    ADD_FAILURE() << "client " << id << ": " << c.status();
    t->errors++;
    return;
  }
  if ((*c)->server().lookup_path != o.lookup_path) {
    ADD_FAILURE() << "client " << id << " looks up over "
                  << client::LookupPathName((*c)->server().lookup_path);
    t->errors++;
  }
  if (!(*c)->RegisterCodec(w.codec.profile).ok()) t->errors++;
  std::mt19937 rng(id);
  std::vector<PageWrite> shared;
  for (int i = 0; i < kSharedPages; ++i) {
    shared.push_back({w.shared_keys[i], PageKind::kInt2, w.contents[i]});
  }
  auto check = [&](const std::vector<uint8_t>& got, size_t want) {
    if (got != w.contents[want]) t->corrupt++;
  };
  for (int r = 0; r < kRounds; ++r) {
    const auto& keys = w.keys[id][r];
    std::vector<PageWrite> writes;
    for (int i = 0; i < kPagesPerRound; ++i) {
      writes.push_back({keys[i], PageKind::kInt2, w.contents[w.content(id, r, i)]});
    }
    writes.insert(writes.end(), shared.begin(), shared.end());
    auto st = (*c)->Store(w.codec, writes);
    if (!st.ok() || st->failed != 0 || st->stored < kPagesPerRound) {
      ADD_FAILURE() << "client " << id << " round " << r << " store: "
                    << (st.ok() ? st->item_status[0].ToString() : st.status().ToString());
      t->errors++;
      continue;
    }
    // Own pages: probe (blocking and pipelined async), then load into caller buffers.
    auto hit = (*c)->Lookup(w.codec, keys);
    if (!hit.ok() || hit->matched != kPagesPerRound) t->lost++;
    auto ahit = (*c)->LookupAsync(w.codec, keys).get();
    if (!ahit.ok() || ahit->matched != kPagesPerRound) t->lost++;
    std::vector<std::vector<uint8_t>> bufs(kPagesPerRound,
                                           std::vector<uint8_t>(w.codec.int2_page_bytes));
    std::vector<std::span<uint8_t>> dst(bufs.begin(), bufs.end());
    auto n = (*c)->LoadInto(w.codec, keys, dst);
    if (!n.ok()) {
      ADD_FAILURE() << "client " << id << " load: " << n.status();
      t->errors++;
    } else if (*n != kPagesPerRound) {
      t->lost++;
    } else {
      for (int i = 0; i < kPagesPerRound; ++i) check(bufs[i], w.content(id, r, i));
      t->loads++;
    }
    // Shared prefix (stored by everyone, kept once).
    if (!WaitForSharedPrefix(**c, w, t)) {
      ADD_FAILURE() << "client " << id << " round " << r << ": shared prefix never committed";
      t->lost++;
      continue;
    }
    auto sh = (r % 2 == 0) ? (*c)->LoadAsync(w.codec, w.shared_keys).get()
                           : (*c)->Load(w.codec, w.shared_keys);
    if (!sh.ok() || sh->matched != kSharedPages) {
      t->lost++;
    } else {
      for (int i = 0; i < kSharedPages; ++i) check(sh->pages[i], i);
    }
    // Someone else's pages from an earlier round: may be deleted already; if loaded, exact.
    if (r > 0) {
      const int other = static_cast<int>(rng() % kClients);
      const int orr = static_cast<int>(rng() % r);
      auto theirs = (*c)->Load(w.codec, w.keys[other][orr]);
      if (!theirs.ok()) {
        ADD_FAILURE() << "client " << id << " foreign load: " << theirs.status();
        t->errors++;
      } else {
        for (uint32_t i = 0; i < theirs->matched; ++i) check(theirs->pages[i], w.content(other, orr, i));
        if (theirs->matched > 0) t->foreign_hits++;
      }
    }
    // Delete own pages of two rounds ago (pinned ones come back FAILED_PRECONDITION).
    if (r >= 2) {
      auto del = (*c)->Delete(w.codec, w.keys[id][r - 2]);
      if (!del.ok()) {
        t->errors++;
      } else {
        for (const auto& s : *del) {
          if (!s.ok() && !absl::IsFailedPrecondition(s)) {
            ADD_FAILURE() << "client " << id << " delete: " << s;
            t->errors++;
          }
        }
      }
    }
  }
}

TEST(ConcurrencyTest, SixtyFourClientsMixedOpsZeroLostOrCorrupt) {
  auto daemon = StartDaemon({"--pool-mb", "256"});
  ASSERT_NE(daemon, nullptr);
  auto admin = Connect(daemon->address());
  ASSERT_NE(admin, nullptr);
  World w;
  w.codec = RegisterRefmodel(*admin);
  for (int i = 0; i < kContents; ++i) w.contents.push_back(MakePage(w.codec.profile, PageKind::kInt2, 500 + i));
  w.shared_keys = client::Client::BlockKeys(w.codec, Tokens(99, kSharedPages * 64));
  w.keys.resize(kClients);
  for (int id = 0; id < kClients; ++id) {
    for (int r = 0; r < kRounds; ++r) {
      w.keys[id].push_back(client::Client::BlockKeys(
          w.codec, Tokens(10000 + id * 100 + r, kPagesPerRound * 64)));
    }
  }
  Tally t;
  std::vector<std::thread> threads;
  for (int id = 0; id < kClients; ++id) {
    threads.emplace_back(RunClient, daemon->address(), std::cref(w), id, &t);
  }
  for (auto& th : threads) th.join();

  EXPECT_EQ(t.errors.load(), 0);
  EXPECT_EQ(t.lost.load(), 0);
  EXPECT_EQ(t.corrupt.load(), 0);
  EXPECT_EQ(t.loads.load(), kClients * kRounds);
  EXPECT_GT(t.foreign_hits.load(), 0);
  std::printf("loads %d, foreign hits %d, shared prefix still being stored by another client "
              "(waited) %d\n", t.loads.load(), t.foreign_hits.load(), t.shared_waits.load());

  // Final state: the last two rounds of every client and the shared prefix, all exact.
  int lost = 0, corrupt = 0;
  for (int id = 0; id < kClients; ++id) {
    for (int r = kRounds - 2; r < kRounds; ++r) {
      auto got = admin->Load(w.codec, w.keys[id][r]);
      ASSERT_TRUE(got.ok()) << got.status();
      lost += kPagesPerRound - static_cast<int>(got->matched);
      for (uint32_t i = 0; i < got->matched; ++i) corrupt += got->pages[i] != w.contents[w.content(id, r, i)];
    }
    for (int r = 0; r < kRounds - 2; ++r) {  // deleted rounds are gone
      auto got = admin->Lookup(w.codec, w.keys[id][r]);
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(got->matched, 0u) << "client " << id << " round " << r << " survived its delete";
    }
  }
  EXPECT_EQ(lost, 0);
  EXPECT_EQ(corrupt, 0);
  auto stats = admin->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pages, static_cast<uint64_t>(kClients * 2 * kPagesPerRound + kSharedPages));
  EXPECT_EQ(stats->leases, 0u);
  EXPECT_EQ(stats->reservations, 0u);
  EXPECT_EQ(stats->evictions, 0u);
}

}  // namespace
}  // namespace oscarkv::testing
