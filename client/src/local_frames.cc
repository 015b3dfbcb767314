#include "local_frames.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace oscarkv::client {

namespace local = ::oscarkv::v1::local;

absl::Status SendLocalFrame(int sock, local::Method method, uint64_t id,
                            const google::protobuf::MessageLite& msg, int fd) {
  local::RequestHeader h;
  h.method = static_cast<uint16_t>(method);
  h.id = id;
  std::string f(reinterpret_cast<const char*>(&h), sizeof(h));
  msg.AppendToString(&f);
  iovec iov{f.data(), f.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    mh.msg_control = control;
    mh.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  for (;;) {
    const ssize_t r = ::sendmsg(sock, &mh, MSG_NOSIGNAL);
    if (r == static_cast<ssize_t>(f.size())) return absl::OkStatus();
    if (r < 0 && errno == EINTR) continue;
    return absl::UnavailableError(
        absl::StrCat("local connection: send: ", r < 0 ? std::strerror(errno) : "short"));
  }
}

absl::StatusOr<LocalAnswer> RecvLocalAnswer(int sock, uint64_t id, std::string* buf) {
  if (buf->size() < local::kMaxFrameBytes) buf->resize(local::kMaxFrameBytes);
  iovec iov{buf->data(), buf->size()};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  LocalAnswer a;
  if (n > 0) {
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (a.fd < 0) {
          a.fd = fd;
        } else {
          ::close(fd);
        }
      }
    }
  }
  auto fail = [&](absl::Status s) {
    if (a.fd >= 0) ::close(a.fd);
    return s;
  };
  if (n <= 0) {
    return fail(absl::UnavailableError(absl::StrCat(
        "local connection: ",
        n == 0 ? "closed by the daemon"
               : (errno == EAGAIN ? "no answer within the RPC timeout" : std::strerror(errno)))));
  }
  local::ResponseHeader h;
  if (static_cast<size_t>(n) < sizeof(h) || (mh.msg_flags & MSG_TRUNC)) {
    return fail(absl::InternalError("local connection: malformed answer"));
  }
  std::memcpy(&h, buf->data(), sizeof(h));
  if (h.magic != local::kMagic || h.message_bytes > static_cast<size_t>(n) - sizeof(h)) {
    return fail(absl::InternalError("local connection: malformed answer"));
  }
  if (h.id != id && h.id != 0) {
    return fail(absl::InternalError(
        absl::StrCat("local connection: answer ", h.id, " for request ", id)));
  }
  const absl::string_view text(buf->data() + sizeof(h), h.message_bytes);
  a.status = h.code == 0 ? absl::OkStatus()
                         : absl::Status(static_cast<absl::StatusCode>(h.code), text);
  if (h.id == 0 && !a.status.ok()) return fail(a.status);  // the daemon refused the frame
  a.body = buf->data() + sizeof(h) + h.message_bytes;
  a.body_bytes = static_cast<size_t>(n) - sizeof(h) - h.message_bytes;
  return a;
}

}  // namespace oscarkv::client
