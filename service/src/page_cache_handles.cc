// PageCache: transfer handles (PublishHandle / OpenHandle / CloseHandle) and the pin helpers
// they share with leases.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "oscarkv/proto/codec_convert.h"
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

}  // namespace

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

absl::Status PageCache::PublishHandle(const pb::PublishHandleRequest& req,
                                      pb::PublishHandleResponse* resp) {
  if (absl::Status s = CheckHandleName(req.handle()); !s.ok()) return s;
  auto codec = FindCodec(req.codec_id());
  if (!codec.ok()) return codec.status();
  if (absl::Status s = CheckBatch(req.keys_size(), "keys"); !s.ok()) return s;
  if (req.metadata().size() > kMaxHandleMetadata) {
    return absl::InvalidArgumentError(absl::StrCat("handle metadata of ", req.metadata().size(),
                                                   " bytes exceeds ", kMaxHandleMetadata));
  }
  std::vector<IndexKey> keys(req.keys_size());
  for (int i = 0; i < req.keys_size(); ++i) {
    if (req.keys(i).size() != 16) {
      return absl::InvalidArgumentError(
          absl::StrCat("keys[", i, "] has ", req.keys(i).size(), " bytes; keys are 16 bytes"));
    }
    keys[i].codec = (*codec)->index;
    std::memcpy(keys[i].key.bytes.data(), req.keys(i).data(), 16);
  }
  auto same_pages = [&](const Handle& h) {
    if (h.codec != (*codec)->index || h.pages.size() != keys.size()) return false;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!(h.pages[i].key == keys[i])) return false;
    }
    return true;
  };
  {
    absl::MutexLock lock(&handles_mu_);
    auto it = handles_.find(req.handle());
    if (it != handles_.end() && it->second.deadline_ms >= clock_->NowMs()) {
      if (!same_pages(it->second)) {
        return absl::AlreadyExistsError(
            absl::StrCat("handle '", req.handle(), "' already holds other pages"));
      }
      resp->set_deadline_unix_ms(it->second.deadline_unix_ms);
      return absl::OkStatus();
    }
    if (handles_.size() >= options_.max_handles) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this daemon already holds ", handles_.size(), " handles"));
    }
  }
  Handle h;
  h.codec = (*codec)->index;
  h.codec_id = req.codec_id();
  h.metadata = req.metadata();
  h.pages.reserve(keys.size());
  h.info.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    PinnedPage p;
    PageKind kind;
    uint16_t tokens;
    if (!PinCommitted(keys[i], &p, &kind, &tokens)) {
      for (const PinnedPage& q : h.pages) UnpinPage(q);
      return absl::NotFoundError(absl::StrCat("keys[", i, "] (", keys[i].key.Hex(),
                                              ") is not committed; store it before publishing"));
    }
    h.pages.push_back(p);
    h.info.emplace_back(kind, tokens);
  }
  uint32_t ttl = req.ttl_ms() == 0 ? options_.default_handle_ttl_ms : req.ttl_ms();
  ttl = std::min(ttl, options_.max_handle_ttl_ms);
  h.deadline_ms = clock_->NowMs() + ttl;
  h.deadline_unix_ms = clock_->UnixMs() + ttl;
  Handle replaced;  // an expired handle of the same name not yet reaped
  bool have_replaced = false;
  {
    absl::ReleasableMutexLock lock(&handles_mu_);
    auto it = handles_.find(req.handle());
    if (it != handles_.end()) {
      if (it->second.deadline_ms >= clock_->NowMs()) {
        // A concurrent publish of the same name won.
        const bool same = same_pages(it->second);
        const uint64_t deadline = it->second.deadline_unix_ms;
        lock.Release();
        for (const PinnedPage& q : h.pages) UnpinPage(q);
        if (!same) {
          return absl::AlreadyExistsError(
              absl::StrCat("handle '", req.handle(), "' already holds other pages"));
        }
        resp->set_deadline_unix_ms(deadline);
        return absl::OkStatus();
      }
      replaced = std::move(it->second);
      have_replaced = true;
      handles_.erase(it);
    }
    resp->set_deadline_unix_ms(h.deadline_unix_ms);
    handles_.emplace(req.handle(), std::move(h));
  }
  if (have_replaced) {
    for (const PinnedPage& q : replaced.pages) UnpinPage(q);
  }
  return absl::OkStatus();
}

absl::Status PageCache::OpenHandle(const pb::OpenHandleRequest& req,
                                   pb::OpenHandleResponse* resp) {
  if (absl::Status s = CheckHandleName(req.handle()); !s.ok()) return s;
  Lease lease;
  {
    absl::MutexLock lock(&handles_mu_);
    auto it = handles_.find(req.handle());
    if (it == handles_.end() || it->second.deadline_ms < clock_->NowMs()) {
      return absl::NotFoundError(
          absl::StrCat("handle '", req.handle(), "' is unknown, closed or expired"));
    }
    const Handle& h = it->second;
    // The handle holds its pins, so every page is still allocated: add the lease's own.
    lease.pages = h.pages;
    for (const PinnedPage& p : h.pages) RepinPage(p);
    resp->set_codec_id(h.codec_id);
    resp->set_metadata(h.metadata);
    resp->set_handle_deadline_unix_ms(h.deadline_unix_ms);
    for (size_t i = 0; i < h.pages.size(); ++i) {
      pb::PageRef* ref = resp->add_pages();
      ref->set_key(std::string(reinterpret_cast<const char*>(h.pages[i].key.key.bytes.data()), 16));
      ref->set_offset(h.pages[i].offset);
      ref->set_bytes(h.pages[i].page_bytes);
      ref->set_kind(proto::ToProto(h.info[i].first));
      ref->set_token_count(h.info[i].second);
    }
  }
  uint32_t ms = req.lease_ms() == 0 ? options_.default_lease_ms : req.lease_ms();
  ms = std::min(ms, options_.max_lease_ms);
  lease.deadline_ms = clock_->NowMs() + ms;
  resp->set_lease_deadline_unix_ms(clock_->UnixMs() + ms);
  resp->set_lease_id(InsertLease(std::move(lease)));
  return absl::OkStatus();
}

absl::Status PageCache::CloseHandle(const pb::CloseHandleRequest& req, pb::CloseHandleResponse*) {
  if (absl::Status s = CheckHandleName(req.handle()); !s.ok()) return s;
  Handle h;
  {
    absl::MutexLock lock(&handles_mu_);
    auto it = handles_.find(req.handle());
    if (it == handles_.end()) return absl::OkStatus();
    h = std::move(it->second);
    handles_.erase(it);
  }
  for (const PinnedPage& p : h.pages) UnpinPage(p);
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
  }
}

}  // namespace oscarkv::service
