// The handoff as it runs in production: `oscarkv pd prefill` and `oscarkv pd decode` as two
// processes, each with its own daemon, compared byte for byte with a single-process run. Once on
// loopback, once on two hosts (two network namespaces joined by a veth pair; skipped when they
// cannot be created).
#include <unistd.h>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "oscarkv/testing/netns_hosts.h"
#include "oscarkv/pd/workers.h"
#include "test_util.h"

namespace oscarkv::pd {
namespace {

using Json = nlohmann::json;
using ::oscarkv::testing::NetnsHosts;
using ::oscarkv::testing::ProcessResult;
using ::oscarkv::testing::RunProcess;

std::string OscarkvBinary() {
  const std::string p = testing::BinaryDir() + "/cli/oscarkv";
  return ::access(p.c_str(), X_OK) == 0 ? p : "";
}

std::vector<std::string> CodecArgs(const std::string& model) {
  const CodecOptions c = testing::SmallCodec();
  return {"--model",       model,
          "--page-tokens", std::to_string(c.page_tokens),
          "--sink",        std::to_string(c.sink_tokens),
          "--recent",      std::to_string(c.recent_tokens)};
}

absl::StatusOr<Json> LastJson(const ProcessResult& r) {
  std::string line;
  for (size_t b = 0, e; b < r.out.size(); b = e + 1) {
    e = r.out.find('\n', b);
    if (e == std::string::npos) e = r.out.size();
    if (e > b && r.out[b] == '{') line = r.out.substr(b, e - b);
  }
  if (r.exit_code != 0 || line.empty()) {
    return absl::InternalError("exit " + std::to_string(r.exit_code) + ", stdout: " + r.out);
  }
  return Json::parse(line);
}

// Daemons on the two hosts (exec prefixes empty for loopback) and the two worker processes.
// `dev`: each host's network device for UCX (UCX_NET_DEVICES).
void RunHandoff(const std::vector<std::string> exec[2], const std::string addr[2],
                const std::string dev[2]) {
  const std::string model = testing::RefModelDir();
  if (model.empty()) GTEST_SKIP() << "reference model not found (set OSCARKV_REFMODEL)";
  const std::string bin = OscarkvBinary();
  if (bin.empty()) GTEST_SKIP() << "the oscarkv tool is not built (ninja oscarkv)";
  auto daemon_bin = oscarkv::testing::LocalDaemon::FindDaemonBinary();
  ASSERT_TRUE(daemon_bin.ok()) << daemon_bin.status();
  std::unique_ptr<oscarkv::testing::LocalDaemon> daemon[2];
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> cmd = exec[i];
    cmd.insert(cmd.end(),
               {*daemon_bin, "--listen", addr[i] + ":0", "--pool-mb", "64", "--metrics-listen",
                "off", "--log-level", "warn", "--ucx-tls", "tcp", "--ucx-net-devices", dev[i],
                // netns veth addresses are not loopback: plaintext gRPC, and the decode host
                // reads daemon A's whole-pool data plane over the veth (any peer on that link
                // could read and write the pool: acceptable in throwaway namespaces only)
                "--allow-plaintext", "--ucx-allow-unverified-rma"});
    oscarkv::testing::LocalDaemonOptions o;
    o.binary = cmd[0];
    o.flags.assign(cmd.begin() + 1, cmd.end());
    auto d = oscarkv::testing::LocalDaemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon[i] = std::move(*d);
  }
  const std::string handle = "proc-req-" + std::to_string(::getpid());
  std::vector<std::string> pre = exec[0];
  pre.insert(pre.end(), {bin, "pd", "prefill", "--daemon", daemon[0]->address(), "--prompt",
                         testing::Prompt(), "--handle", handle, "--json"});
  const auto codec_args = CodecArgs(model);
  pre.insert(pre.end(), codec_args.begin(), codec_args.end());
  auto pr = RunProcess(pre);
  ASSERT_TRUE(pr.ok()) << pr.status();
  auto pj = LastJson(*pr);
  ASSERT_TRUE(pj.ok()) << pj.status();
  EXPECT_GT((*pj)["int2_pages"].get<int>(), 0);

  const uint32_t n = 24;
  std::vector<std::string> dec = exec[1];
  dec.insert(dec.end(),
             {bin, "pd", "decode", "--daemon", daemon[0]->address(), "--local-daemon",
              daemon[1]->address(), "--handle", handle, "--tokens", std::to_string(n), "--json"});
#ifdef OSCARKV_PD_HAS_UCX
  dec.insert(dec.end(), {"--data-path", "ucx", "--ucx-net-devices", dev[1]});
#else
  dec.insert(dec.end(), {"--data-path", "grpc"});
#endif
  dec.insert(dec.end(), codec_args.begin(), codec_args.end());
  auto dr = RunProcess(dec);
  ASSERT_TRUE(dr.ok()) << dr.status();
  auto dj = LastJson(*dr);
  ASSERT_TRUE(dj.ok()) << dj.status();

  auto m = engine::Model::Load(model);
  ASSERT_TRUE(m.ok());
  auto codec = MakeEngineCodec((*m)->config(), testing::SmallCodec());
  ASSERT_TRUE(codec.ok());
  auto ref = ReferenceGenerate(**m, *codec, BytesToTokens(testing::Prompt()), n);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ((*dj)["generated"].get<std::vector<int32_t>>(), *ref);
#ifdef OSCARKV_PD_HAS_UCX
  EXPECT_EQ((*dj)["data_path"].get<std::string>().rfind("ucx", 0), 0u) << (*dj)["data_path"];
#else
  EXPECT_EQ((*dj)["data_path"].get<std::string>(), "grpc");
#endif
  EXPECT_LT((*dj)["page_bytes"].get<uint64_t>(), (*dj)["bf16_equivalent_bytes"].get<uint64_t>());
  EXPECT_EQ((*dj)["page_bytes"].get<uint64_t>(), (*pj)["page_bytes"].get<uint64_t>());
  EXPECT_GT((*dj)["cached_local_pages"].get<int>(), 0);

  // The handle was consumed: a second decode fails cleanly (exit 1, no result).
  auto again = RunProcess(dec);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->exit_code, 1);
  EXPECT_EQ(again->out.find('{'), std::string::npos);
}

TEST(PdProcessTest, LoopbackHandoffEqualsSingleProcess) {
  const std::vector<std::string> exec[2] = {{}, {}};
  const std::string addr[2] = {"127.0.0.1", "127.0.0.1"};
  const std::string dev[2] = {"lo", "lo"};
  RunHandoff(exec, addr, dev);
}

TEST(PdProcessTest, TwoHostHandoffOverVethEqualsSingleProcess) {
  auto hosts = NetnsHosts::Create("okvpdtest");
  if (!hosts.ok()) {
    GTEST_SKIP() << "cannot create network namespaces here: " << hosts.status().message();
  }
  const std::vector<std::string> exec[2] = {(*hosts)->Exec(0), (*hosts)->Exec(1)};
  const std::string addr[2] = {(*hosts)->address(0), (*hosts)->address(1)};
  const std::string dev[2] = {(*hosts)->device(0), (*hosts)->device(1)};
  RunHandoff(exec, addr, dev);
}

TEST(PdProcessTest, NetnsHostsAreRemovedOnDestruction) {
  std::string name;
  {
    auto hosts = NetnsHosts::Create("okvpdtest");
    if (!hosts.ok())
      GTEST_SKIP() << "cannot create network namespaces here: " << hosts.status().message();
    name = (*hosts)->name(0);
    EXPECT_EQ(::access(("/var/run/netns/" + name).c_str(), F_OK), 0);
  }
  EXPECT_NE(::access(("/var/run/netns/" + name).c_str(), F_OK), 0);
}

}  // namespace
}  // namespace oscarkv::pd
