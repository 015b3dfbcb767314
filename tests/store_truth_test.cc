// "The store never lies", against a real oscarkvd: a page whose Commit fails is not left behind
// as a reservation that a later Store of the same key counts as deduplicated.
#include <grpcpp/grpcpp.h>

#include <chrono>

#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

using client::PageWrite;
namespace pb = ::oscarkv::v1;

std::string Bytes(const std::array<uint8_t, 16>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// Another writer's raw gRPC Reserve of one INT2 page under `key`: its reservation id, 0 (and a
// test failure) when the RPC or the item failed.
uint64_t RawReserve(pb::KvCache::Stub& stub, const client::Codec& codec, const BlockKey& key) {
  pb::ReserveRequest rq;
  rq.set_codec_id(Bytes(codec.id.bytes));
  auto* item = rq.add_items();
  item->set_key(Bytes(key.bytes));
  item->set_kind(pb::PAGE_KIND_INT2);
  pb::ReserveResponse rr;
  grpc::ClientContext ctx;
  const grpc::Status s = stub.Reserve(&ctx, rq, &rr);
  EXPECT_TRUE(s.ok()) << s.error_message();
  if (!s.ok() || rr.results_size() != 1) return 0;
  EXPECT_EQ(rr.results(0).status().code(), 0) << rr.results(0).status().message();
  return rr.results(0).status().code() == 0 ? rr.reservation_id() : 0;
}

// The sequence of issue 23: store a page with a corrupt checksum -> DATA_LOSS; store the
// correct page under the same key -> stored=1, and Lookup matches it.
TEST(StoreTruthTest, CorruptCommitThenCorrectStoreIsStored) {
  for (client::DataPath path : {client::DataPath::kAuto, client::DataPath::kGrpc}) {
    auto daemon = StartDaemon();
    ASSERT_NE(daemon, nullptr);
    auto c = Connect(daemon->address(), path);
    ASSERT_NE(c, nullptr);
    const client::Codec codec = RegisterRefmodel(*c);
    const std::vector<BlockKey> keys =
        client::Client::BlockKeys(codec, Tokens(7, codec.profile.page_tokens));
    ASSERT_EQ(keys.size(), 1u);
    const std::vector<uint8_t> good = MakePage(codec.profile, PageKind::kInt2, 7);
    std::vector<uint8_t> corrupt = good;
    corrupt[corrupt.size() / 2] ^= 0x40;  // payload byte: the header parses, the checksum fails

    const PageWrite bad_write{keys[0], PageKind::kInt2, corrupt};
    auto bad = c->Store(codec, std::span<const PageWrite>(&bad_write, 1));
    ASSERT_TRUE(bad.ok()) << bad.status();
    EXPECT_EQ(bad->stored, 0u);
    EXPECT_EQ(bad->deduplicated, 0u);
    EXPECT_EQ(bad->failed, 1u);
    EXPECT_EQ(bad->item_status[0].code(), absl::StatusCode::kDataLoss) << bad->item_status[0];
    EXPECT_EQ(c->Lookup(codec, keys, {})->matched, 0u);
    EXPECT_EQ(bad->ToStatus().code(), absl::StatusCode::kDataLoss);
    auto stats = c->GetStats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->reservations, 0u) << "the failed page's reservation was left behind";

    const PageWrite good_write{keys[0], PageKind::kInt2, good};
    auto ok = c->Store(codec, std::span<const PageWrite>(&good_write, 1));
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(ok->stored, 1u) << ok->item_status[0];
    EXPECT_EQ(ok->deduplicated, 0u);
    EXPECT_EQ(c->Lookup(codec, keys, {})->matched, 1u);
    auto loaded = c->Load(codec, keys);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_EQ(loaded->matched, 1u);
    EXPECT_EQ(loaded->pages[0], good);
    // Stored now: a third store is deduplicated against the verified page.
    auto again = c->Store(codec, std::span<const PageWrite>(&good_write, 1));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->deduplicated, 1u);
  }
}

// One batch naming a key twice: the first copy is stored, the second waits for that commit and
// is deduplicated; nothing fails and nothing is counted twice.
TEST(StoreTruthTest, DuplicateKeyInOneBatchIsStoredOnce) {
  for (client::DataPath path : {client::DataPath::kAuto, client::DataPath::kGrpc}) {
    auto daemon = StartDaemon();
    ASSERT_NE(daemon, nullptr);
    auto c = Connect(daemon->address(), path);
    ASSERT_NE(c, nullptr);
    const client::Codec codec = RegisterRefmodel(*c);
    const auto keys = client::Client::BlockKeys(codec, Tokens(24, 64));
    const auto page = MakePage(codec.profile, PageKind::kInt2, 6);
    const std::vector<PageWrite> writes = {{keys[0], PageKind::kInt2, page},
                                           {keys[0], PageKind::kInt2, page}};
    auto r = c->Store(codec, writes);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->stored, 1u);
    EXPECT_EQ(r->deduplicated, 1u);
    EXPECT_EQ(r->failed, 0u);
    EXPECT_TRUE(r->ToStatus().ok()) << r->ToStatus();
  }
}

// A key that another writer has reserved and not committed is in progress, not stored: Store
// reports it as not cached (ABORTED) once its wait runs out, and stores it once the other
// reservation is gone.
TEST(StoreInProgressTest, KeyReservedElsewhereIsNeverCountedAsDeduplicated) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  client::ConnectOptions o;
  o.address = daemon->address();
  o.store_in_progress_wait_ms = 30;
  auto cs = client::Client::Connect(o);
  ASSERT_TRUE(cs.ok()) << cs.status();
  auto& c = **cs;
  const client::Codec codec = RegisterRefmodel(c);
  const auto keys = client::Client::BlockKeys(codec, Tokens(25, 64));
  const auto page = MakePage(codec.profile, PageKind::kInt2, 7);

  // Another writer: a raw gRPC Reserve of the key, never committed (yet).
  auto stub = pb::KvCache::NewStub(
      grpc::CreateChannel(daemon->address(), grpc::InsecureChannelCredentials()));
  const uint64_t reservation = RawReserve(*stub, codec, keys[0]);
  ASSERT_NE(reservation, 0u);

  const PageWrite w{keys[0], PageKind::kInt2, page};
  const auto t0 = std::chrono::steady_clock::now();
  auto busy = c.Store(codec, std::span<const PageWrite>(&w, 1));
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_EQ(busy->item_status[0].code(), absl::StatusCode::kAborted) << busy->item_status[0];
  EXPECT_EQ(busy->stored, 0u);
  EXPECT_EQ(busy->deduplicated, 0u);
  EXPECT_EQ(busy->failed, 1u);
  EXPECT_GE(waited, std::chrono::milliseconds(30));  // it asked again for the whole wait
  EXPECT_LT(waited, std::chrono::seconds(5));

  pb::AbortRequest ab;
  ab.set_reservation_id(reservation);
  pb::AbortResponse abr;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Abort(&ctx, ab, &abr).ok());
  }
  auto stored = c.Store(codec, std::span<const PageWrite>(&w, 1));
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, 1u) << stored->item_status[0];
  auto loaded = c.Load(codec, keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->matched, 1u);
  EXPECT_TRUE(loaded->pages[0] == page);
}

// checksums_verified lets the daemon skip its pass only over bytes the writer hashed in their
// slot; pages that came through WritePages are verified by the daemon whatever the flag says.
TEST(StoreTruthTest, StreamedPagesAreVerifiedWhateverTheWriterClaims) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const auto keys = client::Client::BlockKeys(codec, Tokens(26, 64));
  auto corrupt = MakePage(codec.profile, PageKind::kInt2, 8);
  corrupt[corrupt.size() - 1] ^= 0x01;
  auto stub = pb::KvCache::NewStub(
      grpc::CreateChannel(daemon->address(), grpc::InsecureChannelCredentials()));
  const uint64_t reservation = RawReserve(*stub, codec, keys[0]);
  ASSERT_NE(reservation, 0u);
  {
    grpc::ClientContext ctx;
    pb::WriteResponse wr;
    auto w = stub->WritePages(&ctx, &wr);
    pb::WriteChunk chunk;
    chunk.set_reservation_id(reservation);
    chunk.set_key(Bytes(keys[0].bytes));
    chunk.set_offset(0);
    chunk.set_data(corrupt.data(), corrupt.size());
    ASSERT_TRUE(w->Write(chunk));
    w->WritesDone();
    ASSERT_TRUE(w->Finish().ok());
  }
  pb::CommitRequest cq;
  cq.set_reservation_id(reservation);
  cq.set_checksums_verified(true);  // a false claim
  pb::CommitResponse cr;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Commit(&ctx, cq, &cr).ok());
  }
  ASSERT_EQ(cr.results_size(), 1);
  EXPECT_EQ(cr.results(0).code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_EQ(c->Lookup(codec, keys)->matched, 0u);
}

// The daemon hashes WritePages chunks in its copy into the slot (one pass): a byte corrupted in
// flight -- in the third of several chunks, after the header went through intact -- is still
// DATA_LOSS at Commit, and the correct page sent again (in order, or out of order, which the
// daemon verifies with a second pass) stores and loads byte-identical.
TEST(StoreTruthTest, OnePassWritePagesCatchesAByteCorruptedInFlight) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const auto keys = client::Client::BlockKeys(codec, Tokens(27, 2 * codec.profile.page_tokens));
  ASSERT_EQ(keys.size(), 2u);
  const std::vector<uint8_t> pages[2] = {MakePage(codec.profile, PageKind::kInt2, 11),
                                         MakePage(codec.profile, PageKind::kInt2, 12)};
  auto stub = pb::KvCache::NewStub(
      grpc::CreateChannel(daemon->address(), grpc::InsecureChannelCredentials()));
  auto reserve = [&](int k) { return RawReserve(*stub, codec, keys[k]); };
  // Sends page k in 8 chunks (in `order`), flipping one byte of chunk `corrupt_chunk` in flight.
  auto write = [&](uint64_t res, int k, std::vector<int> order, int corrupt_chunk) {
    const std::vector<uint8_t>& page = pages[k];
    const size_t piece = (page.size() + 7) / 8;
    grpc::ClientContext ctx;
    pb::WriteResponse wr;
    auto w = stub->WritePages(&ctx, &wr);
    for (int i : order) {
      const size_t off = i * piece;
      const size_t n = std::min(piece, page.size() - off);
      pb::WriteChunk chunk;
      chunk.set_reservation_id(res);
      chunk.set_key(Bytes(keys[k].bytes));
      chunk.set_offset(off);
      chunk.set_data(page.data() + off, n);
      if (i == corrupt_chunk) (*chunk.mutable_data())[n / 2] ^= 0x10;
      EXPECT_TRUE(w->Write(chunk));
    }
    w->WritesDone();
    EXPECT_TRUE(w->Finish().ok());
    EXPECT_EQ(wr.bytes_written(), page.size());
  };
  auto commit = [&](uint64_t res) {
    pb::CommitRequest cq;
    cq.set_reservation_id(res);
    pb::CommitResponse cr;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub->Commit(&ctx, cq, &cr).ok());
    EXPECT_EQ(cr.results_size(), 1);
    return cr.results_size() == 1 ? absl::StatusCode(cr.results(0).code())
                                  : absl::StatusCode::kUnknown;
  };
  const std::vector<int> in_order = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<int> shuffled = {4, 5, 6, 7, 0, 1, 2, 3};
  uint64_t res = reserve(0);
  write(res, 0, in_order, /*corrupt_chunk=*/2);
  EXPECT_EQ(commit(res), absl::StatusCode::kDataLoss);
  res = reserve(1);
  write(res, 1, shuffled, /*corrupt_chunk=*/6);
  EXPECT_EQ(commit(res), absl::StatusCode::kDataLoss);
  EXPECT_EQ(c->Lookup(codec, keys)->matched, 0u);

  res = reserve(0);
  write(res, 0, in_order, -1);
  EXPECT_EQ(commit(res), absl::StatusCode::kOk);
  res = reserve(1);
  write(res, 1, shuffled, -1);
  EXPECT_EQ(commit(res), absl::StatusCode::kOk);
  auto loaded = c->Load(codec, keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->matched, 2u);
  EXPECT_TRUE(loaded->pages[0] == pages[0]);
  EXPECT_TRUE(loaded->pages[1] == pages[1]);
}

}  // namespace
}  // namespace oscarkv::testing
