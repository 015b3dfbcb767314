// Speaking the daemon's same-host control socket by hand (frames: proto/oscarkv/v1/
// local_control.h) in tests against the real oscarkvd: dial, build a request frame, send it and
// receive one answer. Shared by daemon_local_socket_test.cc and daemon_local_reserve_test.cc.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "google/protobuf/message_lite.h"
#include "gtest/gtest.h"
#include "oscarkv/v1/local_control.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::service::testing {

namespace lc = ::oscarkv::v1::local;

// A SOCK_SEQPACKET connection to `path` with a 5 s receive timeout; -1 when nothing serves it.
inline int DialLocal(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// A request frame: the header for (`m`, `id`) followed by `body` (a serialized message, or any
// bytes a test wants the daemon to refuse).
inline std::string RawFrame(lc::Method m, uint64_t id, const std::string& body) {
  lc::RequestHeader h;
  h.method = static_cast<uint16_t>(m);
  h.id = id;
  std::string f(reinterpret_cast<const char*>(&h), sizeof(h));
  f += body;
  return f;
}
inline std::string Frame(lc::Method m, uint64_t id, const google::protobuf::MessageLite& msg) {
  return RawFrame(m, id, msg.SerializeAsString());
}

struct Answer {
  bool closed = false;  // EOF (or the receive timeout) instead of a frame
  lc::ResponseHeader h;
  std::string message, body;
};

inline Answer Recv(int fd) {
  Answer a;
  std::string buf(lc::kMaxFrameBytes + 1, '\0');
  const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
  if (n <= 0) {
    a.closed = true;
    return a;
  }
  EXPECT_GE(n, static_cast<ssize_t>(sizeof(a.h)));
  std::memcpy(&a.h, buf.data(), sizeof(a.h));
  EXPECT_EQ(a.h.magic, lc::kMagic);
  a.message = buf.substr(sizeof(a.h), a.h.message_bytes);
  a.body = buf.substr(sizeof(a.h) + a.h.message_bytes, n - sizeof(a.h) - a.h.message_bytes);
  return a;
}

inline Answer Call(int fd, const std::string& frame) {
  EXPECT_EQ(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(frame.size()));
  return Recv(fd);
}

// Sends a Handshake (wire version 1) on `fd`; true when the daemon accepted it.
inline bool SendHandshake(int fd, const std::string& client_name) {
  v1::HandshakeRequest req;
  req.set_wire_version(1);
  req.set_client_name(client_name);
  Answer a = Call(fd, Frame(lc::Method::kHandshake, 1, req));
  return !a.closed && a.h.code == 0;
}

// A handshaken connection (-1 on failure).
inline int Handshaken(const std::string& path, const std::string& client_name = "smoke-local") {
  const int fd = DialLocal(path);
  if (fd < 0) return -1;
  if (!SendHandshake(fd, client_name)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One connection owned by a test (closed by the destructor).
class LocalConn {
 public:
  explicit LocalConn(const std::string& path) : fd_(DialLocal(path)) {}
  ~LocalConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  LocalConn(const LocalConn&) = delete;
  LocalConn& operator=(const LocalConn&) = delete;
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  Answer Call(lc::Method m, uint64_t id, const std::string& body) {
    return testing::Call(fd_, RawFrame(m, id, body));
  }
  Answer Recv() { return testing::Recv(fd_); }
  bool Handshake(const std::string& client_name = "local-conn") {
    return SendHandshake(fd_, client_name);
  }

 private:
  int fd_ = -1;
};

}  // namespace oscarkv::service::testing
