// The handoff through a real daemon (child process) on the real reference model, in one test
// process with separate clients and decoders for the two sides: equality with a single-process
// run, and every way a handle can be unusable (unknown, consumed, expired, corrupt, duplicate).
#include "oscarkv/pd/handoff.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "oscarkv/kernels/page_format.h"
#ifdef OSCARKV_PD_HAS_UCX
#include "oscarkv/client/ucx_loader.h"
#endif
#include "oscarkv/pd/workers.h"
#include "test_util.h"

namespace oscarkv::pd {
namespace {

class HandoffTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = testing::RefModelDir();
    if (dir.empty()) return;
    auto m = engine::Model::Load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
    auto c = MakeEngineCodec(model_->config(), testing::SmallCodec());
    ASSERT_TRUE(c.ok()) << c.status();
    codec_ = new EngineCodec(*c);
  }
  static void TearDownTestSuite() {
    delete codec_;
    delete model_;
    codec_ = nullptr;
    model_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "reference model not found (set OSCARKV_REFMODEL)";
    // The corruption test writes the pool through its file: only a trusted-mode pool has one
    // that can be mapped read-write (isolated pools are tested in tests/shm_isolation_test).
    const bool corrupts = std::string(::testing::UnitTest::GetInstance()->current_test_info()
                                          ->name()) == "CorruptedPageIsDetected";
    auto d = corrupts ? testing::StartDaemon({"--shm-mode", "trusted"}) : testing::StartDaemon();
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    auto p = testing::Connect(daemon_->address(), client::DataPath::kAuto);
    auto q = testing::Connect(daemon_->address(), client::DataPath::kGrpc);
    ASSERT_TRUE(p.ok() && q.ok());
    prefill_client_ = std::move(*p);
    decode_client_ = std::move(*q);
  }

  PrefillResult Publish(const std::string& handle, uint64_t ttl_ms = 0) {
    PrefillWorker w(*model_, *codec_, *prefill_client_);
    auto r = w.Run(BytesToTokens(testing::Prompt()), handle, ttl_ms);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : PrefillResult{};
  }

#ifdef OSCARKV_PD_HAS_UCX
  // A UCX loader for this test's daemon over TCP on loopback (lookups over gRPC).
  absl::StatusOr<std::unique_ptr<client::UcxLoader>> ConnectUcxLoader() {
    client::UcxLoaderOptions uo;
    uo.connect.address = daemon_->address();
    uo.connect.data_path = client::DataPath::kGrpc;
    uo.tls = "tcp";
    uo.net_devices = "lo";
    return client::UcxLoader::Connect(uo);
  }
#endif

  static engine::Model* model_;
  static EngineCodec* codec_;
  std::unique_ptr<oscarkv::testing::LocalDaemon> daemon_;
  std::unique_ptr<client::HandleClient> prefill_client_, decode_client_;
};
engine::Model* HandoffTest::model_ = nullptr;
EngineCodec* HandoffTest::codec_ = nullptr;

TEST_F(HandoffTest, DecodeSideEqualsSingleProcessRun) {
  const PrefillResult pre = Publish("req-equal");
  EXPECT_GT(pre.stats.int2_pages, 0u) << "the test codec must produce INT2 history pages";
  EXPECT_GT(pre.stats.bf16_pages, 0u);
  DecodeWorker dw(*model_, *codec_, *decode_client_);
  auto got = dw.Run("req-equal", 40);  // crosses page flushes
  ASSERT_TRUE(got.ok()) << got.status();
  auto ref = ReferenceGenerate(*model_, *codec_, BytesToTokens(testing::Prompt()), 40);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(got->generated, *ref);
  EXPECT_EQ(got->generated.front(), pre.first_token);
  EXPECT_EQ(got->prompt, BytesToTokens(testing::Prompt()));
  // Bytes: INT2 history makes the pages smaller than all-BF16 pages of the same tokens.
  const uint64_t int2 = GeometryFor(codec_->profile, PageKind::kInt2).page_bytes();
  const uint64_t bf16 = GeometryFor(codec_->profile, PageKind::kBf16).page_bytes();
  EXPECT_EQ(got->stats.page_bytes, got->stats.int2_pages * int2 + got->stats.bf16_pages * bf16);
  EXPECT_EQ(got->stats.bf16_equivalent_bytes, got->stats.pages * bf16);
  EXPECT_LT(got->stats.page_bytes, got->stats.bf16_equivalent_bytes);
  EXPECT_EQ(got->stats.page_bytes, pre.stats.page_bytes);
  // Consumed: a second open finds nothing.
  auto again = dw.Run("req-equal", 1);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
}

TEST_F(HandoffTest, UnknownHandleIsNotFound) {
  DecodeWorker dw(*model_, *codec_, *decode_client_);
  auto got = dw.Run("no-such-request", 4);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
  EXPECT_NE(got.status().message().find("'no-such-request'"), absl::string_view::npos)
      << got.status();
}

TEST_F(HandoffTest, ExpiredHandleIsNotFound) {
  Publish("req-ttl", /*ttl_ms=*/300);
  std::this_thread::sleep_for(std::chrono::milliseconds(900));  // the daemon's ttl passes
  DecodeWorker dw(*model_, *codec_, *decode_client_);
  auto got = dw.Run("req-ttl", 4);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
  EXPECT_NE(got.status().message().find("'req-ttl'"), absl::string_view::npos) << got.status();
}

// The manifest's own expiry (a guard against a daemon clock that runs late).
TEST_F(HandoffTest, ManifestExpiryIsRefusedAndCloses) {
  Publish("req-expired", /*ttl_ms=*/60000);
  DecodeWorker dw(*model_, *codec_, *decode_client_);
  OpenOptions late;
  late.now_unix_ms = UnixMs() + 120000;
  auto got = dw.Run("req-expired", 4, late);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_NE(got.status().message().find("expired"), absl::string_view::npos) << got.status();
  // The expired handle was closed.
  auto after = dw.Run("req-expired", 4);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kNotFound) << after.status();
}

TEST_F(HandoffTest, NameHoldingOtherPagesIsAlreadyExists) {
  Publish("req-dup");
  PrefillWorker w(*model_, *codec_, *prefill_client_);
  auto r = w.Run(BytesToTokens(std::string(testing::Prompt()) + " More text."), "req-dup", 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << r.status();
}

TEST_F(HandoffTest, OtherCodecIsRefused) {
  Publish("req-codec");
  CodecOptions other = testing::SmallCodec();
  other.recent_tokens = 48;
  auto c = MakeEngineCodec(model_->config(), other);
  ASSERT_TRUE(c.ok());
  DecodeWorker dw(*model_, *c, *decode_client_);
  auto got = dw.Run("req-codec", 4);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
}

// Flips one byte of one stored INT2 page inside the daemon's pool; the decode side must refuse
// the handle (DATA_LOSS) both with the client's checksum check and with it switched off (the
// handoff's own check against the manifest).
TEST_F(HandoffTest, CorruptedPageIsDetected) {
  const PrefillResult pre = Publish("req-corrupt");
  if (daemon_->shm_path().empty()) GTEST_SKIP() << "daemon has no shared-memory pool to corrupt";
  auto codec = decode_client_->client().RegisterCodec(codec_->profile);
  ASSERT_TRUE(codec.ok());
  const auto keys = HandoffPageKeys(*codec, "req-corrupt", pre.stats.pages);
  client::LookupOptions pin;
  pin.pin = true;
  auto look = prefill_client_->client().Lookup(*codec, keys, pin);
  ASSERT_TRUE(look.ok()) << look.status();
  ASSERT_EQ(look->matched, keys.size());
  size_t victim = 0;
  while (victim < look->pages.size() && look->pages[victim].kind != PageKind::kInt2) ++victim;
  ASSERT_LT(victim, look->pages.size());
  const int fd = ::open(daemon_->shm_path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << daemon_->shm_path();
  const uint64_t off = look->pages[victim].offset, bytes = look->pages[victim].bytes;
  const long pg = ::sysconf(_SC_PAGESIZE);
  const uint64_t base = off / pg * pg;
  void* map = ::mmap(nullptr, off - base + bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, base);
  ASSERT_NE(map, MAP_FAILED);
  uint8_t* page = static_cast<uint8_t*>(map) + (off - base);
  page[kPageHeaderBytes + bytes / 2] ^= 0x5a;  // a code byte in the payload
  ::munmap(map, off - base + bytes);
  ::close(fd);
  ASSERT_TRUE(prefill_client_->client().Release(*look).ok());

  OpenOptions keep;
  keep.consume = false;
  DecodeWorker dw(*model_, *codec_, *decode_client_);
  auto got = dw.Run("req-corrupt", 4, keep);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  auto unverified = testing::Connect(daemon_->address(), client::DataPath::kGrpc, /*verify=*/false);
  ASSERT_TRUE(unverified.ok());
  DecodeWorker dw2(*model_, *codec_, **unverified);
  auto got2 = dw2.Run("req-corrupt", 4, keep);
  EXPECT_EQ(got2.status().code(), absl::StatusCode::kDataLoss) << got2.status();
#ifdef OSCARKV_PD_HAS_UCX
  // And over UCX RMA gets from the pool.
  auto loader = ConnectUcxLoader();
  ASSERT_TRUE(loader.ok()) << loader.status();
  DecodeWorker dw3(*model_, *codec_, (*loader)->handles(), loader->get());
  auto got3 = dw3.Run("req-corrupt", 4, keep);
  EXPECT_EQ(got3.status().code(), absl::StatusCode::kDataLoss) << got3.status();
#endif
}

#ifdef OSCARKV_PD_HAS_UCX
TEST_F(HandoffTest, UcxLoadEqualsSingleProcessRun) {
  Publish("req-ucx");
  auto loader = ConnectUcxLoader();
  ASSERT_TRUE(loader.ok()) << loader.status();
  DecodeWorker dw(*model_, *codec_, (*loader)->handles(), loader->get());
  auto got = dw.Run("req-ucx", 16);
  ASSERT_TRUE(got.ok()) << got.status();
  auto ref = ReferenceGenerate(*model_, *codec_, BytesToTokens(testing::Prompt()), 16);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(got->generated, *ref);
}
#endif

TEST(ManifestTest, RoundTripsAndRejectsGarbage) {
  HandoffManifest m;
  m.handle = "h";
  m.profile = *BuiltinProfile("refmodel");
  m.tokens = {1, 2, 3, 250};
  m.plan = {{PageKind::kBf16, 0, 3}};
  m.checksums = {0xfeedfacecafebeefull};
  m.created_unix_ms = 5;
  m.expires_unix_ms = 7;
  m.prompt_tokens = 3;
  auto back = DecodeManifest(EncodeManifest(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tokens, m.tokens);
  EXPECT_EQ(back->checksums, m.checksums);
  EXPECT_EQ(back->profile.Id(), m.profile.Id());
  EXPECT_EQ(back->plan[0].token_count, 3u);
  EXPECT_EQ(DecodeManifest("{not json").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(DecodeManifest("{\"format\":\"oscarkv-pd-manifest/1\"}").ok());
}

}  // namespace
}  // namespace oscarkv::pd
