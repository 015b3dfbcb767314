// Out-of-band exchange of worker addresses and memory blobs without gRPC, for tests and
// benchmarks (oscarkv::testing_ucx, not installed): length-prefixed blobs over a socket or pipe, a child process started with one end
// of a socketpair, and a server loop that progresses a worker until its control socket closes.
//
// Nothing here opens a network socket: the control channel is an AF_UNIX socketpair inherited
// across fork/exec. UCX's own traffic goes where the context's UCX_TLS / UCX_NET_DEVICES send it.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "oscarkv/transport/transport.h"

namespace oscarkv {
class Subprocess;
}  // namespace oscarkv

namespace oscarkv::testing {

// Owns a file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.Release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int Release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// Blob framing: u32 little-endian length, then the bytes. At most 64 MiB.
absl::Status SendBlob(int fd, absl::string_view blob);
// DEADLINE_EXCEEDED on timeout, UNAVAILABLE when the other end closed.
absl::StatusOr<std::string> RecvBlob(int fd, absl::Duration timeout);

// A child process holding one end of a socketpair as its control channel.
class PeerProcess {
 public:
  // fork + exec `argv` with the child's end of a socketpair at fd `child_fd` (also appended to
  // argv as "--control-fd=<n>" when append_fd_arg) and `env` set on top of the environment.
  static absl::StatusOr<PeerProcess> Spawn(std::vector<std::string> argv,
                                           const std::map<std::string, std::string>& env,
                                           bool append_fd_arg = true);
  PeerProcess();
  PeerProcess(PeerProcess&& o) noexcept;
  PeerProcess& operator=(PeerProcess&& o) noexcept;
  ~PeerProcess();  // SIGKILLs and reaps a child that is still running

  pid_t pid() const;  // -1 once reaped
  int control_fd() const { return control_.get(); }
  void Kill(int sig);
  // Closes the control channel (the child's cue to exit) and reaps; the child's exit status.
  absl::StatusOr<int> CloseAndWait(absl::Duration timeout);

 private:
  std::unique_ptr<Subprocess> proc_;
  UniqueFd control_;
};

// Answers one command blob arriving on the control channel with a reply blob.
using ControlHandler = std::function<std::string(const std::string& command)>;

// Server loop: progresses `worker` (sleeping on its event fd and the control fd when idle) until
// the control channel reaches EOF (OK) or `max_time` passes (DEADLINE_EXCEEDED). Command blobs
// on the control channel are answered by `handler` (an empty reply without one).
absl::Status ServeUntilClosed(transport::Worker& worker, int control_fd, absl::Duration max_time,
                              const ControlHandler& handler = nullptr);

// Parses "--control-fd=<n>" style values; INVALID_ARGUMENT unless a valid open fd.
absl::StatusOr<int> ParseControlFd(absl::string_view value);

}  // namespace oscarkv::testing
