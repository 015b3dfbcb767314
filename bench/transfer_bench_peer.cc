// The far side of `oscarkv bench transfer` (this same binary re-executed with --serve) and the
// ucx_perftest runs it is compared with.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench_pages.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/testing/bootstrap.h"
#include "oscarkv/util/subprocess.h"
#include "transfer_bench_internal.h"

namespace oscarkv::bench::transfer_bench {

using transport::Context;
using transport::ContextOptions;
using transport::Worker;

size_t CountValid(const uint8_t* pool, size_t bytes, size_t count, std::string* first_bad) {
  size_t ok = 0;
  for (size_t i = 0; i < count; ++i) {
    absl::StatusOr<PageHeader> h = ParsePageHeaderStandalone({pool + i * bytes, bytes});
    ok += h.ok() ? 1 : 0;
    if (!h.ok() && first_bad != nullptr && first_bad->size() < 400) {
      absl::StrAppend(first_bad, " slot ", i, ": ", h.status().message(), ";");
    }
  }
  return ok;
}

std::string LoadAverage() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "?";
  char buf[128] = {0};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  std::string s(buf, n);
  return s.substr(0, s.find(' '));
}

ContextOptions LoopbackContext(const std::string& tls) {
  ContextOptions o;
  o.tls = tls;
  o.net_devices = "lo";
  return o;
}

// ---- peer side ----------------------------------------------------------------------------

int Serve(const Args& args) {
  auto fd = testing::ParseControlFd(args.str("control-fd"));
  auto profile = BuiltinProfile(args.str("shape"));
  auto int2_pages = args.integer("int2-pages");
  auto bf16_pages = args.integer("bf16-pages");
  for (const absl::Status& s :
       {fd.status(), profile.status(), int2_pages.status(), bf16_pages.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "bench transfer --serve: %s\n", Msg(s).c_str());
      return 2;
    }
  }
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "bench transfer --serve: %s\n", s.ToString().c_str());
    return 1;
  };
  auto ctx = Context::Create(LoopbackContext(args.str("tls")));
  if (!ctx.ok()) return fail(ctx.status());
  auto worker = Worker::Create(**ctx);
  if (!worker.ok()) return fail(worker.status());
  const size_t int2_bytes = GeometryFor(*profile, PageKind::kInt2).page_bytes();
  const size_t bf16_bytes = GeometryFor(*profile, PageKind::kBf16).page_bytes();
  // The pools come from UCX (as a daemon's would), so shm peers map them directly.
  auto int2_region = (*ctx)->Allocate(int2_bytes * *int2_pages);
  if (!int2_region.ok()) return fail(int2_region.status());
  auto bf16_region = (*ctx)->Allocate(bf16_bytes * *bf16_pages);
  if (!bf16_region.ok()) return fail(bf16_region.status());
  struct {
    uint8_t* data;
  } int2{(*int2_region)->base()}, bf16{(*bf16_region)->base()};
  if (absl::Status s = FillWithPages(*profile, PageKind::kInt2, {int2.data, int2_bytes * *int2_pages}, *int2_pages,
                                      8, 1); !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = FillWithPages(*profile, PageKind::kBf16, {bf16.data, bf16_bytes * *bf16_pages}, *bf16_pages,
                                      4, 2); !s.ok()) {
    return fail(s);
  }
  for (const std::string* blob :
       {&(*worker)->address(), &(*int2_region)->exported(), &(*bf16_region)->exported()}) {
    if (absl::Status s = testing::SendBlob(*fd, *blob); !s.ok()) return fail(s);
  }
  absl::Status s = testing::ServeUntilClosed(
      **worker, *fd, absl::Minutes(10), [&](const std::string& cmd) -> std::string {
        if (cmd == "count-valid") {
          return absl::StrCat(CountValid(int2.data, int2_bytes, *int2_pages), " ",
                              CountValid(bf16.data, bf16_bytes, *bf16_pages));
        }
        return "?";
      });
  return s.ok() ? 0 : fail(s);
}

// ---- ucx_perftest -------------------------------------------------------------------------

absl::StatusOr<PerftestResult> RunPerftest(const std::string& perftest, const std::string& tls,
                                           const std::string& test, size_t msg_bytes,
                                           int64_t iters, int port, int outstanding) {
  const std::map<std::string, std::string> env = {{"UCX_TLS", tls}, {"UCX_NET_DEVICES", "lo"}};
  std::vector<std::string> common = {"-p", absl::StrCat(port)};
  std::vector<std::string> server_argv = {perftest};
  server_argv.insert(server_argv.end(), common.begin(), common.end());
  // The server's output is not needed; the destructor kills it if it has not exited.
  SpawnOptions so(server_argv);
  so.search_path = true;
  so.env = env;
  so.stdout_mode = Stdio::kNull;
  so.stderr_to_stdout = true;
  auto server = Subprocess::Spawn(so);
  if (!server.ok()) return server.status();
  absl::SleepFor(absl::Milliseconds(300));  // let it listen
  std::vector<std::string> argv = {perftest, "127.0.0.1", "-t", test, "-s", absl::StrCat(msg_bytes),
                                   "-n", absl::StrCat(iters), "-w", absl::StrCat(std::max<int64_t>(iters / 10, 4)),
                                   "-f"};
  if (outstanding > 0) {
    argv.push_back("-O");
    argv.push_back(absl::StrCat(outstanding));
  }
  argv.insert(argv.end(), common.begin(), common.end());
  PerftestResult res;
  res.command = absl::StrCat(absl::StrJoin(env, " ", absl::PairFormatter("=")), " ",
                             absl::StrJoin(argv, " "));
  SpawnOptions co(argv);
  co.search_path = true;
  co.env = env;
  co.stderr_to_stdout = true;
  auto run = RunAndCollect(std::move(co), absl::Seconds(120));
  // The server exits once the test is done; never leave it behind.
  (void)(*server)->Wait(absl::Seconds(2));
  (*server)->Kill();
  if (!run.ok()) return run.status();
  if (run->exit_code != 0) {
    return absl::InternalError(absl::StrCat(perftest, " failed:\n", run->output));
  }
  const std::string* text = &run->output;
  // The result row: "[Final:] <iters> <p50 lat> <avg lat> <overall lat> <avg MB/s> <overall MB/s>
  // <avg msg/s> <overall msg/s>" (-f prints only this row, without the "Final:" label).
  double mbps = -1;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    std::vector<std::string> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (!w.empty() && w[0] == "Final:") w.erase(w.begin());
    if (w.size() != 8) continue;
    double v[8];
    bool numeric = true;
    for (int i = 0; i < 8; ++i) numeric &= absl::SimpleAtod(w[i], &v[i]);
    if (numeric) mbps = v[5];
  }
  if (mbps > 0) {
    res.gbps = mbps * 1048576.0 / 1e9;  // perftest's MB is 2^20 bytes
    return res;
  }
  return absl::InternalError(absl::StrCat("could not parse ucx_perftest output:\n", *text));
}

}  // namespace oscarkv::bench::transfer_bench
