#include "client_session.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "local_channel.h"
#include "oscarkv/util/status_macros.h"
#include "oscarkv/v1/local_control.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "page_fetch.h"
#include "rpc_core.h"
#include "shm_load_staging.h"
#include "shm_mapping.h"
#include "shm_staging.h"

namespace oscarkv::client {

namespace pb = ::oscarkv::v1;

Session::~Session() = default;

const ShmMapping* Session::pool() const { return staging ? staging->pool() : shm.get(); }

bool Session::Stale(bool probe) const {
  if (local != nullptr && local->Stale()) return true;
  if (!probe) return false;
  return (staging != nullptr && staging->Broken()) || (source != nullptr && source->Broken());
}

absl::StatusOr<std::shared_ptr<Session>> OpenSession(RpcCore& rpc, const ConnectOptions& options) {
  auto session = std::make_shared<Session>();
  Session& s = *session;
  pb::HandshakeRequest req;
  req.set_wire_version(pb::WIRE_VERSION_1);
  req.set_client_name(options.client_name);
  pb::HandshakeResponse resp;
  auto ctx = rpc.Context();
  OSCARKV_RETURN_IF_ERROR(FromGrpc(rpc.stub().Handshake(ctx.get(), req, &resp),
                                   absl::StrCat("handshake with oscarkvd at ", options.address)));
  if (resp.wire_version() != pb::WIRE_VERSION_1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "oscarkvd at ", options.address, " speaks wire version ", resp.wire_version(),
        ", this client ", int{pb::WIRE_VERSION_1}));
  }
  s.server.server_version = resp.server_version();
  s.server.node_id = resp.node_id();
  s.server.shm_path = resp.shm_path();
  s.server.shm_bytes = resp.shm_bytes();
  s.server.max_batch = resp.max_batch() ? resp.max_batch() : 1024;
  if (options.data_path != DataPath::kGrpc && !resp.shm_isolated()) {
    auto m = ShmMapping::Map(s.server.shm_path, s.server.shm_bytes);
    if (m.ok()) {
      s.shm = std::move(*m);
    } else if (options.data_path == DataPath::kSharedMemory) {
      return m.status();
    }
  }
  s.server.local_socket = resp.local_socket();
  if (!options.shared_namespace.empty() && options.lookup_path == LookupPath::kLocal) {
    return absl::InvalidArgumentError(
        "a shared_namespace client looks up over gRPC: the local socket serves a tenant's own "
        "namespace only (use lookup_path kAuto or kGrpc)");
  }
  if (options.lookup_path != LookupPath::kGrpc && options.shared_namespace.empty()) {
    if (s.server.local_socket.empty()) {
      if (options.lookup_path == LookupPath::kLocal) {
        return absl::FailedPreconditionError(absl::StrCat(
            "oscarkvd at ", options.address, " serves no local control socket (--local-socket off?)"));
      }
    } else {
      auto ch = LocalChannel::Open(s.server.local_socket, options.client_name, resp.instance_id(),
                                   options.rpc_timeout_ms, !options.dedicated_connection);
      if (ch.ok() && (*ch)->tenant() != resp.tenant()) {
        // Tenants: the socket knows this process by its uid, gRPC by its certificate. Lookups
        // must act for the tenant the stores act for.
        ch = absl::FailedPreconditionError(absl::StrCat(
            "the daemon serves this process's uid as tenant '", (*ch)->tenant(),
            "' but its certificate as tenant '", resp.tenant(), "'"));
      }
      if (ch.ok()) {
        s.local = std::move(*ch);
      } else if (options.lookup_path == LookupPath::kLocal) {
        return absl::Status(ch.status().code(),
                            absl::StrCat("local control socket of oscarkvd at ", options.address,
                                         ": ", ch.status().message()));
      }  // kAuto: another host (or no access): gRPC
    }
  }
  s.server.lookup_path = s.local ? LookupPath::kLocal : LookupPath::kGrpc;
  if (options.data_path != DataPath::kGrpc && resp.shm_isolated()) {
    // Isolated pool: mapped read-only from a descriptor the local socket passes; stores go
    // through a staging region of ours. Needs the local socket (same host).
    absl::Status why = absl::FailedPreconditionError(
        "the daemon's isolated pool needs its local socket, which this client could not use");
    std::shared_ptr<LocalChannel> ch = s.local;
    if (ch == nullptr && !s.server.local_socket.empty()) {
      auto opened = LocalChannel::Open(s.server.local_socket, options.client_name,
                                       resp.instance_id(), options.rpc_timeout_ms,
                                       /*shared=*/false);
      if (opened.ok() && (*opened)->tenant() != resp.tenant()) {
        // Staged writes act for the socket's tenant (the uid's), Reserve and Commit for the
        // certificate's: they must be the same tenant.
        why = absl::FailedPreconditionError(absl::StrCat(
            "the daemon serves this process's uid as tenant '", (*opened)->tenant(),
            "' but its certificate as tenant '", resp.tenant(), "'"));
      } else if (opened.ok()) {
        ch = std::move(*opened);
      } else {
        why = opened.status();
      }
    }
    if (ch != nullptr) {
      auto st = ShmStaging::Open(*ch, s.server.shm_bytes);
      if (st.ok()) {
        s.staging = std::move(*st);
      } else {
        why = st.status();
      }
    }
    if (s.staging != nullptr && s.staging->pool() == nullptr) {
      // A tenant maps no pool: its loads go through a load staging region of its own.
      auto ls = ShmLoadStaging::Open(*ch);
      if (ls.ok()) {
        s.source = std::move(*ls);
      } else if (options.data_path == DataPath::kSharedMemory) {
        return absl::Status(ls.status().code(), absl::StrCat("shared memory of oscarkvd at ",
                                                             options.address, ": ",
                                                             ls.status().message()));
      }
    }
    if (s.staging == nullptr && options.data_path == DataPath::kSharedMemory) {
      return absl::Status(why.code(), absl::StrCat("shared memory of oscarkvd at ",
                                                   options.address, ": ", why.message()));
    }
  }
  const ShmMapping* pool = s.staging ? s.staging->pool() : s.shm.get();
  s.server.data_path =
      pool != nullptr || s.source != nullptr ? DataPath::kSharedMemory : DataPath::kGrpc;
  if (pool != nullptr) {
    s.source = std::make_unique<ShmPageSource>(*pool);
  } else if (s.source == nullptr) {
    s.source = std::make_unique<StreamPageSource>(rpc, /*by_key=*/true);
  }
  return session;
}

}  // namespace oscarkv::client
