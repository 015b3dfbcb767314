// The control channel of the GPU handoff: length-prefixed frames over a unix stream socket,
// every wait bounded by poll(2), a closed peer reported as UNAVAILABLE.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "oscarkv/pd/gpu_handoff.h"

namespace oscarkv::pd::gpu {
namespace {

using Clock = std::chrono::steady_clock;

struct FrameHeader {
  uint32_t magic;
  uint32_t type;
  uint64_t length;
};
static_assert(sizeof(FrameHeader) == 16);

int RemainingMs(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Waits until `fd` is readable/writable or the deadline passes.
absl::Status WaitFd(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, RemainingMs(deadline));
    if (rc > 0) return absl::OkStatus();  // errors and hangups surface in send/recv
    if (rc == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("control socket: timed out waiting to ", what, " (peer stalled?)"));
    }
    if (errno != EINTR) {
      return absl::InternalError(absl::StrCat("control socket: poll: ", std::strerror(errno)));
    }
  }
}

absl::Status SendAll(int fd, const void* data, size_t size, Clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    if (absl::Status s = WaitFd(fd, POLLOUT, deadline, "send"); !s.ok()) return s;
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == EPIPE || errno == ECONNRESET) {
        return absl::UnavailableError("control socket: the peer process closed its end");
      }
      return absl::InternalError(absl::StrCat("control socket: send: ", std::strerror(errno)));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Reads exactly `size` bytes; `started` says whether part of the frame was already read.
absl::Status RecvAll(int fd, void* data, size_t size, Clock::time_point deadline, bool started) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    if (absl::Status s = WaitFd(fd, POLLIN, deadline, "receive"); !s.ok()) return s;
    const ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n == 0) {
      return absl::UnavailableError(started ? "control socket: the peer process closed mid-frame"
                                            : "control socket: the peer process closed its end");
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) {
        return absl::UnavailableError("control socket: the peer process reset the connection");
      }
      return absl::InternalError(absl::StrCat("control socket: recv: ", std::strerror(errno)));
    }
    p += n;
    size -= static_cast<size_t>(n);
    started = true;
  }
  return absl::OkStatus();
}

}  // namespace

const char* MsgTypeName(MsgType t) {
  switch (t) {
    case MsgType::kHello:
      return "hello";
    case MsgType::kWant:
      return "want";
    case MsgType::kOffer:
      return "offer";
    case MsgType::kDone:
      return "done";
    case MsgType::kError:
      return "error";
    case MsgType::kBye:
      return "bye";
  }
  return "?";
}

absl::Status SendMessage(int fd, MsgType type, std::string_view body, int timeout_ms) {
  if (body.size() > kMaxFrameBody) {
    return absl::InvalidArgumentError(absl::StrCat("frame body of ", body.size(), " bytes"));
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const FrameHeader h{kFrameMagic, static_cast<uint32_t>(type), body.size()};
  if (absl::Status s = SendAll(fd, &h, sizeof(h), deadline); !s.ok()) return s;
  return SendAll(fd, body.data(), body.size(), deadline);
}

absl::StatusOr<Message> RecvMessage(int fd, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  FrameHeader h{};
  if (absl::Status s = RecvAll(fd, &h, sizeof(h), deadline, false); !s.ok()) return s;
  if (h.magic != kFrameMagic) {
    return absl::DataLossError(
        absl::StrCat("control socket: bad frame magic 0x", absl::Hex(h.magic)));
  }
  if (h.type < static_cast<uint32_t>(MsgType::kHello) ||
      h.type > static_cast<uint32_t>(MsgType::kBye)) {
    return absl::DataLossError(absl::StrCat("control socket: unknown frame type ", h.type));
  }
  if (h.length > kMaxFrameBody) {
    return absl::DataLossError(absl::StrCat("control socket: frame of ", h.length, " bytes"));
  }
  Message m{static_cast<MsgType>(h.type), std::string(h.length, '\0')};
  if (absl::Status s = RecvAll(fd, m.body.data(), m.body.size(), deadline, true); !s.ok()) {
    return s;
  }
  return m;
}

absl::Status PeerAlive(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return absl::OkStatus();
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno == ECONNRESET)) {
    return absl::UnavailableError("control socket: the peer process closed its end (it died?)");
  }
  return absl::OkStatus();
}

}  // namespace oscarkv::pd::gpu
