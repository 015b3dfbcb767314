#include "oscarkv/client/cluster_client.h"

#include <algorithm>
#include <future>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "oscarkv/cluster/grpc_prober.h"
#include "oscarkv/util/status_macros.h"
#ifdef OSCARKV_HAVE_UCX_CLIENT
#include "oscarkv/client/ucx_loader.h"
#endif

namespace oscarkv::client {
namespace {

// A member connection. Dropped (and redialled on next use) after any transport failure, so a
// restarted member gets a fresh handshake.
struct MemberConn {
#ifdef OSCARKV_HAVE_UCX_CLIENT
  std::unique_ptr<UcxLoader> ucx;  // when ClusterOptions::ucx; owns the HandleClient then
#endif
  std::unique_ptr<HandleClient> owned;
  HandleClient* hc = nullptr;
  absl::Mutex mu;
  absl::flat_hash_set<std::string> codecs ABSL_GUARDED_BY(mu);  // registered codec ids (hex)
};

bool IsTransportFailure(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

// A member failure that a successful call saw after it had its answer: Load's or LoadHandle's
// pages verified, then the lease release timed out. OK for calls that have none.
template <typename T>
absl::Status FailureAfterAnswer(const T&) {
  return absl::OkStatus();
}
absl::Status FailureAfterAnswer(const LoadResult& r) { return r.release_status; }
absl::Status FailureAfterAnswer(const HandlePages& r) { return r.release_status; }

bool IsUnknownCodec(const absl::Status& s) {
  return s.code() == absl::StatusCode::kNotFound && absl::StrContains(s.message(), "unknown codec");
}

class ClusterClientImpl final : public ClusterClient {
 public:
  ClusterClientImpl(ClusterOptions options, std::unique_ptr<cluster::Membership> membership)
      : options_(std::move(options)), membership_(std::move(membership)) {
    closer_ = std::thread([this] { CloseLoop(); });
  }
  ~ClusterClientImpl() override {
    {
      absl::MutexLock lock(&mu_);
      for (auto& [addr, c] : conns_) retired_.push_back(std::move(c));
      conns_.clear();
      stopping_ = true;
    }
    closer_.join();
  }

  cluster::Membership& membership() override { return *membership_; }

  absl::StatusOr<Codec> RegisterCodec(const CodecProfile& profile) override {
    const std::vector<std::string> live = membership_->Live();
    if (live.empty()) return absl::UnavailableError("no live cluster member");
    std::vector<std::future<absl::StatusOr<Codec>>> futs;
    for (const std::string& addr : live) {
      futs.push_back(std::async(std::launch::async, [this, addr, &profile]() {
        return RegisterOn(addr, profile);
      }));
    }
    absl::StatusOr<Codec> first = absl::UnavailableError("no live cluster member answered");
    for (auto& f : futs) {
      absl::StatusOr<Codec> c = f.get();
      if (c.ok() && !first.ok()) first = c;
      if (!c.ok() && !IsTransportFailure(c.status())) first = c.status();  // a real refusal
    }
    return first;
  }

  absl::StatusOr<StoreResult> Store(const Codec& codec,
                                    std::span<const PageWrite> pages) override {
    std::vector<BlockKey> keys;
    keys.reserve(pages.size());
    for (const PageWrite& p : pages) keys.push_back(p.key);
    StoreResult out;
    out.item_status.assign(pages.size(), absl::OkStatus());
    const std::vector<std::string> live = membership_->Live();
    if (live.empty()) return absl::UnavailableError("no live cluster member");
    const auto groups = cluster::GroupByOwner(live, keys);
    std::vector<std::future<void>> futs;
    for (size_t m = 0; m < live.size(); ++m) {
      if (groups[m].empty()) continue;
      futs.push_back(std::async(std::launch::async, [&, m]() {
        std::vector<PageWrite> mine;
        for (size_t i : groups[m]) mine.push_back(pages[i]);
        auto r = OnMember<StoreResult>(live[m], codec, [&](MemberConn& c) {
          return c.hc->client().Store(codec, mine);
        });
        for (size_t j = 0; j < groups[m].size(); ++j) {
          out.item_status[groups[m][j]] =
              r.ok() ? r->item_status[j]
                     : absl::Status(r.status().code(), absl::StrCat("owner ", live[m], ": ",
                                                                    r.status().message()));
        }
      }));
    }
    for (auto& f : futs) f.get();
    for (const absl::Status& s : out.item_status) {
      if (s.ok()) {
        ++out.stored;
      } else if (s.code() == absl::StatusCode::kAlreadyExists) {
        ++out.deduplicated;
      } else {
        ++out.failed;
      }
    }
    return out;
  }

  absl::StatusOr<ClusterLookupResult> Lookup(const Codec& codec,
                                             std::span<const BlockKey> keys) override {
    ClusterLookupResult out;
    const std::vector<std::string> live = membership_->Live();
    if (live.empty() || keys.empty()) return out;  // everything is a miss
    const auto groups = cluster::GroupByOwner(live, keys);
    std::vector<std::future<size_t>> futs(live.size());
    for (size_t m = 0; m < live.size(); ++m) {
      if (groups[m].empty()) continue;
      futs[m] = std::async(std::launch::async, [&, m]() -> size_t {
        std::vector<BlockKey> mine;
        for (size_t i : groups[m]) mine.push_back(keys[i]);
        auto r = OnMember<LookupResult>(live[m], codec, [&](MemberConn& c) {
          return c.hc->client().Lookup(codec, mine);
        });
        if (!r.ok()) return kFailed;
        // The owner's first missing key is where the global prefix can end at the latest.
        return r->matched < groups[m].size() ? groups[m][r->matched] : keys.size();
      });
    }
    size_t matched = keys.size();
    for (size_t m = 0; m < live.size(); ++m) {
      if (groups[m].empty()) continue;
      size_t first_miss = futs[m].get();
      if (first_miss == kFailed) {
        ++out.owners_failed;
        first_miss = groups[m][0];
      }
      matched = std::min(matched, first_miss);
    }
    out.matched = static_cast<uint32_t>(matched);
    return out;
  }

  absl::StatusOr<ClusterLoadResult> Load(const Codec& codec,
                                         std::span<const BlockKey> keys) override {
    OSCARKV_ASSIGN_OR_RETURN(ClusterLookupResult found, Lookup(codec, keys));
    ClusterLoadResult out;
    out.owners_failed = found.owners_failed;
    if (found.matched == 0) return out;
    const auto prefix = keys.subspan(0, found.matched);
    const std::vector<std::string> live = membership_->Live();
    if (live.empty()) return out;
    const auto groups = cluster::GroupByOwner(live, prefix);
    out.pages.resize(prefix.size());
    out.owners.resize(prefix.size());
    std::vector<size_t> first_miss(live.size(), prefix.size());
    std::vector<char> failed(live.size(), 0);
    std::vector<std::future<void>> futs;
    for (size_t m = 0; m < live.size(); ++m) {
      if (groups[m].empty()) continue;
      futs.push_back(std::async(std::launch::async, [&, m]() {
        std::vector<BlockKey> mine;
        for (size_t i : groups[m]) mine.push_back(prefix[i]);
        auto r = OnMember<LoadResult>(live[m], codec, [&](MemberConn& c) {
#ifdef OSCARKV_HAVE_UCX_CLIENT
          if (c.ucx != nullptr) return c.ucx->Load(codec, mine);
#endif
          return c.hc->client().Load(codec, mine);
        });
        if (!r.ok()) {
          first_miss[m] = groups[m][0];
          failed[m] = 1;
          return;
        }
        // Client::Load verified every page (header, codec, kind, checksum).
        for (size_t j = 0; j < r->matched; ++j) {
          out.pages[groups[m][j]] = std::move(r->pages[j]);
          out.owners[groups[m][j]] = live[m];
        }
        if (r->matched < groups[m].size()) first_miss[m] = groups[m][r->matched];
      }));
    }
    for (auto& f : futs) f.get();
    size_t matched = prefix.size();
    for (size_t m = 0; m < live.size(); ++m) {
      if (groups[m].empty()) continue;
      out.owners_failed += failed[m];
      matched = std::min(matched, first_miss[m]);
    }
    out.pages.resize(matched);
    out.owners.resize(matched);
    out.matched = static_cast<uint32_t>(matched);
    for (const auto& p : out.pages) out.bytes += p.size();
    return out;
  }

  absl::StatusOr<uint64_t> PublishHandle(const Codec& codec, const std::string& handle,
                                         std::span<const PageWrite> pages,
                                         const std::string& metadata, uint32_t ttl_ms) override {
    OSCARKV_ASSIGN_OR_RETURN(std::string owner,
                             membership_->OwnerOf(HandleOwnerKey(codec, handle)));
    return OnMember<uint64_t>(owner, codec, [&](MemberConn& c) {
      return c.hc->Publish(codec, handle, pages, metadata, ttl_ms);
    });
  }

  absl::StatusOr<HandlePages> LoadHandle(const Codec& codec, const std::string& handle) override {
    OSCARKV_ASSIGN_OR_RETURN(std::string owner,
                             membership_->OwnerOf(HandleOwnerKey(codec, handle)));
    return OnMember<HandlePages>(owner, codec, [&](MemberConn& c) {
#ifdef OSCARKV_HAVE_UCX_CLIENT
      if (c.ucx != nullptr) return c.ucx->LoadHandle(codec, handle);
#endif
      return c.hc->Load(codec, handle);
    });
  }

  absl::Status CloseHandle(const Codec& codec, const std::string& handle) override {
    OSCARKV_ASSIGN_OR_RETURN(std::string owner,
                             membership_->OwnerOf(HandleOwnerKey(codec, handle)));
    return OnMember<bool>(owner, codec, [&](MemberConn& c) -> absl::StatusOr<bool> {
             OSCARKV_RETURN_IF_ERROR(c.hc->Close(handle));
             return true;
           })
        .status();
  }

 private:
  static constexpr size_t kFailed = ~size_t{0};

  absl::StatusOr<std::shared_ptr<MemberConn>> Conn(const std::string& addr) {
    {
      absl::MutexLock lock(&mu_);
      auto it = conns_.find(addr);
      if (it != conns_.end()) return it->second;
    }
    ConnectOptions o;
    o.address = addr;
    o.client_name = options_.client_name;
    o.data_path = options_.member_data_path;
    o.verify_checksums = options_.verify_checksums;
    o.rpc_timeout_ms = options_.owner_timeout_ms;
    o.async_threads = 1;
    o.dedicated_connection = true;  // a fresh connection per incarnation of the member
    auto conn = std::make_shared<MemberConn>();
    absl::Status s;
    if (options_.ucx) {
#ifdef OSCARKV_HAVE_UCX_CLIENT
      UcxLoaderOptions uo;
      uo.connect = o;
      uo.tls = options_.ucx_tls;
      uo.net_devices = options_.ucx_net_devices;
      uo.buffer_bytes = options_.ucx_buffer_bytes;
      uo.peer_timeout_ms = options_.owner_timeout_ms;
      uo.transfer_timeout_ms = options_.owner_timeout_ms;
      auto l = UcxLoader::Connect(uo);
      if (l.ok()) {
        conn->ucx = std::move(*l);
        conn->hc = &conn->ucx->handles();
      }
      s = l.status();
#endif
    } else {
      auto hc = HandleClient::Connect(o);
      if (hc.ok()) {
        conn->owned = std::move(*hc);
        conn->hc = conn->owned.get();
      }
      s = hc.status();
    }
    if (!s.ok()) {
      membership_->MarkDown(addr);
      return absl::Status(s.code(), absl::StrCat("member ", addr, ": ", s.message()));
    }
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = conns_.emplace(addr, conn);
    return it->second;
  }

  // Marks the member down and retires its connection. Closing a UCX endpoint to a hung peer
  // waits up to its peer timeout, so the last reference is dropped on the closer thread, never
  // on the caller's.
  void Drop(const std::string& addr, const std::shared_ptr<MemberConn>& conn) {
    membership_->MarkDown(addr);
    absl::MutexLock lock(&mu_);
    auto it = conns_.find(addr);
    if (it != conns_.end() && it->second == conn) {
      conns_.erase(it);
      retired_.push_back(conn);  // once: only the caller that removed it retires it
    }
  }

  void CloseLoop() {
    for (;;) {
      std::vector<std::shared_ptr<MemberConn>> batch;
      bool stop;
      {
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(
                                 +[](ClusterClientImpl* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   return self->stopping_ || !self->retired_.empty();
                                 },
                                 this),
                             absl::Milliseconds(200));
        batch.swap(retired_);
        stop = stopping_;
      }
      // Wait until the callers' references are gone too, then close here.
      for (auto& c : batch) {
        for (int i = 0; i < 1000 && c.use_count() > 1; ++i) absl::SleepFor(absl::Milliseconds(5));
      }
      batch.clear();
      if (stop) {
        absl::MutexLock lock(&mu_);
        if (retired_.empty()) return;
      }
    }
  }

  absl::StatusOr<Codec> RegisterOn(const std::string& addr, const CodecProfile& profile) {
    OSCARKV_ASSIGN_OR_RETURN(std::shared_ptr<MemberConn> conn, Conn(addr));
    auto c = conn->hc->client().RegisterCodec(profile);
    if (!c.ok()) {
      if (IsTransportFailure(c.status())) Drop(addr, conn);
      return c;
    }
    absl::MutexLock lock(&conn->mu);
    conn->codecs.insert(c->id.Hex());
    return c;
  }

  // Runs `fn` against member `addr` with the codec registered there; retries once when the
  // member forgot the codec (restart); drops the connection and marks the member down on a
  // transport failure, also one that came after a successful answer (FailureAfterAnswer): the
  // answer is returned, but the member is hung or gone, and the next call must not wait on it.
  template <typename T, typename Fn>
  absl::StatusOr<T> OnMember(const std::string& addr, const Codec& codec, Fn fn) {
    for (int attempt = 0;; ++attempt) {
      OSCARKV_ASSIGN_OR_RETURN(std::shared_ptr<MemberConn> conn, Conn(addr));
      bool registered;
      {
        absl::MutexLock lock(&conn->mu);
        registered = conn->codecs.contains(codec.id.Hex());
      }
      if (!registered) {
        auto c = RegisterOn(addr, codec.profile);
        if (!c.ok()) return c.status();
      }
      absl::StatusOr<T> r = fn(*conn);
      if (r.ok()) {
        if (IsTransportFailure(FailureAfterAnswer(*r))) Drop(addr, conn);
        return r;
      }
      if (IsUnknownCodec(r.status()) && attempt == 0) {
        absl::MutexLock lock(&conn->mu);
        conn->codecs.clear();
        continue;
      }
      if (IsTransportFailure(r.status())) Drop(addr, conn);
      return absl::Status(r.status().code(),
                          absl::StrCat("member ", addr, ": ", r.status().message()));
    }
  }

  const ClusterOptions options_;
  std::unique_ptr<cluster::Membership> membership_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<MemberConn>> conns_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<MemberConn>> retired_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread closer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Connect(
    ClusterOptions options, std::unique_ptr<cluster::Prober> prober, cluster::Resolver resolver) {
  if (options.owner_timeout_ms <= 0) {
    return absl::InvalidArgumentError("owner_timeout_ms must be > 0");
  }
#ifndef OSCARKV_HAVE_UCX_CLIENT
  if (options.ucx) {
    return absl::UnimplementedError("ClusterClient was built without UCX (transport module)");
  }
#endif
  if (prober == nullptr) prober = cluster::NewGrpcProber();
  OSCARKV_ASSIGN_OR_RETURN(
      std::unique_ptr<cluster::Membership> m,
      cluster::Membership::Start(options.membership, std::move(prober), std::move(resolver)));
  return std::unique_ptr<ClusterClient>(new ClusterClientImpl(std::move(options), std::move(m)));
}

BlockKey ClusterClient::HandleOwnerKey(const Codec& codec, const std::string& handle) {
  const std::string salt = "oscarkv.handle-owner/" + handle;
  return ChainBlockKey(codec.id, salt, nullptr, {});
}

}  // namespace oscarkv::client
