#include "oscarkv/transport/bootstrap.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace oscarkv::transport {
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
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  // Everything the child needs is prepared before fork: after it only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    const std::string key = kv.substr(0, kv.find('='));
    if (env.count(key) == 0) env_strings.push_back(std::move(kv));
  }
  for (const auto& [k, v] : env) env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> cenv;
  for (auto& e : env_strings) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) return Errno("fork");
  if (pid == 0) {
    // Child: keep its end open across exec (clear CLOEXEC), then exec.
    const int fd = child.get();
    const int flags = fcntl(fd, F_GETFD);
    fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  PeerProcess p;
  p.pid_ = pid;
  p.control_ = std::move(parent);
  return p;
}

PeerProcess::PeerProcess(PeerProcess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), control_(std::move(o.control_)) {}

PeerProcess& PeerProcess::operator=(PeerProcess&& o) noexcept {
  if (this != &o) {
    Kill(SIGKILL);
    pid_ = std::exchange(o.pid_, -1);
    control_ = std::move(o.control_);
  }
  return *this;
}

PeerProcess::~PeerProcess() { Kill(SIGKILL); }

void PeerProcess::Kill(int sig) {
  if (pid_ <= 0) return;
  kill(pid_, sig);
  if (sig == SIGKILL) {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
}

absl::StatusOr<int> PeerProcess::CloseAndWait(absl::Duration timeout) {
  control_.Reset();
  if (pid_ <= 0) return absl::FailedPreconditionError("CloseAndWait: no child");
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return 128 + WTERMSIG(status);
    }
    if (r < 0 && errno != EINTR) return Errno("waitpid");
    if (absl::Now() >= deadline) {
      Kill(SIGKILL);
      return absl::DeadlineExceededError("CloseAndWait: child did not exit; killed");
    }
    usleep(2000);
  }
}

absl::Status ServeUntilClosed(Worker& worker, int control_fd, absl::Duration max_time,
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

}  // namespace oscarkv::transport
