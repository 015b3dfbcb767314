#include "oscarkv/testing/local_daemon.h"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "oscarkv/util/subprocess.h"

namespace oscarkv::testing {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MsLeft(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

bool IsExecutable(const std::string& p) { return ::access(p.c_str(), X_OK) == 0; }

}  // namespace

LocalDaemon::LocalDaemon() = default;

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
  SpawnOptions so({binary});
  bool has_listen = false;
  for (const auto& f : o.flags) has_listen |= f == "--listen" || f.rfind("--listen=", 0) == 0;
  if (!has_listen) so.argv.insert(so.argv.end(), {"--listen", "127.0.0.1:0"});
  so.argv.insert(so.argv.end(), o.flags.begin(), o.flags.end());
  so.stdout_mode = Stdio::kPipe;
  so.stderr_path = o.log_path;  // empty: inherited
  // A daemon whose owner thread dies gets the chance to shut down cleanly.
  so.parent_death_signal = SIGTERM;
  auto proc = Subprocess::Spawn(so);
  if (!proc.ok()) return proc.status();

  std::unique_ptr<LocalDaemon> d(new LocalDaemon);
  d->proc_ = *std::move(proc);
  const int fd = d->proc_->stdout_fd();
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
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 200))) <= 0) continue;
    char tmp[4096];
    const ssize_t n = ::read(fd, tmp, sizeof tmp);
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
  d->drain_ = std::thread([fd] {
    char tmp[4096];
    while (::read(fd, tmp, sizeof tmp) > 0) {
    }
  });
  return d;
}

LocalDaemon::~LocalDaemon() {
  if (proc_ != nullptr && !proc_->exit_code().has_value()) Stop(5000).IgnoreError();
  // The drain thread ends at EOF (the daemon exited); the Subprocess closes the pipe after.
  if (drain_.joinable()) drain_.join();
}

pid_t LocalDaemon::pid() const { return proc_ != nullptr ? proc_->pid() : -1; }

absl::StatusOr<int> LocalDaemon::Reap(int64_t timeout_ms) {
  auto code = proc_->Wait(absl::Milliseconds(std::max<int64_t>(timeout_ms, 0)));
  if (!code.ok()) {
    if (absl::IsDeadlineExceeded(code.status())) {
      return absl::DeadlineExceededError("oscarkvd did not exit in time");
    }
    return code.status();
  }
  // Killed: it could not remove its pool segment (a clean exit, even a failed start, does), nor
  // its local control socket file (only a socket is removed, so nothing else goes by mistake).
  if (proc_->term_signal().has_value() && !cleaned_up_) {
    cleaned_up_ = true;
    if (shm_path_.rfind("/dev/shm/", 0) == 0) {
      ::unlink(shm_path_.c_str());
      std::error_code ec;  // and the TLS files it staged beside it (oscarkvd --tls-cert)
      std::filesystem::remove_all(shm_path_ + ".tls", ec);
    }
    struct stat sst;
    if (!local_socket_.empty() && ::lstat(local_socket_.c_str(), &sst) == 0 &&
        S_ISSOCK(sst.st_mode)) {
      ::unlink(local_socket_.c_str());
    }
  }
  return *code;
}

absl::StatusOr<int> LocalDaemon::Stop(int64_t grace_ms) {
  if (auto done = proc_->exit_code(); done.has_value()) return *done;
  proc_->Signal(SIGTERM);
  auto code = Reap(grace_ms);
  if (code.ok()) return code;
  proc_->Signal(SIGKILL);
  Reap(5000).IgnoreError();
  return absl::DeadlineExceededError(
      absl::StrCat("oscarkvd did not exit within ", grace_ms, " ms of SIGTERM; killed"));
}

void LocalDaemon::Kill(int sig) {
  if (proc_->exit_code().has_value()) return;
  proc_->Signal(sig);
  Reap(10000).IgnoreError();
}

void LocalDaemon::Signal(int sig) { proc_->Signal(sig); }

absl::StatusOr<int> LocalDaemon::Wait(int64_t timeout_ms) { return Reap(timeout_ms); }

bool LocalDaemon::Running() {
  if (!proc_->Running()) {
    Reap(0).IgnoreError();  // cleans up after a killed daemon
    return false;
  }
  return true;
}

}  // namespace oscarkv::testing
