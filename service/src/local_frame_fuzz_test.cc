// Runs the libFuzzer entry point of local_frame_fuzzer.cc over a seed corpus (one input per rule
// of the local socket's framing) and seeded random mutations of it, so every build (gcc
// included) fuzzes the framing for a few seconds. For longer runs use the libFuzzer binary
// (scripts/fuzz.sh local_frame 600).
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "fuzz_mutate.h"
#include "gtest/gtest.h"
#include "local_frame_fuzzer.h"
#include "oscarkv/v1/local_control.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::service {
namespace {

namespace local = ::oscarkv::v1::local;
namespace pb = ::oscarkv::v1;

std::string U16(size_t n) { return {static_cast<char>(n & 0xff), static_cast<char>(n >> 8)}; }
// A request record: valid header, `method`, `body`.
std::string Request(uint8_t method, const std::string& body) {
  return std::string(1, 1) + static_cast<char>(method) + U16(body.size()) + body;
}
std::string Raw(const std::string& frame) { return std::string(1, 0) + U16(frame.size()) + frame; }
const std::string kHandshake(1, 2);
std::string Oversized(uint8_t extra_kib) { return std::string(1, 3) + static_cast<char>(extra_kib); }

std::string HeaderBytes(uint32_t magic, uint16_t version, uint16_t method, uint64_t id) {
  local::RequestHeader h;
  h.magic = magic;
  h.version = version;
  h.method = method;
  h.id = id;
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

std::vector<std::string> Seeds() {
  pb::LookupRequest look;
  look.set_codec_id(std::string(16, 'c'));
  for (int i = 0; i < 4; ++i) look.add_keys(std::string(16, static_cast<char>('a' + i)));
  look.set_pin(true);
  pb::ReleaseRequest rel;
  rel.set_lease_id(1);
  pb::HandshakeRequest bad_wire;
  bad_wire.set_wire_version(static_cast<pb::WireVersion>(99));
  const std::string hs_body = [] {
    pb::HandshakeRequest r;
    r.set_wire_version(pb::WIRE_VERSION_1);
    return r.SerializeAsString();
  }();
  // The shared-memory frames (the fuzz server is isolated, regions of at most 1 MiB): a load
  // staging region, chunks of a lease that does not exist, and AttachStaging without its memfd.
  pb::AttachLoadStagingRequest load_region;
  load_region.set_bytes(1 << 20);
  pb::AttachLoadStagingRequest too_big;
  too_big.set_bytes(uint64_t{1} << 40);
  pb::StageReadRequest chunk;
  chunk.set_lease_id(7);
  chunk.set_key(std::string(16, 'a'));
  chunk.set_page_offset(0);
  chunk.set_staging_offset((1 << 20) - 8);
  chunk.set_length(64);
  pb::StageWriteRequest staged;
  staged.set_reservation_id(3);
  staged.set_key(std::string(16, 'b'));
  staged.set_length(64);
  pb::AttachStagingRequest staging;
  staging.set_staging_bytes(1 << 20);
  // Reserve frames: two pages of the fuzz server's codec, a bad key and a bad kind among good
  // items, an unknown codec, and one item more than a frame may hold.
  const std::string codec = LocalFrameFuzzCodecId();
  auto reserve = [&](int items, int key_bytes, pb::PageKind kind, const std::string& id) {
    pb::ReserveRequest r;
    r.set_codec_id(id);
    for (int i = 0; i < items; ++i) {
      auto* item = r.add_items();
      item->set_key(std::string(static_cast<size_t>(i == 1 ? key_bytes : 16),
                                static_cast<char>('k' + i % 64)));
      item->set_kind(i == 2 ? kind : pb::PAGE_KIND_INT2);
    }
    return r.SerializeAsString();
  };
  const std::string reserve_two = reserve(2, 16, pb::PAGE_KIND_INT2, codec);
  const std::string reserve_bad_items = reserve(3, 15, static_cast<pb::PageKind>(7), codec);
  const std::string reserve_unknown_codec = reserve(2, 16, pb::PAGE_KIND_INT2, std::string(16, 'z'));
  const std::string reserve_too_many =
      reserve(static_cast<int>(local::kMaxReserveItems) + 1, 16, pb::PAGE_KIND_INT2, codec);
  std::vector<std::string> seeds = {
      kHandshake + Request(7, load_region.SerializeAsString()) +
          Request(6, chunk.SerializeAsString()) + Request(7, too_big.SerializeAsString()) +
          Request(6, "\xff\x01"),
      kHandshake + Request(6, chunk.SerializeAsString()) +  // StageRead before any region
          Request(4, staging.SerializeAsString()) + Request(5, staged.SerializeAsString()),
      kHandshake + Request(8, reserve_two) + Request(8, reserve_two) +  // then: in progress
          Request(8, reserve_bad_items) + Request(8, reserve_unknown_codec) +
          Request(5, staged.SerializeAsString()) + Request(8, reserve_too_many) +
          Request(8, "\xff\xff"),
      Request(8, reserve_two),                      // Reserve before the handshake
      Request(7, load_region.SerializeAsString()),  // before the handshake
      kHandshake + Request(2, look.SerializeAsString()) + Request(3, rel.SerializeAsString()),
      kHandshake + kHandshake + kHandshake + Request(2, look.SerializeAsString()),
      Request(2, look.SerializeAsString()),         // lookup before the handshake
      Request(3, rel.SerializeAsString()),          // release before the handshake
      Request(1, bad_wire.SerializeAsString()),     // a wire version this daemon does not speak
      kHandshake + Request(9, "x"),                 // unknown method
      kHandshake + Request(2, "\xff\xff\xff"),      // unparsable body
      kHandshake + Request(0, ""),                  // method 0
      Raw(HeaderBytes(0x12345678, 1, 1, 5) + hs_body),  // bad magic
      Raw(HeaderBytes(local::kMagic, 2, 1, 5) + hs_body),  // bad frame version
      Raw(HeaderBytes(local::kMagic, 1, 1, 5) + hs_body),  // a valid handshake, raw
      Raw("short"),                                  // shorter than a header
      Raw(""),                                       // zero-length frame
      kHandshake + Oversized(0),                     // one byte over the limit
      kHandshake + Oversized(8),                     // truncated by the receive buffer
  };
  return seeds;
}

int Feed(const std::string& in) {
  return LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
}

TEST(LocalFrameFuzz, SeedsAndMutationsNeverBreakTheServer) {
  const std::vector<std::string> seeds = Seeds();
  for (const std::string& s : seeds) EXPECT_EQ(Feed(s), 0);
  std::mt19937 rng(24);
  // Seeded mutations for ~3 s (at least 500 inputs, at most 20,000), then random bytes.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  int inputs = 0;
  while (inputs < 20000 && (inputs < 500 || std::chrono::steady_clock::now() < until)) {
    EXPECT_EQ(Feed(MutateBytes(seeds[rng() % seeds.size()], rng, seeds)), 0);
    ++inputs;
  }
  for (int i = 0; i < 300; ++i) {
    std::string in(rng() % 300, '\0');
    for (char& ch : in) ch = static_cast<char>(rng());
    EXPECT_EQ(Feed(in), 0);
  }
  EXPECT_TRUE(LocalFrameFuzzServerAlive());
  // The inputs reached every rule, not only the first check.
  const LocalFrameFuzzStats& st = LocalFrameFuzzStatsForTest();
  EXPECT_GT(st.answers_by_code[0], 100u);   // OK handshakes
  EXPECT_GT(st.answers_by_code[3], 100u);   // INVALID_ARGUMENT: malformed frames
  EXPECT_GT(st.answers_by_code[9], 10u);    // FAILED_PRECONDITION: lookup before handshake, ...
  EXPECT_GT(st.answers_by_code[5] + st.answers_by_code[3], 0u);  // lookups of an unknown codec
  EXPECT_GT(st.closed_by_daemon, 10u);
  EXPECT_GT(st.reserves_ok, 10u);  // Reserve frames that reached the cache and took slots
  std::printf("local frame fuzz: %d mutated inputs, %llu frames, %llu closed by the daemon\n",
              inputs, static_cast<unsigned long long>(st.frames_sent),
              static_cast<unsigned long long>(st.closed_by_daemon));
}

}  // namespace
}  // namespace oscarkv::service
