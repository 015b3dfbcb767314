// LocalDaemon: runs an oscarkvd as a child process of this one, for integration tests and the
// `oscarkv` tool's self-contained commands (demo, pd, bench service). Part of oscarkv::testing,
// which is not installed: an engine links oscarkv::client and talks to a daemon it did not fork.
//
// Contract
// * Start() spawns the binary with the given flags plus `--listen 127.0.0.1:0` (unless a
//   --listen flag is given), waits for its one ready line on stdout
//   (`oscarkvd ready listen=HOST:PORT metrics=HOST:PORT shm=/dev/shm/NAME pool_bytes=N
//   local=PATH|off`) and
//   parses it. Everything the daemon prints afterwards on stdout is drained and dropped. The
//   child is spawned by oscarkv::Subprocess (util/subprocess.h).
// * The LocalDaemon owns the child: the destructor stops it (SIGTERM, then SIGKILL after the
//   grace period). The child also gets SIGTERM if the thread that started it dies.
// * A daemon that exits normally removes its pool segment itself; when the child is found dead
//   by a signal (Kill(SIGKILL), a crash), the LocalDaemon removes the segment (shm=) and the
//   local control socket (local=) it reported, so killed daemons leave nothing in /dev/shm.
// * Not thread-safe: one owner calls Stop()/Kill().
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace oscarkv {
class Subprocess;
}  // namespace oscarkv

namespace oscarkv::testing {

struct LocalDaemonOptions {
  std::string binary;              // path of oscarkvd; empty = FindDaemonBinary()
  std::vector<std::string> flags;  // e.g. {"--pool-mb", "64", "--default-lease-ms", "500"}
  int64_t ready_timeout_ms = 30000;
  // Where the daemon's stderr (its log) goes: empty = inherited from this process.
  std::string log_path;
};

class LocalDaemon {
 public:
  static absl::StatusOr<std::unique_ptr<LocalDaemon>> Start(const LocalDaemonOptions& options);
  ~LocalDaemon();
  LocalDaemon(const LocalDaemon&) = delete;
  LocalDaemon& operator=(const LocalDaemon&) = delete;

  // oscarkvd next to the running executable (<build>/cli/../service/oscarkvd, or the same
  // directory for an installed layout), else from $OSCARKVD; NOT_FOUND naming where it looked.
  static absl::StatusOr<std::string> FindDaemonBinary();

  const std::string& address() const { return address_; }          // listen=
  const std::string& metrics_address() const { return metrics_; }  // metrics=
  const std::string& shm_path() const { return shm_path_; }         // shm=
  const std::string& local_socket() const { return local_socket_; } // local= ("" when off)
  uint64_t pool_bytes() const { return pool_bytes_; }
  pid_t pid() const;
  const std::string& ready_line() const { return ready_line_; }

  // SIGTERM, then waits up to `grace_ms` (SIGKILL after that). Returns the exit code (128+sig
  // when killed by a signal). Stopping twice returns the first result.
  absl::StatusOr<int> Stop(int64_t grace_ms = 10000);
  // Sends `sig` (e.g. SIGKILL) and reaps the child.
  void Kill(int sig);
  // Sends `sig` and returns at once (a test that keeps talking to a daemon while it drains).
  void Signal(int sig);
  // Waits up to `timeout_ms` for the child to exit on its own: its exit code (128+sig when a
  // signal ended it); DEADLINE_EXCEEDED leaves it running.
  absl::StatusOr<int> Wait(int64_t timeout_ms);
  // True while the child process has not exited.
  bool Running();

 private:
  LocalDaemon();
  // Waits up to timeout_ms for the child to exit; its exit code. Removes what a killed daemon
  // leaves behind (its pool segment and local socket).
  absl::StatusOr<int> Reap(int64_t timeout_ms);

  std::unique_ptr<Subprocess> proc_;
  std::thread drain_;
  std::string address_, metrics_, shm_path_, local_socket_, ready_line_;
  uint64_t pool_bytes_ = 0;
  bool cleaned_up_ = false;
};

}  // namespace oscarkv::testing
