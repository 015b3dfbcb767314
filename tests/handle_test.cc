// Transfer handles against a real oscarkvd: publish (sink + history + partial tail), open and
// load by name over shared memory and over gRPC, idempotent publish, close, expiry.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "oscarkv/client/handles.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

using client::DataPath;
using client::HandleClient;

std::unique_ptr<HandleClient> ConnectHandles(const std::string& addr, DataPath path) {
  client::ConnectOptions o;
  o.address = addr;
  o.data_path = path;
  auto c = HandleClient::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// A request's handoff: BF16 sink page, INT2 history pages (canonical keys), a partial BF16 tail
// page (derived key).
struct Handoff {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<client::PageWrite> writes;
};

Handoff MakeHandoff(const client::Codec& codec, const std::string& handle, uint64_t seed) {
  const CodecProfile& p = codec.profile;
  const auto tokens = Tokens(seed, p.page_tokens * 4 + 17);
  const auto keys = client::Client::BlockKeys(codec, tokens);
  Handoff h;
  h.bytes.push_back(MakePage(p, PageKind::kBf16, seed * 10));
  for (size_t i = 1; i < keys.size(); ++i) h.bytes.push_back(MakePage(p, PageKind::kInt2, seed * 10 + i));
  {  // the tail: 17 tokens
    const uint32_t T = p.page_tokens;
    std::vector<float> kv(size_t{p.num_layers} * 2 * T * p.num_kv_heads * p.head_dim, 0.25f);
    for (size_t i = 0; i < kv.size(); ++i) kv[i] = float(SplitMix(seed + i) % 1000) / 500.0f - 1;
    KVSequenceView view{kv.data(), p.num_layers, p.num_kv_heads, p.head_dim, T};
    auto page = EncodePage(p, nullptr, PageKind::kBf16, view, 0, 17);
    EXPECT_TRUE(page.ok()) << page.status();
    h.bytes.push_back(*page);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    h.writes.push_back({keys[i], i == 0 ? PageKind::kBf16 : PageKind::kInt2, h.bytes[i]});
  }
  h.writes.push_back({HandleClient::HandleTailKey(codec, handle, 0), PageKind::kBf16,
                      h.bytes.back()});
  return h;
}

class HandleTest : public ::testing::TestWithParam<DataPath> {};

TEST_P(HandleTest, PublishOpenLoadClose) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto prefill = ConnectHandles(d->address(), DataPath::kAuto);
  auto decode = ConnectHandles(d->address(), GetParam());
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  const client::Codec codec = RegisterRefmodel(prefill->client());
  const client::Codec codec2 = RegisterRefmodel(decode->client());
  Handoff h = MakeHandoff(codec, "req-1", 7);

  auto deadline = prefill->Publish(codec, "req-1", h.writes, "meta:seq=1", 60000);
  ASSERT_TRUE(deadline.ok()) << deadline.status();
  // Idempotent retry; another page set under the same name is refused.
  EXPECT_TRUE(prefill->Publish(codec, "req-1", h.writes, "meta:seq=1", 60000).ok());
  std::vector<BlockKey> other = {h.writes[1].key};
  EXPECT_EQ(prefill->PublishKeys(codec, "req-1", other, "", 0).status().code(),
            absl::StatusCode::kAlreadyExists);
  // Unknown keys publish nothing.
  BlockKey missing;
  missing.bytes.fill(0xAB);
  std::vector<BlockKey> bad = {h.writes[0].key, missing};
  EXPECT_EQ(prefill->PublishKeys(codec, "req-bad", bad, "", 0).status().code(),
            absl::StatusCode::kNotFound);

  auto loaded = decode->Load(codec2, "req-1");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(decode->client().server().data_path, GetParam() == DataPath::kGrpc ? DataPath::kGrpc
                                                                               : DataPath::kSharedMemory);
  EXPECT_EQ(loaded->info.metadata, "meta:seq=1");
  ASSERT_EQ(loaded->pages.size(), h.bytes.size());
  for (size_t i = 0; i < h.bytes.size(); ++i) EXPECT_EQ(loaded->pages[i], h.bytes[i]) << i;
  EXPECT_EQ(loaded->info.pages.front().kind, PageKind::kBf16);
  EXPECT_EQ(loaded->info.pages[1].kind, PageKind::kInt2);
  EXPECT_EQ(loaded->info.pages.back().token_count, 17u);
  EXPECT_EQ(loaded->info.pages[1].token_count, codec.profile.page_tokens);

  // Pinned by the handle: a Clear without include_pinned keeps the pages.
  ASSERT_TRUE(prefill->client().Clear(nullptr, /*include_pinned=*/false).ok());
  EXPECT_TRUE(decode->Load(codec2, "req-1").ok());

  ASSERT_TRUE(prefill->Close("req-1").ok());
  EXPECT_TRUE(prefill->Close("req-1").ok());  // idempotent
  EXPECT_EQ(decode->Load(codec2, "req-1").status().code(), absl::StatusCode::kNotFound);
  auto stats = prefill->client().GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pinned_pages, 0u);
  EXPECT_EQ(stats->leases, 0u);
}

// A handle page corrupted in the pool after it was published is DATA_LOSS on load (the one
// load path verifies every page, on either data path); no page of that load is returned.
TEST_P(HandleTest, CorruptedPageIsDataLossOnLoad) {
  auto d = StartDaemon({"--shm-mode", "trusted"});  // a pool file this test can write
  ASSERT_NE(d, nullptr);
  auto prefill = ConnectHandles(d->address(), DataPath::kAuto);
  auto decode = ConnectHandles(d->address(), GetParam());
  ASSERT_TRUE(prefill && decode);
  const client::Codec codec = RegisterRefmodel(prefill->client());
  Handoff h = MakeHandoff(codec, "req-c", 9);
  ASSERT_TRUE(prefill->Publish(codec, "req-c", h.writes, "", 60000).ok());
  ASSERT_TRUE(decode->Load(codec, "req-c").ok());
  auto info = prefill->Open("req-c");
  ASSERT_TRUE(info.ok()) << info.status();
  const uint64_t off = info->pages[2].offset + info->pages[2].bytes - 1;  // its last byte
  ASSERT_TRUE(prefill->client().Release(info->lease_id).ok());
  const int fd = ::open(d->shm_path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(off)), 1);
  byte ^= 0x08;
  ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(off)), 1);
  ::close(fd);
  auto bad = decode->Load(codec, "req-c");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  EXPECT_NE(bad.status().message().find(h.writes[2].key.Hex()), std::string::npos)
      << bad.status();
  auto stats = prefill->client().GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->leases, 0u);  // the failed load released its lease
}

INSTANTIATE_TEST_SUITE_P(Paths, HandleTest, ::testing::Values(DataPath::kSharedMemory,
                                                              DataPath::kGrpc),
                         [](const auto& info) { return client::DataPathName(info.param); });

TEST(HandleExpiry, ExpiresAfterTtlAndOpenedLeaseOutlivesClose) {
  auto d = StartDaemon({"--reaper-interval-ms", "50"});
  ASSERT_NE(d, nullptr);
  auto hc = ConnectHandles(d->address(), DataPath::kGrpc);
  ASSERT_NE(hc, nullptr);
  const client::Codec codec = RegisterRefmodel(hc->client());
  Handoff h = MakeHandoff(codec, "short", 9);
  ASSERT_TRUE(hc->Publish(codec, "short", h.writes, "", 300).ok());
  auto opened = hc->Open("short", 60000);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE(hc->Close("short").ok());
  // The opener's lease still pins the pages: they stay loadable by key.
  std::vector<BlockKey> keys;
  for (const auto& w : h.writes) keys.push_back(w.key);
  ASSERT_TRUE(hc->client().Clear(nullptr, false).ok());
  auto probe = hc->client().Lookup(codec, std::span(keys).subspan(0, 1));
  ASSERT_TRUE(probe.ok());
  EXPECT_EQ(probe->matched, 1u);
  ASSERT_TRUE(hc->client().Release(opened->lease_id).ok());

  ASSERT_TRUE(hc->Publish(codec, "short", h.writes, "", 300).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(hc->Open("short").status().code(), absl::StatusCode::kNotFound);
  auto stats = hc->client().GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pinned_pages, 0u);
  // Bad names are rejected.
  EXPECT_EQ(hc->Open("").status().code(), absl::StatusCode::kInvalidArgument);
}

// Handle metadata is daemon heap, not pool: a client that publishes handles with 1 MiB of
// metadata each is stopped at 256 MiB in all (before: 65,536 handles x 1 MiB = 64 GiB), and
// closing one makes room again. Handles without metadata are not affected.
TEST(HandleMetadata, HeldMetadataIsBoundedPerTenant) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto hc = ConnectHandles(d->address(), DataPath::kGrpc);
  ASSERT_NE(hc, nullptr);
  const client::Codec codec = RegisterRefmodel(hc->client());
  Handoff h = MakeHandoff(codec, "m", 11);
  ASSERT_TRUE(hc->client().Store(codec, h.writes).ok());
  const std::vector<BlockKey> keys = {h.writes[1].key};
  const std::string meta(size_t{1} << 20, 'm');
  int published = 0;
  absl::Status refused;
  for (int i = 0; i < 300; ++i) {
    auto r = hc->PublishKeys(codec, "m-" + std::to_string(i), keys, meta, 60000);
    if (!r.ok()) {
      refused = r.status();
      break;
    }
    ++published;
  }
  EXPECT_EQ(published, 256);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("metadata"), absl::string_view::npos) << refused;
  // Without metadata a handle still publishes; one closed frees its MiB for the next.
  EXPECT_TRUE(hc->PublishKeys(codec, "empty", keys, "", 60000).ok());
  ASSERT_TRUE(hc->Close("m-0").ok());
  EXPECT_TRUE(hc->PublishKeys(codec, "m-again", keys, meta, 60000).ok());
  EXPECT_EQ(hc->PublishKeys(codec, "m-over", keys, meta, 60000).status().code(),
            absl::StatusCode::kResourceExhausted);
  auto opened = hc->Open("m-again");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->metadata, meta);
  ASSERT_TRUE(hc->client().Release(opened->lease_id).ok());
}

}  // namespace
}  // namespace oscarkv::testing
