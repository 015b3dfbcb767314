// Same-host stores to an isolated daemon reserve on the staging connection (a local Reserve
// frame, no gRPC round trip) and copy the first chunks into staging while the daemon answers.
// Against a real oscarkvd: the daemon's /metrics show every Reserve carried by the local socket;
// pages deduplicated among the chunks copied ahead, pages of several staging chunks and a
// corrupt page in the middle of a batch all end as they must (stored byte-exact, deduplicated,
// DATA_LOSS for that page alone); a shared-namespace client still reserves over gRPC.
#include <string>

#include "test_util.h"

namespace oscarkv::testing {
namespace {

using client::PageWrite;

std::unique_ptr<LocalDaemon> StartWithMetrics() {
  return StartDaemon({"--metrics-listen", "127.0.0.1:0", "--pool-mb", "96"});
}

TEST(StoreLocalReserveTest, IsolatedStoresReserveOnTheStagingConnection) {
  auto daemon = StartWithMetrics();
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const PageBatch batch = MakeBatch(codec, 31, 20, 100);
  const auto& keys = batch.keys;
  const auto& pages = batch.pages;
  const auto& writes = batch.writes;
  ASSERT_EQ(keys.size(), 20u);

  // Pages 0 and 5 first: in the batch below they are among the chunks copied ahead of the
  // Reserve answer, and are then deduplicated instead of staged.
  const std::vector<PageWrite> first = {writes[0], writes[5]};
  auto pre = c->Store(codec, first);
  ASSERT_TRUE(pre.ok()) << pre.status();
  EXPECT_EQ(pre->stored, 2u);
  auto r = c->Store(codec, writes);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stored, 18u);
  EXPECT_EQ(r->deduplicated, 2u);
  EXPECT_EQ(r->failed, 0u);
  EXPECT_TRUE(absl::IsAlreadyExists(r->item_status[0])) << r->item_status[0];
  EXPECT_TRUE(absl::IsAlreadyExists(r->item_status[5])) << r->item_status[5];
  auto loaded = c->Load(codec, keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->matched, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE(loaded->pages[i] == pages[i]) << i;

  const std::string m = MetricsText(daemon->metrics_address());
  ASSERT_NE(m.find("oscarkv_rpcs_total"), std::string::npos) << m.substr(0, 300);
  const uint64_t local = MetricValue(m, "oscarkv_local_calls_total{method=\"Reserve\"} ");
  const uint64_t all = MetricValue(m, "oscarkv_rpcs_total{method=\"Reserve\",code=\"OK\"} ");
  EXPECT_EQ(local, 2u);
  EXPECT_EQ(all, local) << "a Reserve went over gRPC";
  EXPECT_EQ(MetricValue(m, "oscarkv_rpcs_total{method=\"Commit\",code=\"OK\"} "), 0u)
      << "staged pages are committed with their last chunk";
  // Every local method is timed and counted as gRPC calls are: one AttachStaging, one
  // StageWrite per staged page (2 + 18; the two deduplicated pages were not staged).
  for (const char* method : {"AttachStaging", "StageWrite"}) {
    const std::string q = std::string("{method=\"") + method + "\"";
    const uint64_t want = std::string(method) == "StageWrite" ? 20 : 1;
    EXPECT_EQ(MetricValue(m, "oscarkv_local_calls_total" + q + "} "), want) << method;
    EXPECT_EQ(MetricValue(m, "oscarkv_rpcs_total" + q + ",code=\"OK\"} "), want) << method;
    EXPECT_EQ(MetricValue(m, "oscarkv_rpc_duration_seconds_count" + q + "} "), want) << method;
  }
  EXPECT_NE(m.find("oscarkv_local_calls_total{method=\"StageRead\"} 0\n"), std::string::npos)
      << "every local method is listed, called or not";

  // A shared-namespace client's Reserve acts for the namespace, which the socket does not know:
  // it reserves over gRPC. (Without tenants there is no namespace to join: the connect fails
  // or the store is refused, never reserved on the socket.)
  client::ConnectOptions shared;
  shared.address = daemon->address();
  shared.shared_namespace = "team";
  auto sc = client::Client::Connect(shared);
  if (sc.ok()) {
    const PageWrite w{keys[0], PageKind::kInt2, pages[0]};
    (void)(*sc)->Store(codec, std::span<const PageWrite>(&w, 1));
    EXPECT_EQ(MetricValue(MetricsText(daemon->metrics_address()),
                      "oscarkv_local_calls_total{method=\"Reserve\"} "),
              local);
  }
}

// Pages of two staging chunks each (a profile whose INT2 page is over 2 MiB), with a corrupt
// page in the middle: the chunks copied ahead may end mid-page; every good page is stored
// byte-exact and the corrupt one alone is DATA_LOSS, its reservation gone.
TEST(StoreLocalReserveTest, MultiChunkPagesAndACorruptPageInTheBatch) {
  auto daemon = StartWithMetrics();
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  CodecProfile big = *BuiltinProfile("qwen3-8b");
  big.model_id = "qwen3-8b-x2.2";
  big.num_layers = 80;
  auto codec = c->RegisterCodec(big);
  ASSERT_TRUE(codec.ok()) << codec.status();
  ASSERT_GT(codec->int2_page_bytes, uint64_t{2} << 20);
  ASSERT_LT(codec->int2_page_bytes, uint64_t{4} << 20);
  const auto keys = client::Client::BlockKeys(*codec, Tokens(32, 10 * big.page_tokens));
  ASSERT_EQ(keys.size(), 10u);
  std::vector<std::vector<uint8_t>> pages;
  for (size_t i = 0; i < keys.size(); ++i) pages.push_back(MakePage(codec->profile, PageKind::kInt2, 200 + i));
  pages[4][pages[4].size() - 100] ^= 0x10;  // in the page's second chunk
  std::vector<PageWrite> writes;
  for (size_t i = 0; i < keys.size(); ++i) writes.push_back({keys[i], PageKind::kInt2, pages[i]});
  auto r = c->Store(*codec, writes);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stored, 9u);
  EXPECT_EQ(r->failed, 1u);
  EXPECT_EQ(r->item_status[4].code(), absl::StatusCode::kDataLoss) << r->item_status[4];
  auto stats = c->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->reservations, 0u);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto got = c->Load(*codec, std::span<const BlockKey>(&keys[i], 1));
    ASSERT_TRUE(got.ok()) << got.status();
    if (i == 4) {
      EXPECT_EQ(got->matched, 0u);
    } else {
      ASSERT_EQ(got->matched, 1u) << i;
      EXPECT_TRUE(got->pages[0] == pages[i]) << i;
    }
  }
  // Stored again, correctly: stored (never "deduplicated" against the failed attempt).
  pages[4][pages[4].size() - 100] ^= 0x10;
  auto again = c->Store(*codec, std::span<const PageWrite>(&writes[4], 1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stored, 1u) << again->item_status[0];
  const std::string m = MetricsText(daemon->metrics_address());
  EXPECT_EQ(MetricValue(m, "oscarkv_rpcs_total{method=\"Reserve\",code=\"OK\"} "),
            MetricValue(m, "oscarkv_local_calls_total{method=\"Reserve\"} "));
}

}  // namespace
}  // namespace oscarkv::testing
