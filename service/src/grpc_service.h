// KvCacheService: the gRPC binding of PageCache. Each handler converts the call's absl::Status
// one-to-one into a grpc::Status and records latency and result code in Metrics. The data-plane
// streams move page bytes in chunks of at most kReadChunkBytes.
#pragma once

#include "oscarkv/service/metrics.h"
#include "oscarkv/service/page_cache.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"

namespace oscarkv::service {

inline constexpr size_t kReadChunkBytes = size_t{1} << 20;

class KvCacheService final : public pb::KvCache::Service {
 public:
  KvCacheService(PageCache* cache, Metrics* metrics) : cache_(cache), metrics_(metrics) {}

  grpc::Status Handshake(grpc::ServerContext*, const pb::HandshakeRequest*,
                         pb::HandshakeResponse*) override;
  grpc::Status RegisterCodec(grpc::ServerContext*, const pb::RegisterCodecRequest*,
                             pb::RegisterCodecResponse*) override;
  grpc::Status Lookup(grpc::ServerContext*, const pb::LookupRequest*,
                      pb::LookupResponse*) override;
  grpc::Status Reserve(grpc::ServerContext*, const pb::ReserveRequest*,
                       pb::ReserveResponse*) override;
  grpc::Status Commit(grpc::ServerContext*, const pb::CommitRequest*,
                      pb::CommitResponse*) override;
  grpc::Status Abort(grpc::ServerContext*, const pb::AbortRequest*, pb::AbortResponse*) override;
  grpc::Status WritePages(grpc::ServerContext*, grpc::ServerReader<pb::WriteChunk>*,
                          pb::WriteResponse*) override;
  grpc::Status ReadPages(grpc::ServerContext*, const pb::ReadRequest*,
                         grpc::ServerWriter<pb::ReadChunk>*) override;
  grpc::Status Release(grpc::ServerContext*, const pb::ReleaseRequest*,
                       pb::ReleaseResponse*) override;
  grpc::Status RenewLease(grpc::ServerContext*, const pb::RenewLeaseRequest*,
                          pb::RenewLeaseResponse*) override;
  grpc::Status Delete(grpc::ServerContext*, const pb::DeleteRequest*,
                      pb::DeleteResponse*) override;
  grpc::Status Clear(grpc::ServerContext*, const pb::ClearRequest*, pb::ClearResponse*) override;
  grpc::Status Stats(grpc::ServerContext*, const pb::StatsRequest*, pb::StatsResponse*) override;

 private:
  PageCache* cache_;
  Metrics* metrics_;
};

grpc::Status ToGrpc(const absl::Status& s);

}  // namespace oscarkv::service
