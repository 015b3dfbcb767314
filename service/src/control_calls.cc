#include "control_calls.h"

#include <unistd.h>

#include <random>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "oscarkv/service/log.h"

namespace oscarkv::service {

absl::Status RpcTimer::Done(absl::Status s) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count();
  m_->Record(rpc_, static_cast<int>(s.code()), ns);
  if (!s.ok() && LogEnabled(LogLevel::kDebug)) {
    LogEvent(LogLevel::kDebug, "rpc_error",
             {{"method", RpcName(rpc_)},
              {"code", absl::StatusCodeToString(s.code())},
              {"message", std::string(s.message())}});
  }
  return s;
}

namespace {
uint64_t RandomInstanceId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd() ^ (uint64_t(::getpid()) << 16);
  return id;
}
}  // namespace

ControlCalls::ControlCalls(PageCache* cache, Metrics* metrics)
    : cache_(cache), metrics_(metrics), instance_id_(RandomInstanceId()) {}

absl::Status ControlCalls::Handshake(const Caller& caller, const pb::HandshakeRequest& req,
                                     pb::HandshakeResponse* resp, const std::string& peer,
                                     const char* front_end) {
  RpcTimer t(metrics_, Rpc::kHandshake);
  absl::Status s = wire::Handshake(*cache_, caller, req, resp);
  if (s.ok()) {
    resp->set_local_socket(local_socket_);
    resp->set_instance_id(instance_id_);
    if (cache_->tenants().configured()) resp->set_tenant(caller.tenant);
  }
  // Every pooled local connection handshakes: those are debug lines, gRPC clients info lines.
  const LogLevel level = !s.ok() ? LogLevel::kWarn
                         : std::string_view(front_end) == "grpc" ? LogLevel::kInfo
                                                                 : LogLevel::kDebug;
  if (!LogEnabled(level)) return t.Done(std::move(s));
  LogEvent(level, s.ok() ? "handshake" : "handshake_refused",
           {{"client", req.client_name().substr(0, 128)},
            {"peer", peer},
            {"via", front_end},
            {"tenant", caller.tenant},
            {"wire_version", absl::StrCat(req.wire_version())}});
  return t.Done(std::move(s));
}

namespace {
Caller CallerOf(const Tenant& t, uint32_t ns) {
  Caller c;
  c.tenant = t.name();
  c.admin = t.admin();
  c.tenant_id = t.id();
  c.ns = ns;
  return c;
}
}  // namespace

absl::StatusOr<Caller> ControlCalls::CallerFor(const std::vector<std::string>& cert_names,
                                               absl::string_view shared) const {
  const TenantRegistry& reg = cache_->tenants();
  auto t = reg.FromCertificate(cert_names);
  if (!t.ok()) return t.status();
  if (!reg.configured() && !shared.empty()) {
    return absl::PermissionDeniedError(
        "this daemon has no tenants and no shared namespaces (oscarkv-namespace / "
        "shared_namespace set)");
  }
  auto ns = reg.NamespaceFor(**t, shared);
  if (!ns.ok()) return ns.status();
  return CallerOf(**t, *ns);
}

absl::StatusOr<Caller> ControlCalls::LocalCallerFor(uint32_t uid, uint32_t gid) const {
  auto t = cache_->tenants().FromPeer(uid, gid, ::geteuid());
  if (!t.ok()) return t.status();
  return CallerOf(**t, (*t)->id());
}

}  // namespace oscarkv::service
