#include "oscarkv/client/local_daemon.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace oscarkv::client {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MsLeft(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

bool IsExecutable(const std::string& p) { return ::access(p.c_str(), X_OK) == 0; }

}  // namespace

absl::StatusOr<std::string> LocalDaemon::FindDaemonBinary() {
  std::vector<std::string> tried;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto dir = self.parent_path();
    for (const auto& p : {dir / "oscarkvd", dir.parent_path() / "service" / "oscarkvd"}) {
      tried.push_back(p.string());
      if (IsExecutable(p.string())) return p.string();
    }
  }
  if (const char* env = std::getenv("OSCARKVD"); env != nullptr && *env != '\0') {
    tried.push_back(env);
    if (IsExecutable(env)) return std::string(env);
  }
  std::string where;
  for (const auto& t : tried) absl::StrAppend(&where, where.empty() ? "" : ", ", t);
  return absl::NotFoundError(absl::StrCat(
      "oscarkvd not found (looked at ", where,
      "); build it (ninja oscarkvd) or pass its path (--daemon PATH or $OSCARKVD)"));
}

absl::StatusOr<std::unique_ptr<LocalDaemon>> LocalDaemon::Start(const LocalDaemonOptions& o) {
  std::string binary = o.binary;
  if (binary.empty()) {
    auto found = FindDaemonBinary();
    if (!found.ok()) return found.status();
    binary = *found;
  }
  if (!IsExecutable(binary)) {
    return absl::NotFoundError(absl::StrCat("oscarkvd binary ", binary, " is not executable"));
  }
  std::vector<std::string> argv = {binary};
  bool has_listen = false;
  for (const auto& f : o.flags) has_listen |= f == "--listen" || f.rfind("--listen=", 0) == 0;
  if (!has_listen) argv.insert(argv.end(), {"--listen", "127.0.0.1:0"});
  argv.insert(argv.end(), o.flags.begin(), o.flags.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);

  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  int log_fd = -1;
  if (!o.log_path.empty()) {
    log_fd = ::open(o.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      ::close(out[0]);
      ::close(out[1]);
      return absl::InternalError(absl::StrCat("cannot open ", o.log_path, ": ", std::strerror(errno)));
    }
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only until exec.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(out[1], STDOUT_FILENO);
    if (log_fd >= 0) ::dup2(log_fd, STDERR_FILENO);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  if (log_fd >= 0) ::close(log_fd);

  std::unique_ptr<LocalDaemon> d(new LocalDaemon);
  d->pid_ = pid;
  d->stdout_fd_ = out[0];
  // Read up to the ready line.
  const auto deadline = Clock::now() + std::chrono::milliseconds(o.ready_timeout_ms);
  std::string buf;
  for (;;) {
    const size_t nl = buf.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (line.rfind("oscarkvd ready ", 0) != 0) continue;  // tolerate other output
      d->ready_line_ = line;
      for (absl::string_view field : absl::StrSplit(line, ' ')) {
        std::pair<std::string, std::string> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
        if (kv.first == "listen") d->address_ = kv.second;
        if (kv.first == "metrics") d->metrics_ = kv.second;
        if (kv.first == "shm") d->shm_path_ = kv.second;
        if (kv.first == "local" && kv.second != "off") d->local_socket_ = kv.second;
        if (kv.first == "pool_bytes" && !absl::SimpleAtoi(kv.second, &d->pool_bytes_)) {
          d->pool_bytes_ = 0;
        }
      }
      if (d->address_.empty()) {
        return absl::InternalError(absl::StrCat("oscarkvd ready line has no listen=: ", line));
      }
      break;
    }
    const int64_t left = MsLeft(deadline);
    if (left <= 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "oscarkvd (", binary, ") printed no ready line within ", o.ready_timeout_ms, " ms"));
    }
    pollfd p{d->stdout_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 200))) <= 0) continue;
    char tmp[4096];
    const ssize_t n = ::read(d->stdout_fd_, tmp, sizeof tmp);
    if (n <= 0) {
      auto code = d->Reap(2000);
      return absl::FailedPreconditionError(absl::StrCat(
          "oscarkvd (", binary, ") exited before it was ready",
          code.ok() ? absl::StrCat(" with status ", *code) : "",
          o.log_path.empty() ? " (its log is above)" : absl::StrCat("; log: ", o.log_path)));
    }
    buf.append(tmp, static_cast<size_t>(n));
  }
  // Keep the pipe drained so a chatty daemon never blocks on a full stdout.
  d->drain_ = std::thread([fd = d->stdout_fd_] {
    char tmp[4096];
    while (::read(fd, tmp, sizeof tmp) > 0) {
    }
  });
  return d;
}

LocalDaemon::~LocalDaemon() {
  if (!exited_ && pid_ > 0) Stop(5000).IgnoreError();
  if (drain_.joinable()) drain_.join();
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

absl::StatusOr<int> LocalDaemon::Reap(int64_t timeout_ms) {
  if (exited_) return exit_code_;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      // Killed: it could not remove its pool segment (a clean exit, even a failed start, does).
      if (WIFSIGNALED(st) && shm_path_.rfind("/dev/shm/", 0) == 0) {
        ::unlink(shm_path_.c_str());
        std::error_code ec;  // and the TLS files it staged beside it (oscarkvd --tls-cert)
        std::filesystem::remove_all(shm_path_ + ".tls", ec);
      }
      // Nor its local control socket file (a socket, so nothing else is removed by mistake).
      struct stat sst;
      if (WIFSIGNALED(st) && !local_socket_.empty() &&
          ::lstat(local_socket_.c_str(), &sst) == 0 && S_ISSOCK(sst.st_mode)) {
        ::unlink(local_socket_.c_str());
      }
      return exit_code_;
    }
    if (r < 0) {
      exited_ = true;
      exit_code_ = -1;
      return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
    }
    if (MsLeft(deadline) <= 0) {
      return absl::DeadlineExceededError("oscarkvd did not exit in time");
    }
    ::usleep(5000);
  }
}

absl::StatusOr<int> LocalDaemon::Stop(int64_t grace_ms) {
  if (exited_) return exit_code_;
  ::kill(pid_, SIGTERM);
  auto code = Reap(grace_ms);
  if (code.ok()) return code;
  ::kill(pid_, SIGKILL);
  Reap(5000).IgnoreError();
  return absl::DeadlineExceededError(
      absl::StrCat("oscarkvd did not exit within ", grace_ms, " ms of SIGTERM; killed"));
}

void LocalDaemon::Kill(int sig) {
  if (exited_) return;
  ::kill(pid_, sig);
  Reap(10000).IgnoreError();
}

bool LocalDaemon::Running() {
  if (exited_) return false;
  return !Reap(0).ok();
}

}  // namespace oscarkv::client
