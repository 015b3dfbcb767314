// Tenants: who a caller is, which namespace of keys it may use, and what it may hold.
//
// * Identity. Over gRPC a tenant is the verified mTLS client certificate: its subject CN or one
//   of its URI SANs must equal a configured tenant name (tenant_identity.h reads them). On the
//   local socket it is the peer's SO_PEERCRED uid (or gid) listed in a tenant's `uids`/`gids`.
//   A caller that names no tenant is refused. Without a `tenants:` section there is one tenant,
//   "default", with the admin role and no quotas beyond the daemon-wide limits: today's single-
//   user behaviour (plaintext loopback setups keep working).
// * Namespaces. Every tenant has its own namespace: codec registrations, and so page keys,
//   leases, reservations and handles, are per namespace, so equal block keys of two tenants
//   never collide or deduplicate. A shared namespace (`shared_namespaces:`) is the one way to
//   share pages: its member tenants may select it per call (client option shared_namespace).
// * Quotas. Each tenant has limits on pool bytes it stores, pages it pins (a page pinned by two
//   leases counts twice), live leases, transfer handles and codec registrations. Charge() takes
//   from a limit or answers RESOURCE_EXHAUSTED naming the quota; Refund() gives back. Counters
//   are atomics: thread-safe, lock-free.
// The registry is immutable after Create (tenants are fixed for the daemon's life).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oscarkv/service/config.h"

namespace oscarkv::service {

enum class Quota : int { kPoolBytes = 0, kPinnedPages, kLeases, kHandles, kCodecs };
inline constexpr int kNumQuotas = 5;
// The config key of a quota ("pool_mb", "pinned_pages", "leases", "handles", "codecs").
const char* QuotaName(Quota q);

inline constexpr uint64_t kUnlimited = ~uint64_t{0};
// Transfer-handle metadata (opaque bytes of up to 1 MiB per handle) is daemon heap, not pool
// memory: each tenant's live handles hold at most this much of it together, whatever its
// handles quota (without tenants: the one default tenant's 65,536 handles).
inline constexpr uint64_t kHandleMetadataBytesPerTenant = uint64_t{256} << 20;
// Pins the default tenant of a daemon without `tenants:` may hold (leases and handles together).
inline constexpr uint64_t kSingleTenantPinnedPages = uint64_t{1} << 20;

class Tenant {
 public:
  Tenant(uint32_t id, std::string name, bool admin, std::array<uint64_t, kNumQuotas> limits)
      : id_(id), name_(std::move(name)), admin_(admin), limits_(limits) {}

  uint32_t id() const { return id_; }  // also the id of its own namespace
  const std::string& name() const { return name_; }
  bool admin() const { return admin_; }
  uint64_t limit(Quota q) const { return limits_[static_cast<int>(q)]; }
  uint64_t used(Quota q) const {
    return used_[static_cast<int>(q)].load(std::memory_order_relaxed);
  }

  // Takes `n` of quota `q`; RESOURCE_EXHAUSTED naming the quota (nothing taken) when the
  // tenant would exceed it, counted in refusals(q).
  absl::Status Charge(Quota q, uint64_t n);
  // Charge without counting a refusal: for a caller that may make room and retry (the pool
  // quota evicts the tenant's own pages first), which calls CountRefusal when it gives up.
  absl::Status TryCharge(Quota q, uint64_t n);
  void CountRefusal(Quota q) {
    refusals_[static_cast<int>(q)].fetch_add(1, std::memory_order_relaxed);
  }
  void Refund(Quota q, uint64_t n);
  // Calls refused RESOURCE_EXHAUSTED by quota `q` (per-tenant metrics).
  uint64_t refusals(Quota q) const {
    return refusals_[static_cast<int>(q)].load(std::memory_order_relaxed);
  }

  // Takes `n` bytes of handle metadata (kHandleMetadataBytesPerTenant in all), or answers
  // RESOURCE_EXHAUSTED (nothing taken, counted as a handles-quota refusal).
  absl::Status ChargeHandleMetadata(uint64_t n);
  void RefundHandleMetadata(uint64_t n);
  uint64_t handle_metadata_bytes() const {
    return handle_metadata_.load(std::memory_order_relaxed);
  }

  // Figures of this tenant's Stats answer.
  std::atomic<uint64_t> pages{0}, lookups{0}, hits{0}, misses{0};

 private:
  const uint32_t id_;
  const std::string name_;
  const bool admin_;
  const std::array<uint64_t, kNumQuotas> limits_;
  std::array<std::atomic<uint64_t>, kNumQuotas> used_{};
  std::array<std::atomic<uint64_t>, kNumQuotas> refusals_{};
  std::atomic<uint64_t> handle_metadata_{0};
};

struct Namespace {
  uint32_t id = 0;
  std::string name;
  bool shared = false;
  std::vector<uint32_t> members;  // tenant ids (a tenant's own namespace: just itself)
};

class TenantRegistry {
 public:
  static constexpr const char* kDefaultTenant = "default";
  // Builds the registry from config.tenants / config.shared_namespaces (already validated by
  // DaemonConfig::Validate). `pool_bytes` sizes the default pool_mb quota (an equal share).
  static absl::StatusOr<std::unique_ptr<TenantRegistry>> Create(const DaemonConfig& config,
                                                                uint64_t pool_bytes);
  // The single default tenant (no `tenants:` configured): admin, unlimited quotas except
  // `max_codecs` codecs, `max_handles` handles (the daemon-wide limits of old) and
  // kSingleTenantPinnedPages pins (which also bound its leases).
  static std::unique_ptr<TenantRegistry> SingleTenant(uint64_t max_codecs, uint64_t max_handles);

  bool configured() const { return configured_; }
  size_t size() const { return tenants_.size(); }
  Tenant* tenant(uint32_t id) const { return id < tenants_.size() ? tenants_[id].get() : nullptr; }
  Tenant* Find(absl::string_view name) const;
  const Namespace* ns(uint32_t id) const {
    return id < namespaces_.size() ? &namespaces_[id] : nullptr;
  }
  size_t namespaces() const { return namespaces_.size(); }

  // The tenant of a verified client certificate: the first of `names` (its subject CN, then its
  // URI SANs) that is a tenant. UNAUTHENTICATED when no certificate was presented (`names`
  // empty), PERMISSION_DENIED when it names no tenant. Without configured tenants: the default
  // tenant, certificate or not.
  absl::StatusOr<Tenant*> FromCertificate(const std::vector<std::string>& names) const;
  // The tenant of a local-socket peer: uid first, then gid. PERMISSION_DENIED when neither is
  // mapped. Without configured tenants: the default tenant for root and `daemon_uid` only.
  absl::StatusOr<Tenant*> FromPeer(uint32_t uid, uint32_t gid, uint32_t daemon_uid) const;
  // The namespace a call of `tenant` uses: its own for "", else the shared namespace of that
  // name, PERMISSION_DENIED when the tenant is not a member (NOT_FOUND hides nothing here: the
  // namespace names are the operator's, not secrets).
  absl::StatusOr<uint32_t> NamespaceFor(const Tenant& tenant, absl::string_view shared) const;
  // Whether `tenant` may use namespace `ns_id` (a member; admins may use every namespace for
  // clear and stats only, which the cache checks itself).
  bool MayUse(const Tenant& tenant, uint32_t ns_id) const;
  // Whether any tenant maps local-socket peers by uid/gid (the socket is then opened to every
  // local user, and access is decided per peer).
  bool maps_local_peers() const { return maps_local_peers_; }

 private:
  TenantRegistry() = default;
  bool configured_ = false;
  bool maps_local_peers_ = false;
  std::vector<std::unique_ptr<Tenant>> tenants_;
  std::vector<Namespace> namespaces_;  // [0, tenants) own, then shared
  absl::flat_hash_map<std::string, uint32_t> by_name_;
  absl::flat_hash_map<std::string, uint32_t> shared_by_name_;
  absl::flat_hash_map<uint32_t, uint32_t> by_uid_, by_gid_;
};

}  // namespace oscarkv::service
