#include "oscarkv/service/tenants.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace oscarkv::service {

const char* QuotaName(Quota q) {
  switch (q) {
    case Quota::kPoolBytes: return "pool_mb";
    case Quota::kPinnedPages: return "pinned_pages";
    case Quota::kLeases: return "leases";
    case Quota::kHandles: return "handles";
    case Quota::kCodecs: return "codecs";
  }
  return "?";
}

namespace {
std::string LimitText(Quota q, uint64_t limit) {
  if (q == Quota::kPoolBytes) return absl::StrCat(limit >> 20, " MiB");
  return absl::StrCat(limit);
}
}  // namespace

absl::Status Tenant::Charge(Quota q, uint64_t n) {
  absl::Status s = TryCharge(q, n);
  if (!s.ok()) CountRefusal(q);
  return s;
}

absl::Status Tenant::TryCharge(Quota q, uint64_t n) {
  const int i = static_cast<int>(q);
  const uint64_t limit = limits_[i];
  if (limit == kUnlimited) {
    used_[i].fetch_add(n, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  uint64_t cur = used_[i].load(std::memory_order_relaxed);
  do {
    if (n > limit || cur > limit - n) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant '", name_, "' is over its ", QuotaName(q), " quota (", LimitText(q, limit),
          ", ", q == Quota::kPoolBytes ? absl::StrCat(cur >> 20, " MiB") : absl::StrCat(cur),
          " in use)"));
    }
  } while (!used_[i].compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
  return absl::OkStatus();
}

void Tenant::Refund(Quota q, uint64_t n) {
  const int i = static_cast<int>(q);
  uint64_t cur = used_[i].load(std::memory_order_relaxed);
  // Never below zero, whatever a caller's bookkeeping does.
  while (!used_[i].compare_exchange_weak(cur, cur - std::min(cur, n), std::memory_order_relaxed)) {
  }
}

absl::Status Tenant::ChargeHandleMetadata(uint64_t n) {
  uint64_t cur = handle_metadata_.load(std::memory_order_relaxed);
  do {
    if (n > kHandleMetadataBytesPerTenant || cur > kHandleMetadataBytesPerTenant - n) {
      CountRefusal(Quota::kHandles);
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant '", name_, "': its open handles already hold ", cur >> 10, " KiB of metadata; ",
          n >> 10, " KiB more would exceed the ", kHandleMetadataBytesPerTenant >> 20,
          " MiB a tenant's handles may hold (close handles, or keep less metadata)"));
    }
  } while (!handle_metadata_.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
  return absl::OkStatus();
}

void Tenant::RefundHandleMetadata(uint64_t n) {
  uint64_t cur = handle_metadata_.load(std::memory_order_relaxed);
  while (!handle_metadata_.compare_exchange_weak(cur, cur - std::min(cur, n),
                                                 std::memory_order_relaxed)) {
  }
}

std::unique_ptr<TenantRegistry> TenantRegistry::SingleTenant(uint64_t max_codecs,
                                                             uint64_t max_handles) {
  std::unique_ptr<TenantRegistry> r(new TenantRegistry);
  std::array<uint64_t, kNumQuotas> limits;
  limits.fill(kUnlimited);
  // Pins (of leases and handles) cost daemon heap (~100 bytes each, and every lease holds at
  // least one): 2^20 of them bound a daemon without tenants to ~100 MiB of it, where any
  // admitted client could otherwise grow it without limit. Far above what engines hold (a pin
  // lasts one request; 64 GiB of Qwen3-8B INT2 pages are 52k pages).
  limits[static_cast<int>(Quota::kPinnedPages)] = kSingleTenantPinnedPages;
  limits[static_cast<int>(Quota::kCodecs)] = max_codecs;
  limits[static_cast<int>(Quota::kHandles)] = max_handles;
  r->tenants_.push_back(std::make_unique<Tenant>(0, kDefaultTenant, /*admin=*/true, limits));
  r->namespaces_.push_back({0, kDefaultTenant, false, {0}});
  r->by_name_.emplace(kDefaultTenant, 0);
  return r;
}

absl::StatusOr<std::unique_ptr<TenantRegistry>> TenantRegistry::Create(
    const DaemonConfig& config, uint64_t pool_bytes) {
  if (config.tenants.empty()) {
    return SingleTenant(config.max_codecs, kUnlimited);
  }
  if (config.tenants.size() > kMaxTenants) {
    return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxTenants, " tenants"));
  }
  std::unique_ptr<TenantRegistry> r(new TenantRegistry);
  r->configured_ = true;
  // pool_mb quotas must fit the pool together: a tenant's quota promises it room, which an
  // oversubscribed pool could not give while other tenants stay within theirs. A tenant without
  // one gets an even share of the pool, or less: what the explicit quotas leave, split evenly.
  const uint64_t pool_mb = pool_bytes >> 20;
  uint64_t explicit_mb = 0, unset = 0;
  for (const TenantConfig& t : config.tenants) {
    if (t.pool_mb.has_value()) {
      explicit_mb += *t.pool_mb;
    } else {
      ++unset;
    }
  }
  if (explicit_mb > pool_mb || (unset > 0 && (pool_mb - explicit_mb) / unset == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenants: the pool_mb quotas add up to ", explicit_mb, " MiB",
        unset > 0 && explicit_mb <= pool_mb ? absl::StrCat(" and leave less than 1 MiB each for the ", unset,
                                 " tenant(s) without one")
                  : std::string(),
        ", but the pool holds ", pool_mb, " MiB (pool.mb / --pool-mb): a tenant could be "
        "refused room its quota promises. Lower the quotas or enlarge the pool"));
  }
  const uint64_t share_mb =
      unset > 0 ? std::min(pool_mb / config.tenants.size(), (pool_mb - explicit_mb) / unset) : 0;
  for (const TenantConfig& t : config.tenants) {
    const uint32_t id = static_cast<uint32_t>(r->tenants_.size());
    if (!r->by_name_.emplace(t.name, id).second) {
      return absl::InvalidArgumentError(absl::StrCat("tenant '", t.name, "' is listed twice"));
    }
    std::array<uint64_t, kNumQuotas> limits;
    limits[static_cast<int>(Quota::kPoolBytes)] = t.pool_mb.value_or(share_mb) << 20;
    limits[static_cast<int>(Quota::kPinnedPages)] =
        t.pinned_pages.value_or(kDefaultQuotaPinnedPages);
    limits[static_cast<int>(Quota::kLeases)] = t.leases.value_or(kDefaultQuotaLeases);
    limits[static_cast<int>(Quota::kHandles)] = t.handles.value_or(kDefaultQuotaHandles);
    limits[static_cast<int>(Quota::kCodecs)] = t.codecs.value_or(kDefaultQuotaCodecs);
    r->tenants_.push_back(std::make_unique<Tenant>(id, t.name, t.admin, limits));
    r->namespaces_.push_back({id, t.name, false, {id}});
    for (uint32_t uid : t.uids) {
      if (!r->by_uid_.emplace(uid, id).second) {
        return absl::InvalidArgumentError(absl::StrCat("uid ", uid, " maps to two tenants"));
      }
      r->maps_local_peers_ = true;
    }
    for (uint32_t gid : t.gids) {
      if (!r->by_gid_.emplace(gid, id).second) {
        return absl::InvalidArgumentError(absl::StrCat("gid ", gid, " maps to two tenants"));
      }
      r->maps_local_peers_ = true;
    }
  }
  for (const SharedNamespaceConfig& s : config.shared_namespaces) {
    Namespace ns;
    ns.id = static_cast<uint32_t>(r->namespaces_.size());
    ns.name = s.name;
    ns.shared = true;
    for (const std::string& m : s.tenants) {
      auto it = r->by_name_.find(m);
      if (it == r->by_name_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("shared namespace '", s.name, "' names unknown tenant '", m, "'"));
      }
      ns.members.push_back(it->second);
    }
    if (r->by_name_.contains(s.name) || !r->shared_by_name_.emplace(s.name, ns.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("shared namespace '", s.name, "' reuses a tenant or namespace name"));
    }
    r->namespaces_.push_back(std::move(ns));
  }
  return r;
}

Tenant* TenantRegistry::Find(absl::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : tenants_[it->second].get();
}

absl::StatusOr<Tenant*> TenantRegistry::FromCertificate(
    const std::vector<std::string>& names) const {
  if (!configured_) return tenants_[0].get();
  if (names.empty()) {
    return absl::UnauthenticatedError(
        "this daemon serves tenants: present a client certificate whose subject CN or URI SAN "
        "names a configured tenant");
  }
  for (const std::string& n : names) {
    if (Tenant* t = Find(n)) return t;
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "client certificate (CN '", names[0].substr(0, 128),
      "') names no tenant of this daemon; add it to tenants: or use another certificate"));
}

absl::StatusOr<Tenant*> TenantRegistry::FromPeer(uint32_t uid, uint32_t gid,
                                                 uint32_t daemon_uid) const {
  if (!configured_) {
    if (uid == 0 || uid == daemon_uid) return tenants_[0].get();
    return absl::PermissionDeniedError(absl::StrCat(
        "uid ", uid, " may not use this socket (only root and the daemon's uid ", daemon_uid,
        " may); use the gRPC address"));
  }
  if (auto it = by_uid_.find(uid); it != by_uid_.end()) return tenants_[it->second].get();
  if (auto it = by_gid_.find(gid); it != by_gid_.end()) return tenants_[it->second].get();
  return absl::PermissionDeniedError(absl::StrCat(
      "uid ", uid, " / gid ", gid, " is no tenant of this daemon (tenants: uids/gids); use the "
      "gRPC address with a client certificate"));
}

absl::StatusOr<uint32_t> TenantRegistry::NamespaceFor(const Tenant& tenant,
                                                      absl::string_view shared) const {
  if (shared.empty()) return tenant.id();
  auto it = shared_by_name_.find(shared);
  if (it == shared_by_name_.end() || !MayUse(tenant, it->second)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "tenant '", tenant.name(), "' is not a member of a shared namespace '",
        shared.substr(0, 128), "'"));
  }
  return it->second;
}

bool TenantRegistry::MayUse(const Tenant& tenant, uint32_t ns_id) const {
  if (ns_id >= namespaces_.size()) return false;
  const auto& m = namespaces_[ns_id].members;
  return std::find(m.begin(), m.end(), tenant.id()) != m.end();
}

}  // namespace oscarkv::service
