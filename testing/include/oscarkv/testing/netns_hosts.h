// Two "hosts" for the P/D handoff's demo (`oscarkv pd demo`) and tests (oscarkv::testing, not
// installed): two Linux network namespaces joined by a
// veth pair (10.R.S.1 <-> 10.R.S.2/24), or plain loopback when namespaces cannot be made.
//
// Contract
// * NetnsHosts::Create() needs root (CAP_SYS_ADMIN/CAP_NET_ADMIN) and the `ip` tool; it returns
//   UNAVAILABLE (with the reason) when it cannot make them, and undoes whatever it made. Names
//   are unique per process (prefix + pid + counter). The destructor deletes both namespaces
//   (which deletes the veth pair); every exit path that runs destructors cleans up.
// * Traffic stays inside the namespaces this object created (or on 127.0.0.0/8).
// * RunProcess: runs a program to completion (util/subprocess.h) with stdout captured; stderr
//   is inherited.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace oscarkv::testing {

class NetnsHosts {
 public:
  static absl::StatusOr<std::unique_ptr<NetnsHosts>> Create(const std::string& prefix = "okvpd");
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  const std::string& name(int host) const { return ns_[host]; }
  const std::string& address(int host) const { return addr_[host]; }
  // The host's end of the veth pair (for UCX_NET_DEVICES).
  const std::string& device(int host) const { return dev_[host]; }
  // argv prefix that runs a command on `host`: {ip, "netns", "exec", name}.
  std::vector<std::string> Exec(int host) const;

 private:
  NetnsHosts() = default;
  std::string ip_;
  std::string ns_[2], addr_[2], dev_[2];
  bool created_[2] = {false, false};
};

// Path of the `ip` tool, or NOT_FOUND.
absl::StatusOr<std::string> FindIpTool();

struct ProcessResult {
  int exit_code = 0;  // 128+signal when killed
  std::string out;    // its stdout
};
// Runs argv[0] (a path) with argv, waits at most timeout_ms (then SIGKILL).
absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                         int64_t timeout_ms = 120000);

}  // namespace oscarkv::testing
