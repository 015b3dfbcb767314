#include "oscarkv/util/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace oscarkv {
namespace {

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Descriptors Spawn opens; whatever is still held is closed on every return path.
struct Fds {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err = -1, null = -1, report[2] = {-1, -1};
  ~Fds() {
    for (int* fd : {&in[0], &in[1], &out[0], &out[1], &err, &null, &report[0], &report[1]}) {
      CloseFd(*fd);
    }
  }
};

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status ExecError(const std::string& program, int err) {
  const std::string msg = absl::StrCat("cannot run ", program, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// Child side: tells the parent why the child is giving up (errno over the report pipe) and
// exits 127 without running atexit handlers or flushing the parent's stdio buffers.
[[noreturn]] void ReportAndExit(int report_fd, int err) {
  (void)!::write(report_fd, &err, sizeof(err));
  ::_exit(127);
}

// Child side, after fork: async-signal-safe calls only. Never returns.
[[noreturn]] void ExecChild(const SpawnOptions& o, const Fds& f, pid_t parent, const char* program,
                            char* const* argv, char* const* envp,
                            const std::vector<int>& keep_sorted,
                            const std::vector<int>& open_sorted) {
  const auto die = [&](int err) { ReportAndExit(f.report[1], err); };
  if (o.parent_death_signal != 0) {
    ::prctl(PR_SET_PDEATHSIG, o.parent_death_signal);
    if (::getppid() != parent) ::_exit(127);  // the parent is already gone
  }
  if (o.stdin_mode == Stdio::kPipe && ::dup2(f.in[0], STDIN_FILENO) < 0) die(errno);
  if (o.stdin_mode == Stdio::kNull && ::dup2(f.null, STDIN_FILENO) < 0) die(errno);
  if (o.stdout_mode == Stdio::kPipe && ::dup2(f.out[1], STDOUT_FILENO) < 0) die(errno);
  if (o.stdout_mode == Stdio::kNull && ::dup2(f.null, STDOUT_FILENO) < 0) die(errno);
  if (o.stderr_to_stdout) {
    if (::dup2(STDOUT_FILENO, STDERR_FILENO) < 0) die(errno);
  } else if (f.err >= 0 && ::dup2(f.err, STDERR_FILENO) < 0) {
    die(errno);
  }
  for (int fd : keep_sorted) {
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags < 0 || ::fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) < 0) die(errno);
  }
  if (o.close_other_fds) {  // close the gaps between the descriptors that stay open
    unsigned from = 3;
    for (int fd : open_sorted) {
      const unsigned u = static_cast<unsigned>(fd);
      if (u > from) ::syscall(SYS_close_range, from, u - 1, 0u);
      from = std::max(from, u + 1);
    }
    ::syscall(SYS_close_range, from, ~0u, 0u);
  }
  if (o.search_path) {
    ::execvpe(program, argv, envp);
  } else {
    ::execve(program, argv, envp);
  }
  ReportAndExit(f.report[1], errno);  // exec returned: it failed
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return absl::InvalidArgumentError("Subprocess: empty argv");
  const std::string program = o.program.empty() ? o.argv[0] : o.program;

  // argv and envp, built before fork.
  std::vector<std::string> args = o.argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv(*e);
    if (o.env.count(kv.substr(0, kv.find('='))) == 0) env.push_back(std::move(kv));
  }
  for (const auto& [k, v] : o.env) env.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> cenv;
  for (std::string& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  std::vector<int> keep = o.inherit_fds;
  std::sort(keep.begin(), keep.end());
  keep.erase(std::remove_if(keep.begin(), keep.end(), [](int fd) { return fd < 3; }), keep.end());

  Fds f;
  if (o.stdin_mode == Stdio::kPipe && ::pipe2(f.in, O_CLOEXEC) != 0) return Errno("pipe2");
  if (o.stdout_mode == Stdio::kPipe && ::pipe2(f.out, O_CLOEXEC) != 0) return Errno("pipe2");
  if (o.stdin_mode == Stdio::kNull || o.stdout_mode == Stdio::kNull) {
    f.null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (f.null < 0) return Errno("open /dev/null");
  }
  if (!o.stderr_to_stdout && !o.stderr_path.empty()) {
    f.err = ::open(o.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f.err < 0) return Errno(absl::StrCat("open ", o.stderr_path));
  }
  if (::pipe2(f.report, O_CLOEXEC) != 0) return Errno("pipe2");

  const pid_t parent = ::getpid();
  std::vector<int> open_sorted = keep;  // what close_other_fds leaves open until exec
  open_sorted.push_back(f.report[1]);
  std::sort(open_sorted.begin(), open_sorted.end());
  const pid_t pid = ::fork();
  if (pid < 0) return Errno("fork");
  if (pid == 0) {
    ExecChild(o, f, parent, program.c_str(), cargv.data(), cenv.data(), keep, open_sorted);
  }

  CloseFd(f.report[1]);
  std::unique_ptr<Subprocess> p(new Subprocess());
  p->pid_ = pid;
  // The report pipe closes at exec (EOF, 0 bytes) or carries the errno of what failed before.
  int err = 0;
  ssize_t n;
  do {
    n = ::read(f.report[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(err))) {
    p->Wait().IgnoreError();  // it has _exit'ed
    return ExecError(program, err);
  }
  if (o.stdin_mode == Stdio::kPipe) std::swap(p->stdin_fd_, f.in[1]);
  if (o.stdout_mode == Stdio::kPipe) std::swap(p->stdout_fd_, f.out[0]);
  return p;
}

Subprocess::~Subprocess() {
  CloseStdin();
  CloseStdout();
  if (pid_ > 0) Kill();
}

void Subprocess::CloseStdin() { CloseFd(stdin_fd_); }
void Subprocess::CloseStdout() { CloseFd(stdout_fd_); }

bool Subprocess::TryReap(bool block) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (reaped_) return true;
  }
  // Wait without reaping (WNOWAIT) outside the lock: the zombie keeps the pid from being reused
  // while Signal may still run; the reap itself happens under the lock.
  siginfo_t info{};
  int rc;
  do {
    info.si_pid = 0;
    rc = ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT | (block ? 0 : WNOHANG));
  } while (rc < 0 && errno == EINTR);
  std::lock_guard<std::mutex> l(mu_);
  if (reaped_) return true;
  if (rc < 0) {  // not our child any more (ECHILD): nothing to reap
    reaped_ = true;
    status_ = 0;
    return true;
  }
  if (info.si_pid == 0) return false;  // still running
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  status_ = st;
  return true;
}

void Subprocess::Signal(int sig) {
  std::lock_guard<std::mutex> l(mu_);
  if (!reaped_ && pid_ > 0) ::kill(pid_, sig);
}

bool Subprocess::Running() { return !TryReap(/*block=*/false); }

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) {
    TryReap(/*block=*/true);
    return *exit_code();
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration nap = absl::Microseconds(200);
  while (!TryReap(/*block=*/false)) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " did not exit within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(std::min(nap, left));
    nap = std::min(nap * 2, absl::Milliseconds(10));
  }
  return *exit_code();
}

int Subprocess::Terminate(absl::Duration grace) {
  Signal(SIGTERM);
  if (auto code = Wait(grace); code.ok()) return *code;
  return Kill();
}

int Subprocess::Kill() {
  Signal(SIGKILL);
  TryReap(/*block=*/true);
  return *exit_code();
}

std::optional<int> Subprocess::exit_code() const {
  std::lock_guard<std::mutex> l(mu_);
  if (!reaped_) return std::nullopt;
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return WEXITSTATUS(status_);
}

std::optional<int> Subprocess::term_signal() const {
  std::lock_guard<std::mutex> l(mu_);
  if (!reaped_ || !WIFSIGNALED(status_)) return std::nullopt;
  return WTERMSIG(status_);
}

std::string Subprocess::DescribeExit() const {
  std::lock_guard<std::mutex> l(mu_);
  if (!reaped_) return "running";
  if (WIFSIGNALED(status_)) return absl::StrCat("killed by signal ", WTERMSIG(status_));
  return absl::StrCat("exit ", WEXITSTATUS(status_));
}

absl::StatusOr<RunOutput> RunAndCollect(SpawnOptions options, absl::Duration timeout) {
  options.stdout_mode = Stdio::kPipe;
  const std::string what = options.argv.empty() ? "" : options.argv[0];
  auto child = Subprocess::Spawn(options);
  if (!child.ok()) return child.status();
  Subprocess& p = **child;
  const absl::Time deadline = absl::Now() + timeout;
  auto timed_out = [&] {
    p.Kill();
    return absl::DeadlineExceededError(absl::StrCat(
        what, " did not finish within ", absl::FormatDuration(timeout), " (killed)"));
  };
  RunOutput r;
  char buf[65536];
  for (;;) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return timed_out();
    pollfd pfd{p.stdout_fd(), POLLIN, 0};
    const int n = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) return Errno("poll");
    if (n <= 0) continue;
    const ssize_t got = ::read(p.stdout_fd(), buf, sizeof(buf));
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) break;  // EOF: the child closed its stdout (normally: it exited)
    r.output.append(buf, static_cast<size_t>(got));
  }
  p.CloseStdout();
  auto code = p.Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
  if (!code.ok()) return timed_out();
  r.exit_code = *code;
  return r;
}

}  // namespace oscarkv
