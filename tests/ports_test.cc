// What oscarkvd listens on, against real daemon processes: a taken metrics port is an error that
// names the port (no silent sharing through SO_REUSEPORT); metrics on their own address; a peer
// the local socket refuses gets a PERMISSION_DENIED frame before the close; the UCX data plane
// listens only on the gRPC listen address's interface.
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "oscarkv/v1/local_control.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

std::string TempPath(const std::string& what) {
  return ::testing::TempDir() + "/ports_test_" + std::to_string(::getpid()) + "_" + what;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::StatusOr<std::unique_ptr<testing::LocalDaemon>> Start(std::vector<std::string> flags,
                                                           const std::string& log = "") {
  static int seq = 0;
  testing::LocalDaemonOptions o;
  o.binary = OSCARKVD_PATH;
  o.flags = {"--pool-mb", "64", "--shm-name", UniqueShmName("oscarkv-ports", seq++)};
  o.flags.insert(o.flags.end(), flags.begin(), flags.end());
  o.log_path = log;
  return testing::LocalDaemon::Start(o);
}

int PortOf(const std::string& host_port) {
  return std::stoi(host_port.substr(host_port.rfind(':') + 1));
}

// GET /metrics over a plain TCP connection; the response's status line and body.
std::string HttpGet(const std::string& host, int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return "connect failed";
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (int i = 0; i < 10000; ++i) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

TEST(PortsTest, TakenMetricsPortIsAnErrorNamingThePort) {
  auto first = Start({"--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = PortOf((*first)->metrics_address());
  ASSERT_GT(port, 0);

  // A second daemon asking for the same metrics port must not share it.
  const std::string log = TempPath("second.log");
  auto second = Start({"--metrics-listen", "127.0.0.1:" + std::to_string(port)}, log);
  ASSERT_FALSE(second.ok()) << "a second daemon started on taken metrics port " << port;
  const std::string text = ReadFile(log);
  // One line naming the address and saying it is taken (the start-up check before any bind, or
  // the metrics server's own bind).
  EXPECT_NE(text.find("oscarkvd: "), std::string::npos) << text;
  EXPECT_NE(text.find("cannot listen on 127.0.0.1:" + std::to_string(port) + ": "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("in use"), std::string::npos) << text;
  EXPECT_NE(std::string(second.status().message()).find("with status 1"), std::string::npos)
      << second.status();
  // The first daemon still answers on its port.
  EXPECT_NE(HttpGet("127.0.0.1", port, "/metrics").find("oscarkv_pool_bytes"), std::string::npos);
  std::remove(log.c_str());
}

// cpp-httplib's default socket options set SO_REUSEPORT, and two sockets that both set it share
// a port: a listener holding the port with SO_REUSEPORT (as an oscarkvd before this fix did)
// must still make the daemon fail.
TEST(PortsTest, MetricsPortHeldWithReusePortIsStillTaken) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int yes = 1;
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof(yes)), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);

  const std::string log = TempPath("reuseport.log");
  auto d = Start({"--metrics-listen", "127.0.0.1:" + std::to_string(port)}, log);
  EXPECT_FALSE(d.ok()) << "the daemon shared metrics port " << port << " via SO_REUSEPORT";
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find("cannot listen on 127.0.0.1:" + std::to_string(port) + ": "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("in use"), std::string::npos) << text;
  ::close(fd);
  std::remove(log.c_str());
}

TEST(PortsTest, MetricsOnTheirOwnAddress) {
  // 127.0.0.2 is loopback too (127.0.0.0/8): metrics there, gRPC on 127.0.0.1.
  auto d = Start({"--metrics-listen", "127.0.0.2:0"});
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string m = (*d)->metrics_address();
  ASSERT_EQ(m.rfind("127.0.0.2:", 0), 0u) << m;
  EXPECT_EQ((*d)->address().rfind("127.0.0.1:", 0), 0u) << (*d)->address();
  EXPECT_NE(HttpGet("127.0.0.2", PortOf(m), "/metrics").find("oscarkv_pool_bytes"),
            std::string::npos);
  EXPECT_EQ(HttpGet("127.0.0.1", PortOf(m), "/metrics"), "connect failed");
}

// The local socket admits root and the daemon's uid. A peer of another uid that reaches the
// socket anyway (here: its mode loosened) reads one PERMISSION_DENIED frame, then EOF.
TEST(PortsTest, LocalSocketRefusedPeerGetsPermissionDenied) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  auto d = Start({"--metrics-listen", "off"});
  ASSERT_TRUE(d.ok()) << d.status();
  const std::string path = (*d)->local_socket();
  ASSERT_FALSE(path.empty());
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0);

  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipefd[0]);
    std::string report;
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
      report = "setuid failed";
    } else {
      const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
      timeval tv{5, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        report = std::string("connect: ") + std::strerror(errno);
      } else {
        char buf[8192];
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        const ssize_t eof = n > 0 ? ::recv(fd, buf + n, sizeof(buf) - n, 0) : -1;
        v1::local::ResponseHeader h;
        if (n < static_cast<ssize_t>(sizeof(h))) {
          report = "no frame (" + std::to_string(n) + ")";
        } else {
          std::memcpy(&h, buf, sizeof(h));
          report = "magic=" + std::to_string(h.magic == v1::local::kMagic) +
                   " code=" + std::to_string(h.code) + " id=" + std::to_string(h.id) +
                   " eof=" + std::to_string(eof) + " msg=" +
                   std::string(buf + sizeof(h), std::min<size_t>(h.message_bytes,
                                                                 n - sizeof(h)));
        }
      }
      ::close(fd);
    }
    (void)!::write(pipefd[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(pipefd[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof(buf))) > 0;) report.append(buf, n);
  ::close(pipefd[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  EXPECT_EQ(report.rfind("magic=1 code=7 id=0 eof=0 msg=uid 65534 may not use this socket", 0),
            0u)
      << report;
  // Its own uid's clients are still served.
  auto c = Connect((*d)->address());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->server().lookup_path, client::LookupPath::kLocal);
}

// Listening TCP sockets (and bound UDP sockets) of a process: "ADDR:PORT" strings.
std::vector<std::string> ListeningAddresses(pid_t pid) {
  std::set<std::string> inodes;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      char target[256];
      const ssize_t n =
          ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      const std::string t(target, static_cast<size_t>(n));
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    ::closedir(d);
  }
  std::vector<std::string> out;
  for (const char* table : {"tcp", "tcp6", "udp", "udp6"}) {
    const bool tcp = table[0] == 't';
    const bool v6 = std::strchr(table, '6') != nullptr;
    std::ifstream in("/proc/" + std::to_string(pid) + "/net/" + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (!inodes.count(inode) || (tcp && state != "0A")) continue;  // 0A = LISTEN
      const std::string hex = local.substr(0, local.find(':'));
      const int port = std::stoi(local.substr(local.find(':') + 1), nullptr, 16);
      char text[INET6_ADDRSTRLEN] = "?";
      if (!v6) {
        in_addr a{static_cast<in_addr_t>(std::stoul(hex, nullptr, 16))};
        ::inet_ntop(AF_INET, &a, text, sizeof(text));
      } else {
        in6_addr a{};
        for (int w = 0; w < 4; ++w) {
          const uint32_t word = static_cast<uint32_t>(std::stoul(hex.substr(w * 8, 8), nullptr, 16));
          std::memcpy(reinterpret_cast<uint8_t*>(&a) + w * 4, &word, 4);
        }
        ::inet_ntop(AF_INET6, &a, text, sizeof(text));
      }
      out.push_back(std::string(table) + " " + text + ":" + std::to_string(port));
    }
  }
  return out;
}

// The daemon's isolated UCX data-plane process (its child running --internal-ucx-data-plane).
pid_t DataPlaneChild(pid_t daemon) {
  DIR* d = ::opendir("/proc");
  pid_t found = -1;
  while (dirent* e = d ? ::readdir(d) : nullptr) {
    const pid_t p = static_cast<pid_t>(std::atoi(e->d_name));
    if (p <= 0) continue;
    const std::string stat = ReadFile("/proc/" + std::to_string(p) + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream f(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    f >> state >> ppid;
    if (ppid != daemon) continue;
    if (ReadFile("/proc/" + std::to_string(p) + "/cmdline").find("--internal-ucx-data-plane") !=
        std::string::npos) {
      found = p;
    }
  }
  if (d) ::closedir(d);
  return found;
}

bool IsLoopbackText(const std::string& entry) {
  const std::string addr = entry.substr(entry.find(' ') + 1, entry.rfind(':') - entry.find(' ') - 1);
  return addr.rfind("127.", 0) == 0 || addr == "::1" || addr.rfind("::ffff:127.", 0) == 0;
}

// A non-loopback IPv4 address of an interface that is up, or "".
std::string NonLoopbackAddress() {
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return "";
  std::string out;
  for (ifaddrs* i = ifs; i != nullptr && out.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                sizeof(text));
    out = text;
  }
  ::freeifaddrs(ifs);
  return out;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += e + "; ";
  return s;
}

TEST(PortsTest, UcxDataPlaneListensOnlyOnTheListenInterface) {
  auto d = Start({"--metrics-listen", "off", "--ucx-tls", "tcp"});
  ASSERT_TRUE(d.ok()) << d.status();
  const pid_t child = DataPlaneChild((*d)->pid());
  ASSERT_GT(child, 0) << "no UCX data-plane process under daemon " << (*d)->pid();
  const auto child_listens = ListeningAddresses(child);
  ASSERT_FALSE(child_listens.empty()) << "the tcp data plane listens nowhere";
  for (const auto& l : child_listens) {
    EXPECT_TRUE(IsLoopbackText(l)) << "data plane listens on " << l << " (all: "
                                   << Join(child_listens) << ")";
  }
  for (const auto& l : ListeningAddresses((*d)->pid())) {
    EXPECT_TRUE(IsLoopbackText(l)) << "daemon listens on " << l;
  }
}

// The control for the test above: with every device allowed, a host with a non-loopback
// interface gets a data-plane listener there, so the check above can see one. (The whole-pool
// data plane reachable off this host needs --ucx-allow-unverified-rma: ucx_dataplane_test.)
TEST(PortsTest, UcxAllDevicesListensBeyondLoopback) {
  const std::string other = NonLoopbackAddress();
  if (other.empty()) GTEST_SKIP() << "this host has no non-loopback IPv4 interface";
  auto d = Start({"--metrics-listen", "off", "--ucx-tls", "tcp", "--ucx-net-devices", "all",
                  "--ucx-allow-unverified-rma"});
  ASSERT_TRUE(d.ok()) << d.status();
  const pid_t child = DataPlaneChild((*d)->pid());
  ASSERT_GT(child, 0);
  const auto listens = ListeningAddresses(child);
  bool beyond = false;
  for (const auto& l : listens) beyond |= !IsLoopbackText(l);
  EXPECT_TRUE(beyond) << "with all devices, expected a listener beyond loopback (" << other
                      << "): " << Join(listens);
}

// The whole-pool data plane on loopback is open to every local uid (UCX accepts any peer): not
// gated, but the daemon says so at start; with --ucx off it does not.
TEST(PortsTest, PoolDataPlaneOnLoopbackWarnsThatEveryLocalUserReachesIt) {
  const std::string log = TempPath("ucx_warn.log");
  {
    auto d = Start({"--metrics-listen", "off", "--ucx-tls", "tcp"}, log);
    ASSERT_TRUE(d.ok()) << d.status();
  }
  std::string text = ReadFile(log);
  EXPECT_NE(text.find("event=ucx_pool_plane_open_to_local_users"), std::string::npos) << text;
  EXPECT_NE(text.find("can read every page in the pool"), std::string::npos) << text;
  std::remove(log.c_str());
  const std::string off_log = TempPath("ucx_off.log");
  {
    auto d = Start({"--metrics-listen", "off", "--ucx", "off"}, off_log);
    ASSERT_TRUE(d.ok()) << d.status();
  }
  text = ReadFile(off_log);
  EXPECT_EQ(text.find("ucx_pool_plane_open_to_local_users"), std::string::npos) << text;
  std::remove(off_log.c_str());
}

}  // namespace
}  // namespace oscarkv::testing
