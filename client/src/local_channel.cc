#include "local_channel.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "oscarkv/util/sched_slice.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::client {

namespace local = ::oscarkv::v1::local;
namespace pb = ::oscarkv::v1;

namespace {

constexpr int64_t kReaderWakeMs = 100;  // the async reader checks deadlines at least this often
constexpr uint64_t kReaderSliceUs = 100;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SetTimeout(int fd, int opt, int64_t ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv));
}

std::string* FrameBuffer() {
  thread_local std::string buf;
  return &buf;
}
// A receive buffer of one frame plus a byte (to see oversize frames), not zero-filled: only the
// bytes a frame writes are ever touched.
struct RecvBuf {
  std::unique_ptr<char[]> data{new char[local::kMaxFrameBytes + 1]};
  size_t size() const { return local::kMaxFrameBytes + 1; }
};
RecvBuf* RecvBuffer() {
  thread_local RecvBuf buf;
  return &buf;
}

// Serializes a request frame into *out (header id filled in later by PatchId when needed).
absl::Status BuildFrame(local::Method method, uint64_t id, const google::protobuf::MessageLite& m,
                        std::string* out) {
  const size_t body = m.ByteSizeLong();
  if (sizeof(local::RequestHeader) + body > local::kMaxFrameBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("request of ", body,
                                                     " bytes exceeds the local frame limit"));
  }
  local::RequestHeader h;
  h.method = static_cast<uint16_t>(method);
  h.id = id;
  out->resize(sizeof(h) + body);
  std::memcpy(out->data(), &h, sizeof(h));
  m.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out->data() + sizeof(h)));
  return absl::OkStatus();
}

absl::Status SendAll(int fd, const std::string& frame) {
  for (;;) {
    const ssize_t r = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    if (r == static_cast<ssize_t>(frame.size())) return absl::OkStatus();
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return absl::DeadlineExceededError("oscarkvd's local socket is not taking requests");
    }
    return absl::UnavailableError(
        absl::StrCat("local socket send: ", r < 0 ? std::strerror(errno) : "short send"));
  }
}

struct Frame {
  local::ResponseHeader h;
  const char* message = nullptr;
  const char* body = nullptr;
  size_t body_bytes = 0;
};

// Receives one response frame into *buf. EAGAIN (SO_RCVTIMEO) is DEADLINE_EXCEEDED.
absl::StatusOr<Frame> RecvFrame(int fd, RecvBuf* buf) {
  ssize_t n;
  do {
    n = ::recv(fd, buf->data.get(), buf->size(), MSG_TRUNC);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return absl::DeadlineExceededError("no answer from oscarkvd's local socket in time");
  }
  if (n < 0) {
    return absl::UnavailableError(absl::StrCat("local socket recv: ", std::strerror(errno)));
  }
  if (n == 0) return absl::UnavailableError("oscarkvd closed the local connection");
  if (static_cast<size_t>(n) > buf->size() - 1) {
    return absl::InternalError(absl::StrCat("oscarkvd sent a ", n, "-byte local frame"));
  }
  Frame f;
  if (static_cast<size_t>(n) < sizeof(f.h)) {
    return absl::InternalError("oscarkvd sent a local frame shorter than its header");
  }
  std::memcpy(&f.h, buf->data.get(), sizeof(f.h));
  if (f.h.magic != local::kMagic || f.h.version != local::kFrameVersion ||
      sizeof(f.h) + size_t{f.h.message_bytes} > static_cast<size_t>(n)) {
    return absl::InternalError("oscarkvd sent a malformed local frame");
  }
  f.message = buf->data.get() + sizeof(f.h);
  f.body = f.message + f.h.message_bytes;
  f.body_bytes = static_cast<size_t>(n) - sizeof(f.h) - f.h.message_bytes;
  return f;
}

absl::Status FrameStatus(const Frame& f, const char* what) {
  if (f.h.code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(f.h.code),
                      absl::StrCat(what, ": ", absl::string_view(f.message, f.h.message_bytes)));
}

absl::Status Prefixed(const absl::Status& s, const char* what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// The reader thread asks for a short scheduler time slice (oscarkv/util/sched_slice.h): it runs
// microseconds per answer, and a short slice lets it run ahead of CPU-bound threads sharing the
// cores (the daemon's epoll threads do the same, oscarkvd --local-slice-us).
void RequestShortSlice() { (void)RequestSchedulerSlice(kReaderSliceUs); }  // best effort

}  // namespace

absl::StatusOr<int> LocalChannel::Dial(int64_t recv_timeout_ms, std::string* tenant) {
  sockaddr_un addr{};
  if (path_.empty() || path_.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad local socket path '", path_, "'"));
  }
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  auto fail = [fd](absl::Status s) {
    ::close(fd);
    return s;
  };
  int want = static_cast<int>(local::kMaxFrameBytes) + 4096, got = 0;
  socklen_t len = sizeof(got);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
  if (::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &len) != 0 || got < want) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "the kernel grants a ", got, "-byte socket buffer, the local socket needs ", want,
        " (raise net.core.wmem_max)")));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.data(), path_.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    // Once open, the socket of this instance gone means the daemon is (or was) down.
    if (errno == ENOENT || errno == ECONNREFUSED) stale_.store(true, std::memory_order_relaxed);
    return fail(absl::UnavailableError(
        absl::StrCat("cannot connect to ", path_, ": ", std::strerror(errno))));
  }
  SetTimeout(fd, SO_RCVTIMEO, timeout_ms_);
  SetTimeout(fd, SO_SNDTIMEO, timeout_ms_);
  pb::HandshakeRequest req;
  req.set_wire_version(pb::WIRE_VERSION_1);
  req.set_client_name(client_name_);
  std::string frame;
  if (absl::Status s = BuildFrame(local::Method::kHandshake, 1, req, &frame); !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = SendAll(fd, frame); !s.ok()) return fail(s);
  auto f = RecvFrame(fd, RecvBuffer());
  if (!f.ok()) return fail(f.status());
  if (absl::Status s = FrameStatus(*f, "local handshake"); !s.ok()) return fail(s);
  pb::HandshakeResponse resp;
  if (f->h.id != 1 || !resp.ParseFromArray(f->body, static_cast<int>(f->body_bytes))) {
    return fail(absl::InternalError("local handshake: malformed answer"));
  }
  if (resp.wire_version() != pb::WIRE_VERSION_1) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "local socket ", path_, " speaks wire version ", resp.wire_version())));
  }
  if (instance_ != 0 && resp.instance_id() != instance_) {
    // The daemon was restarted (or another one took the path): this channel can never be used
    // again; the Client reconnects on its next call (Stale()).
    // Open's first dial (the one that learns the tenant) is told of a mismatch for good.
    if (tenant != nullptr) {
      return fail(absl::FailedPreconditionError(absl::StrCat(
          "local socket ", path_, " belongs to another oscarkvd than the one at the gRPC address")));
    }
    stale_.store(true, std::memory_order_relaxed);
    return fail(absl::UnavailableError(absl::StrCat(
        "local socket ", path_, " now belongs to another oscarkvd instance than the one this "
        "client connected to (restarted?): the next call reconnects")));
  }
  if (recv_timeout_ms != timeout_ms_) SetTimeout(fd, SO_RCVTIMEO, recv_timeout_ms);
  if (tenant != nullptr) *tenant = resp.tenant();
  return fd;
}

absl::StatusOr<std::shared_ptr<LocalChannel>> LocalChannel::Open(const std::string& path,
                                                                 const std::string& client_name,
                                                                 uint64_t expect_instance,
                                                                 int64_t timeout_ms, bool shared) {
  static std::mutex registry_mu;
  static auto* registry =
      new std::map<std::pair<std::string, uint64_t>, std::weak_ptr<LocalChannel>>();
  const auto key = std::make_pair(path, expect_instance);
  std::lock_guard<std::mutex> lock(registry_mu);
  if (shared) {
    auto it = registry->find(key);
    if (it != registry->end()) {
      if (auto ch = it->second.lock()) return ch;
      registry->erase(it);
    }
  }
  std::shared_ptr<LocalChannel> ch(
      new LocalChannel(path, client_name, expect_instance, timeout_ms));
  // Proves the path works; becomes the first idle connection.
  auto fd = ch->Dial(timeout_ms, &ch->tenant_);
  if (!fd.ok()) return fd.status();
  ch->PutIdle(*fd);
  if (shared) (*registry)[key] = ch;
  return ch;
}

LocalChannel::~LocalChannel() {
  std::vector<std::thread> readers;
  {
    std::lock_guard<std::mutex> s(send_mu_);
    std::lock_guard<std::mutex> a(async_mu_);
    closing_ = true;
    if (async_fd_ >= 0) ::shutdown(async_fd_, SHUT_RDWR);
    readers.swap(readers_);
  }
  for (auto& t : readers) t.join();
  std::lock_guard<std::mutex> s(send_mu_);
  std::lock_guard<std::mutex> a(async_mu_);
  if (async_fd_ >= 0) ::close(async_fd_);
  for (int fd : dead_fds_) ::close(fd);
  std::lock_guard<std::mutex> i(idle_mu_);
  for (int fd : idle_) ::close(fd);
}

int LocalChannel::TakeIdle() {
  std::lock_guard<std::mutex> lock(idle_mu_);
  if (idle_.empty()) return -1;
  const int fd = idle_.back();
  idle_.pop_back();
  return fd;
}

void LocalChannel::PutIdle(int fd) {
  std::lock_guard<std::mutex> lock(idle_mu_);
  idle_.push_back(fd);
}

absl::Status LocalChannel::Call(local::Method method, const google::protobuf::MessageLite& req,
                                google::protobuf::MessageLite* resp, const char* what) {
  thread_local uint64_t next_id = 0;
  const uint64_t id = ++next_id;
  std::string* frame = FrameBuffer();
  if (absl::Status s = BuildFrame(method, id, req, frame); !s.ok()) return Prefixed(s, what);
  int fd = TakeIdle();
  const bool pooled = fd >= 0;
  if (fd < 0) {
    auto d = Dial(timeout_ms_);
    if (!d.ok()) return Prefixed(d.status(), what);
    fd = *d;
  }
  auto exchange = [&](int conn) -> absl::StatusOr<Frame> {
    if (absl::Status sent = SendAll(conn, *frame); !sent.ok()) return sent;
    return RecvFrame(conn, RecvBuffer());
  };
  absl::StatusOr<Frame> f = exchange(fd);
  if (!f.ok() && pooled && absl::IsUnavailable(f.status())) {
    // An idle connection the daemon closed (it stopped, or was restarted: the dial below then
    // finds another instance and marks this channel stale). Nothing was answered on it, so the
    // call goes once more on a new connection.
    ::close(fd);
    auto d = Dial(timeout_ms_);
    if (!d.ok()) return Prefixed(d.status(), what);
    fd = *d;
    f = exchange(fd);
  }
  if (!f.ok()) {
    ::close(fd);  // a late answer must never be read as the next call's
    return Prefixed(f.status(), what);
  }
  if (f->h.id != id || f->h.method != static_cast<uint16_t>(method)) {
    ::close(fd);
    // The daemon refused the frame itself (id 0): its message says why.
    if (f->h.code != 0) return FrameStatus(*f, what);
    return absl::InternalError(absl::StrCat(what, ": local answer to another request"));
  }
  PutIdle(fd);
  if (absl::Status s = FrameStatus(*f, what); !s.ok()) return s;
  if (!resp->ParseFromArray(f->body, static_cast<int>(f->body_bytes))) {
    return absl::InternalError(absl::StrCat(what, ": unparsable local answer"));
  }
  return absl::OkStatus();
}

void LocalChannel::CallAsync(local::Method method, const google::protobuf::MessageLite& req,
                             const char* what, Done done) {
  std::string* frame = FrameBuffer();
  if (absl::Status s = BuildFrame(method, 0, req, frame); !s.ok()) {
    done(Prefixed(s, what), nullptr, 0);
    return;
  }
  std::unique_lock<std::mutex> send_lock(send_mu_);
  int fd;
  {
    std::lock_guard<std::mutex> lock(async_mu_);
    fd = async_fd_;
    if (closing_) {
      send_lock.unlock();
      done(absl::CancelledError("the client is shutting down"), nullptr, 0);
      return;
    }
  }
  if (fd < 0) {
    {
      std::lock_guard<std::mutex> lock(async_mu_);
      for (int dead : dead_fds_) ::close(dead);  // no sender uses them: we hold send_mu_
      dead_fds_.clear();
    }
    auto d = Dial(kReaderWakeMs);
    if (!d.ok()) {
      send_lock.unlock();
      done(Prefixed(d.status(), what), nullptr, 0);
      return;
    }
    fd = *d;
    std::lock_guard<std::mutex> lock(async_mu_);
    async_fd_ = fd;
    readers_.emplace_back([this, fd] { ReadLoop(fd); });
  }
  const uint64_t id = next_id_++;
  local::RequestHeader h;
  std::memcpy(&h, frame->data(), sizeof(h));
  h.id = id;
  std::memcpy(frame->data(), &h, sizeof(h));
  {
    std::lock_guard<std::mutex> lock(async_mu_);
    pending_.push_back({id, NowNs() + timeout_ms_ * 1000000, what, std::move(done)});
  }
  if (absl::Status s = SendAll(fd, *frame); !s.ok()) {
    // The connection is unusable: the reader sees it end and fails every pending call.
    ::shutdown(fd, SHUT_RDWR);
  }
}

void LocalChannel::FailPending(int fd, const absl::Status& s) {
  std::deque<Pending> failed;
  {
    std::lock_guard<std::mutex> lock(async_mu_);
    if (async_fd_ == fd) async_fd_ = -1;
    dead_fds_.push_back(fd);
    failed.swap(pending_);
  }
  for (Pending& p : failed) p.done(Prefixed(s, p.what), nullptr, 0);
}

void LocalChannel::ReadLoop(int fd) {
  RequestShortSlice();
  RecvBuf buf;
  std::vector<Pending> expired;
  for (;;) {
    auto f = RecvFrame(fd, &buf);
    if (!f.ok() && !absl::IsDeadlineExceeded(f.status())) {
      FailPending(fd, f.status());
      return;
    }
    Pending done{0, 0, "", nullptr};
    bool protocol_error = false;
    const int64_t now = NowNs();
    {
      std::lock_guard<std::mutex> lock(async_mu_);
      if (f.ok() && !pending_.empty()) {
        if (f->h.id == pending_.front().id) {
          done = std::move(pending_.front());
          pending_.pop_front();
        } else if (f->h.id > pending_.front().id || f->h.id == 0) {
          protocol_error = true;  // answers come in order; id 0: the daemon refused a frame
        }  // else: the late answer of a call that already timed out
      }
      while (!pending_.empty() && pending_.front().deadline_ns < now) {
        expired.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
    }
    if (done.done) {
      done.done(FrameStatus(*f, done.what), f->h.code == 0 ? f->body : nullptr,
                f->h.code == 0 ? f->body_bytes : 0);
    }
    for (Pending& p : expired) {
      p.done(absl::DeadlineExceededError(
                 absl::StrCat(p.what, ": no answer from oscarkvd's local socket in time")),
             nullptr, 0);
    }
    expired.clear();
    if (protocol_error) {
      ::shutdown(fd, SHUT_RDWR);
      FailPending(fd, f->h.code != 0 ? absl::Status(static_cast<absl::StatusCode>(f->h.code),
                                                    absl::string_view(f->message, f->h.message_bytes))
                                     : absl::InternalError("local answer out of order"));
      return;
    }
  }
}

}  // namespace oscarkv::client
