// Runs the libFuzzer entry point of request_fuzzer.cc over random and mutated-valid inputs so
// every build (gcc included) exercises request validation.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fuzz_mutate.h"
#include "gtest/gtest.h"
#include "oscarkv/service/page_cache.h"
#include "test_pages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace oscarkv::service {
const PageCache& FuzzCacheForTest();
namespace {

using testing::Key;
using testing::TinyProfile;

int Feed(uint8_t op, const std::string& body) {
  std::string in(1, static_cast<char>(op));
  in += body;
  return LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
}

// Valid requests of each kind (ops as in request_fuzzer.cc) that the mutator starts from.
std::vector<std::pair<uint8_t, std::string>> Seeds(std::mt19937& rng) {
  std::vector<std::pair<uint8_t, std::string>> seeds;
  auto keys = [&](auto msg_add, int n) {
    for (int i = 0; i < n; ++i) msg_add(Key(rng() % 32));
  };
  v1::HandshakeRequest hs;
  hs.set_wire_version(1);
  seeds.push_back({0, hs.SerializeAsString()});
  v1::RegisterCodecRequest reg;
  *reg.mutable_profile() = TinyProfile();
  seeds.push_back({1, reg.SerializeAsString()});
  v1::LookupRequest look;
  look.set_codec_id(std::string(16, 'c'));
  keys([&](const std::string& k) { look.add_keys(k); }, 5);
  look.set_pin(true);
  seeds.push_back({0x82, look.SerializeAsString()});
  v1::ReserveRequest res;
  res.set_codec_id(std::string(16, 'c'));
  for (int i = 0; i < 4; ++i) {
    auto* it = res.add_items();
    it->set_key(Key(rng() % 32));
    it->set_kind(i % 2 ? v1::PAGE_KIND_BF16 : v1::PAGE_KIND_INT2);
  }
  seeds.push_back({0x83, res.SerializeAsString()});
  v1::CommitRequest com;
  com.set_reservation_id(1);  // 1: the fuzzer's last reservation
  keys([&](const std::string& k) { com.add_keys(k); }, 2);
  seeds.push_back({4, com.SerializeAsString()});
  v1::WriteChunk wc;
  wc.set_reservation_id(1);
  wc.set_key(Key(3));
  wc.set_offset(100);
  wc.set_data(std::string(300, 'x'));
  seeds.push_back({6, wc.SerializeAsString()});
  v1::ReadRequest rd;
  rd.set_lease_id(1);  // 1: the fuzzer's last lease
  seeds.push_back({7, rd.SerializeAsString()});
  v1::DeleteRequest del;
  del.set_codec_id(std::string(16, 'c'));
  keys([&](const std::string& k) { del.add_keys(k); }, 3);
  seeds.push_back({0x8A, del.SerializeAsString()});
  v1::ClearRequest clr;
  clr.set_include_pinned(true);
  seeds.push_back({0x8B, clr.SerializeAsString()});
  v1::ReleaseRequest rel;
  rel.set_lease_id(1);
  seeds.push_back({8, rel.SerializeAsString()});
  v1::AbortRequest ab;
  ab.set_reservation_id(1);
  seeds.push_back({5, ab.SerializeAsString()});
  seeds.push_back({12, ""});
  seeds.push_back({13, "\x10"});
  return seeds;
}

TEST(RequestFuzz, RandomBytesNeverCrash) {
  std::mt19937 rng(1);
  for (int i = 0; i < 3000; ++i) {
    std::string in(rng() % 200, '\0');
    for (char& ch : in) ch = static_cast<char>(rng());
    EXPECT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size()), 0);
  }
}

TEST(RequestFuzz, MutatedValidRequestsNeverCrash) {
  std::mt19937 rng(2);
  for (int round = 0; round < 400; ++round) {
    for (auto& [op, body] : Seeds(rng)) {
      EXPECT_EQ(Feed(op, body), 0);
      EXPECT_EQ(Feed(op, MutateBytes(body, rng)), 0);
      EXPECT_EQ(Feed(static_cast<uint8_t>(op ^ (rng() % 2 ? 0x80 : 0)), MutateBytes(body, rng)), 0);
    }
  }
  // The inputs got past validation into the real paths, not just parse errors.
  const CacheCounters& k = FuzzCacheForTest().counters();
  EXPECT_GT(k.lookups.load(), 100u);
  EXPECT_GT(k.reserved.load(), 100u);
  EXPECT_GT(k.dedup_rejects.load() + k.in_progress_rejects.load(), 0u);
  EXPECT_GT(k.commit_failures.load(), 0u);
  EXPECT_GT(k.bytes_written.load(), 0u);
}

}  // namespace
}  // namespace oscarkv::service
