#include "oscarkv/cluster/grpc_prober.h"

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "absl/container/flat_hash_map.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"

namespace oscarkv::cluster {
namespace {

class GrpcProber final : public Prober {
 public:
  bool Probe(const std::string& address, absl::Duration timeout) override {
    oscarkv::v1::KvCache::Stub* stub = StubFor(address);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    oscarkv::v1::HandshakeRequest req;
    req.set_wire_version(oscarkv::v1::WIRE_VERSION_1);
    req.set_client_name("oscarkv-cluster-prober");
    oscarkv::v1::HandshakeResponse resp;
    return stub->Handshake(&ctx, req, &resp).ok();
  }

 private:
  oscarkv::v1::KvCache::Stub* StubFor(const std::string& address) {
    absl::MutexLock l(&mu_);
    auto& stub = stubs_[address];
    if (!stub) {
      grpc::ChannelArguments args;
      // Reconnect quickly after a member comes back.
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
      stub = oscarkv::v1::KvCache::NewStub(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    }
    return stub.get();
  }
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<oscarkv::v1::KvCache::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Prober> NewGrpcProber() { return std::make_unique<GrpcProber>(); }

}  // namespace oscarkv::cluster
