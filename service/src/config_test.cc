#include "oscarkv/service/config.h"

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"

namespace oscarkv::service {
namespace {

absl::StatusOr<CommandLineAction> Parse(std::vector<std::string> args, DaemonConfig* c) {
  args.insert(args.begin(), "oscarkvd");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data(), c);
}

TEST(Config, EmbeddedDefaultMatchesTheStructDefaults) {
  DaemonConfig parsed;
  parsed.max_batch = 1;  // overwritten by the YAML
  parsed.listen = "x";
  ASSERT_TRUE(ApplyConfigYaml(DefaultConfigYaml(), "default", &parsed).ok());
  DaemonConfig d;
  EXPECT_EQ(parsed.listen, d.listen);
  EXPECT_EQ(parsed.metrics_listen, d.metrics_listen);
  EXPECT_EQ(parsed.max_batch, d.max_batch);
  EXPECT_EQ(parsed.default_lease_ms, d.default_lease_ms);
  EXPECT_EQ(parsed.reservation_ttl_ms, d.reservation_ttl_ms);
  EXPECT_EQ(parsed.reaper_interval_ms, d.reaper_interval_ms);
  EXPECT_EQ(parsed.pool_mb, 0u);
  EXPECT_EQ(parsed.local_socket, d.local_socket);
  EXPECT_EQ(parsed.local_threads, d.local_threads);
  EXPECT_EQ(parsed.local_slice_us, d.local_slice_us);
  EXPECT_TRUE(parsed.Validate().ok());
}

TEST(Config, YamlOverridesAndErrorsNameTheProblem) {
  DaemonConfig c;
  ASSERT_TRUE(ApplyConfigYaml("listen: 0.0.0.0:7000\npool:\n  mb: 128\nlimits:\n  max_batch: 10\n",
                              "t.yaml", &c)
                  .ok());
  EXPECT_EQ(c.listen, "0.0.0.0:7000");
  EXPECT_EQ(c.pool_mb, 128u);
  EXPECT_EQ(c.max_batch, 10u);
  EXPECT_EQ(c.metrics_listen, "127.0.0.1:9464");  // untouched

  absl::Status s = ApplyConfigYaml("listen: [unclosed\n", "bad.yaml", &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bad.yaml"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("line"), absl::string_view::npos) << s;

  s = ApplyConfigYaml("pool:\n  megabytes: 5\n", "t.yaml", &c);
  EXPECT_NE(s.message().find("pool.megabytes"), absl::string_view::npos) << s;
  s = ApplyConfigYaml("limits:\n  max_batch: -3\n", "t.yaml", &c);
  EXPECT_NE(s.message().find("limits.max_batch"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("line 2"), absl::string_view::npos) << s;
  EXPECT_FALSE(ApplyConfigYaml("- a\n- b\n", "t.yaml", &c).ok());
  EXPECT_FALSE(ApplyConfigYaml("pool:\n  huge_pages: maybe\n", "t.yaml", &c).ok());
  EXPECT_EQ(c.max_batch, 10u);  // failed applies change nothing
  EXPECT_TRUE(ApplyConfigYaml("", "empty.yaml", &c).ok());
}

TEST(Config, FlagsOverrideTheFileAndAreValidated) {
  const std::string path = ::testing::TempDir() + "/oscarkvd_test.yaml";
  {
    std::ofstream f(path);
    f << "listen: 127.0.0.1:6000\nleases:\n  default_ms: 1000\n";
  }
  DaemonConfig c;
  auto a = Parse({"--config", path, "--listen", "127.0.0.1:0", "--pool-mb=64",
                  "--metrics-listen", "off", "--log-level", "debug"},
                 &c);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, CommandLineAction::kRun);
  EXPECT_EQ(c.listen, "127.0.0.1:0");
  EXPECT_EQ(c.default_lease_ms, 1000u);
  EXPECT_EQ(c.pool_mb, 64u);
  EXPECT_EQ(c.metrics_listen, "off");

  DaemonConfig d;
  EXPECT_EQ(Parse({"--listen", "nonsense"}, &d).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse({"--listen", "1.2.3.4:70000"}, &d).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse({"--pool-mb", "lots"}, &d).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse({"--log-level", "loud"}, &d).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse({"--bogus"}, &d).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse({"--default-lease-ms", "9", "--max-lease-ms", "5"}, &d).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse({"--config", "/nonexistent/x.yaml"}, &d).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(d.listen, "127.0.0.1:50051");  // untouched by failed parses
  EXPECT_EQ(*Parse({"--help"}, &d), CommandLineAction::kHelp);
  EXPECT_EQ(*Parse({"--print-default-config"}, &d), CommandLineAction::kPrintDefaultConfig);
  EXPECT_TRUE(Parse({"--listen", "unix:/tmp/oscarkvd.sock"}, &d).ok());
  EXPECT_NE(CommandLineHelp().find("--pool-mb"), std::string::npos);
  EXPECT_EQ(CommandLineHelp().rfind("usage: oscarkvd", 0), 0u);
}

TEST(Config, ListenAddresses) {
  auto a = ParseListenAddress("[::1]:0", false, true);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->ToGrpc(), "[::1]:0");
  auto u = ParseListenAddress("unix:/run/x.sock", false, true);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->ToGrpc(), "unix:/run/x.sock");
  EXPECT_FALSE(ParseListenAddress("unix:/x", false, false).ok());
  EXPECT_TRUE(ParseListenAddress("off", true, false)->off);
  EXPECT_FALSE(ParseListenAddress("off", false, false).ok());
  EXPECT_TRUE(ParseListenAddress("localhost:7000", false, true).ok());
  EXPECT_TRUE(ParseListenAddress("0.0.0.0:0", false, true).ok());
  // Refused before gRPC sees them (it would wrap the port or ask DNS about a bare word).
  for (const char* bad : {"127.0.0.1:99999", "127.0.0.1:65536", "localhost", "127.0.0.1:",
                          "127.0.0.1:+80", "::1:5", "[::1:5", "[zz]:5", "a b:5", "host/x:5",
                          ":5", "unix:"}) {
    auto r = ParseListenAddress(bad, false, true);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(bad), absl::string_view::npos) << r.status();
  }
  EXPECT_NE(ParseListenAddress("127.0.0.1:99999", false, true).status().message().find("0..65535"),
            absl::string_view::npos);
  EXPECT_NE(ParseListenAddress("::1:5", false, true).status().message().find("brackets"),
            absl::string_view::npos);
}

TEST(Config, WrongTypeNamesTheTypeProblem) {
  DaemonConfig c;
  auto msg = [&](const std::string& yaml) {
    return std::string(ApplyConfigYaml(yaml, "t.yaml", &c).message());
  };
  EXPECT_NE(msg("pool: 64\n").find("pool must be a map"), std::string::npos) << msg("pool: 64\n");
  EXPECT_EQ(msg("pool: 64\n").find("unknown"), std::string::npos);
  EXPECT_NE(msg("leases: [1, 2]\n").find("leases must be a map"), std::string::npos);
  EXPECT_NE(msg("listen:\n  host: x\n").find("listen must be a single value, not a map"),
            std::string::npos);
  EXPECT_NE(msg("pool:\n  mb:\n    a: 1\n").find("pool.mb must be a single value"),
            std::string::npos);
  EXPECT_NE(msg("node_id: [a, b]\n").find("node_id must be a single value, not a list"),
            std::string::npos);
  EXPECT_NE(msg("pool:\n  mb: lots\n").find("pool.mb: expected an integer"), std::string::npos);
  EXPECT_NE(msg("bogus: 1\n").find("unknown key 'bogus'"), std::string::npos);
  EXPECT_NE(msg("bogus:\n  a: 1\n").find("unknown section 'bogus'"), std::string::npos);
  EXPECT_NE(msg("pool:\n  nope: 1\n").find("unknown key 'pool.nope'"), std::string::npos);
  EXPECT_NE(msg("node_id: a\npool: 64\n").find("line 2"), std::string::npos);
  EXPECT_TRUE(ApplyConfigYaml("pool:\n", "t.yaml", &c).ok());  // an empty section
}

// --print-default-config is the reference: every flag of --help appears in it.
TEST(Config, DefaultConfigListsEveryFlag) {
  const std::string help = CommandLineHelp(), yaml = DefaultConfigYaml();
  int flags = 0;
  for (size_t p = help.find("\n  --"); p != std::string::npos; p = help.find("\n  --", p + 1)) {
    const size_t end = help.find_first_of(" \n", p + 3);
    const std::string flag = help.substr(p + 3, end - p - 3);
    if (flag == "--help") continue;
    ++flags;
    EXPECT_NE(yaml.find(flag + " "), std::string::npos) << flag << " missing from the default config";
  }
  EXPECT_GT(flags, 20);
}

}  // namespace
}  // namespace oscarkv::service

namespace oscarkv::service {
namespace {

TEST(Config, CpuLists) {
  EXPECT_EQ(*ParseCpuList("1"), (std::vector<int>{1}));
  EXPECT_EQ(*ParseCpuList("2-4,0,3"), (std::vector<int>{0, 2, 3, 4}));
  for (const char* bad : {"", "x", "1-", "-1", "3-1", "1,,2", "1024", "0-2000"}) {
    EXPECT_FALSE(ParseCpuList(bad).ok()) << bad;
  }
  DaemonConfig c;
  auto ok = Parse({"--cpus", "0-1"}, &c);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(c.cpus, "0-1");
  auto bad = Parse({"--cpus", "one"}, &c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cpus"), std::string::npos) << bad.status();
  DaemonConfig y;
  ASSERT_TRUE(ApplyConfigYaml("server:\n  cpus: \"1\"\n", "test", &y).ok());
  EXPECT_EQ(y.cpus, "1");
}

TEST(Config, LocalSocketSettings) {
  DaemonConfig c;
  auto ok = Parse({"--local-socket", "off", "--local-threads", "2", "--local-slice-us", "0"}, &c);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(c.local_socket, "off");
  EXPECT_EQ(c.local_threads, 2u);
  EXPECT_EQ(c.local_slice_us, 0u);
  for (std::vector<std::string> bad : {std::vector<std::string>{"--local-threads", "0"},
                                       {"--local-threads", "65"},
                                       {"--local-slice-us", "50"},
                                       {"--local-slice-us", "200000"}}) {
    DaemonConfig b;
    auto r = Parse(bad, &b);
    EXPECT_FALSE(r.ok()) << bad[0] << " " << bad[1];
    EXPECT_NE(r.status().message().find("local"), std::string::npos) << r.status();
  }
  DaemonConfig y;
  ASSERT_TRUE(
      ApplyConfigYaml("server:\n  local_socket: /tmp/x.sock\n  local_slice_us: 250\n", "t", &y).ok());
  EXPECT_EQ(y.local_socket, "/tmp/x.sock");
  EXPECT_EQ(y.local_slice_us, 250u);
  EXPECT_TRUE(y.Validate().ok());
  y.local_slice_us = 10;
  EXPECT_FALSE(y.Validate().ok());
}

}  // namespace
}  // namespace oscarkv::service

namespace oscarkv::service {
namespace {

// TLS without a client CA authenticates no client (every caller is the admin): refused off
// loopback unless tls.allow_unauthenticated_clients; loopback, unix sockets and mTLS start.
TEST(Config, TlsWithoutClientCaOffLoopbackNeedsTheOptIn) {
  DaemonConfig c;
  c.listen = "0.0.0.0:50051";
  c.tls_cert = "/x/server.pem";
  c.tls_key = "/x/server.key";
  absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("tls.allow_unauthenticated_clients"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--tls-client-ca"), std::string::npos) << s;
  c.listen = "10.1.2.3:50051";
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kFailedPrecondition);
  for (const char* local : {"127.0.0.1:50051", "[::1]:50051", "localhost:1", "unix:/tmp/s"}) {
    c.listen = local;
    EXPECT_TRUE(c.Validate().ok()) << local << ": " << c.Validate();
  }
  c.listen = "0.0.0.0:50051";
  c.tls_client_ca = "/x/ca.pem";
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  c.tls_client_ca.clear();
  ASSERT_TRUE(ApplyConfigYaml("tls:\n  allow_unauthenticated_clients: true\n", "t", &c).ok());
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  DaemonConfig f;
  auto r = Parse({"--listen", "0.0.0.0:1", "--tls-cert", "/a", "--tls-key", "/b"}, &f);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  r = Parse({"--listen", "0.0.0.0:1", "--tls-cert", "/a", "--tls-key", "/b",
             "--tls-allow-unauthenticated-clients"}, &f);
  EXPECT_TRUE(r.ok()) << r.status();
}

}  // namespace
}  // namespace oscarkv::service
