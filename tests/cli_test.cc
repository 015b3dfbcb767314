// The `oscarkv` tool against a real oscarkvd: operator subcommands (health, stats, lookup,
// evict, clear) with their exit codes and JSON, clear errors when the daemon is down, the demo
// (the README's main job) and a short `bench service --json`.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>

#include "gmock/gmock.h"
#include "nlohmann/json.hpp"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

struct CmdResult {
  int code = -1;
  std::string out, err;
};

// Runs `<binary> <args>` through the shell, capturing stdout and stderr.
CmdResult RunBinary(const std::string& binary, const std::string& args) {
  const std::string err_path = ::testing::TempDir() + "/cli_err_" + std::to_string(::getpid());
  const std::string cmd = binary + " " + args + " 2>" + err_path;
  CmdResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream f(err_path);
  r.err.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  std::remove(err_path.c_str());
  return r;
}

CmdResult Oscarkv(const std::string& args) { return RunBinary(OSCARKV_CLI_PATH, args); }
CmdResult Oscarkvd(const std::string& args) { return RunBinary(OSCARKVD_PATH, args); }

size_t Lines(const std::string& s) { return std::count(s.begin(), s.end(), '\n'); }

TEST(CliTest, DaemonDownIsOneReadableLineAndExit1) {
  for (const char* cmd : {"health", "stats", "lookup --keys 5d55a8bf9ffbceec922d5a1b7acc1d7f",
                          "evict --keys 5d55a8bf9ffbceec922d5a1b7acc1d7f", "clear --all"}) {
    CmdResult r = Oscarkv(std::string(cmd) + " --addr 127.0.0.1:1 --timeout-ms 2000");
    EXPECT_EQ(r.code, 1) << cmd;
    EXPECT_THAT(r.err, HasSubstr("cannot reach oscarkvd at 127.0.0.1:1")) << cmd;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << cmd << ": " << r.err;
  }
  CmdResult j = Oscarkv("health --addr 127.0.0.1:1 --json");
  EXPECT_EQ(j.code, 1);
  EXPECT_FALSE(json::parse(j.out).at("healthy").get<bool>());
}

TEST(CliTest, UsageErrors) {
  EXPECT_EQ(Oscarkv("clear").code, 2);                // must say which pages
  EXPECT_EQ(Oscarkv("stats --no-such-flag").code, 2);
  CmdResult h = Oscarkv("lookup --help");
  EXPECT_EQ(h.code, 0);
  EXPECT_THAT(h.out, HasSubstr("--tokens-file"));
}

// Exit 2 for what is wrong on the command line, refused before anything is dialled.
TEST(CliTest, BadFlagValuesAreUsageErrors) {
  struct Case {
    const char* args;
    const char* says;
  };
  for (const Case& c : {Case{"stats --addr 127.0.0.1:99999", "1..65535"},
                        Case{"health --addr 127.0.0.1:0", "1..65535"},
                        Case{"stats --addr localhost", "expected HOST:PORT"},
                        Case{"stats --addr ::1:50051", "brackets"},
                        Case{"stats --timeout-ms 0", "--timeout-ms"},
                        Case{"lookup --keys nothex", "32-hex block key"},
                        Case{"lookup --keys 5d55a8bf9ffbceec922d5a1b7acc1d7f --tokens-file x",
                             "exactly one"},
                        Case{"evict --shape nosuch --keys 5d55a8bf9ffbceec922d5a1b7acc1d7f",
                             "nosuch"},
                        Case{"clear --codec xyz", "32 hex"}}) {
    CmdResult r = Oscarkv(c.args);
    EXPECT_EQ(r.code, 2) << c.args << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.says)) << c.args;
    EXPECT_EQ(Lines(r.err), 1u) << c.args << ": " << r.err;
  }
  EXPECT_EQ(Oscarkv("").code, 2);
  EXPECT_EQ(Oscarkv("no-such-command").code, 2);
  CmdResult help = Oscarkv("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.out, HasSubstr("exit codes: 0 ok, 1 the operation failed"));
}

// The daemon's start-up failures: one readable line, no gRPC core log, the documented codes.
TEST(CliTest, DaemonStartupErrorsAreOneLine) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string small = " --pool-mb 8 --local-socket off --ucx off ";
  CmdResult busy = Oscarkvd("--listen " + daemon->address() + " --metrics-listen off" + small);
  EXPECT_EQ(busy.code, 1) << busy.err;
  EXPECT_THAT(busy.err, HasSubstr("cannot listen on " + daemon->address() + ": port " +
                                  daemon->address().substr(daemon->address().rfind(':') + 1) +
                                  " is already in use"));
  EXPECT_EQ(Lines(busy.err), 1u) << busy.err;
  // The metrics port taken: the same.
  CmdResult busy_metrics =
      Oscarkvd("--listen 127.0.0.1:0 --metrics-listen " + daemon->address() + small);
  EXPECT_EQ(busy_metrics.code, 1) << busy_metrics.err;
  EXPECT_THAT(busy_metrics.err, HasSubstr("already in use"));
  EXPECT_THAT(busy_metrics.err, HasSubstr("--metrics-listen"));
  EXPECT_EQ(Lines(busy_metrics.err), 1u) << busy_metrics.err;

  for (const char* bad : {"127.0.0.1:99999", "localhost", "not an address", "[::1"}) {
    CmdResult r = Oscarkvd(std::string("--listen '") + bad + "' --metrics-listen off" + small);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(bad));
    EXPECT_EQ(Lines(r.err), 1u) << r.err;
  }
  const std::string yaml = ::testing::TempDir() + "/cli_pool_" + std::to_string(::getpid());
  {
    std::ofstream f(yaml);
    f << "listen: 127.0.0.1:0\npool: 64\n";
  }
  CmdResult typed = Oscarkvd("--config " + yaml);
  EXPECT_EQ(typed.code, 2);
  EXPECT_THAT(typed.err, HasSubstr("pool must be a map"));
  std::remove(yaml.c_str());

  CmdResult defaults = Oscarkvd("--print-default-config");
  EXPECT_EQ(defaults.code, 0);
  CmdResult help = Oscarkvd("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.out, HasSubstr("Exit codes"));
  for (const char* flag : {"--listen", "--pool-mb", "--ucx-net-devices", "--cpus", "--config"}) {
    EXPECT_THAT(defaults.out, HasSubstr(flag));
  }
}

TEST(CliTest, OperatorCommandsAgainstDaemon) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  const std::string addr = " --addr " + daemon->address();
  auto c = Connect(daemon->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const auto tokens = Tokens(77, 5 * 64 + 10);  // 5 full blocks
  const auto keys = client::Client::BlockKeys(codec, tokens);
  std::vector<std::vector<uint8_t>> pages;
  std::vector<client::PageWrite> writes;
  for (size_t i = 0; i < 3; ++i) pages.push_back(MakePage(codec.profile, PageKind::kInt2, i));
  for (size_t i = 0; i < 3; ++i) writes.push_back({keys[i], PageKind::kInt2, pages[i]});
  ASSERT_EQ(c->Store(codec, writes)->stored, 3u);  // the first 3 of 5 blocks are cached
  const std::string tokens_file = ::testing::TempDir() + "/tokens_" + std::to_string(::getpid());
  {
    std::ofstream f(tokens_file);
    for (uint32_t t : tokens) f << t << (t % 3 ? ' ' : '\n');
  }

  CmdResult health = Oscarkv("health" + addr);
  EXPECT_EQ(health.code, 0) << health.err;
  EXPECT_THAT(health.out, HasSubstr("ok:"));

  CmdResult look = Oscarkv("lookup --json --shape refmodel --tokens-file " + tokens_file + addr);
  ASSERT_EQ(look.code, 0) << look.err;
  json lj = json::parse(look.out);
  EXPECT_EQ(lj.at("matched").get<int>(), 3);
  EXPECT_EQ(lj.at("keys").get<int>(), 5);
  EXPECT_EQ(lj.at("tokens").get<int>(), 5 * 64 + 10);
  EXPECT_EQ(lj.at("blocks")[0].at("key").get<std::string>(), keys[0].Hex());

  CmdResult by_key = Oscarkv("lookup --codec " + codec.id.Hex() + " --keys " + keys[0].Hex() + "," +
                       keys[1].Hex() + addr);
  EXPECT_EQ(by_key.code, 0) << by_key.err;
  EXPECT_THAT(by_key.out, HasSubstr("2 of 2 blocks cached"));

  CmdResult stats = Oscarkv("stats --json" + addr);
  ASSERT_EQ(stats.code, 0) << stats.err;
  json sj = json::parse(stats.out);
  EXPECT_EQ(sj.at("pages").get<int>(), 3);
  EXPECT_GE(sj.at("hits").get<int>(), 5);

  CmdResult evict = Oscarkv("evict --json --shape refmodel --keys " + keys[0].Hex() + "," + keys[4].Hex() + addr);
  ASSERT_EQ(evict.code, 0) << evict.err;
  json ej = json::parse(evict.out);
  EXPECT_EQ(ej.at("removed").get<int>(), 1);
  EXPECT_EQ(ej.at("not_cached").get<int>(), 1);

  CmdResult clear = Oscarkv("clear --json --shape refmodel" + addr);
  ASSERT_EQ(clear.code, 0) << clear.err;
  EXPECT_EQ(json::parse(clear.out).at("pages_removed").get<int>(), 2);
  EXPECT_EQ(c->GetStats()->pages, 0u);
  std::remove(tokens_file.c_str());
}

// The README's main job: starts its own daemon and checks byte identity itself.
TEST(CliTest, DemoRunsEndToEnd) {
  CmdResult r = Oscarkv("demo");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("byte-identical to A's pages: yes"));
  EXPECT_THAT(r.out, HasSubstr("oscarkvd stopped cleanly"));
}

// A fresh clone has no trained model: the handoff section runs on a random-weight checkpoint
// the demo writes itself, and still checks the handoff against a single-process run.
TEST(CliTest, DemoHandoffOnRandomCheckpoint) {
  CmdResult r = Oscarkv("demo --random-model --tokens 384");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("a random-weight Qwen3-style checkpoint"));
  EXPECT_THAT(r.out, HasSubstr("[3/3] decode process"));
  EXPECT_THAT(r.out, HasSubstr("equal                 : yes"));
  EXPECT_EQ(r.out.find("skipped"), std::string::npos) << r.out;
}

// A model the user named that is not there is an error, not a silent fallback.
TEST(CliTest, DemoRefusesAMissingNamedModel) {
  CmdResult r = Oscarkv("pd demo --loopback --model /nonexistent/model");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/model holds no config.json (from --model)"));
  r = RunBinary("OSCARKV_REFMODEL=/nonexistent/ref " + std::string(OSCARKV_CLI_PATH),
                "pd demo --loopback");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("holds no config.json (from $OSCARKV_REFMODEL)"));
}

TEST(CliTest, BenchServiceJsonHasAcceptanceFields) {
  CmdResult r = Oscarkv("bench service --json --duration-s 0.3 --batch 8 --lookup-keys 8 --pool-mb 64 --rate 1000 --clients 1,4");
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_GT(j.at("shm_load_vs_memcpy").get<double>(), 0.0);
  EXPECT_GT(j.at("store_vs_memcpy").get<double>(), 0.0);
  EXPECT_GT(j.at("load_verified_vs_memcpy").get<double>(), 0.0);
  EXPECT_EQ(j.at("store_load").at("batch_pages").get<int>(), 8);
  EXPECT_GT(j.at("lookup_peak_per_s").get<double>(), 0.0);
  EXPECT_TRUE(j.at("lookup_p99_ms_at_10k").is_null());  // --rate 1000: not measured at 10k
  EXPECT_GT(j.at("open_loop").at("p99_ms").get<double>(), 0.0);
  EXPECT_EQ(j.at("closed_loop").size(), 2u);
  EXPECT_EQ(j.at("open_loop").at("senders").get<std::string>(), "async");  // the default
  // Both lookup paths side by side: the library's default (the local socket here) and gRPC.
  EXPECT_EQ(j.at("lookup_path").get<std::string>(), "local");
  EXPECT_GT(j.at("lookup_peak_per_s_grpc").get<double>(), 0.0);
  EXPECT_TRUE(j.at("lookup_p99_ms_at_10k_grpc").is_null());
  EXPECT_GT(j.at("open_loop_grpc").at("p99_ms").get<double>(), 0.0);
  EXPECT_EQ(j.at("closed_loop_grpc").size(), 2u);
  // One path only.
  r = Oscarkv("bench service --json --duration-s 0.2 --batch 8 --lookup-keys 8 --pool-mb 64 "
              "--rate 1000 --clients 2 --lookup-path grpc");
  ASSERT_EQ(r.code, 0) << r.err;
  j = json::parse(r.out);
  EXPECT_TRUE(j.at("lookup_peak_per_s").is_null());
  EXPECT_GT(j.at("lookup_peak_per_s_grpc").get<double>(), 0.0);
  EXPECT_EQ(Oscarkv("bench service --lookup-path tcp").code, 2);
}

}  // namespace
}  // namespace oscarkv::testing
