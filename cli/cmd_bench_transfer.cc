// `oscarkv bench transfer`: page-batch RMA bandwidth over UCX per transport, beside ucx_perftest
// on the same transport and message size, and the P/D handoff of a 32K-token request at Qwen3-8B
// shape, INT2 page set vs all-BF16 pages, over the same path.
//
// The far side is this same binary re-executed as a peer (`--serve`): it holds registered pools
// of real pages and progresses its worker; the two processes exchange UCX blobs over an AF_UNIX
// socketpair. UCX traffic is confined to loopback (UCX_NET_DEVICES=lo) and shared memory.
#if __has_include("oscarkv/transport/transport.h")  // built only with the transport module
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "command.h"
#include "nlohmann/json.hpp"
#include "oscarkv/kernels/page_codec.h"
#include "oscarkv/kernels/page_set.h"
#include "oscarkv/transport/bootstrap.h"
#include "oscarkv/transport/transport.h"
#include "oscarkv/util/args.h"
#include "oscarkv/util/status_macros.h"
#include "oscarkv/util/subprocess.h"

namespace oscarkv::cli {
namespace {

using transport::Context;
using transport::ContextOptions;
using transport::Direction;
using transport::EndpointOptions;
using transport::MemoryRegion;
using transport::RemoteMemory;
using transport::TransferDesc;
using transport::Worker;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Page-aligned, zeroed host memory.
struct HostBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  explicit HostBuffer(size_t n) : size(n) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, n) == 0) {
      data = static_cast<uint8_t*>(p);
      std::memset(data, 0, n);
    }
  }
  ~HostBuffer() { std::free(data); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
};

// Fills `count` page slots with real pages of `kind`: `distinct` pages encoded from random rows,
// repeated (each slot a whole valid page).
absl::Status FillPool(const CodecProfile& p, PageKind kind, uint8_t* pool, size_t count,
                      size_t distinct) {
  const size_t bytes = GeometryFor(p, kind).page_bytes();
  std::mt19937 rng(kind == PageKind::kInt2 ? 1 : 2);
  std::normal_distribution<float> n;
  std::vector<float> kv(size_t{p.num_layers} * 2 * p.page_tokens * p.num_kv_heads * p.head_dim);
  for (size_t i = 0; i < std::min(distinct, count); ++i) {
    for (float& v : kv) v = n(rng);
    KVSequenceView view{kv.data(), p.num_layers, p.num_kv_heads, p.head_dim, p.page_tokens};
    if (absl::Status s = EncodePage(p, nullptr, kind, view, 0, p.page_tokens,
                                    {pool + i * bytes, bytes});
        !s.ok()) {
      return s;
    }
  }
  for (size_t i = distinct; i < count; ++i) {
    std::memcpy(pool + i * bytes, pool + (i % distinct) * bytes, bytes);
  }
  return absl::OkStatus();
}

size_t CountValid(const uint8_t* pool, size_t bytes, size_t count, std::string* first_bad = nullptr) {
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

// The 1-minute load average: benchmarks on a shared machine are only as good as its quiet.
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
  auto fd = transport::ParseControlFd(args.str("control-fd"));
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
  if (absl::Status s = FillPool(*profile, PageKind::kInt2, int2.data, *int2_pages, 8); !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = FillPool(*profile, PageKind::kBf16, bf16.data, *bf16_pages, 4); !s.ok()) {
    return fail(s);
  }
  for (const std::string* blob :
       {&(*worker)->address(), &(*int2_region)->exported(), &(*bf16_region)->exported()}) {
    if (absl::Status s = transport::SendBlob(*fd, *blob); !s.ok()) return fail(s);
  }
  absl::Status s = transport::ServeUntilClosed(
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

struct PerftestResult {
  double gbps = 0;  // 1e9 bytes/s
  std::string command;
};

// ucx_perftest server + client on 127.0.0.1, same UCX_TLS; "Final:" line -> overall MB/s.
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

// ---- client side --------------------------------------------------------------------------

struct TransportReport {
  std::string name, tls, lanes, error_handling;
  double get_gbps = 0, put_gbps = 0;    // distinct pages (real batch)
  double get1_gbps = 0, put1_gbps = 0;  // one reused page buffer per end (perftest's pattern)
  double perftest_get_gbps = 0, perftest_put_gbps = 0, memcpy_gbps = 0, memcpy1_gbps = 0;
  std::string perftest_get_cmd, perftest_put_cmd;
  double batch_get_ms = 0;
  uint64_t int2_handoff_bytes = 0, bf16_handoff_bytes = 0;
  double int2_handoff_s = 0, bf16_handoff_s = 0;
  size_t int2_handoff_pages = 0, int2_handoff_bf16_pages = 0;
  size_t verified_pages = 0, checked_pages = 0;
};

absl::Status Check(absl::Status s, const std::string& what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

struct BenchConfig {
  std::string perftest;
  int64_t batch_pages, bw_pages, reps, handoff_tokens, bf16_distinct, perftest_outstanding;
  int port;
};

absl::StatusOr<TransportReport> BenchOne(const std::string& name, const BenchConfig& cfg,
                                         const CodecProfile& profile) {
  TransportReport rep;
  rep.name = name;
  rep.tls = name;
  std::replace(rep.tls.begin(), rep.tls.end(), '+', ',');
  const size_t int2_bytes = GeometryFor(profile, PageKind::kInt2).page_bytes();
  const size_t bf16_bytes = GeometryFor(profile, PageKind::kBf16).page_bytes();
  const std::vector<PlannedPage> plan = PlanSequencePages(profile, cfg.handoff_tokens);
  const size_t plan_pages = plan.size();
  const size_t int2_pool = std::max<size_t>(plan_pages, cfg.batch_pages);
  const size_t bf16_pool = std::min<size_t>(cfg.bf16_distinct, plan_pages);

  std::fprintf(stderr, "[%s] starting peer: %zu INT2 pages (%.0f MB) + %zu BF16 pages (%.0f MB)\n",
               name.c_str(), int2_pool, int2_pool * int2_bytes / 1e6, bf16_pool,
               bf16_pool * bf16_bytes / 1e6);
  auto peer = transport::PeerProcess::Spawn(
      {"/proc/self/exe", "bench", "transfer", "--serve", "--tls", rep.tls, "--int2-pages",
       absl::StrCat(int2_pool), "--bf16-pages", absl::StrCat(bf16_pool)},
      {});
  if (!peer.ok()) return peer.status();
  std::string blobs[3];
  for (auto& b : blobs) {
    auto r = transport::RecvBlob(peer->control_fd(), absl::Seconds(120));
    if (!r.ok()) return Check(r.status(), "peer did not start");
    b = *r;
  }
  OSCARKV_ASSIGN_OR_RETURN(auto ctx, Context::Create(LoopbackContext(rep.tls)));
  OSCARKV_ASSIGN_OR_RETURN(auto worker, Worker::Create(*ctx));
  EndpointOptions eo;
  eo.name = absl::StrCat(name, "-peer");
  eo.peer_timeout = absl::Seconds(5);
  rep.error_handling = "peer";
  if (!ctx->capabilities().peer_failure_detection) {
    // posix/sysv shared memory cannot report a dead peer in this UCX: the watchdog does.
    eo.error_handling = EndpointOptions::ErrorHandling::kNone;
    rep.error_handling = "none (watchdog)";
  }
  auto ep = worker->Connect(blobs[0], eo);
  if (!ep.ok()) return ep.status();
  OSCARKV_ASSIGN_OR_RETURN(auto remote_int2, (*ep)->ImportRemote(blobs[1]));
  OSCARKV_ASSIGN_OR_RETURN(auto remote_bf16, (*ep)->ImportRemote(blobs[2]));

  HostBuffer int2(int2_bytes * int2_pool), bf16(bf16_bytes * bf16_pool);
  if (int2.data == nullptr || bf16.data == nullptr) {
    return absl::ResourceExhaustedError("client buffer allocation failed");
  }
  OSCARKV_ASSIGN_OR_RETURN(auto local_int2, ctx->Register(int2.data, int2.size));
  // Highest local slot each pool has received a page into; those are checksum-verified at the end.
  size_t int2_used = 0, bf16_used = 0;
  OSCARKV_ASSIGN_OR_RETURN(auto local_bf16, ctx->Register(bf16.data, bf16.size));

  // Page-batch bandwidth: batches of `batch_pages` INT2 pages, `bw_pages` in total. Distinct
  // pages at both ends (a real batch, DRAM to DRAM) or, as ucx_perftest does, one page buffer at
  // each end reused by every op (cache-resident: the like-for-like comparison with perftest).
  // At least bw_pages pages and at least min_time, so fast transports are not timed over a few
  // milliseconds; `pages_moved` (optional) gets the count, which ucx_perftest then also uses.
  const absl::Duration min_time = absl::Milliseconds(250);
  auto bandwidth = [&](Direction d, bool same_buffer,
                       int64_t* pages_moved = nullptr) -> absl::StatusOr<double> {
    std::vector<TransferDesc> descs;
    for (int64_t i = 0; i < cfg.batch_pages; ++i) {
      const int64_t slot = same_buffer ? 0 : i;
      descs.push_back({int2.data + slot * int2_bytes, remote_int2->base() + slot * int2_bytes,
                       int2_bytes});
    }
    const int64_t batches = std::max<int64_t>(1, cfg.bw_pages / cfg.batch_pages);
    int2_used = std::max<size_t>(int2_used, same_buffer ? 1 : cfg.batch_pages);
    OSCARKV_RETURN_IF_ERROR((*ep)->Run(d, *local_int2, *remote_int2, descs, absl::Seconds(60)));
    const absl::Time start = absl::Now();
    int64_t done = 0;
    while (done < batches || absl::Now() - start < min_time) {
      OSCARKV_RETURN_IF_ERROR((*ep)->Run(d, *local_int2, *remote_int2, descs, absl::Seconds(60)));
      ++done;
    }
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    if (d == Direction::kGet && !same_buffer) rep.batch_get_ms = secs * 1e3 / done;
    if (pages_moved != nullptr) *pages_moved = done * cfg.batch_pages;
    return double(done) * cfg.batch_pages * int2_bytes / secs / 1e9;
  };
  // The raw bound of a batch on this machine: memcpy of the same distinct pages, in-process.
  HostBuffer scratch(int2_bytes * cfg.batch_pages);
  if (scratch.data == nullptr) return absl::ResourceExhaustedError("scratch allocation failed");
  // Same timing rule as bandwidth(); same_buffer copies one page onto one page (cache-hot).
  auto memcpy_bound = [&](bool same_buffer) -> double {
    const int64_t batches = std::max<int64_t>(1, cfg.bw_pages / cfg.batch_pages);
    const absl::Time start = absl::Now();
    int64_t done = 0;
    while (done < batches || absl::Now() - start < min_time) {
      for (int64_t i = 0; i < cfg.batch_pages; ++i) {
        const int64_t slot = same_buffer ? 0 : i;
        std::memcpy(scratch.data + slot * int2_bytes, int2.data + slot * int2_bytes, int2_bytes);
      }
      ++done;
    }
    return double(done) * cfg.batch_pages * int2_bytes /
           absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
  };

  // Handoff: every page of the plan fetched from the peer in one go (two batches posted together
  // when the plan mixes kinds). BF16 slots cycle over bf16_pool distinct pages at both ends.
  auto handoff = [&](bool all_bf16, uint64_t* bytes) -> absl::StatusOr<double> {
    std::vector<TransferDesc> d_int2, d_bf16;
    size_t k_int2 = 0, k_bf16 = 0;
    for (const PlannedPage& pp : plan) {
      if (!all_bf16 && pp.kind == PageKind::kInt2) {
        const size_t s = k_int2++ % int2_pool;
        d_int2.push_back({int2.data + s * int2_bytes, remote_int2->base() + s * int2_bytes,
                          int2_bytes});
      } else {
        const size_t s = k_bf16++ % bf16_pool;
        d_bf16.push_back({bf16.data + s * bf16_bytes, remote_bf16->base() + s * bf16_bytes,
                          bf16_bytes});
      }
    }
    *bytes = d_int2.size() * int2_bytes + d_bf16.size() * bf16_bytes;
    int2_used = std::max(int2_used, std::min(k_int2, int2_pool));
    bf16_used = std::max(bf16_used, std::min(k_bf16, bf16_pool));
    if (!all_bf16) {
      rep.int2_handoff_pages = d_int2.size();
      rep.int2_handoff_bf16_pages = d_bf16.size();
    }
    const absl::Time start = absl::Now();
    std::unique_ptr<transport::Transfer> t1, t2;
    if (!d_int2.empty()) {
      OSCARKV_ASSIGN_OR_RETURN(t1, (*ep)->Post(Direction::kGet, *local_int2, *remote_int2, d_int2));
    }
    if (!d_bf16.empty()) {
      OSCARKV_ASSIGN_OR_RETURN(t2, (*ep)->Post(Direction::kGet, *local_bf16, *remote_bf16, d_bf16));
    }
    if (t1) OSCARKV_RETURN_IF_ERROR(t1->Wait(absl::Seconds(120)));
    if (t2) OSCARKV_RETURN_IF_ERROR(t2->Wait(absl::Seconds(120)));
    return absl::ToDoubleSeconds(absl::Now() - start);
  };

  // Interleave ours and ucx_perftest; keep each one's best of `reps`.
  for (int64_t r = 0; r < cfg.reps; ++r) {
    std::fprintf(stderr, "[%s] rep %lld/%lld: page-batch get/put, ucx_perftest get/put\n",
                 name.c_str(), static_cast<long long>(r + 1), static_cast<long long>(cfg.reps));
    OSCARKV_ASSIGN_OR_RETURN(double g, bandwidth(Direction::kGet, false));
    rep.get_gbps = std::max(rep.get_gbps, g);
    OSCARKV_ASSIGN_OR_RETURN(double p, bandwidth(Direction::kPut, false));
    rep.put_gbps = std::max(rep.put_gbps, p);
    int64_t get_msgs = 0, put_msgs = 0;
    OSCARKV_ASSIGN_OR_RETURN(double g1, bandwidth(Direction::kGet, true, &get_msgs));
    rep.get1_gbps = std::max(rep.get1_gbps, g1);
    OSCARKV_ASSIGN_OR_RETURN(double p1, bandwidth(Direction::kPut, true, &put_msgs));
    rep.put1_gbps = std::max(rep.put1_gbps, p1);
    const double mc = memcpy_bound(false), mc1 = memcpy_bound(true);
    rep.memcpy_gbps = std::max(rep.memcpy_gbps, mc);
    rep.memcpy1_gbps = std::max(rep.memcpy1_gbps, mc1);
    OSCARKV_ASSIGN_OR_RETURN(
        auto pg, RunPerftest(cfg.perftest, rep.tls, "ucp_get", int2_bytes, get_msgs,
                             cfg.port + 2 * r, cfg.perftest_outstanding));
    rep.perftest_get_gbps = std::max(rep.perftest_get_gbps, pg.gbps);
    rep.perftest_get_cmd = pg.command;
    OSCARKV_ASSIGN_OR_RETURN(
        auto pp, RunPerftest(cfg.perftest, rep.tls, "ucp_put_bw", int2_bytes, put_msgs,
                             cfg.port + 2 * r + 1, cfg.perftest_outstanding));
    rep.perftest_put_gbps = std::max(rep.perftest_put_gbps, pp.gbps);
    rep.perftest_put_cmd = pp.command;
    std::fprintf(stderr,
                 "[%s]   batch get %.3f put %.3f memcpy %.3f | same-buffer get %.3f put %.3f "
                 "memcpy %.3f | perftest get %.3f put %.3f GB/s\n",
                 name.c_str(), g, p, mc, g1, p1, mc1, pg.gbps, pp.gbps);
  }
  for (int64_t r = 0; r < cfg.reps; ++r) {
    std::fprintf(stderr, "[%s] rep %lld/%lld: %u-token handoff, INT2 page set then all-BF16\n",
                 name.c_str(), static_cast<long long>(r + 1), static_cast<long long>(cfg.reps),
                 static_cast<unsigned>(cfg.handoff_tokens));
    OSCARKV_ASSIGN_OR_RETURN(double ti, handoff(false, &rep.int2_handoff_bytes));
    OSCARKV_ASSIGN_OR_RETURN(double tb, handoff(true, &rep.bf16_handoff_bytes));
    rep.int2_handoff_s = r == 0 ? ti : std::min(rep.int2_handoff_s, ti);
    rep.bf16_handoff_s = r == 0 ? tb : std::min(rep.bf16_handoff_s, tb);
  }
  // Every page that crossed is a real page: verify all local slots and ask the peer about its.
  rep.checked_pages = int2_used + bf16_used;
  std::string bad;
  rep.verified_pages = CountValid(int2.data, int2_bytes, int2_used, &bad) +
                       CountValid(bf16.data, bf16_bytes, bf16_used, &bad);
  std::vector<std::string> lanes = (*ep)->Transports();
  rep.lanes = absl::StrJoin(lanes, ",");
  OSCARKV_RETURN_IF_ERROR(transport::SendBlob(peer->control_fd(), "count-valid"));
  OSCARKV_ASSIGN_OR_RETURN(std::string peer_valid,
                           transport::RecvBlob(peer->control_fd(), absl::Seconds(60)));
  if (peer_valid != absl::StrCat(int2_pool, " ", bf16_pool)) {
    return absl::DataLossError(absl::StrCat("peer pool pages no longer verify: ", peer_valid));
  }
  remote_int2.reset();
  remote_bf16.reset();
  ep->reset();
  auto code = peer->CloseAndWait(absl::Seconds(30));
  if (!code.ok() || *code != 0) {
    return absl::InternalError(absl::StrCat("peer exited badly: ",
                                            code.ok() ? absl::StrCat(*code) : Msg(code.status())));
  }
  if (rep.verified_pages != rep.checked_pages) {
    return absl::DataLossError(absl::StrCat(rep.checked_pages - rep.verified_pages,
                                            " received pages failed their checksum:", bad));
  }
  return rep;
}

int RunBenchTransfer(int argc, char** argv) {
  Args args("bench transfer",
            "Page-batch RMA bandwidth over UCX per transport beside ucx_perftest (same transport,\n"
            "same message size), and the 32K-token P/D handoff at Qwen3-8B shape: INT2 page set\n"
            "(sink + recent BF16, history INT2) vs all-BF16 pages over the same path.");
  args.Flag("json", "print JSON (ucx_vs_perftest, handoff_bytes_ratio, "
                    "handoff_speedup_int2_vs_bf16, per-transport details)")
      .Option("transports", "tcp,shm",
              "UCX_TLS values to measure, comma-separated ('+' joins transports inside one "
              "value: posix+cma)")
      .Option("shape", "qwen3-8b", "model shape (page geometry)")
      .Option("batch-pages", "64", "INT2 pages per RMA batch in the bandwidth test")
      .Option("bw-pages", "512",
              "minimum INT2 pages per bandwidth measurement (each also runs >= 0.25 s)")
      .Option("reps", "3", "repetitions; each figure is the best of them")
      .Option("handoff-tokens", "32768", "tokens of the handed-off request")
      .Option("bf16-distinct", "64",
              "distinct BF16 pages held at each end (memory cap; the handoff still moves every "
              "page's bytes, cycling over these slots)")
      .Option("perftest", "ucx_perftest", "ucx_perftest binary")
      .Option("perftest-outstanding", "0", "ucx_perftest -O (0 = its default)")
      .Option("port", "13370", "first TCP port for ucx_perftest's bootstrap on 127.0.0.1")
      .Flag("serve", "internal: run as the peer")
      .Option("tls", "tcp", "internal (--serve): UCX_TLS")
      .Option("int2-pages", "512", "internal (--serve): INT2 pool pages")
      .Option("bf16-pages", "64", "internal (--serve): BF16 pool pages")
      .Option("control-fd", "", "internal (--serve): control socket")
      .Epilog(
          "Traffic stays on this host: UCX_NET_DEVICES=lo for tcp, shared memory for shm.\n"
          "Example: oscarkv bench transfer --transports tcp,shm --json");
  if (auto rc = args.ParseOrExitCode(argc, argv)) return *rc;
  if (args.flag("serve")) return Serve(args);

  auto profile = BuiltinProfile(args.str("shape"));
  BenchConfig cfg;
  cfg.perftest = args.str("perftest");
  auto ints = {std::make_pair("batch-pages", &cfg.batch_pages),
               std::make_pair("bw-pages", &cfg.bw_pages), std::make_pair("reps", &cfg.reps),
               std::make_pair("handoff-tokens", &cfg.handoff_tokens),
               std::make_pair("bf16-distinct", &cfg.bf16_distinct),
               std::make_pair("perftest-outstanding", &cfg.perftest_outstanding)};
  if (!profile.ok()) {
    std::fprintf(stderr, "oscarkv bench transfer: %s\n", Msg(profile.status()).c_str());
    return 2;
  }
  for (auto [name, dst] : ints) {
    auto v = args.integer(name);
    if (!v.ok() || *v < 0 || (*v == 0 && std::string(name) != "perftest-outstanding")) {
      std::fprintf(stderr, "oscarkv bench transfer: --%s must be a positive integer\n", name);
      return 2;
    }
    *dst = *v;
  }
  auto port = args.integer("port");
  if (!port.ok() || *port <= 1024 || *port > 65000) {
    std::fprintf(stderr, "oscarkv bench transfer: bad --port\n");
    return 2;
  }
  cfg.port = static_cast<int>(*port);

  const std::string load_before = LoadAverage();
  std::vector<TransportReport> reports;
  int index = 0;
  for (absl::string_view t : absl::StrSplit(args.str("transports"), ',', absl::SkipEmpty())) {
    BenchConfig c = cfg;
    c.port = cfg.port + 16 * index++;
    auto r = BenchOne(std::string(t), c, *profile);
    if (!r.ok()) {
      std::fprintf(stderr, "oscarkv bench transfer [%s]: %s\n", std::string(t).c_str(),
                   r.status().ToString().c_str());
      return 1;
    }
    reports.push_back(*r);
  }
  if (reports.empty()) {
    std::fprintf(stderr, "oscarkv bench transfer: no transports given\n");
    return 2;
  }

  // Headline figures: the worst transport decides.
  double vs_perftest = 1e9, bytes_ratio = 1e9, speedup = 1e9;
  for (const auto& r : reports) {
    vs_perftest = std::min(vs_perftest, r.get1_gbps / r.perftest_get_gbps);
    bytes_ratio = std::min(bytes_ratio, double(r.bf16_handoff_bytes) / r.int2_handoff_bytes);
    speedup = std::min(speedup, r.bf16_handoff_s / r.int2_handoff_s);
  }
  const size_t int2_bytes = GeometryFor(*profile, PageKind::kInt2).page_bytes();
  const size_t bf16_bytes = GeometryFor(*profile, PageKind::kBf16).page_bytes();
  const std::string note = absl::StrCat(
      "bandwidth: RMA get/put of batches of ", cfg.batch_pages, " INT2 pages (", int2_bytes,
      " B each), at least ", cfg.bw_pages, " pages and 0.25 s per measurement, best of ",
      cfg.reps,
      "; 'distinct pages' moves real batches DRAM to DRAM; 'one reused buffer' repeats one page "
      "buffer per end like ucx_perftest (cache-resident) and is what ucx_vs_perftest compares"
      "; ucx_perftest ucp_get/ucp_put_bw -s ", int2_bytes,
      " -n <the page count of our same-buffer run> on 127.0.0.1 with the same UCX_TLS. handoff: one ", cfg.handoff_tokens,
      "-token request, every page fetched by RMA get; all-BF16 moves every page's full bytes "
      "but cycles over ", cfg.bf16_distinct, " distinct ", bf16_bytes,
      "-byte slots at each end to cap memory.");
  if (args.flag("json")) {
    nlohmann::json j;
    j["ucx_vs_perftest"] = vs_perftest;
    j["handoff_bytes_ratio"] = bytes_ratio;
    j["handoff_speedup_int2_vs_bf16"] = speedup;
    j["shape"] = args.str("shape");
    j["int2_page_bytes"] = int2_bytes;
    j["bf16_page_bytes"] = bf16_bytes;
    j["note"] = note;
    j["load_average_1m_before"] = load_before;
    j["load_average_1m_after"] = LoadAverage();
    j["cpus"] = sysconf(_SC_NPROCESSORS_ONLN);
    for (const auto& r : reports) {
      j["transports"][r.name] = {
          {"ucx_tls", r.tls},
          {"endpoint_lanes", r.lanes},
          {"error_handling", r.error_handling},
          {"batch_get_gbps", r.get_gbps},
          {"batch_put_gbps", r.put_gbps},
          {"memcpy_batch_gbps", r.memcpy_gbps},
          {"memcpy_same_buffer_gbps", r.memcpy1_gbps},
          {"same_buffer_get_gbps", r.get1_gbps},
          {"same_buffer_put_gbps", r.put1_gbps},
          {"perftest_get_gbps", r.perftest_get_gbps},
          {"perftest_put_gbps", r.perftest_put_gbps},
          {"get_vs_perftest", r.get1_gbps / r.perftest_get_gbps},
          {"put_vs_perftest", r.put1_gbps / r.perftest_put_gbps},
          {"batch_get_vs_memcpy", r.get_gbps / r.memcpy_gbps},
          {"perftest_get_command", r.perftest_get_cmd},
          {"perftest_put_command", r.perftest_put_cmd},
          {"batch_get_ms", r.batch_get_ms},
          {"handoff_int2_bytes", r.int2_handoff_bytes},
          {"handoff_bf16_bytes", r.bf16_handoff_bytes},
          {"handoff_int2_pages", r.int2_handoff_pages},
          {"handoff_int2_set_bf16_pages", r.int2_handoff_bf16_pages},
          {"handoff_int2_seconds", r.int2_handoff_s},
          {"handoff_bf16_seconds", r.bf16_handoff_s},
          {"handoff_bytes_ratio", double(r.bf16_handoff_bytes) / r.int2_handoff_bytes},
          {"handoff_speedup_int2_vs_bf16", r.bf16_handoff_s / r.int2_handoff_s},
          {"pages_verified", r.verified_pages},
          {"pages_checked", r.checked_pages}};
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("\nUCX page transfer, %s shape (INT2 page %zu B, BF16 page %zu B)\n",
              args.str("shape").c_str(), int2_bytes, bf16_bytes);
  std::printf("%-5s %-24s | %-32s | %-36s | %s\n", "", "", "batch of distinct pages (GB/s)",
              "one reused buffer, like perftest (GB/s)", "ucx_perftest (GB/s)");
  std::printf("%-5s %-24s | %9s %9s %12s | %9s %9s %16s | %8s %8s | %6s %6s\n", "tls",
              "endpoint lanes", "get", "put", "memcpy bound", "get", "put", "memcpy (cached)",
              "get", "put", "get %", "put %");
  for (const auto& r : reports) {
    std::printf("%-5s %-24s | %9.3f %9.3f %12.3f | %9.3f %9.3f %16.3f | %8.3f %8.3f | %5.0f%% "
                "%5.0f%%\n",
                r.name.c_str(), r.lanes.c_str(), r.get_gbps, r.put_gbps, r.memcpy_gbps,
                r.get1_gbps, r.put1_gbps, r.memcpy1_gbps, r.perftest_get_gbps,
                r.perftest_put_gbps, 100 * r.get1_gbps / r.perftest_get_gbps,
                100 * r.put1_gbps / r.perftest_put_gbps);
  }
  std::printf("\n%lld-token handoff (plan: %zu INT2 + %zu BF16 pages vs %zu BF16 pages)\n",
              static_cast<long long>(cfg.handoff_tokens), reports[0].int2_handoff_pages,
              reports[0].int2_handoff_bf16_pages,
              reports[0].int2_handoff_pages + reports[0].int2_handoff_bf16_pages);
  std::printf("%-6s %12s %12s %8s %10s %10s %8s\n", "tls", "INT2 MB", "BF16 MB", "bytes x",
              "INT2 s", "BF16 s", "speedup");
  for (const auto& r : reports) {
    std::printf("%-6s %12.1f %12.1f %7.2fx %10.3f %10.3f %7.2fx\n", r.name.c_str(),
                r.int2_handoff_bytes / 1e6, r.bf16_handoff_bytes / 1e6,
                double(r.bf16_handoff_bytes) / r.int2_handoff_bytes, r.int2_handoff_s,
                r.bf16_handoff_s, r.bf16_handoff_s / r.int2_handoff_s);
  }
  std::printf("\nucx_vs_perftest %.3f   handoff_bytes_ratio %.2f   "
              "handoff_speedup_int2_vs_bf16 %.2f   (worst transport)\n",
              vs_perftest, bytes_ratio, speedup);
  std::printf("note: %s\n", note.c_str());
  std::printf("machine: %ld CPUs, 1-minute load average %s before, %s after\n",
              sysconf(_SC_NPROCESSORS_ONLN), load_before.c_str(), LoadAverage().c_str());
  return 0;
}

}  // namespace

OSCARKV_COMMAND("bench transfer",
                "UCX page-batch GB/s vs ucx_perftest; 32K-token handoff INT2 vs BF16",
                RunBenchTransfer);

}  // namespace oscarkv::cli
#endif  // __has_include transport.h
