// Helpers for the integration tests: a real oscarkvd child per test, connected clients, and
// real encoded pages with deterministic content.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "oscarkv/client/client.h"
#include "oscarkv/testing/local_daemon.h"
#include "oscarkv/kernels/page_codec.h"

namespace oscarkv::testing {

// Starts oscarkvd (the one this build made) on 127.0.0.1, port 0, with its own shm segment.
// A pool segment name no earlier test process can have left behind: a SIGKILLed daemon leaves
// its /dev/shm file, and with pids wrapping at 32768 a name of pid and sequence alone was
// sometimes taken, so the daemon refused to start ("already exists").
inline std::string UniqueShmName(const std::string& prefix, int seq) {
  const auto ns = std::chrono::system_clock::now().time_since_epoch().count();
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(seq) + "-" +
         std::to_string(static_cast<uint64_t>(ns) % 1000000000000ull);
}

inline std::unique_ptr<testing::LocalDaemon> StartDaemon(std::vector<std::string> flags = {}) {
  static int seq = 0;
  testing::LocalDaemonOptions o;
  o.binary = OSCARKVD_PATH;
  o.flags = {"--metrics-listen", "off", "--shm-name", UniqueShmName("oscarkv-it", seq++)};
  bool has_pool = false;
  for (const auto& f : flags) has_pool |= f == "--pool-mb";
  if (!has_pool) o.flags.insert(o.flags.end(), {"--pool-mb", "64"});
  o.flags.insert(o.flags.end(), flags.begin(), flags.end());
  auto d = testing::LocalDaemon::Start(o);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

inline std::unique_ptr<client::Client> Connect(const std::string& addr,
                                               client::DataPath path = client::DataPath::kAuto,
                                               bool verify = true) {
  client::ConnectOptions o;
  o.address = addr;
  o.data_path = path;
  o.verify_checksums = verify;
  auto c = client::Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

inline uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A real page of `profile` whose content is a pure function of `seed` (one block of
// page_tokens tokens, rows uniform in [-2, 2), already "rotated").
inline std::vector<uint8_t> MakePage(const CodecProfile& p, PageKind kind, uint64_t seed) {
  const uint32_t T = p.page_tokens;
  std::vector<float> kv(size_t{p.num_layers} * 2 * T * p.num_kv_heads * p.head_dim);
  for (size_t i = 0; i < kv.size(); ++i) {
    kv[i] = static_cast<float>(SplitMix(seed * 0x100000001b3ull + i) >> 40) / (1 << 22) - 2.0f;
  }
  KVSequenceView view{kv.data(), p.num_layers, p.num_kv_heads, p.head_dim, T};
  auto page = EncodePage(p, nullptr, kind, view, 0, T);
  EXPECT_TRUE(page.ok()) << page.status();
  return page.ok() ? *std::move(page) : std::vector<uint8_t>{};
}

// Token ids of a synthetic request: `n` tokens, ids a function of (seed, position).
inline std::vector<uint32_t> Tokens(uint64_t seed, size_t n) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>(SplitMix(seed * 1000003 + i) % 151936);
  return t;
}

inline client::Codec RegisterRefmodel(client::Client& c) {
  auto codec = c.RegisterCodec(*BuiltinProfile("refmodel"));
  EXPECT_TRUE(codec.ok()) << codec.status();
  return codec.ok() ? *codec : client::Codec{};
}

// `n` pages of `codec` (INT2) under the block keys of `n` blocks of tokens `token_seed`, page i
// made from seed `page_seed + i`; `writes` points into `pages` (do not copy the batch).
struct PageBatch {
  std::vector<BlockKey> keys;
  std::vector<std::vector<uint8_t>> pages;
  std::vector<client::PageWrite> writes;
};
inline PageBatch MakeBatch(const client::Codec& codec, uint64_t token_seed, size_t n,
                           uint64_t page_seed) {
  PageBatch b;
  b.keys = client::Client::BlockKeys(codec, Tokens(token_seed, n * codec.profile.page_tokens));
  EXPECT_EQ(b.keys.size(), n);
  for (size_t i = 0; i < n; ++i) {
    b.pages.push_back(MakePage(codec.profile, PageKind::kInt2, page_seed + i));
  }
  for (size_t i = 0; i < b.keys.size() && i < n; ++i) {
    b.writes.push_back({b.keys[i], PageKind::kInt2, b.pages[i]});
  }
  return b;
}

// GET /metrics of a daemon started with --metrics-listen (HTTP/1.0: the body ends at close).
inline std::string MetricsText(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  ::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &a.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[16384];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

// The value of the metric line of `metrics` that starts with `prefix` (0 when absent).
inline uint64_t MetricValue(const std::string& metrics, const std::string& prefix) {
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StartsWith(line, prefix)) continue;
    uint64_t v = 0;
    if (absl::SimpleAtoi(line.substr(prefix.size()), &v)) return v;
  }
  return 0;
}

}  // namespace oscarkv::testing
