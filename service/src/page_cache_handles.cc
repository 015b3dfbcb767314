// PageCache: transfer handles (PublishHandle / OpenHandle / CloseHandle) and the pin helpers
// they share with leases.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "page_cache_internal.h"

namespace oscarkv::service {

namespace {

constexpr size_t kMaxHandleName = 256;
constexpr size_t kMaxHandleMetadata = size_t{1} << 20;

absl::Status CheckHandleName(const std::string& name) {
  if (name.empty() || name.size() > kMaxHandleName) {
    return absl::InvalidArgumentError(
        absl::StrCat("handle name must be 1..", kMaxHandleName, " bytes, got ", name.size()));
  }
  return absl::OkStatus();
}

// Handle names are per tenant: the table's key is the tenant id, then the name.
std::string HandleKey(uint32_t tenant, const std::string& name) {
  std::string k(reinterpret_cast<const char*>(&tenant), sizeof(tenant));
  k += name;
  return k;
}

}  // namespace

void PageCache::RefundHandle(const Handle& h) {
  if (Tenant* t = tenants_->tenant(h.tenant)) {
    t->Refund(Quota::kHandles, 1);
    t->Refund(Quota::kPinnedPages, h.pages.size());
    t->RefundHandleMetadata(h.metadata.size());
  }
}

bool PageCache::PinCommitted(const IndexKey& k, PinnedPage* out, PageKind* kind,
                             uint16_t* tokens) {
  Shard& shard = ShardFor(k);
  absl::MutexLock lock(&shard.mu);
  auto it = shard.map.find(k);
  if (it == shard.map.end() || !it->second.committed) return false;
  Entry& e = it->second;
  e.referenced = true;
  if (e.pins++ == 0) counters_.pinned_pages.fetch_add(1, std::memory_order_relaxed);
  pool_->Ref(e.offset);
  *out = {k, e.gen, e.offset, e.page_bytes};
  *kind = e.kind;
  *tokens = e.token_count;
  return true;
}

void PageCache::RepinPage(const PinnedPage& p) {
  pool_->Ref(p.offset);
  Shard& shard = ShardFor(p.key);
  absl::MutexLock lock(&shard.mu);
  auto it = shard.map.find(p.key);
  if (it != shard.map.end() && it->second.gen == p.gen) {
    if (it->second.pins++ == 0) counters_.pinned_pages.fetch_add(1, std::memory_order_relaxed);
  }
}

uint64_t PageCache::InsertLease(Lease lease) {
  const uint64_t id = NewId();
  LeaseShard& ls = LeaseShardFor(id);
  absl::MutexLock lock(&ls.mu);
  ls.map.emplace(id, std::move(lease));
  counters_.leases.fetch_add(1, std::memory_order_relaxed);
  return id;
}

absl::StatusOr<uint64_t> PageCache::PublishHandle(const Caller& caller,
                                                  const PublishHandleArgs& args) {
  if (absl::Status s = CheckHandleName(args.name); !s.ok()) return s;
  auto tenant_or = TenantOf(caller);
  if (!tenant_or.ok()) return tenant_or.status();
  Tenant& tenant = **tenant_or;
  const std::string name = HandleKey(tenant.id(), args.name);
  auto codec = FindCodec(caller, args.codec);
  if (!codec.ok()) return codec.status();
  if (absl::Status s = CheckBatch(args.keys.size(), "keys"); !s.ok()) return s;
  if (args.metadata.size() > kMaxHandleMetadata) {
    return absl::InvalidArgumentError(absl::StrCat("handle metadata of ", args.metadata.size(),
                                                   " bytes exceeds ", kMaxHandleMetadata));
  }
  std::vector<IndexKey> keys(args.keys.size());
  for (size_t i = 0; i < args.keys.size(); ++i) keys[i] = {(*codec)->index, args.keys[i]};
  auto same_pages = [&](const Handle& h) {
    if (h.codec != (*codec)->index || h.pages.size() != keys.size()) return false;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!(h.pages[i].key == keys[i])) return false;
    }
    return true;
  };
  {
    absl::MutexLock lock(&handles_mu_);
    auto it = handles_.find(name);
    if (it != handles_.end() && it->second.deadline_ms >= clock_->NowMs()) {
      if (!same_pages(it->second)) {
        return absl::AlreadyExistsError(
            absl::StrCat("handle '", args.name, "' already holds other pages"));
      }
      return it->second.deadline_unix_ms;
    }
    // With tenants, each tenant's handles quota bounds the table (so one tenant's handles never
    // block another's); without, the daemon-wide max_handles does.
    if (!tenants_->configured() && handles_.size() >= options_.max_handles) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this daemon already holds ", handles_.size(), " handles"));
    }
  }
  if (absl::Status s = tenant.Charge(Quota::kHandles, 1); !s.ok()) return s;
  if (absl::Status s = tenant.Charge(Quota::kPinnedPages, keys.size()); !s.ok()) {
    tenant.Refund(Quota::kHandles, 1);
    return s;
  }
  if (absl::Status s = tenant.ChargeHandleMetadata(args.metadata.size()); !s.ok()) {
    tenant.Refund(Quota::kHandles, 1);
    tenant.Refund(Quota::kPinnedPages, keys.size());
    return s;
  }
  Handle h;
  h.tenant = tenant.id();
  h.codec = (*codec)->index;
  h.codec_id = args.codec;
  h.metadata = args.metadata;
  h.pages.reserve(keys.size());
  h.info.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    PinnedPage p;
    PageKind kind;
    uint16_t tokens;
    if (!PinCommitted(keys[i], &p, &kind, &tokens)) {
      for (const PinnedPage& q : h.pages) UnpinPage(q);
      tenant.Refund(Quota::kHandles, 1);
      tenant.Refund(Quota::kPinnedPages, keys.size());
      tenant.RefundHandleMetadata(args.metadata.size());
      return absl::NotFoundError(absl::StrCat("keys[", i, "] (", keys[i].key.Hex(),
                                              ") is not committed; store it before publishing"));
    }
    h.pages.push_back(p);
    h.info.emplace_back(kind, tokens);
  }
  uint32_t ttl = args.ttl_ms == 0 ? options_.default_handle_ttl_ms : args.ttl_ms;
  ttl = std::min(ttl, options_.max_handle_ttl_ms);
  h.deadline_ms = clock_->NowMs() + ttl;
  h.deadline_unix_ms = clock_->UnixMs() + ttl;
  uint64_t deadline_unix_ms = 0;
  Handle replaced;  // an expired handle of the same name not yet reaped
  bool have_replaced = false;
  {
    absl::ReleasableMutexLock lock(&handles_mu_);
    auto it = handles_.find(name);
    if (it != handles_.end()) {
      if (it->second.deadline_ms >= clock_->NowMs()) {
        // A concurrent publish of the same name won.
        const bool same = same_pages(it->second);
        const uint64_t deadline = it->second.deadline_unix_ms;
        lock.Release();
        for (const PinnedPage& q : h.pages) UnpinPage(q);
        RefundHandle(h);
        if (!same) {
          return absl::AlreadyExistsError(
              absl::StrCat("handle '", args.name, "' already holds other pages"));
        }
        return deadline;
      }
      replaced = std::move(it->second);
      have_replaced = true;
      handles_.erase(it);
    }
    deadline_unix_ms = h.deadline_unix_ms;
    handles_.emplace(name, std::move(h));
  }
  if (have_replaced) {
    for (const PinnedPage& q : replaced.pages) UnpinPage(q);
    RefundHandle(replaced);
  }
  return deadline_unix_ms;
}

absl::StatusOr<OpenedHandle> PageCache::OpenHandle(const Caller& caller,
                                                   const OpenHandleArgs& args) {
  if (absl::Status s = CheckHandleName(args.name); !s.ok()) return s;
  auto tenant_or = TenantOf(caller);
  if (!tenant_or.ok()) return tenant_or.status();
  Tenant& tenant = **tenant_or;
  OpenedHandle out;
  Lease lease;
  lease.tenant = tenant.id();
  {
    absl::MutexLock lock(&handles_mu_);
    auto it = handles_.find(HandleKey(tenant.id(), args.name));
    if (it == handles_.end() || it->second.deadline_ms < clock_->NowMs()) {
      return absl::NotFoundError(
          absl::StrCat("handle '", args.name, "' is unknown, closed or expired"));
    }
    const Handle& h = it->second;
    // The reader's lease is charged like a pinning Lookup's.
    if (absl::Status s = tenant.Charge(Quota::kLeases, 1); !s.ok()) return s;
    if (absl::Status s = tenant.Charge(Quota::kPinnedPages, h.pages.size()); !s.ok()) {
      tenant.Refund(Quota::kLeases, 1);
      return s;
    }
    // The handle holds its pins, so every page is still allocated: add the lease's own.
    lease.pages = h.pages;
    for (const PinnedPage& p : h.pages) RepinPage(p);
    out.codec = h.codec_id;
    out.metadata = h.metadata;
    out.handle_deadline_unix_ms = h.deadline_unix_ms;
    out.pages.reserve(h.pages.size());
    for (size_t i = 0; i < h.pages.size(); ++i) {
      out.pages.push_back({h.pages[i].key.key, h.pages[i].offset, h.pages[i].page_bytes,
                           h.info[i].first, h.info[i].second});
    }
  }
  uint32_t ms = args.lease_ms == 0 ? options_.default_lease_ms : args.lease_ms;
  ms = std::min(ms, options_.max_lease_ms);
  lease.deadline_ms = clock_->NowMs() + ms;
  out.lease_deadline_unix_ms = clock_->UnixMs() + ms;
  out.lease_id = InsertLease(std::move(lease));
  return out;
}

absl::Status PageCache::CloseHandle(const Caller& caller, const std::string& name) {
  if (absl::Status s = CheckHandleName(name); !s.ok()) return s;
  Handle h;
  {
    absl::MutexLock lock(&handles_mu_);
    // Another tenant's handle of this name is not this caller's to close.
    auto it = handles_.find(HandleKey(caller.tenant_id, name));
    if (it == handles_.end()) return absl::OkStatus();
    h = std::move(it->second);
    handles_.erase(it);
  }
  for (const PinnedPage& p : h.pages) UnpinPage(p);
  RefundHandle(h);
  return absl::OkStatus();
}

size_t PageCache::OpenHandles() const {
  absl::MutexLock lock(&handles_mu_);
  return handles_.size();
}

void PageCache::ReapHandles() {
  const int64_t now = clock_->NowMs();
  std::vector<Handle> expired;
  {
    absl::MutexLock lock(&handles_mu_);
    for (auto it = handles_.begin(); it != handles_.end();) {
      auto cur = it++;
      if (cur->second.deadline_ms < now) {
        expired.push_back(std::move(cur->second));
        handles_.erase(cur);
      }
    }
  }
  for (const Handle& h : expired) {
    for (const PinnedPage& p : h.pages) UnpinPage(p);
    RefundHandle(h);
  }
}

}  // namespace oscarkv::service
