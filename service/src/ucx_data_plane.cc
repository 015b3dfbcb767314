#include "ucx_data_plane.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "oscarkv/service/log.h"
#include "oscarkv/util/status_macros.h"
#include "oscarkv/util/subprocess.h"

namespace oscarkv::service {

namespace pb = ::oscarkv::v1;

// One ucp context + worker over [base, base + bytes), and the thread that progresses it.
class UcxDataPlane::Core {
 public:
  static absl::StatusOr<std::unique_ptr<Core>> Start(const std::string& tls,
                                                     const std::string& net_devices,
                                                     uint8_t* base, size_t bytes) {
    auto c = std::make_unique<Core>();
    transport::ContextOptions co;
    co.tls = tls;
    co.net_devices = net_devices;
    co.name = "oscarkvd";
    OSCARKV_ASSIGN_OR_RETURN(c->context_, transport::Context::Create(co));
    OSCARKV_ASSIGN_OR_RETURN(c->region_, c->context_->Register(base, bytes));
    OSCARKV_ASSIGN_OR_RETURN(c->worker_, transport::Worker::Create(*c->context_));
    pb::GetDataPlaneResponse& info = c->info_;
    info.set_worker_address(c->worker_->address());
    info.set_pool_rkey(c->region_->exported());
    info.set_pool_base(reinterpret_cast<uint64_t>(base));
    info.set_pool_bytes(bytes);
    info.set_tls(tls);
    for (const std::string& t : c->context_->capabilities().transports) info.add_transports(t);
    info.set_peer_failure_detection(c->context_->capabilities().peer_failure_detection);
    // From here on the worker belongs to the progress thread.
    transport::Worker* w = c->worker_.get();
    std::atomic<bool>* stop = &c->stop_;
    c->progress_ = std::thread([w, stop] {
      while (!stop->load(std::memory_order_acquire)) w->WaitForEvents(absl::Milliseconds(100));
    });
    return c;
  }
  ~Core() {
    stop_.store(true, std::memory_order_release);
    if (progress_.joinable()) progress_.join();
    worker_.reset();
    region_.reset();
    context_.reset();
  }
  const pb::GetDataPlaneResponse& info() const { return info_; }

 private:
  std::unique_ptr<transport::Context> context_;
  std::unique_ptr<transport::MemoryRegion> region_;
  std::unique_ptr<transport::Worker> worker_;
  std::atomic<bool> stop_{false};
  std::thread progress_;
  pb::GetDataPlaneResponse info_;
};

namespace {

// Reads exactly n bytes from fd, waiting at most until `deadline`.
absl::Status ReadFull(int fd, void* dst, size_t n, std::chrono::steady_clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError("data-plane child did not answer");
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t got = ::read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return absl::UnavailableError("data-plane child exited before describing itself");
    p += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

bool WriteFull(int fd, const void* src, size_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxDataPlane>> UcxDataPlane::Start(
    const UcxDataPlaneOptions& options) {
  auto dp = std::unique_ptr<UcxDataPlane>(new UcxDataPlane);
  dp->options_ = options;
  if (options.shm_path.empty() && options.shm_fd < 0) {
    OSCARKV_ASSIGN_OR_RETURN(dp->core_, Core::Start(options.tls, options.net_devices,
                                                    options.pool_base, options.pool_bytes));
    dp->info_ = dp->core_->info();
    dp->up_ = true;
    return dp;
  }
  dp->isolated_ = true;
  // Every child is spawned by the supervisor thread, which lives as long as this object: the
  // child's parent-death signal fires when the THREAD that forked it exits, and Start may run on
  // a transient one (a gRPC handler starting a tenant's data plane).
  std::promise<absl::Status> first;
  std::future<absl::Status> started = first.get_future();
  dp->supervisor_ = std::thread([d = dp.get(), &first] {
    absl::Status s = d->SpawnChild();
    const bool ok = s.ok();
    first.set_value(std::move(s));
    if (ok) d->Supervise();
  });
  if (absl::Status s = started.get(); !s.ok()) {
    dp->supervisor_.join();
    dp->stop_.store(true);
    return s;
  }
  return dp;
}

absl::Status UcxDataPlane::SpawnChild() {
  // The child's stdin is its lifeline (EOF: it tears its UCX state down and exits); its stdout
  // carries one length-prefixed GetDataPlaneResponse. No other descriptor of the daemon's is
  // inherited. The child sets its own parent-death signal (RunUcxDataPlaneChild).
  const std::string pool_arg =
      options_.shm_fd >= 0 ? absl::StrCat("fd:", options_.shm_fd) : options_.shm_path;
  SpawnOptions so({options_.self_exe, "--internal-ucx-data-plane", pool_arg,
                   absl::StrCat(options_.pool_bytes), options_.tls, options_.net_devices,
                   absl::StrCat(::getpid())});
  so.stdin_mode = Stdio::kPipe;
  so.stdout_mode = Stdio::kPipe;
  so.close_other_fds = true;
  if (options_.shm_fd >= 0) so.inherit_fds = {options_.shm_fd};
  so.parent_death_signal = 0;
  auto spawned = Subprocess::Spawn(so);
  if (!spawned.ok()) return spawned.status();
  std::shared_ptr<Subprocess> child = std::move(*spawned);
  uint64_t len = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  absl::Status s = ReadFull(child->stdout_fd(), &len, sizeof(len), deadline);
  std::string blob;
  if (s.ok() && (len == 0 || len > (1u << 20))) s = absl::InternalError("bad data-plane reply");
  if (s.ok()) {
    blob.resize(len);
    s = ReadFull(child->stdout_fd(), blob.data(), len, deadline);
  }
  child->CloseStdout();
  pb::GetDataPlaneResponse info;
  if (s.ok() && !info.ParseFromString(blob)) s = absl::InternalError("bad data-plane reply");
  if (!s.ok()) {
    child->CloseStdin();
    const int code = child->Kill();  // a child that had exited keeps its own exit code
    if (code > 0 && code < 128) {
      return absl::UnavailableError(absl::StrCat(
          "UCX data-plane process failed to start (exit ", code, "; its error is in "
          "the daemon's stderr): ", s.message()));
    }
    return s;
  }
  std::lock_guard<std::mutex> l(mu_);
  child_ = std::move(child);
  info_ = std::move(info);
  up_ = true;
  return absl::OkStatus();
}

void UcxDataPlane::Supervise() {
  int backoff_ms = 100;
  while (!stop_.load()) {
    std::shared_ptr<Subprocess> child;
    {
      std::lock_guard<std::mutex> l(mu_);
      child = child_;
    }
    const auto born = std::chrono::steady_clock::now();
    if (child) (void)child->Wait();  // until it exits; the destructor may signal it meanwhile
    {
      std::lock_guard<std::mutex> l(mu_);
      up_ = false;
      if (child_) child_->CloseStdin();
      child_.reset();
    }
    if (stop_.load()) return;
    if (child) {
      restarts_.fetch_add(1);
      LogEvent(LogLevel::kWarn, "ucx_data_plane_died",
               {{"pid", absl::StrCat(child->pid())},
                {"status", child->DescribeExit()},
                {"action", "restarting; clients reconnect on their next call"}});
      if (std::chrono::steady_clock::now() - born > std::chrono::seconds(10)) backoff_ms = 100;
    }
    for (int waited = 0; waited < backoff_ms && !stop_.load(); waited += 20) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (stop_.load()) return;
    if (absl::Status s = SpawnChild(); !s.ok()) {
      LogEvent(LogLevel::kError, "ucx_data_plane_restart_failed",
               {{"error", std::string(s.message())}});
      backoff_ms = std::min(backoff_ms * 2, 5000);
      continue;
    }
    LogEvent(LogLevel::kInfo, "ucx_data_plane_restarted",
             {{"restarts", absl::StrCat(restarts_.load())}});
    backoff_ms = std::min(backoff_ms * 2, 5000);
  }
}

absl::StatusOr<pb::GetDataPlaneResponse> UcxDataPlane::Info() const {
  std::lock_guard<std::mutex> l(mu_);
  if (!up_) {
    return absl::UnavailableError(
        "the UCX data plane is restarting (its process died); retry shortly");
  }
  return info_;
}

UcxDataPlane::~UcxDataPlane() {
  stop_.store(true);
  std::shared_ptr<Subprocess> child;
  {
    std::lock_guard<std::mutex> l(mu_);
    child = child_;
    // EOF on the child's stdin: it tears its UCX state down and exits.
    if (child_) child_->CloseStdin();
  }
  if (supervisor_.joinable()) {
    // The supervisor returns once the child is reaped; force it after 3 s.
    std::atomic<bool> done{false};
    std::thread killer([&] {
      for (int i = 0; i < 150 && !done.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (!done.load() && child) child->Signal(SIGKILL);
    });
    supervisor_.join();
    done = true;
    killer.join();
  }
  core_.reset();
}

int RunUcxDataPlaneChild(int argc, char** argv) {
  // argv: oscarkvd --internal-ucx-data-plane SHM_PATH POOL_BYTES TLS NETDEVS PARENT_PID
  if (argc != 7) {
    std::fprintf(stderr, "oscarkvd: --internal-ucx-data-plane is internal to oscarkvd\n");
    return 2;
  }
  uint64_t bytes = 0;
  int64_t parent = 0;
  if (!absl::SimpleAtoi(argv[3], &bytes) || !absl::SimpleAtoi(argv[6], &parent) ||
      bytes == 0) {
    std::fprintf(stderr, "oscarkvd: bad --internal-ucx-data-plane arguments\n");
    return 2;
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) return 1;  // the daemon is already gone
  // "fd:N": an isolated pool's read-only descriptor, inherited; else the pool file's path.
  // Read-only either way: the pool's data plane serves RMA gets, and UCX's emulated RMA (tcp)
  // would carry out a put from any peer that reaches the worker, whatever key it presents -- on
  // a read-only mapping that put faults this process (restarted by the daemon), never a page.
  const std::string pool_arg = argv[2];
  int fd = -1;
  if (pool_arg.rfind("fd:", 0) == 0) {
    if (!absl::SimpleAtoi(pool_arg.substr(3), &fd) || fd < 3) fd = -1;
  } else {
    fd = ::open(argv[2], O_RDONLY | O_CLOEXEC);
  }
  const int prot = PROT_READ;
  if (fd < 0) {
    std::fprintf(stderr, "oscarkvd data plane: open %s: %s\n", argv[2], std::strerror(errno));
    return 1;
  }
  void* base = ::mmap(nullptr, bytes, prot, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    std::fprintf(stderr, "oscarkvd data plane: mmap: %s\n", std::strerror(errno));
    return 1;
  }
  int code = 0;
  {
    auto core = UcxDataPlane::Core::Start(argv[4], argv[5], static_cast<uint8_t*>(base), bytes);
    if (!core.ok()) {
      std::fprintf(stderr, "oscarkvd data plane: %s\n", std::string(core.status().message()).c_str());
      return 1;
    }
    const std::string blob = (*core)->info().SerializeAsString();
    const uint64_t len = blob.size();
    if (!WriteFull(1, &len, sizeof(len)) || !WriteFull(1, blob.data(), blob.size())) code = 1;
    // Serve until the daemon closes our stdin (or dies: PDEATHSIG).
    char c;
    while (code == 0) {
      const ssize_t r = ::read(0, &c, 1);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
    }
  }
  ::munmap(base, bytes);
  return code;
}

}  // namespace oscarkv::service
