#include "oscarkv/testing/netns_hosts.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "oscarkv/util/subprocess.h"

namespace oscarkv::testing {
namespace {

std::atomic<int> g_counter{0};

// Runs `ip` with its stderr captured too: its errors become the Status.
absl::Status RunIp(const std::string& ip, std::vector<std::string> args) {
  args.insert(args.begin(), ip);
  SpawnOptions o(args);
  o.stderr_to_stdout = true;
  auto r = RunAndCollect(std::move(o), absl::Seconds(30));
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    std::string out = r->output;
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return absl::UnavailableError(
        absl::StrCat("`", absl::StrJoin(args, " "), "` failed (exit ", r->exit_code, "): ", out));
  }
  return absl::OkStatus();
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
  auto r = RunAndCollect(SpawnOptions(argv), absl::Milliseconds(timeout_ms));
  if (!r.ok()) return r.status();
  return ProcessResult{r->exit_code, std::move(r->output)};
}

}  // namespace oscarkv::testing
