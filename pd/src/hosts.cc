#include "oscarkv/pd/hosts.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace oscarkv::pd {
namespace {

std::atomic<int> g_counter{0};

absl::StatusOr<ProcessResult> RunQuiet(const std::vector<std::string>& argv);

absl::Status RunIp(const std::string& ip, std::vector<std::string> args) {
  args.insert(args.begin(), ip);
  auto r = RunQuiet(args);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    std::string out = r->out;
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return absl::UnavailableError(
        absl::StrCat("`", absl::StrJoin(args, " "), "` failed (exit ", r->exit_code, "): ", out));
  }
  return absl::OkStatus();
}

// Like RunProcess, with stderr captured too (for `ip`, whose errors become the Status).
absl::StatusOr<ProcessResult> SpawnAndWait(const std::vector<std::string>& argv, bool merge_stderr,
                                           int64_t timeout_ms);

absl::StatusOr<ProcessResult> RunQuiet(const std::vector<std::string>& argv) {
  return SpawnAndWait(argv, /*merge_stderr=*/true, 30000);
}

pid_t ForkExec(const std::vector<std::string>& argv, bool merge_stderr, int* out_fd,
               std::string* error) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    *error = absl::StrCat("pipe: ", std::strerror(errno));
    return -1;
  }
  std::vector<std::string> copy = argv;
  std::vector<char*> cargv;
  for (auto& a : copy) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    *error = absl::StrCat("fork: ", std::strerror(errno));
    ::close(fds[0]);
    ::close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(fds[1], STDOUT_FILENO);
    if (merge_stderr) ::dup2(fds[1], STDERR_FILENO);
    ::execv(cargv[0], cargv.data());
    const char msg[] = "exec failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::close(fds[1]);
  *out_fd = fds[0];
  return pid;
}

// Reads `fd` to EOF (or the deadline), then reaps `pid`.
absl::StatusOr<ProcessResult> Collect(pid_t pid, int fd, int64_t timeout_ms,
                                      const std::string& what) {
  ProcessResult r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool timed_out = false;
  char buf[65536];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    const ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    r.out.append(buf, got);
  }
  ::close(fd);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " did not finish within ", timeout_ms, " ms (killed)"));
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

absl::StatusOr<ProcessResult> SpawnAndWait(const std::vector<std::string>& argv, bool merge_stderr,
                                           int64_t timeout_ms) {
  if (argv.empty()) return absl::InvalidArgumentError("empty command");
  int fd = -1;
  std::string error;
  const pid_t pid = ForkExec(argv, merge_stderr, &fd, &error);
  if (pid < 0) return absl::InternalError(error);
  return Collect(pid, fd, timeout_ms, argv[0]);
}

}  // namespace

absl::StatusOr<std::string> FindIpTool() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return std::string(p);
  }
  return absl::NotFoundError("the `ip` tool (iproute2) was not found");
}

absl::StatusOr<std::unique_ptr<NetnsHosts>> NetnsHosts::Create(const std::string& prefix) {
  auto ip = FindIpTool();
  if (!ip.ok()) return absl::UnavailableError(std::string(ip.status().message()));
  if (::geteuid() != 0) {
    return absl::UnavailableError("network namespaces need root (this process is not)");
  }
  std::unique_ptr<NetnsHosts> h(new NetnsHosts());
  h->ip_ = *ip;
  const int n = g_counter.fetch_add(1);
  const std::string id = absl::StrCat(::getpid(), "-", n);
  // Each pair is its own isolated network, so the addresses can be the same for every pair.
  h->addr_[0] = "10.251.0.1";
  h->addr_[1] = "10.251.0.2";
  for (int i = 0; i < 2; ++i) {
    h->ns_[i] = absl::StrCat(prefix, "-", id, i == 0 ? "-a" : "-b");
    if (absl::Status s = RunIp(h->ip_, {"netns", "add", h->ns_[i]}); !s.ok()) return s;
    h->created_[i] = true;
  }
  // veth names: at most 15 characters, unique on the host while they exist (briefly, before
  // they move into the namespaces).
  const std::string va = absl::StrCat("okv", ::getpid() % 1000000, "a", n % 100);
  const std::string vb = absl::StrCat("okv", ::getpid() % 1000000, "b", n % 100);
  h->dev_[0] = va;
  h->dev_[1] = vb;
  const std::vector<std::vector<std::string>> steps = {
      {"link", "add", va, "type", "veth", "peer", "name", vb},
      {"link", "set", va, "netns", h->ns_[0]},
      {"link", "set", vb, "netns", h->ns_[1]},
      {"-n", h->ns_[0], "addr", "add", h->addr_[0] + "/24", "dev", va},
      {"-n", h->ns_[1], "addr", "add", h->addr_[1] + "/24", "dev", vb},
      {"-n", h->ns_[0], "link", "set", va, "up"},
      {"-n", h->ns_[1], "link", "set", vb, "up"},
      {"-n", h->ns_[0], "link", "set", "lo", "up"},
      {"-n", h->ns_[1], "link", "set", "lo", "up"},
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    if (absl::Status s = RunIp(h->ip_, steps[i]); !s.ok()) {
      if (i <= 1) (void)RunIp(h->ip_, {"link", "del", va});  // not yet inside a namespace
      return s;  // the destructor deletes the namespaces (and the veth inside them)
    }
  }
  return h;
}

NetnsHosts::~NetnsHosts() {
  for (int i = 0; i < 2; ++i) {
    if (created_[i]) (void)RunIp(ip_, {"netns", "del", ns_[i]});
  }
}

std::vector<std::string> NetnsHosts::Exec(int host) const {
  return {ip_, "netns", "exec", ns_[host]};
}

absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv, int64_t timeout_ms) {
  return SpawnAndWait(argv, /*merge_stderr=*/false, timeout_ms);
}

absl::StatusOr<std::unique_ptr<Process>> Process::Spawn(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("empty command");
  std::unique_ptr<Process> p(new Process());
  std::string error;
  p->pid_ = ForkExec(argv, /*merge_stderr=*/false, &p->fd_, &error);
  if (p->pid_ < 0) return absl::InternalError(error);
  return p;
}

absl::StatusOr<ProcessResult> Process::Wait(int64_t timeout_ms) {
  if (pid_ < 0) return absl::FailedPreconditionError("process already waited for");
  const pid_t pid = pid_;
  pid_ = -1;
  return Collect(pid, fd_, timeout_ms, "child process");
}

Process::~Process() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::close(fd_);
    int status;
    ::waitpid(pid_, &status, 0);
  }
}

}  // namespace oscarkv::pd
