// Helpers of the daemon process tests (daemon_smoke_test.cc, daemon_local_socket_test.cc):
// launch the real oscarkvd binary on free ports and wait for it to exit.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"

namespace oscarkv::service::testing {

struct Daemon {
  pid_t pid = -1;
  std::map<std::string, std::string> ready;  // fields of the ready line
  std::string line;
};

// Starts oscarkvd and waits (up to 20 s) for its ready line.
inline Daemon Start(std::vector<std::string> extra) {
  Daemon d;
  int out[2];
  if (pipe(out) != 0) return d;
  std::vector<std::string> args = {OSCARKVD_PATH, "--listen", "127.0.0.1:0", "--metrics-listen",
                                   "127.0.0.1:0", "--pool-mb", "32", "--log-level", "warn"};
  args.insert(args.end(), extra.begin(), extra.end());
  d.pid = fork();
  if (d.pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline && d.line.find('\n') == std::string::npos) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    d.line.append(buf, n);
  }
  close(out[0]);
  std::istringstream in(d.line.substr(0, d.line.find('\n')));
  std::string word;
  while (in >> word) {
    if (auto eq = word.find('='); eq != std::string::npos) {
      d.ready[word.substr(0, eq)] = word.substr(eq + 1);
    }
  }
  return d;
}

// Exit code of `pid` once it exits (killing it after `ms`: then -1).
inline int WaitExit(pid_t pid, int ms) {
  int status = 0;
  for (int i = 0; i < ms / 50; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    usleep(50000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

inline int StopAndWait(pid_t pid) {
  kill(pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 200; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    usleep(50000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// A gRPC Handshake at wire version 1.
inline grpc::Status GrpcHandshake(v1::KvCache::Stub& stub, v1::HandshakeResponse* resp) {
  grpc::ClientContext ctx;
  v1::HandshakeRequest req;
  req.set_wire_version(1);
  return stub.Handshake(&ctx, req, resp);
}

}  // namespace oscarkv::service::testing
