// The GPU handoff on two GPUs, as `oscarkv pd gpu-handoff` runs it (two processes): every page
// arrives verified by CUDA IPC and by NCCL; the real model's handoff continues exactly as one
// process would; and a process that dies at any stage of the handoff makes the other side fail
// promptly with a clear error instead of hanging. Skips (saying why) without two CUDA devices.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "oscarkv/pd/gpu_handoff.h"
#include "oscarkv/util/refmodel.h"

namespace oscarkv::pd::gpu {
namespace {

using Json = nlohmann::json;

std::string Cli() {
  if (const char* c = std::getenv("OSCARKV_CLI")) return c;
  const char* b = std::getenv("OSCARKV_BINARY_DIR");
  return std::string(b ? b : "..") + "/cli/oscarkv";
}

struct CliRun {
  int exit_code = -1;
  Json json;
  std::string out;
  double seconds = 0;
};

CliRun RunCli(const std::string& args) {
  CliRun r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = ::popen((Cli() + " pd gpu-handoff --json " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) r.out += buf;
  const int st = ::pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t at = r.out.rfind("\n{");
  const std::string last = at == std::string::npos ? r.out : r.out.substr(at + 1);
  r.json = Json::parse(last, nullptr, false);
  return r;
}

class GpuHandoffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Capabilities c = Probe();
    if (!c.cuda || c.devices < 2) {
      GTEST_SKIP() << "needs 2 CUDA devices, found " << c.devices << " (" << c.note
                   << "); CI is CPU-only -- run on the two-GPU device (scripts/gpu/gpu_handoff.sh)";
    }
    if (!std::filesystem::exists(Cli())) GTEST_SKIP() << "no oscarkv tool at " << Cli();
  }
};

TEST_F(GpuHandoffTest, SyntheticPagesArriveVerifiedByIpcAndNccl) {
  const CliRun r = RunCli("--synthetic refmodel --context 4096 --reps 3 --warmup 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_FALSE(r.json.is_discarded()) << r.out;
  EXPECT_TRUE(r.json["ok"].get<bool>()) << r.out;
  int verified = 0;
  for (const Json& s : r.json["summary"]) {
    EXPECT_EQ(s["reps"].get<int>(), 3);
    if (s["mechanism"] != "peer") {
      EXPECT_TRUE(s["verified"].get<bool>()) << s.dump();
      ++verified;
    }
  }
  EXPECT_EQ(verified, 4) << r.out;  // {int2, bf16} x {ipc, nccl}
  // The bytes moved are the layouts' (at 4096 tokens the BF16 sink and tail are ~9% of it).
  const CodecProfile prof = *BuiltinProfile("refmodel");
  const double want = double(PlanLayout(prof, AllBf16Plan(prof, 4096), "").total_bytes) /
                      PlanLayout(prof, PlanSequencePages(prof, 4096), "").total_bytes;
  EXPECT_NEAR(r.json["handoff_bytes_ratio"].get<double>(), want, 1e-9);
  EXPECT_GT(want, 4.5);
}

TEST_F(GpuHandoffTest, RealModelContinuesAsOneProcessWould) {
  const std::string model = FindRefModel();
  if (model.empty()) GTEST_SKIP() << "reference model not found (set OSCARKV_REFMODEL)";
  const CliRun r = RunCli("--model " + model +
                          " --prompt-bytes 700 --tokens 12 --page-tokens 16 "
                          "--sink 16 --recent 32 --reps 2 --warmup 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(r.json.value("equal_ipc", false)) << r.out;
  EXPECT_TRUE(r.json.value("equal_nccl", false)) << r.out;
}

// side:stage -> the other side must fail on its own, quickly, naming the peer.
class GpuHandoffDeathTest : public GpuHandoffTest,
                            public ::testing::WithParamInterface<const char*> {};

TEST_P(GpuHandoffDeathTest, PeerDeathIsAClearErrorNotAHang) {
  const std::string die = GetParam();
  const bool prefill_dies = die.rfind("prefill:", 0) == 0;
  const CliRun r = RunCli(
      "--synthetic refmodel --context 2048 --reps 2 --warmup 1 "
      "--timeout-ms 20000 --die " +
      die);
  EXPECT_NE(r.exit_code, 0) << r.out;
  ASSERT_FALSE(r.json.is_discarded()) << r.out;
  EXPECT_FALSE(r.json["hung"].get<bool>()) << r.out;
  const Json& dead = r.json[prefill_dies ? "prefill" : "decode"];
  const Json& other = r.json[prefill_dies ? "decode" : "prefill"];
  EXPECT_EQ(dead["exit"], "killed by signal 9") << r.out;
  EXPECT_EQ(other["exit"], "exit 1") << r.out;
  const std::string err = other.value("error", "");
  EXPECT_FALSE(err.empty()) << r.out;
  // (A copy from a dead exporter's IPC memory may instead fail as a CUDA error.)
  if (die != "prefill:ipc-offer") {
    EXPECT_NE(err.find("peer"), std::string::npos) << err;
  }
  // Noticed from the socket, long before the 20 s step timeout.
  EXPECT_LT(other["exit_ms"].get<double>() - dead["exit_ms"].get<double>(), 10000) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Stages, GpuHandoffDeathTest,
                         ::testing::Values("prefill:hello", "prefill:ipc-offer",
                                           "prefill:nccl-send", "decode:ipc-copy",
                                           "decode:nccl-recv"));

}  // namespace
}  // namespace oscarkv::pd::gpu
