#include "oscarkv/testing/bootstrap.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "oscarkv/util/subprocess.h"

namespace oscarkv::testing {
namespace {

constexpr uint32_t kMaxBlob = 64u << 20;

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

int RemainingMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

absl::Status ReadFull(int fd, char* buf, size_t n, absl::Time deadline) {
  size_t got = 0;
  while (got < n) {
    pollfd pfd{fd, POLLIN, 0};
    const int pr = poll(&pfd, 1, RemainingMs(deadline));
    if (pr < 0) {
      if (errno == EINTR) continue;
      return Errno("poll");
    }
    if (pr == 0) return absl::DeadlineExceededError("RecvBlob: timed out");
    const ssize_t r = read(fd, buf + got, n - got);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("read");
    }
    if (r == 0) return absl::UnavailableError("RecvBlob: the other end closed");
    got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

}  // namespace

void UniqueFd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status SendBlob(int fd, absl::string_view blob) {
  if (blob.size() > kMaxBlob) return absl::InvalidArgumentError("SendBlob: blob too large");
  std::string frame;
  const uint32_t len = static_cast<uint32_t>(blob.size());
  frame.append(reinterpret_cast<const char*>(&len), sizeof(len));
  frame.append(blob.data(), blob.size());
  size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t w = send(fd, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == ENOTSOCK) {  // a pipe
        const ssize_t pw = write(fd, frame.data() + sent, frame.size() - sent);
        if (pw < 0 && errno != EINTR) return Errno("write");
        if (pw > 0) sent += static_cast<size_t>(pw);
        continue;
      }
      if (errno == EINTR) continue;
      return Errno("send");
    }
    sent += static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RecvBlob(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  uint32_t len = 0;
  if (absl::Status s = ReadFull(fd, reinterpret_cast<char*>(&len), sizeof(len), deadline);
      !s.ok()) {
    return s;
  }
  if (len > kMaxBlob) return absl::InvalidArgumentError("RecvBlob: blob too large");
  std::string out(len, '\0');
  if (absl::Status s = ReadFull(fd, out.data(), len, deadline); !s.ok()) return s;
  return out;
}

absl::StatusOr<PeerProcess> PeerProcess::Spawn(std::vector<std::string> argv,
                                               const std::map<std::string, std::string>& env,
                                               bool append_fd_arg) {
  if (argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return Errno("socketpair");
  UniqueFd parent(sv[0]), child(sv[1]);
  if (append_fd_arg) argv.push_back(absl::StrCat("--control-fd=", child.get()));
  // The child keeps its end across exec; the parent's end is close-on-exec.
  SpawnOptions so(std::move(argv));
  so.env = env;
  so.inherit_fds = {child.get()};
  so.parent_death_signal = 0;
  auto proc = Subprocess::Spawn(so);
  if (!proc.ok()) return proc.status();
  PeerProcess p;
  p.proc_ = std::move(*proc);
  p.control_ = std::move(parent);
  return p;
}

PeerProcess::PeerProcess() = default;

PeerProcess::PeerProcess(PeerProcess&& o) noexcept
    : proc_(std::move(o.proc_)), control_(std::move(o.control_)) {}

PeerProcess& PeerProcess::operator=(PeerProcess&& o) noexcept {
  if (this != &o) {
    Kill(SIGKILL);
    proc_ = std::move(o.proc_);
    control_ = std::move(o.control_);
  }
  return *this;
}

PeerProcess::~PeerProcess() { Kill(SIGKILL); }

pid_t PeerProcess::pid() const { return proc_ ? proc_->pid() : -1; }

void PeerProcess::Kill(int sig) {
  if (!proc_) return;
  if (sig != SIGKILL) {
    proc_->Signal(sig);
    return;
  }
  proc_->Kill();
  proc_.reset();
}

absl::StatusOr<int> PeerProcess::CloseAndWait(absl::Duration timeout) {
  control_.Reset();
  if (!proc_) return absl::FailedPreconditionError("CloseAndWait: no child");
  absl::StatusOr<int> code = proc_->Wait(timeout);
  if (!code.ok()) {
    Kill(SIGKILL);
    return absl::DeadlineExceededError("CloseAndWait: child did not exit; killed");
  }
  proc_.reset();
  return code;
}

absl::Status ServeUntilClosed(transport::Worker& worker, int control_fd, absl::Duration max_time,
                              const ControlHandler& handler) {
  const absl::Time deadline = absl::Now() + max_time;
  while (absl::Now() < deadline) {
    if (worker.Progress() != 0) continue;
    // Idle: sleep on both the worker's event fd and the control channel.
    const ucs_status_t armed = ucp_worker_arm(worker.raw());
    if (armed == UCS_ERR_BUSY) continue;
    pollfd pfds[2] = {{control_fd, POLLIN, 0}, {worker.event_fd(), POLLIN, 0}};
    const int n = armed == UCS_OK ? 2 : 1;
    const int pr = poll(pfds, n, armed == UCS_OK ? 100 : 1);
    if (pr > 0 && (pfds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      absl::StatusOr<std::string> cmd = RecvBlob(control_fd, absl::Seconds(5));
      if (!cmd.ok()) {
        return absl::IsUnavailable(cmd.status()) ? absl::OkStatus() : cmd.status();
      }
      std::string reply;
      if (handler) reply = handler(*cmd);
      if (absl::Status s = SendBlob(control_fd, reply); !s.ok()) return s;
    }
  }
  return absl::DeadlineExceededError("ServeUntilClosed: max_time reached");
}

absl::StatusOr<int> ParseControlFd(absl::string_view value) {
  int fd = -1;
  if (!absl::SimpleAtoi(value, &fd) || fd < 0 || fcntl(fd, F_GETFD) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("not an open file descriptor: '",
                                                   std::string(value), "'"));
  }
  return fd;
}

}  // namespace oscarkv::testing
