// libFuzzer target for request validation: every input is one request to one PageCache method
// through the front ends' wire translation (cache_wire.h: the code behind each RPC), decoded
// from the bytes a client would send. Byte 0 picks the
// method and a few knobs; the rest is the serialized request message. The cache must never
// crash, and per-item responses must match their requests one-to-one.
//
// Built as a libFuzzer binary with clang (service_request_fuzzer); every build also runs this
// entry point over thousands of random and mutated-valid inputs (request_fuzz_test.cc).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "google/protobuf/stubs/logging.h"
#include "cache_wire.h"
#include "oscarkv/service/page_cache.h"

namespace {

using namespace oscarkv;
using namespace oscarkv::service;

struct FuzzState {
  FakeClock clock;
  std::unique_ptr<PagePool> pool;
  std::unique_ptr<PageCache> cache;
  std::string codec;
  // Ids below 4 in a request stand for the last reservation / lease the fuzzer created, so
  // mutated inputs reach Commit, WritePages and ReadPages on live objects.
  uint64_t last_reservation = 0;
  uint64_t last_lease = 0;
  FuzzState() {
    // Invalid UTF-8 in string fields makes parsing fail, as it should; don't log each one.
    google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                       const std::string&) {});
    PagePoolOptions po;
    po.chunk_bytes = 64 << 10;
    pool = std::move(*PagePool::Create(std::move(*CreateHeapArena(2 << 20)), po));
    CacheOptions co;
    co.max_batch = 64;
    co.index_shards = 4;
    co.default_lease_ms = 100;
    co.max_lease_ms = 1000;
    co.reservation_ttl_ms = 100;
    co.max_reservation_ttl_ms = 1000;
    cache = std::make_unique<PageCache>(pool.get(), &clock, co);
    pb::RegisterCodecRequest req;
    auto* p = req.mutable_profile();
    p->set_model_id("fuzz");
    p->set_num_layers(1);
    p->set_num_kv_heads(1);
    p->set_tp_size(1);
    p->set_head_dim(64);
    p->set_page_tokens(16);
    p->set_group_size(32);
    p->set_scale_dtype(1);
    pb::RegisterCodecResponse resp;
    if (!wire::RegisterCodec(*cache, Caller{}, req, &resp).ok()) std::abort();
    codec = resp.codec_id();
  }
};

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void CheckItems(const absl::Status& s, int want, int got) {
  Check(static_cast<int>(s.code()) >= 0 && static_cast<int>(s.code()) <= 16);
  if (s.ok()) Check(want == got);
}

FuzzState* State() {
  static FuzzState* st = new FuzzState;
  return st;
}

}  // namespace

namespace oscarkv::service {
// For request_fuzz_test.cc: shows how deep the inputs reached.
const PageCache& FuzzCacheForTest() { return *State()->cache; }
}  // namespace oscarkv::service

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzState* st = State();
  if (size == 0) return 0;
  const uint8_t op = data[0];
  const bool use_codec = (op & 0x80) != 0;  // swap in the registered codec id
  const char* body = reinterpret_cast<const char*>(data + 1);
  const int n = static_cast<int>(size - 1);
  PageCache& c = *st->cache;
  const Caller caller;
  switch (op & 0x0F) {
    case 0: {
      pb::HandshakeRequest r;
      pb::HandshakeResponse out;
      if (r.ParseFromArray(body, n)) (void)wire::Handshake(c, caller, r, &out);
      break;
    }
    case 1: {
      pb::RegisterCodecRequest r;
      pb::RegisterCodecResponse out;
      if (r.ParseFromArray(body, n)) (void)wire::RegisterCodec(c, caller, r, &out);
      break;
    }
    case 2: {
      pb::LookupRequest r;
      pb::LookupResponse out;
      if (!r.ParseFromArray(body, n)) break;
      if (use_codec) r.set_codec_id(st->codec);
      absl::Status s = wire::Lookup(c, caller, r, &out);
      if (out.lease_id() != 0) st->last_lease = out.lease_id();
      if (s.ok()) {
        Check(out.matched() <= static_cast<uint32_t>(r.keys_size()));
        Check(out.pages_size() == (r.pin() ? static_cast<int>(out.matched()) : 0));
      }
      break;
    }
    case 3: {
      pb::ReserveRequest r;
      pb::ReserveResponse out;
      if (!r.ParseFromArray(body, n)) break;
      if (use_codec) r.set_codec_id(st->codec);
      absl::Status s = wire::Reserve(c, caller, r, &out);
      CheckItems(s, r.items_size(), out.results_size());
      if (out.reservation_id() != 0) st->last_reservation = out.reservation_id();
      break;
    }
    case 4: {
      pb::CommitRequest r;
      pb::CommitResponse out;
      if (!r.ParseFromArray(body, n)) break;
      if (r.reservation_id() < 4) r.set_reservation_id(st->last_reservation);
      absl::Status s = wire::Commit(c, caller, r, &out);
      if (s.ok() && r.keys_size() > 0) Check(out.results_size() == r.keys_size());
      break;
    }
    case 5: {
      pb::AbortRequest r;
      pb::AbortResponse out;
      if (!r.ParseFromArray(body, n)) break;
      if (r.reservation_id() < 4) r.set_reservation_id(st->last_reservation);
      Check(wire::Abort(c, caller, r, &out).ok());
      break;
    }
    case 6: {
      pb::WriteChunk r;
      if (!r.ParseFromArray(body, n)) break;
      if (r.reservation_id() < 4) r.set_reservation_id(st->last_reservation);
      absl::StatusOr<uint64_t> written = wire::WriteChunk(c, caller, r);
      if (written.ok()) Check(*written == r.data().size());
      break;
    }
    case 7: {
      pb::ReadRequest r;
      if (!r.ParseFromArray(body, n)) break;
      if (r.lease_id() < 4) r.set_lease_id(st->last_lease);
      auto plan = wire::PrepareRead(c, caller, r);
      if (plan.ok()) {
        uint64_t sum = 0;
        for (const auto& p : (*plan)->pages()) sum += p.data[0] + p.data[p.bytes - 1];
        (void)sum;
      }
      break;
    }
    case 8: {
      pb::ReleaseRequest r;
      pb::ReleaseResponse out;
      if (!r.ParseFromArray(body, n)) break;
      if (r.lease_id() < 4) r.set_lease_id(st->last_lease);
      Check(wire::Release(c, caller, r, &out).ok());
      break;
    }
    case 9: {
      pb::RenewLeaseRequest r;
      pb::RenewLeaseResponse out;
      if (!r.ParseFromArray(body, n)) break;
      if (r.lease_id() < 4) r.set_lease_id(st->last_lease);
      (void)wire::RenewLease(c, caller, r, &out);
      break;
    }
    case 10: {
      pb::DeleteRequest r;
      pb::DeleteResponse out;
      if (!r.ParseFromArray(body, n)) break;
      if (use_codec) r.set_codec_id(st->codec);
      absl::Status s = wire::Delete(c, caller, r, &out);
      CheckItems(s, r.keys_size(), out.results_size());
      break;
    }
    case 11: {
      pb::ClearRequest r;
      pb::ClearResponse out;
      if (!r.ParseFromArray(body, n)) break;
      if (use_codec) r.set_codec_id(st->codec);
      (void)wire::Clear(c, caller, r, &out);
      break;
    }
    case 12: {
      pb::StatsRequest r;
      pb::StatsResponse out;
      if (r.ParseFromArray(body, n)) Check(wire::Stats(c, caller, r, &out).ok());
      Check(out.pool_used_bytes() <= out.pool_bytes());
      break;
    }
    default:
      // Time passes; expired leases and reservations are reclaimed.
      st->clock.Advance(n > 0 ? data[1] * 4 : 50);
      c.Reap();
      break;
  }
  // Accounting never goes negative (gauges are signed internally to catch underflow).
  const CacheCounters& k = c.counters();
  Check(k.pages.load() >= 0 && k.reserved_pages.load() >= 0 && k.pinned_pages.load() >= 0 &&
        k.leases.load() >= 0);
  Check(st->pool->bytes_used() <= st->pool->capacity_bytes());
  return 0;
}
