// One transport's measurements in `oscarkv bench transfer` (transfer_bench_internal.h).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/kernels/page_set.h"
#include "oscarkv/testing/bootstrap.h"
#include "oscarkv/util/status_macros.h"
#include "transfer_bench_internal.h"

namespace oscarkv::bench::transfer_bench {
namespace {

using transport::Context;
using transport::Direction;
using transport::EndpointOptions;
using transport::TransferDesc;
using transport::Worker;

absl::Status Check(absl::Status s, const std::string& what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

}  // namespace

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
  auto peer = testing::PeerProcess::Spawn(
      {"/proc/self/exe", "bench", "transfer", "--serve", "--tls", rep.tls, "--int2-pages",
       absl::StrCat(int2_pool), "--bf16-pages", absl::StrCat(bf16_pool)},
      {});
  if (!peer.ok()) return peer.status();
  std::string blobs[3];
  for (auto& b : blobs) {
    auto r = testing::RecvBlob(peer->control_fd(), absl::Seconds(120));
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
  OSCARKV_RETURN_IF_ERROR(testing::SendBlob(peer->control_fd(), "count-valid"));
  OSCARKV_ASSIGN_OR_RETURN(std::string peer_valid,
                           testing::RecvBlob(peer->control_fd(), absl::Seconds(60)));
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

}  // namespace oscarkv::bench::transfer_bench
