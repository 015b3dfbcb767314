#include "oscarkv/service/metrics.h"

#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "oscarkv/service/tier.h"

namespace oscarkv::service {

const char* RpcName(Rpc rpc) {
  static const char* kNames[] = {"Handshake", "RegisterCodec", "Lookup",     "Reserve",
                                 "Commit",    "Abort",         "WritePages", "ReadPages",
                                 "Release",   "RenewLease",    "Delete",     "Clear",
                                 "Stats",     "PublishHandle", "OpenHandle", "CloseHandle", "GetDataPlane",
                                 "StageForRma", "UnregisterCodec", "AttachStaging",
                                 "StageWrite", "AttachLoadStaging", "StageRead"};
  static_assert(std::size(kNames) == static_cast<size_t>(Rpc::kCount));
  const int i = static_cast<int>(rpc);
  return i >= 0 && i < static_cast<int>(Rpc::kCount) ? kNames[i] : "unknown";
}

namespace {
const char* CodeName(int code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  return code >= 0 && code < 17 ? kNames[code] : "UNKNOWN";
}

void Counter(std::string* out, const char* name, const char* help, uint64_t v) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " counter\n", name, " ", v,
                  "\n");
}
void Gauge(std::string* out, const char* name, const char* help, int64_t v) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n", name, " ",
                  v < 0 ? 0 : v, "\n");
}

// A Prometheus label value: backslash, double quote and newline escaped.
std::string LabelValue(absl::string_view v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\' || ch == '"') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else {
      out += ch;
    }
  }
  return out;
}

// The quota label of the per-tenant series (pool usage is in bytes, so not "pool_mb").
const char* QuotaLabel(Quota q) {
  return q == Quota::kPoolBytes ? "pool_bytes" : QuotaName(q);
}

void TenantSeries(const TenantRegistry& reg, std::string* out) {
  std::vector<std::string> names;
  for (uint32_t id = 0; id < reg.size(); ++id) {
    names.push_back(absl::StrCat("tenant=\"", LabelValue(reg.tenant(id)->name()), "\""));
  }
  auto family = [&](const char* name, const char* type, const char* help) {
    absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  };
  auto each = [&](const char* name, const char* type, const char* help, auto value) {
    family(name, type, help);
    for (uint32_t id = 0; id < reg.size(); ++id) {
      absl::StrAppend(out, name, "{", names[id], "} ", value(*reg.tenant(id)), "\n");
    }
  };
  each("oscarkv_tenant_pages", "gauge", "Committed pages stored by the tenant.",
       [](const Tenant& t) { return t.pages.load(std::memory_order_relaxed); });
  each("oscarkv_tenant_lookups_total", "counter", "Lookup calls of the tenant.",
       [](const Tenant& t) { return t.lookups.load(std::memory_order_relaxed); });
  each("oscarkv_tenant_lookup_hits_total", "counter", "Keys the tenant's Lookups found.",
       [](const Tenant& t) { return t.hits.load(std::memory_order_relaxed); });
  each("oscarkv_tenant_lookup_misses_total", "counter",
       "Keys of the tenant's Lookups past the matched prefix.",
       [](const Tenant& t) { return t.misses.load(std::memory_order_relaxed); });
  family("oscarkv_tenant_quota_used", "gauge",
         "What the tenant holds of each quota (pool_bytes: page bytes stored or reserved).");
  for (uint32_t id = 0; id < reg.size(); ++id) {
    for (int q = 0; q < kNumQuotas; ++q) {
      absl::StrAppend(out, "oscarkv_tenant_quota_used{", names[id], ",quota=\"",
                      QuotaLabel(static_cast<Quota>(q)), "\"} ",
                      reg.tenant(id)->used(static_cast<Quota>(q)), "\n");
    }
  }
  family("oscarkv_tenant_quota_limit", "gauge",
         "The tenant's limit of each quota (absent: unlimited; pool_bytes in bytes).");
  for (uint32_t id = 0; id < reg.size(); ++id) {
    for (int q = 0; q < kNumQuotas; ++q) {
      const uint64_t limit = reg.tenant(id)->limit(static_cast<Quota>(q));
      if (limit == kUnlimited) continue;
      absl::StrAppend(out, "oscarkv_tenant_quota_limit{", names[id], ",quota=\"",
                      QuotaLabel(static_cast<Quota>(q)), "\"} ", limit, "\n");
    }
  }
  family("oscarkv_tenant_quota_refusals_total", "counter",
         "Calls (or Reserve items) of the tenant refused RESOURCE_EXHAUSTED by each quota.");
  for (uint32_t id = 0; id < reg.size(); ++id) {
    for (int q = 0; q < kNumQuotas; ++q) {
      absl::StrAppend(out, "oscarkv_tenant_quota_refusals_total{", names[id], ",quota=\"",
                      QuotaLabel(static_cast<Quota>(q)), "\"} ",
                      reg.tenant(id)->refusals(static_cast<Quota>(q)), "\n");
    }
  }
}
}  // namespace

void Histogram::Observe(int64_t nanos) {
  if (nanos < 0) nanos = 0;
  const double s = static_cast<double>(nanos) * 1e-9;
  size_t i = 0;
  while (i < kBounds.size() && s > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(static_cast<uint64_t>(nanos), std::memory_order_relaxed);
}

void Histogram::Render(const std::string& name, const std::string& labels,
                       std::string* out) const {
  uint64_t cumulative = 0;
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i < kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    absl::StrAppend(out, name, "_bucket{", labels, sep, "le=\"", kBounds[i], "\"} ", cumulative,
                    "\n");
  }
  cumulative += buckets_[kBounds.size()].load(std::memory_order_relaxed);
  absl::StrAppend(out, name, "_bucket{", labels, sep, "le=\"+Inf\"} ", cumulative, "\n");
  absl::StrAppend(out, name, "_sum{", labels, "} ",
                  static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) * 1e-9, "\n");
  absl::StrAppend(out, name, "_count{", labels, "} ", cumulative, "\n");
}

void Metrics::Record(Rpc rpc, int code, int64_t nanos) {
  const int r = static_cast<int>(rpc);
  if (r < 0 || r >= static_cast<int>(Rpc::kCount)) return;
  latency_[r].Observe(nanos);
  codes_[r][code >= 0 && code < kCodes ? code : 2].fetch_add(1, std::memory_order_relaxed);
}

uint64_t Metrics::calls(Rpc rpc, int code) const {
  return codes_[static_cast<int>(rpc)][code].load(std::memory_order_relaxed);
}

std::string Metrics::Render(const PageCache& cache) const {
  std::string out;
  out.reserve(16384);
  const CacheCounters& c = cache.counters();
  Counter(&out, "oscarkv_lookups_total", "Lookup calls.", c.lookups.load());
  Counter(&out, "oscarkv_lookup_hits_total", "Keys found by Lookup (the matched prefix).",
          c.hits.load());
  Counter(&out, "oscarkv_lookup_misses_total", "Keys of Lookup calls past the matched prefix.",
          c.misses.load());
  Counter(&out, "oscarkv_evictions_total", "Committed pages evicted to make room.",
          c.evictions.load());
  Counter(&out, "oscarkv_bytes_written_total", "Page bytes received through WritePages.",
          c.bytes_written.load());
  Counter(&out, "oscarkv_bytes_read_total", "Page bytes sent through ReadPages.",
          c.bytes_read.load());
  Counter(&out, "oscarkv_pages_reserved_total", "Slots handed out by Reserve.", c.reserved.load());
  Counter(&out, "oscarkv_dedup_rejects_total",
          "Reserve items refused with ALREADY_EXISTS (already stored).",
          c.dedup_rejects.load());
  Counter(&out, "oscarkv_in_progress_rejects_total",
          "Reserve items refused with ABORTED (reserved by another reservation, not committed).",
          c.in_progress_rejects.load());
  Counter(&out, "oscarkv_reserve_failures_total", "Reserve items refused for lack of space.",
          c.reserve_failures.load());
  Counter(&out, "oscarkv_commits_total", "Pages verified and published by Commit.",
          c.commits.load());
  Counter(&out, "oscarkv_commit_failures_total",
          "Commit items rejected (bad header, checksum, unknown key); a page that fails "
          "verification frees its slot.", c.commit_failures.load());
  Counter(&out, "oscarkv_commit_rehashes_total",
          "Pages Commit read again to hash them: not hashed in the copy that wrote the slot "
          "(written out of order, or by a client). 0 while every store is one pass per side.",
          c.commit_rehashes.load());
  Counter(&out, "oscarkv_aborted_pages_total", "Reserved slots freed by Abort or expiry.",
          c.aborted_pages.load());
  Counter(&out, "oscarkv_leases_expired_total", "Leases reclaimed at their deadline.",
          c.leases_expired.load());
  Counter(&out, "oscarkv_reservations_expired_total",
          "Reservations reclaimed at their deadline with uncommitted slots.",
          c.reservations_expired.load());
  Counter(&out, "oscarkv_deletes_total", "Pages removed by Delete.", c.deletes.load());
  const PagePool& pool = cache.pool();
  Gauge(&out, "oscarkv_pool_bytes", "Size of the page pool.",
        static_cast<int64_t>(pool.capacity_bytes()));
  Gauge(&out, "oscarkv_pool_used_bytes", "Pool bytes in allocated slots.",
        static_cast<int64_t>(pool.bytes_used()));
  Gauge(&out, "oscarkv_pages", "Committed pages in the index.", c.pages.load());
  Gauge(&out, "oscarkv_reserved_pages", "Reserved, uncommitted slots.", c.reserved_pages.load());
  Gauge(&out, "oscarkv_pinned_pages", "Pages pinned by at least one lease.",
        c.pinned_pages.load());
  Gauge(&out, "oscarkv_leases", "Live leases.", c.leases.load());
  Gauge(&out, "oscarkv_codecs", "Registered codec profiles.", static_cast<int64_t>(cache.codecs()));
  const PagePoolStats ps = pool.Stats();
  absl::StrAppend(&out,
                  "# HELP oscarkv_pool_slots Slots carved for each page size (spans x slots).\n"
                  "# TYPE oscarkv_pool_slots gauge\n");
  for (const SizeClassStats& c : ps.classes) {
    absl::StrAppend(&out, "oscarkv_pool_slots{slot_bytes=\"", c.slot_bytes, "\"} ",
                    c.spans * c.slots_per_span, "\n");
  }
  absl::StrAppend(&out,
                  "# HELP oscarkv_pool_slots_used Allocated slots for each page size.\n"
                  "# TYPE oscarkv_pool_slots_used gauge\n");
  for (const SizeClassStats& c : ps.classes) {
    absl::StrAppend(&out, "oscarkv_pool_slots_used{slot_bytes=\"", c.slot_bytes, "\"} ",
                    c.slots_used, "\n");
  }
  Gauge(&out, "oscarkv_pool_free_chunks", "Pool chunks not assigned to any page size.",
        static_cast<int64_t>(ps.chunks_free));
  TenantSeries(cache.tenants(), &out);

  if (PageTier* tier = cache.tier()) {
    const tiering::TierStats ts = tier->store_stats();
    const TierCounters& tc = tier->counters();
    Gauge(&out, "oscarkv_tier_capacity_bytes", "SSD tier capacity.",
          static_cast<int64_t>(ts.capacity_bytes));
    Gauge(&out, "oscarkv_tier_bytes", "Page bytes in the SSD tier.",
          static_cast<int64_t>(ts.used_bytes));
    Gauge(&out, "oscarkv_tier_pages", "Pages in the SSD tier.", static_cast<int64_t>(ts.pages));
    Gauge(&out, "oscarkv_tier_queued_bytes", "Demotions queued, not yet written.",
          static_cast<int64_t>(tier->queued_bytes()));
    Counter(&out, "oscarkv_tier_demotions_total", "Evicted pages written to the SSD tier.",
            tc.demotions.load());
    Counter(&out, "oscarkv_tier_demoted_bytes_total", "Bytes written to the SSD tier.",
            tc.demoted_bytes.load());
    Counter(&out, "oscarkv_tier_demote_drops_total",
            "Evicted pages not demoted (queue full past its wait, or a write error).",
            tc.demote_drops.load());
    Counter(&out, "oscarkv_tier_demote_waits_total",
            "Evictions that waited for room in the demotion queue.", tc.demote_waits.load());
    Counter(&out, "oscarkv_tier_promotions_total",
            "SSD tier pages read back into the pool by a pinning Lookup.", tc.promotions.load());
    Counter(&out, "oscarkv_tier_promoted_bytes_total", "Bytes promoted from the SSD tier.",
            tc.promoted_bytes.load());
    Counter(&out, "oscarkv_tier_hits_total", "SSD tier reads that found a verified page.",
            tc.hits.load());
    Counter(&out, "oscarkv_tier_misses_total", "SSD tier reads that found nothing.",
            tc.misses.load());
    Counter(&out, "oscarkv_tier_corruptions_total",
            "SSD tier pages that failed verification (removed, never served).",
            tc.corruptions.load());
    Counter(&out, "oscarkv_tier_evictions_total",
            "SSD tier pages dropped by its LRU to stay under capacity.", ts.evictions);
    absl::StrAppend(&out,
                    "# HELP oscarkv_tier_demote_seconds One page write into the SSD tier.\n"
                    "# TYPE oscarkv_tier_demote_seconds histogram\n");
    tc.demote_latency.Render("oscarkv_tier_demote_seconds", "", &out);
    absl::StrAppend(&out,
                    "# HELP oscarkv_tier_promote_seconds One page read from the SSD tier.\n"
                    "# TYPE oscarkv_tier_promote_seconds histogram\n");
    tc.promote_latency.Render("oscarkv_tier_promote_seconds", "", &out);
  }
  absl::StrAppend(&out,
                  "# HELP oscarkv_rpc_duration_seconds Server-side RPC latency.\n"
                  "# TYPE oscarkv_rpc_duration_seconds histogram\n");
  for (int r = 0; r < static_cast<int>(Rpc::kCount); ++r) {
    latency_[r].Render("oscarkv_rpc_duration_seconds",
                       absl::StrCat("method=\"", RpcName(static_cast<Rpc>(r)), "\""), &out);
  }
  absl::StrAppend(&out,
                  "# HELP oscarkv_rpcs_total RPCs by method and gRPC status code.\n"
                  "# TYPE oscarkv_rpcs_total counter\n");
  for (int r = 0; r < static_cast<int>(Rpc::kCount); ++r) {
    for (int code = 0; code < kCodes; ++code) {
      const uint64_t n = codes_[r][code].load(std::memory_order_relaxed);
      if (n == 0) continue;
      absl::StrAppend(&out, "oscarkv_rpcs_total{method=\"", RpcName(static_cast<Rpc>(r)),
                      "\",code=\"", CodeName(code), "\"} ", n, "\n");
    }
  }
  absl::StrAppend(&out,
                  "# HELP oscarkv_local_calls_total Calls carried by the same-host control "
                  "socket (also in oscarkv_rpcs_total).\n"
                  "# TYPE oscarkv_local_calls_total counter\n");
  for (Rpc r : kLocalMethods) {
    absl::StrAppend(&out, "oscarkv_local_calls_total{method=\"", RpcName(r), "\"} ",
                    local_calls(r), "\n");
  }
  Gauge(&out, "oscarkv_local_connections", "Open connections on the same-host control socket.",
        local_connections());
  Counter(&out, "oscarkv_local_malformed_frames_total",
          "Frames refused on the same-host control socket (the connection was closed).",
          local_malformed());
  return out;
}

}  // namespace oscarkv::service
