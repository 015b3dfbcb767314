// Subprocess: the one fork/exec of the project. Spawns a program with a given argv and
// environment, optionally with pipes to its stdin and stdout, and owns the child: the destructor
// SIGKILLs and reaps a child that is still running, so no process outlives its owner by accident.
//
// Everything the child needs (argv, envp, file descriptors) is prepared before fork; between fork
// and exec the child makes only async-signal-safe calls. A failed exec is reported to the parent
// over a close-on-exec pipe, so Spawn returns the exec error (NOT_FOUND / PERMISSION_DENIED /
// INTERNAL naming the program) instead of a child that exits 127.
//
// Exit codes: the child's exit status, or 128 + signal number when a signal ended it.
// Thread-safety: Signal, Running and Wait may be called from different threads (a supervisor
// blocked in Wait while another thread signals); the pid is never signalled after it was reaped,
// so a recycled pid is never hit. The pipe accessors are for one thread.
#pragma once

#include <sys/types.h>

#include <csignal>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace oscarkv {

enum class Stdio {
  kInherit,  // the parent's descriptor
  kPipe,     // a pipe to the parent (stdin_fd() / stdout_fd())
  kNull,     // /dev/null
};

struct SpawnOptions {
  SpawnOptions() = default;
  explicit SpawnOptions(std::vector<std::string> args) : argv(std::move(args)) {}

  std::vector<std::string> argv;  // argv[0] is also the program to run unless `program` is set
  std::string program;            // the file to exec (e.g. "/proc/self/exe"); empty: argv[0]
  bool search_path = false;       // look the program up in $PATH when it contains no '/'
  std::map<std::string, std::string> env;  // set on top of (replacing) the parent's environment
  Stdio stdin_mode = Stdio::kInherit;
  Stdio stdout_mode = Stdio::kInherit;
  bool stderr_to_stdout = false;  // stderr goes wherever stdout goes
  std::string stderr_path;        // else, when set: stderr to this file (created, truncated)
  std::vector<int> inherit_fds;   // kept open across exec (close-on-exec cleared in the child)
  bool close_other_fds = false;   // close every descriptor >= 3 that is not in inherit_fds
  // Sent to the child when the thread that spawned it exits (PR_SET_PDEATHSIG); 0 for none.
  int parent_death_signal = SIGKILL;
};

class Subprocess {
 public:
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(const SpawnOptions& options);
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();  // SIGKILLs and reaps a child still running; closes the pipes

  pid_t pid() const { return pid_; }
  int stdin_fd() const { return stdin_fd_; }    // -1 unless stdin_mode was kPipe (or closed)
  int stdout_fd() const { return stdout_fd_; }  // -1 unless stdout_mode was kPipe (or closed)
  void CloseStdin();   // EOF on the child's stdin
  void CloseStdout();

  // Sends `sig` unless the child was already reaped.
  void Signal(int sig);
  // Reaps the child without blocking when it has exited; true while it runs.
  bool Running();
  // Waits for the child to exit and reaps it: its exit code. DEADLINE_EXCEEDED when it is still
  // running after `timeout` (it is left running). The default blocks until it exits.
  absl::StatusOr<int> Wait(absl::Duration timeout = absl::InfiniteDuration());
  // SIGTERM, then SIGKILL if it has not exited after `grace`; always reaps. The exit code.
  int Terminate(absl::Duration grace);
  // SIGKILL and reap (a child that already exited keeps its own exit code).
  int Kill();

  std::optional<int> exit_code() const;
  // The signal that ended the child, once reaped; nullopt while it runs or when it exited.
  std::optional<int> term_signal() const;
  // "running", "exit N" or "killed by signal N".
  std::string DescribeExit() const;

 private:
  Subprocess() = default;
  // Reaps if the child has exited (blocking when `block`); true once reaped.
  bool TryReap(bool block);

  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  mutable std::mutex mu_;
  bool reaped_ = false;  // guarded by mu_
  int status_ = 0;       // the raw wait status once reaped; guarded by mu_
};

struct RunOutput {
  int exit_code = 0;
  std::string output;  // what the child wrote to its stdout (and stderr, with stderr_to_stdout)
};
// Runs the program to completion, collecting its stdout (options.stdout_mode is forced to
// kPipe). After `timeout` the child is killed and the result is DEADLINE_EXCEEDED.
absl::StatusOr<RunOutput> RunAndCollect(SpawnOptions options, absl::Duration timeout);

}  // namespace oscarkv
