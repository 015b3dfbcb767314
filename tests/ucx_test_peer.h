// UCX test helpers shared by ucx_tenant_test and ucx_dataplane_test: a raw UCX peer (what any
// process that reaches a worker can do), the daemon's data-plane processes and what they map,
// and this host's first non-loopback interface.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "oscarkv/transport/transport.h"
#include "tenant_pki.h"

namespace oscarkv::testing {

// What any UCX peer can do with a worker address and an exported key: its own context and
// worker, an endpoint to that worker, RMA gets of whatever address it names.
class RawPeer {
 public:
  static std::unique_ptr<RawPeer> Connect(const std::string& worker_address, size_t bytes) {
    auto p = std::unique_ptr<RawPeer>(new RawPeer);
    transport::ContextOptions co;
    co.tls = "tcp";
    co.net_devices = "lo";
    co.name = "raw-peer";
    auto ctx = transport::Context::Create(co);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    if (!ctx.ok()) return nullptr;
    p->context_ = *std::move(ctx);
    p->buffer_.resize(bytes);
    auto region = p->context_->Register(p->buffer_.data(), p->buffer_.size());
    EXPECT_TRUE(region.ok()) << region.status();
    if (!region.ok()) return nullptr;
    p->region_ = *std::move(region);
    auto worker = transport::Worker::Create(*p->context_);
    EXPECT_TRUE(worker.ok()) << worker.status();
    if (!worker.ok()) return nullptr;
    p->worker_ = *std::move(worker);
    transport::EndpointOptions eo;
    eo.peer_timeout = absl::Milliseconds(1000);
    eo.error_handling = transport::EndpointOptions::ErrorHandling::kPeer;
    auto ep = p->worker_->Connect(worker_address, eo);
    EXPECT_TRUE(ep.ok()) << ep.status();
    if (!ep.ok()) return nullptr;
    p->ep_ = *std::move(ep);
    return p;
  }
  ~RawPeer() {
    ep_.reset();
    worker_.reset();
    region_.reset();
    context_.reset();
  }
  // A well-formed key the daemon never issued: this peer's own buffer's.
  std::string OwnKey() const { return region_->exported(); }
  // Writes `bytes` at `addr` of the peer with the key `rkey_blob` (an RMA put).
  absl::Status Put(const std::string& rkey_blob, uint64_t addr, std::span<const uint8_t> bytes) {
    if (bytes.size() > buffer_.size()) return absl::InvalidArgumentError("larger than the buffer");
    auto remote = ep_->ImportRemote(rkey_blob);
    if (!remote.ok()) return remote.status();
    std::copy(bytes.begin(), bytes.end(), buffer_.begin());
    const transport::TransferDesc d{buffer_.data(), addr, bytes.size()};
    absl::Status s = ep_->Run(transport::Direction::kPut, *region_, **remote,
                              std::span<const transport::TransferDesc>(&d, 1),
                              absl::Milliseconds(3000));
    remote->reset();
    return s;
  }
  // `n` bytes at `addr` of the peer, using the key `rkey_blob` (a MemoryRegion::exported()).
  absl::StatusOr<std::vector<uint8_t>> Get(const std::string& rkey_blob, uint64_t addr,
                                           size_t n) {
    if (n > buffer_.size()) return absl::InvalidArgumentError("larger than the buffer");
    auto remote = ep_->ImportRemote(rkey_blob);
    if (!remote.ok()) return remote.status();
    std::fill(buffer_.begin(), buffer_.end(), 0);
    const transport::TransferDesc d{buffer_.data(), addr, n};
    absl::Status s = ep_->Run(transport::Direction::kGet, *region_, **remote,
                              std::span<const transport::TransferDesc>(&d, 1),
                              absl::Milliseconds(3000));
    remote->reset();
    if (!s.ok()) return s;
    return std::vector<uint8_t>(buffer_.begin(), buffer_.begin() + n);
  }

 private:
  RawPeer() = default;
  std::unique_ptr<transport::Context> context_;
  std::vector<uint8_t> buffer_;
  std::unique_ptr<transport::MemoryRegion> region_;
  std::unique_ptr<transport::Worker> worker_;
  std::unique_ptr<transport::Endpoint> ep_;
};

// The daemon's data-plane children: oscarkvd processes whose parent is the daemon, in the
// internal data-plane mode, over `bytes` (0: any size; a tenant's maps kRegionBytes, the pool's
// 64 MiB).
inline std::vector<pid_t> DataPlaneChildren(pid_t daemon, uint64_t bytes) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    const std::string stat = ReadTextFile("/proc/" + std::to_string(pid) + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
    if (f.size() < 2 || std::atoi(f[1].c_str()) != daemon) continue;
    std::vector<std::string> argv =
        absl::StrSplit(ReadTextFile("/proc/" + std::to_string(pid) + "/cmdline"), '\0');
    if (argv.size() > 3 && argv[1] == "--internal-ucx-data-plane" &&
        (bytes == 0 || argv[3] == std::to_string(bytes))) {
      out.push_back(pid);
    }
  }
  ::closedir(d);
  return out;
}


// Where `pid` maps the daemon's pool whose file is `shm_path`: that file (trusted mode) or the
// sealed memfd named after it (isolated mode, "/memfd:oscarkv-pool-NAME"). The start address of
// the first such mapping, 0 if none.
inline uint64_t PoolMappedAt(pid_t pid, const std::string& shm_path) {
  const std::string maps = ReadTextFile("/proc/" + std::to_string(pid) + "/maps");
  const std::string memfd =
      "/memfd:oscarkv-pool-" + shm_path.substr(shm_path.find_last_of('/') + 1);
  for (absl::string_view line : absl::StrSplit(maps, '\n')) {
    bool pool = false;
    for (const std::string& name : {shm_path, memfd}) {
      pool |= absl::EndsWith(line, " " + name) || absl::EndsWith(line, " " + name + " (deleted)");
    }
    if (!pool) continue;
    uint64_t start = 0;
    if (absl::SimpleHexAtoi(line.substr(0, line.find('-')), &start)) return start;
  }
  return 0;
}

// The first up, non-loopback IPv4 interface of this host: {address, interface}; empty if none.
inline std::pair<std::string, std::string> NonLoopbackInterface() {
  std::pair<std::string, std::string> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                sizeof(text));
    out = {text, i->ifa_name};
    break;
  }
  ::freeifaddrs(ifs);
  return out;
}


}  // namespace oscarkv::testing
