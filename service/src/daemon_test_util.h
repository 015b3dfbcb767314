// Helpers of the daemon process tests (daemon_smoke_test.cc, daemon_local_socket_test.cc): the
// real oscarkvd binary (OSCARKVD_PATH) on free ports with a 32 MiB pool, run through
// oscarkv::testing::LocalDaemon (a daemon that must come up) or oscarkv::Subprocess (a start that
// must fail), so these tests fork nothing by hand and never leave a daemon behind.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "oscarkv/testing/local_daemon.h"
#include "oscarkv/util/subprocess.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"

namespace oscarkv::service::testing {

inline std::vector<std::string> DaemonArgs(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--metrics-listen", "127.0.0.1:0", "--pool-mb", "32",
                                   "--log-level",      "warn"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Starts oscarkvd with the default flags plus `extra` (`--listen 127.0.0.1:0` unless `extra`
// has a --listen) and waits up to 20 s for its ready line.
inline absl::StatusOr<std::unique_ptr<oscarkv::testing::LocalDaemon>> Start(
    const std::vector<std::string>& extra) {
  oscarkv::testing::LocalDaemonOptions o;
  o.binary = OSCARKVD_PATH;
  o.flags = DaemonArgs(extra);
  o.ready_timeout_ms = 20000;
  return oscarkv::testing::LocalDaemon::Start(o);
}

// SIGTERM, then its exit code once it exits; -1 when it was still running after 10 s (then it
// is killed).
inline int StopAndWait(oscarkv::testing::LocalDaemon& d) {
  auto code = d.Stop(10000);
  return code.ok() ? *code : -1;
}

// The exit code of a daemon that was told to stop (e.g. d.Signal(SIGTERM)) once it exits;
// -1 when it is still running after `ms` (then it is killed).
inline int WaitExit(oscarkv::testing::LocalDaemon& d, int64_t ms) {
  auto code = d.Wait(ms);
  if (code.ok()) return *code;
  d.Kill(SIGKILL);
  return -1;
}

struct Exited {
  pid_t pid = -1;
  int exit_code = -1;  // -1: it did not exit within the timeout (then it was killed)
  std::string output;  // its stdout
};

// Runs oscarkvd (default flags, `--listen 127.0.0.1:0` first, then `extra`) for a start that
// must fail: waits up to `ms` for it to exit on its own.
inline Exited RunToExit(const std::vector<std::string>& extra, int64_t ms) {
  SpawnOptions so({OSCARKVD_PATH, "--listen", "127.0.0.1:0"});
  const std::vector<std::string> args = DaemonArgs(extra);
  so.argv.insert(so.argv.end(), args.begin(), args.end());
  so.stdout_mode = Stdio::kPipe;  // a failed start prints a few lines at most: the pipe holds them
  Exited e;
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) {
    e.output = std::string(p.status().message());
    return e;
  }
  e.pid = (*p)->pid();
  auto code = (*p)->Wait(absl::Milliseconds(ms));
  if (!code.ok()) {
    (*p)->Kill();
    return e;
  }
  e.exit_code = *code;
  char buf[4096];
  ssize_t n;
  while ((n = ::read((*p)->stdout_fd(), buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) e.output.append(buf, static_cast<size_t>(n));
  }
  return e;
}

// A gRPC Handshake at wire version 1.
inline grpc::Status GrpcHandshake(v1::KvCache::Stub& stub, v1::HandshakeResponse* resp) {
  grpc::ClientContext ctx;
  v1::HandshakeRequest req;
  req.set_wire_version(1);
  return stub.Handshake(&ctx, req, resp);
}

}  // namespace oscarkv::service::testing
