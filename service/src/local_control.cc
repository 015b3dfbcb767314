#include "local_control.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "local_load_staging.h"
#include "local_staging.h"
#include "oscarkv/service/log.h"
#include "oscarkv/util/sched_slice.h"
#include "oscarkv/v1/local_control.h"

namespace oscarkv::service {

namespace local = ::oscarkv::v1::local;

struct LocalControlServer::Conn {
  int fd = -1;
  bool handshaken = false;
  bool want_out = false;  // waiting for EPOLLOUT: output queued, input paused
  std::deque<std::string> out;
  std::string peer;  // "pid=N uid=N" for logs
  uint32_t uid = 0;  // SO_PEERCRED: its place in conns_per_uid_
  Caller caller;     // who the peer is: the tenant its uid/gid maps to (tenants.h)
  std::unique_ptr<StagingRegion> staging;  // AttachStaging: unmapped when the connection closes
  std::unique_ptr<LoadStagingRegion> load_staging;  // AttachLoadStaging: likewise
};

struct LocalControlServer::Worker {
  int epoll_fd = -1;
  int wake_fd = -1;  // eventfd: Stop()
  std::thread thread;
  absl::Mutex mu;  // conns: inserted by the accepting thread, erased by this worker
  std::vector<Conn*> conns ABSL_GUARDED_BY(mu);
  std::string in;   // one received frame
  std::string out;  // one response frame
  pb::HandshakeRequest handshake_req;
  pb::HandshakeResponse handshake_resp;
  pb::LookupRequest lookup_req;  // reused: cleared messages keep their buffers
  pb::LookupResponse lookup_resp;
  pb::ReleaseRequest release_req;
  pb::ReleaseResponse release_resp;
  pb::AttachStagingRequest attach_req;
  pb::AttachStagingResponse attach_resp;
  pb::StageWriteRequest stage_req;
  pb::StageWriteResponse stage_resp;
  pb::AttachLoadStagingRequest attach_load_req;
  pb::AttachLoadStagingResponse attach_load_resp;
  pb::StageReadRequest stage_read_req;
  pb::StageReadResponse stage_read_resp;
  pb::ReserveRequest reserve_req;
  pb::ReserveResponse reserve_resp;
  alignas(cmsghdr) char control[kFdControlBytes];  // descriptors passed with a frame
};

namespace {

constexpr int kFramesPerWakeup = 64;  // per connection and event, so one client cannot starve
constexpr void* kListenTag = nullptr;

bool SocketLive(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  const bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

// SO_SNDBUF large enough for a kMaxFrameBytes frame (the kernel caps a SEQPACKET frame at the
// sender's buffer); true when granted.
bool SizeSendBuffer(int fd) {
  int want = static_cast<int>(local::kMaxFrameBytes) + 4096;
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want)) != 0) return false;
  int got = 0;
  socklen_t len = sizeof(got);
  if (::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &len) != 0) return false;
  if (got >= want) return true;
  // Below net.core.wmem_max: root may force it.
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof(want)) != 0) return false;
  return ::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &len) == 0 && got >= want;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalControlServer>> LocalControlServer::Start(
    const LocalControlOptions& o, ControlCalls* calls) {
  sockaddr_un addr{};
  if (o.path.empty() || o.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("local socket path '", o.path, "' must be 1..",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  if (o.threads < 1 || o.threads > 64) {
    return absl::InvalidArgumentError("local socket threads must be 1..64");
  }
  if (o.slice_us != 0 && (o.slice_us < 100 || o.slice_us > 100000)) {
    return absl::InvalidArgumentError("local socket slice must be 0 or 100..100000 us");
  }
  struct stat st;
  if (::lstat(o.path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("local socket path ", o.path, " exists and is not a socket"));
    }
    if (SocketLive(o.path)) {
      return absl::UnavailableError(
          absl::StrCat("local socket ", o.path, ": another process is serving on it"));
    }
    ::unlink(o.path.c_str());  // a stale socket of a killed daemon
  }
  std::unique_ptr<LocalControlServer> s(new LocalControlServer);
  s->path_ = o.path;
  s->calls_ = calls;
  s->slice_us_ = o.slice_us;
  s->isolated_pool_ = o.isolated_pool;
  s->staging_max_bytes_ = o.staging_max_bytes;
  s->max_per_uid_ = o.max_connections_per_uid;
  s->listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  // The socket inode's mode becomes the file's mode at bind: no window where others may connect.
  // With tenants mapped by uid/gid, every local user may connect and each peer is decided at
  // accept (SO_PEERCRED); else only the daemon's uid (and root) may.
  const mode_t mode = calls->cache()->tenants().maps_local_peers() ? 0666 : 0600;
  ::fchmod(s->listen_fd_, mode);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, o.path.data(), o.path.size());
  if (::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind local socket ", o.path, ": ", std::strerror(errno)));
  }
  s->stopped_ = false;
  ::chmod(o.path.c_str(), mode);
  if (::listen(s->listen_fd_, 1024) != 0) {
    const int e = errno;
    ::unlink(o.path.c_str());
    return absl::InternalError(absl::StrCat("listen on ", o.path, ": ", std::strerror(e)));
  }
  for (int i = 0; i < o.threads; ++i) {
    auto w = std::make_unique<Worker>();
    w->epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
    w->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->epoll_fd < 0 || w->wake_fd < 0) {
      s->Stop();
      return absl::InternalError(absl::StrCat("epoll/eventfd: ", std::strerror(errno)));
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = w.get();  // the worker itself tags its wake-up fd
    ::epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, w->wake_fd, &ev);
    if (i == 0) {
      ev.data.ptr = kListenTag;
      ::epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, s->listen_fd_, &ev);
    }
    s->workers_.push_back(std::move(w));
  }
  for (auto& w : s->workers_) {
    Worker* wp = w.get();
    LocalControlServer* sp = s.get();
    w->thread = std::thread([sp, wp] { sp->Run(wp); });
  }
  return s;
}

LocalControlServer::~LocalControlServer() { Stop(); }

void LocalControlServer::Stop() {
  if (stopped_.exchange(true)) return;
  for (auto& w : workers_) {
    if (w->wake_fd >= 0) {
      const uint64_t one = 1;
      (void)!::write(w->wake_fd, &one, sizeof(one));
    }
  }
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
  }
  for (auto& w : workers_) {
    absl::MutexLock lock(&w->mu);
    for (Conn* c : w->conns) {
      ::close(c->fd);
      delete c;
    }
    w->conns.clear();
    if (w->epoll_fd >= 0) ::close(w->epoll_fd);
    if (w->wake_fd >= 0) ::close(w->wake_fd);
  }
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    ::unlink(path_.c_str());
  }
}

void LocalControlServer::Run(Worker* w) {
  if (slice_us_ > 0 && !RequestSchedulerSlice(slice_us_)) {
    LogEvent(LogLevel::kDebug, "local_socket_slice_refused",
             {{"slice_us", absl::StrCat(slice_us_)}, {"error", std::strerror(errno)}});
  }
  w->in.resize(local::kMaxFrameBytes + 1);
  epoll_event events[64];
  for (;;) {
    const int n = ::epoll_wait(w->epoll_fd, events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      LogEvent(LogLevel::kError, "local_socket_epoll_failed", {{"error", std::strerror(errno)}});
      return;
    }
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == w) return;  // Stop()
      if (tag == kListenTag) {
        Accept();
        continue;
      }
      Conn* c = static_cast<Conn*>(tag);
      bool keep = true;
      if (events[i].events & EPOLLOUT) keep = Flush(w, c);
      if (keep && (events[i].events & EPOLLIN) && !c->want_out) keep = ServeReadable(w, c);
      if (keep && (events[i].events & (EPOLLERR | EPOLLHUP)) && !(events[i].events & EPOLLIN)) {
        keep = false;
      }
      if (!keep) Close(w, c);
    }
  }
}

namespace {
// One error frame (id 0, as for a refused frame) to a peer about to be closed, so it learns why
// instead of reading EOF. Best effort: the socket is new, its buffer empty, the frame small.
void SendRefusal(int fd, const absl::Status& s) {
  local::ResponseHeader h;
  h.code = static_cast<uint32_t>(s.code());
  const absl::string_view text = s.message().substr(0, 1024);
  h.message_bytes = static_cast<uint32_t>(text.size());
  std::string frame(reinterpret_cast<const char*>(&h), sizeof(h));
  frame.append(text.data(), text.size());
  (void)::send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}
}  // namespace

void LocalControlServer::Accept() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        LogEvent(LogLevel::kWarn, "local_socket_accept_failed", {{"error", std::strerror(errno)}});
      }
      return;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    absl::StatusOr<Caller> caller =
        ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0
            ? absl::PermissionDeniedError("no peer credentials (SO_PEERCRED)")
            : calls_->LocalCallerFor(cred.uid, cred.gid);
    if (!caller.ok()) {
      LogEvent(LogLevel::kWarn, "local_socket_peer_refused",
               {{"uid", absl::StrCat(cred.uid)}, {"gid", absl::StrCat(cred.gid)},
                {"pid", absl::StrCat(cred.pid)}});
      SendRefusal(fd, caller.status());
      ::close(fd);
      continue;
    }
    if (!SizeSendBuffer(fd)) {
      LogEvent(LogLevel::kWarn, "local_socket_buffer_too_small",
               {{"need_bytes", absl::StrCat(local::kMaxFrameBytes)},
                {"hint", "raise net.core.wmem_max; clients fall back to gRPC"}});
      SendRefusal(fd, absl::FailedPreconditionError(
                          "the daemon's kernel grants too small a socket buffer for the local "
                          "socket (raise net.core.wmem_max); use the gRPC address"));
      ::close(fd);
      continue;
    }
    if (max_per_uid_ != 0) {
      absl::MutexLock lock(&uid_mu_);
      uint32_t& held = conns_per_uid_[cred.uid];
      if (held >= max_per_uid_) {
        LogEvent(LogLevel::kWarn, "local_socket_connections_exhausted",
                 {{"uid", absl::StrCat(cred.uid)}, {"pid", absl::StrCat(cred.pid)},
                  {"open", absl::StrCat(held)}});
        SendRefusal(fd, absl::ResourceExhaustedError(absl::StrCat(
                            "uid ", cred.uid, " has ", held, " local-socket connections open, the "
                            "limit (server.local_max_connections_per_uid); close some or use gRPC")));
        ::close(fd);
        continue;
      }
      ++held;
    }
    auto* c = new Conn;
    c->fd = fd;
    c->uid = cred.uid;
    c->peer = absl::StrCat("local pid=", cred.pid, " uid=", cred.uid);
    c->caller = *std::move(caller);
    Worker* w = workers_[next_worker_.fetch_add(1) % workers_.size()].get();
    {
      absl::MutexLock lock(&w->mu);
      w->conns.push_back(c);
    }
    calls_->metrics()->LocalConnection(+1);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = c;
    ::epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  }
}

void LocalControlServer::Close(Worker* w, Conn* c) {
  ::epoll_ctl(w->epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
  ::close(c->fd);
  {
    absl::MutexLock lock(&w->mu);
    auto it = std::find(w->conns.begin(), w->conns.end(), c);
    if (it != w->conns.end()) {
      *it = w->conns.back();
      w->conns.pop_back();
    }
  }
  calls_->metrics()->LocalConnection(-1);
  if (max_per_uid_ != 0) {
    absl::MutexLock lock(&uid_mu_);
    auto it = conns_per_uid_.find(c->uid);
    if (it != conns_per_uid_.end() && --it->second == 0) conns_per_uid_.erase(it);
  }
  delete c;
}

bool LocalControlServer::Send(Worker* w, Conn* c, const char* data, size_t n) {
  if (c->out.empty()) {
    for (;;) {
      const ssize_t r = ::send(c->fd, data, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (r == static_cast<ssize_t>(n)) return true;
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return false;  // EPIPE, ECONNRESET, EMSGSIZE: the connection is done
    }
  }
  // The peer is not reading: keep the frame, stop reading its requests until it drains.
  c->out.emplace_back(data, n);
  if (!c->want_out) {
    c->want_out = true;
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.ptr = c;
    ::epoll_ctl(w->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
  }
  return true;
}

bool LocalControlServer::Flush(Worker* w, Conn* c) {
  while (!c->out.empty()) {
    const std::string& f = c->out.front();
    const ssize_t r = ::send(c->fd, f.data(), f.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (r != static_cast<ssize_t>(f.size())) return false;
    c->out.pop_front();
  }
  c->want_out = false;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = c;
  ::epoll_ctl(w->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
  return true;
}

bool LocalControlServer::Reply(Worker* w, Conn* c, uint16_t method, uint64_t id,
                               const absl::Status& s, const google::protobuf::MessageLite* msg,
                               int fd) {
  local::ResponseHeader h;
  h.method = method;
  h.id = id;
  h.code = static_cast<uint32_t>(s.code());
  const absl::string_view text = s.ok() ? absl::string_view() : s.message();
  h.message_bytes = static_cast<uint32_t>(std::min<size_t>(text.size(), 4096));
  const size_t body = s.ok() && msg != nullptr ? msg->ByteSizeLong() : 0;
  const size_t total = sizeof(h) + h.message_bytes + body;
  if (total > local::kMaxFrameBytes) {
    return Reply(w, c, method, id,
                 absl::ResourceExhaustedError(absl::StrCat(
                     "the answer (", total, " bytes) exceeds the local socket's frame limit of ",
                     local::kMaxFrameBytes, " bytes; send it over gRPC")),
                 nullptr);
  }
  w->out.resize(total);
  char* p = w->out.data();
  std::memcpy(p, &h, sizeof(h));
  if (h.message_bytes > 0) std::memcpy(p + sizeof(h), text.data(), h.message_bytes);
  if (body > 0) {
    msg->SerializeWithCachedSizesToArray(
        reinterpret_cast<uint8_t*>(p + sizeof(h) + h.message_bytes));
  }
  if (fd >= 0) {  // a descriptor cannot wait in the output queue: the answer goes now or never
    return c->out.empty() && SendFrameWithFd(c->fd, w->out.data(), w->out.size(), fd);
  }
  return Send(w, c, w->out.data(), w->out.size());
}

bool LocalControlServer::AttachStaging(Worker* w, Conn* c, uint64_t id, const char* body,
                                       int body_bytes, int passed_fd) {
  const uint16_t method = static_cast<uint16_t>(local::Method::kAttachStaging);
  RpcTimer timer(calls_->metrics(), Rpc::kAttachStaging);
  // Every answer is timed and counted, as a gRPC call is.
  auto answer = [&](const absl::Status& s, const google::protobuf::MessageLite* msg, int fd = -1) {
    (void)timer.Done(s);
    return Reply(w, c, method, id, s, msg, fd);
  };
  w->attach_req.Clear();
  w->attach_resp.Clear();
  if (!w->attach_req.ParseFromArray(body, body_bytes)) {
    if (passed_fd >= 0) ::close(passed_fd);
    // Malformed (local_control.h): id 0, counted, and the connection closes.
    calls_->metrics()->LocalMalformed();
    Reply(w, c, 0, 0, absl::InvalidArgumentError("unparsable AttachStagingRequest"), nullptr);
    return false;
  }
  if (isolated_pool_ == nullptr) {
    if (passed_fd >= 0) ::close(passed_fd);
    return answer(absl::FailedPreconditionError(
                     "this daemon's pool is not isolated (pool.shm_mode: trusted): map "
                     "HandshakeResponse.shm_path instead"),
                 nullptr);
  }
  if (passed_fd < 0) {
    return answer(absl::InvalidArgumentError("AttachStaging carries no staging descriptor"),
                 nullptr);
  }
  auto region = StagingRegion::Map(passed_fd, w->attach_req.staging_bytes(), staging_max_bytes_,
                                   *isolated_pool_);
  if (!region.ok()) return answer(region.status(), nullptr);
  w->attach_resp.set_staging_max_bytes(staging_max_bytes_);
  w->attach_resp.set_reserve_frames(true);
  if (!c->caller.admin) {
    // One arena holds every tenant's pages: a mapping of it would let this tenant read the
    // others'. A tenant stores through its staging and loads through a load staging region
    // (AttachLoadStaging, StageRead) that holds only what it may read.
    c->staging = std::move(*region);
    return answer(absl::OkStatus(), &w->attach_resp);
  }
  auto pool_fd = isolated_pool_->OpenReadOnly();
  if (!pool_fd.ok()) return answer(pool_fd.status(), nullptr);
  c->staging = std::move(*region);
  w->attach_resp.set_pool_bytes(isolated_pool_->size());
  const bool sent = answer(absl::OkStatus(), &w->attach_resp, *pool_fd);
  ::close(*pool_fd);
  return sent;
}

bool LocalControlServer::AttachLoadStaging(Worker* w, Conn* c, uint64_t id, const char* body,
                                           int body_bytes) {
  const uint16_t method = static_cast<uint16_t>(local::Method::kAttachLoadStaging);
  RpcTimer timer(calls_->metrics(), Rpc::kAttachLoadStaging);
  auto answer = [&](const absl::Status& s, const google::protobuf::MessageLite* msg, int fd = -1) {
    (void)timer.Done(s);
    return Reply(w, c, method, id, s, msg, fd);
  };
  w->attach_load_req.Clear();
  w->attach_load_resp.Clear();
  if (!w->attach_load_req.ParseFromArray(body, body_bytes)) {
    // Malformed (local_control.h): id 0, counted, and the connection closes.
    calls_->metrics()->LocalMalformed();
    Reply(w, c, 0, 0, absl::InvalidArgumentError("unparsable AttachLoadStagingRequest"), nullptr);
    return false;
  }
  if (isolated_pool_ == nullptr) {
    return answer(absl::FailedPreconditionError(
                     "this daemon's pool is not isolated (pool.shm_mode: trusted): no load "
                     "staging; use the gRPC data path"),
                 nullptr);
  }
  c->load_staging.reset();  // a second region replaces the first (and frees its slot first)
  auto region = LoadStagingRegion::Create(w->attach_load_req.bytes(), staging_max_bytes_,
                                          &load_limiter_, c->caller.tenant_id);
  if (!region.ok()) return answer(region.status(), nullptr);
  auto fd = (*region)->OpenReadOnly();
  if (!fd.ok()) return answer(fd.status(), nullptr);
  c->load_staging = std::move(*region);
  w->attach_load_resp.set_bytes(c->load_staging->bytes().size());
  const bool sent = answer(absl::OkStatus(), &w->attach_load_resp, *fd);
  ::close(*fd);
  return sent;
}

absl::Status LocalControlServer::Reserve(const Caller& caller, const pb::ReserveRequest& req,
                                         pb::ReserveResponse* resp) {
  RpcTimer t(calls_->metrics(), Rpc::kReserve);
  if (static_cast<uint32_t>(req.items_size()) > local::kMaxReserveItems) {
    return t.Done(absl::InvalidArgumentError(
        absl::StrCat("a Reserve frame holds at most ", local::kMaxReserveItems, " items, not ",
                     req.items_size(), "; reserve larger batches over gRPC")));
  }
  absl::Status s = wire::Reserve(*calls_->cache(), caller, req, resp);
  if (s.ok() && sizeof(local::ResponseHeader) + resp->ByteSizeLong() > local::kMaxFrameBytes) {
    // The answer cannot reach the client: nothing may stay reserved that it was not told of.
    if (resp->reservation_id() != 0) {
      (void)calls_->cache()->Abort(caller, resp->reservation_id());
    }
    s = absl::ResourceExhaustedError(absl::StrCat(
        "the Reserve answer exceeds the local socket's frame limit of ", local::kMaxFrameBytes,
        " bytes; nothing was reserved (reserve over gRPC)"));
  }
  return t.Done(std::move(s));
}

bool LocalControlServer::ServeReadable(Worker* w, Conn* c) {
  Metrics* m = calls_->metrics();
  for (int frame = 0; frame < kFramesPerWakeup && !c->want_out; ++frame) {
    iovec iov{w->in.data(), w->in.size()};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = w->control;
    mh.msg_controllen = sizeof(w->control);
    const ssize_t n = ::recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    // A descriptor the client sent: AttachStaging takes it, any other frame closes it unread.
    int passed_fd = TakeReceivedFd(mh);
    struct FdCloser {
      int* fd;
      ~FdCloser() {
        if (*fd >= 0) ::close(*fd);
      }
    } fd_closer{&passed_fd};
    if (n == 0) return false;  // the client closed
    if (mh.msg_flags & MSG_CTRUNC) {
      m->LocalMalformed();
      Reply(w, c, 0, 0, absl::InvalidArgumentError("too many descriptors with one frame"),
            nullptr);
      return false;
    }
    // local_control.h: a malformed frame gets one INVALID_ARGUMENT answer with method and id
    // 0 -- whatever id its header claims, it is no request the client can match -- and the
    // connection closes, so answers still owed are never mistaken for later ones.
    auto malformed = [&](std::string why) {
      m->LocalMalformed();
      LogEvent(LogLevel::kWarn, "local_socket_bad_frame", {{"peer", c->peer}, {"error", why}});
      Reply(w, c, 0, 0, absl::InvalidArgumentError(why), nullptr);
      return false;  // close: the stream of frames can no longer be trusted
    };
    if ((mh.msg_flags & MSG_TRUNC) || static_cast<size_t>(n) > local::kMaxFrameBytes) {
      return malformed(absl::StrCat("frame over ", local::kMaxFrameBytes, " bytes"));
    }
    if (static_cast<size_t>(n) < sizeof(local::RequestHeader)) {
      return malformed(absl::StrCat("frame of ", n, " bytes is shorter than its header"));
    }
    local::RequestHeader h;
    std::memcpy(&h, w->in.data(), sizeof(h));
    if (h.magic != local::kMagic) return malformed("bad frame magic (not an oscarkv client?)");
    if (h.version != local::kFrameVersion) {
      return malformed(absl::StrCat("frame version ", h.version, ", this daemon speaks ",
                                          local::kFrameVersion));
    }
    const char* body = w->in.data() + sizeof(h);
    const int body_bytes = static_cast<int>(n - static_cast<ssize_t>(sizeof(h)));
    switch (static_cast<local::Method>(h.method)) {
      case local::Method::kHandshake: {
        w->handshake_req.Clear();
        w->handshake_resp.Clear();
        if (!w->handshake_req.ParseFromArray(body, body_bytes)) {
          return malformed("unparsable HandshakeRequest");
        }
        m->RecordLocalCall(Rpc::kHandshake);
        absl::Status s = calls_->Handshake(c->caller, w->handshake_req, &w->handshake_resp, c->peer,
                                         "local");
        if (!Reply(w, c, h.method, h.id, s, &w->handshake_resp)) return false;
        if (!s.ok()) return false;  // wire version mismatch: nothing else can follow
        c->handshaken = true;
        break;
      }
      case local::Method::kLookup: {
        if (!c->handshaken) {
          Reply(w, c, h.method, h.id,
                absl::FailedPreconditionError("Handshake first on a local connection"), nullptr);
          return false;
        }
        w->lookup_req.Clear();
        w->lookup_resp.Clear();
        if (!w->lookup_req.ParseFromArray(body, body_bytes)) {
          return malformed("unparsable LookupRequest");
        }
        m->RecordLocalCall(Rpc::kLookup);
        absl::Status s = calls_->Lookup(c->caller, w->lookup_req, &w->lookup_resp);
        if (s.ok() && sizeof(local::ResponseHeader) + w->lookup_resp.ByteSizeLong() >
                          local::kMaxFrameBytes) {
          // Too big for a frame: undo the pin (the answer never reaches the client).
          if (w->lookup_resp.lease_id() != 0) {
            (void)calls_->cache()->Release(c->caller, w->lookup_resp.lease_id());
          }
        }
        if (!Reply(w, c, h.method, h.id, s, &w->lookup_resp)) return false;
        break;
      }
      case local::Method::kRelease: {
        if (!c->handshaken) {
          Reply(w, c, h.method, h.id,
                absl::FailedPreconditionError("Handshake first on a local connection"), nullptr);
          return false;
        }
        w->release_req.Clear();
        w->release_resp.Clear();
        if (!w->release_req.ParseFromArray(body, body_bytes)) {
          return malformed("unparsable ReleaseRequest");
        }
        m->RecordLocalCall(Rpc::kRelease);
        absl::Status s = calls_->Release(c->caller, w->release_req, &w->release_resp);
        if (!Reply(w, c, h.method, h.id, s, &w->release_resp)) return false;
        break;
      }
      case local::Method::kAttachStaging: {
        if (!c->handshaken) {
          Reply(w, c, h.method, h.id,
                absl::FailedPreconditionError("Handshake first on a local connection"), nullptr);
          return false;
        }
        m->RecordLocalCall(Rpc::kAttachStaging);
        const int fd = passed_fd;
        passed_fd = -1;  // AttachStaging owns it now
        if (!AttachStaging(w, c, h.id, body, body_bytes, fd)) return false;
        break;
      }
      case local::Method::kStageWrite: {
        if (!c->handshaken) {
          Reply(w, c, h.method, h.id,
                absl::FailedPreconditionError("Handshake first on a local connection"), nullptr);
          return false;
        }
        w->stage_req.Clear();
        if (!w->stage_req.ParseFromArray(body, body_bytes)) {
          return malformed("unparsable StageWriteRequest");
        }
        m->RecordLocalCall(Rpc::kStageWrite);
        w->stage_resp.Clear();
        RpcTimer timer(m, Rpc::kStageWrite);
        absl::Status s = StageChunk(*calls_->cache(), c->caller, w->stage_req,
                                    c->staging ? c->staging->bytes() : std::span<const uint8_t>(),
                                    &w->stage_resp);
        s = timer.Done(std::move(s));
        if (!Reply(w, c, h.method, h.id, s, &w->stage_resp)) return false;
        break;
      }
      case local::Method::kAttachLoadStaging: {
        if (!c->handshaken) {
          Reply(w, c, h.method, h.id,
                absl::FailedPreconditionError("Handshake first on a local connection"), nullptr);
          return false;
        }
        m->RecordLocalCall(Rpc::kAttachLoadStaging);
        if (!AttachLoadStaging(w, c, h.id, body, body_bytes)) return false;
        break;
      }
      case local::Method::kStageRead: {
        if (!c->handshaken) {
          Reply(w, c, h.method, h.id,
                absl::FailedPreconditionError("Handshake first on a local connection"), nullptr);
          return false;
        }
        w->stage_read_req.Clear();
        if (!w->stage_read_req.ParseFromArray(body, body_bytes)) {
          return malformed("unparsable StageReadRequest");
        }
        m->RecordLocalCall(Rpc::kStageRead);
        RpcTimer timer(m, Rpc::kStageRead);
        absl::Status s = StageReadChunk(
            *calls_->cache(), c->caller, w->stage_read_req,
            c->load_staging ? c->load_staging->bytes() : std::span<uint8_t>());
        s = timer.Done(std::move(s));
        if (!Reply(w, c, h.method, h.id, s, &w->stage_read_resp)) return false;
        break;
      }
      case local::Method::kReserve: {
        if (!c->handshaken) {
          Reply(w, c, h.method, h.id,
                absl::FailedPreconditionError("Handshake first on a local connection"), nullptr);
          return false;
        }
        w->reserve_req.Clear();
        w->reserve_resp.Clear();
        if (!w->reserve_req.ParseFromArray(body, body_bytes)) {
          return malformed("unparsable ReserveRequest");
        }
        m->RecordLocalCall(Rpc::kReserve);
        if (!Reply(w, c, h.method, h.id, Reserve(c->caller, w->reserve_req, &w->reserve_resp),
                   &w->reserve_resp)) {
          return false;
        }
        break;
      }
      default:
        return malformed(absl::StrCat("unknown method ", h.method));
    }
  }
  return true;
}

}  // namespace oscarkv::service
