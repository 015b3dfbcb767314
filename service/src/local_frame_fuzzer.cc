// libFuzzer target for the same-host control socket's framing (proto/oscarkv/v1/local_control.h,
// served by local_control.cc). A real LocalControlServer runs in this process on a socket under
// /tmp; each input becomes the frames one client sends on a fresh connection, one at a time,
// each followed by reading its answer. Checked on every answer: exactly one response frame per
// request (or the daemon closes the connection; it never hangs: 5 s bound), a well-formed
// header (magic, version, message_bytes within the frame, a status code), OK answers carry the
// request's method and id and a body that parses, error answers carry no body. The server
// must survive everything; the fuzz test then checks a fresh connection is still served.
//
// Input: records until the input ends (at most 64):
//   op & 3 == 0  raw frame: u16 length (LE) + that many bytes, sent as they are
//   op & 3 == 1  request: method byte + u16 length + body bytes under a valid header
//   op & 3 == 2  a valid Handshake (wire version 1), so later frames get past the gate
//   op & 3 == 3  oversized: kMaxFrameBytes + 1 + next byte * 1024 bytes of a valid header
//
// Built as a libFuzzer binary with clang (service_local_frame_fuzzer; scripts/fuzz.sh); every
// build runs this entry point over seeds and mutations of them (local_frame_fuzz_test.cc).
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "control_calls.h"
#include "local_control.h"
#include "local_frame_fuzzer.h"
#include "oscarkv/service/log.h"
#include "oscarkv/service/metrics.h"
#include "oscarkv/service/page_cache.h"
#include "oscarkv/v1/local_control.h"
#include "test_pages.h"

namespace oscarkv::service {
namespace {

namespace local = ::oscarkv::v1::local;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "local_frame_fuzzer: %s\n", what);
    __builtin_trap();
  }
}

struct FuzzServer {
  FakeClock clock;
  std::unique_ptr<PagePool> pool;
  std::unique_ptr<PageCache> cache;
  Metrics metrics;
  std::unique_ptr<ControlCalls> calls;
  std::unique_ptr<LocalControlServer> server;
  std::string path;
  std::string buf;  // one answer
  std::string codec_id;  // of the registered TinyProfile
  LocalFrameFuzzStats stats;

  FuzzServer() {
    (void)SetLogLevel("error");  // a warning per malformed frame would be most of the run time
    PagePoolOptions po;
    po.chunk_bytes = 64 << 10;
    pool = std::move(*PagePool::Create(std::move(*CreateHeapArena(2 << 20)), po));
    CacheOptions co;
    co.max_batch = 64;
    co.index_shards = 4;
    cache = std::make_unique<PageCache>(pool.get(), &clock, co);
    calls = std::make_unique<ControlCalls>(cache.get(), &metrics);
    // A codec, so Reserve frames that name it get past the codec check and take slots.
    auto codec = cache->RegisterCodec(Caller{}, testing::ToProfile(testing::TinyProfile()));
    Check(codec.ok(), "cannot register the fuzz codec");
    codec_id.assign(reinterpret_cast<const char*>(codec->id.bytes.data()), codec->id.bytes.size());
    path = "/tmp/oscarkv-frame-fuzz-" + std::to_string(::getpid()) + ".sock";
    LocalControlOptions lo;
    lo.path = path;
    lo.slice_us = 0;
    // Isolated, so the shared-memory frames (AttachStaging, StageWrite, AttachLoadStaging,
    // StageRead, Reserve) are parsed and checked too; small regions keep each input cheap.
    lo.isolated_pool = &pool->arena();
    lo.staging_max_bytes = 1 << 20;
    auto s = LocalControlServer::Start(lo, calls.get());
    Check(s.ok(), "cannot start the local control server");
    server = std::move(*s);
    buf.resize(local::kMaxFrameBytes + 1);
  }

  int Dial() const {
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    Check(fd >= 0, "socket");
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
    Check(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, "connect");
    // Room for an oversized frame (root may exceed wmem_max), and no endless blocking send.
    int want = static_cast<int>(local::kMaxFrameBytes) * 2 + 65536;
    if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof(want)) != 0) {
      (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
    }
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    return fd;
  }

  // Sends `frame`; reads its answer. False when the connection is over (closed by the daemon,
  // or a frame the kernel would not send).
  bool Exchange(int fd, const std::string& frame) {
    const ssize_t sent = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    if (sent < 0) return false;  // EPIPE after the daemon closed; EMSGSIZE past our buffer
    Check(static_cast<size_t>(sent) == frame.size(), "a SEQPACKET send was split");
    ++stats.frames_sent;
    pollfd p{fd, POLLIN, 0};
    Check(::poll(&p, 1, 5000) == 1, "no answer within 5 s (the daemon hangs)");
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_TRUNC);
    if (n <= 0) {
      ++stats.closed_by_daemon;
      return false;
    }
    Check(static_cast<size_t>(n) <= local::kMaxFrameBytes, "answer over the frame limit");
    Check(static_cast<size_t>(n) >= sizeof(local::ResponseHeader), "answer shorter than a header");
    local::ResponseHeader h;
    std::memcpy(&h, buf.data(), sizeof(h));
    Check(h.magic == local::kMagic && h.version == local::kFrameVersion, "answer header");
    Check(h.code <= 16, "answer code is not a status code");
    Check(sizeof(h) + uint64_t{h.message_bytes} <= static_cast<uint64_t>(n), "message_bytes");
    ++stats.answers_by_code[h.code];
    const char* body = buf.data() + sizeof(h) + h.message_bytes;
    const int body_bytes = static_cast<int>(n - sizeof(h) - h.message_bytes);
    if (h.code != 0) {
      Check(body_bytes == 0, "an error answer carries a body");
      return true;
    }
    // An OK answer is for a well-formed request: its method, its id, a body that parses.
    local::RequestHeader q;
    Check(frame.size() >= sizeof(q), "OK answer to a frame shorter than a header");
    std::memcpy(&q, frame.data(), sizeof(q));
    Check(h.method == q.method && h.id == q.id, "OK answer with another method or id");
    bool parsed = false;
    switch (static_cast<local::Method>(h.method)) {
      case local::Method::kHandshake: {
        pb::HandshakeResponse r;
        parsed = r.ParseFromArray(body, body_bytes);
        break;
      }
      case local::Method::kLookup: {
        pb::LookupResponse r;
        parsed = r.ParseFromArray(body, body_bytes);
        break;
      }
      case local::Method::kRelease: {
        pb::ReleaseResponse r;
        parsed = r.ParseFromArray(body, body_bytes);
        break;
      }
      case local::Method::kAttachStaging: {
        pb::AttachStagingResponse r;
        parsed = r.ParseFromArray(body, body_bytes);
        break;
      }
      case local::Method::kStageWrite: {
        pb::StageWriteResponse r;
        parsed = r.ParseFromArray(body, body_bytes);
        break;
      }
      case local::Method::kAttachLoadStaging: {
        pb::AttachLoadStagingResponse r;
        parsed = r.ParseFromArray(body, body_bytes) && r.bytes() > 0 && r.bytes() <= (1 << 20);
        break;
      }
      case local::Method::kStageRead: {
        pb::StageReadResponse r;
        parsed = r.ParseFromArray(body, body_bytes);
        break;
      }
      case local::Method::kReserve: {
        // One result per item of the request, and a reservation id when any slot was given.
        pb::ReserveResponse r;
        pb::ReserveRequest q;
        parsed = r.ParseFromArray(body, body_bytes) &&
                 q.ParseFromArray(frame.data() + sizeof(local::RequestHeader),
                                  static_cast<int>(frame.size() - sizeof(local::RequestHeader)));
        if (parsed) {
          Check(r.results_size() == q.items_size(), "Reserve: a result count != item count");
          bool any_slot = false;
          for (const auto& res : r.results()) any_slot |= res.status().code() == 0;
          Check(!any_slot || r.reservation_id() != 0, "Reserve: slots without a reservation");
          ++stats.reserves_ok;
        }
        break;
      }
      default:
        parsed = false;
    }
    Check(parsed, "OK answer whose body does not parse as that method's response");
    return true;
  }
};

// Lives for the process; at exit the server stops and removes its socket file.
FuzzServer* Server() {
  static FuzzServer* s = [] {
    auto* f = new FuzzServer;
    std::atexit([] { Server()->server->Stop(); });
    return f;
  }();
  return s;
}

std::string Header(uint16_t method, uint64_t id) {
  local::RequestHeader h;
  h.method = method;
  h.id = id;
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

std::string ValidHandshake(uint64_t id) {
  pb::HandshakeRequest r;
  r.set_wire_version(pb::WIRE_VERSION_1);
  r.set_client_name("fuzz");
  return Header(static_cast<uint16_t>(local::Method::kHandshake), id) + r.SerializeAsString();
}

}  // namespace

LocalFrameFuzzStats& LocalFrameFuzzStatsForTest() { return Server()->stats; }
std::string LocalFrameFuzzCodecId() { return Server()->codec_id; }

bool LocalFrameFuzzServerAlive() {
  FuzzServer* s = Server();
  const int fd = s->Dial();
  const uint64_t ok_before = s->stats.answers_by_code[0];
  const bool answered = s->Exchange(fd, ValidHandshake(77));
  ::close(fd);
  return answered && s->stats.answers_by_code[0] == ok_before + 1;
}

}  // namespace oscarkv::service

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace oscarkv::service;
  namespace local = ::oscarkv::v1::local;
  FuzzServer* s = Server();
  // Past every reservation's deadline: what earlier inputs reserved (and never committed) is
  // reclaimed, so the pool does not stay full of them.
  s->clock.Advance(10 * 60 * 1000);
  s->cache->Reap();
  const int fd = s->Dial();
  size_t at = 0;
  uint64_t id = 1;
  auto u16 = [&]() -> size_t {
    if (at + 2 > size) {
      at = size;
      return 0;
    }
    const size_t v = data[at] | (size_t{data[at + 1]} << 8);
    at += 2;
    return v;
  };
  auto bytes = [&](size_t n) {
    n = std::min(n, size - at);
    std::string out(reinterpret_cast<const char*>(data + at), n);
    at += n;
    return out;
  };
  bool oversized_done = false;  // one 384 KiB frame per input is plenty
  for (int record = 0; record < 64 && at < size; ++record) {
    const uint8_t op = data[at++];
    std::string frame;
    switch (op & 3) {
      case 0:
        frame = bytes(u16());
        break;
      case 1: {
        const uint16_t method = at < size ? data[at++] : 0;
        frame = Header(method, id++);
        frame += bytes(u16());
        break;
      }
      case 2:
        frame = ValidHandshake(id++);
        break;
      default: {
        if (oversized_done) continue;
        oversized_done = true;
        const size_t extra = at < size ? size_t{data[at++]} * 1024 : 0;
        frame = Header(static_cast<uint16_t>(local::Method::kLookup), id++);
        frame.resize(local::kMaxFrameBytes + 1 + extra, 'x');
        break;
      }
    }
    if (!s->Exchange(fd, frame)) break;
  }
  ::close(fd);
  return 0;
}
