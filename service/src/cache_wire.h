// The KvCache wire messages (proto/oscarkv/v1/oscarkv.proto) <-> PageCache's plain structs
// (cache_types.h), shared by both front ends: gRPC (grpc_service.cc) and the local socket
// (local_control.cc, which frames the same messages), and by the request fuzzer.
//
// Each function checks what only the wire can get wrong -- byte lengths of keys and codec ids,
// enum values -- with the messages and codes PageCache used when it took protobufs, calls the
// PageCache method, and fills the response. Per-item wire errors (a 15-byte key in a Reserve,
// Commit or Delete) become that item's result; the other items still run. The returned Status
// is the call's, mapped one to one onto a gRPC code by the front end.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oscarkv/service/caller.h"
#include "oscarkv/service/page_cache.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::service {

namespace pb = ::oscarkv::v1;

namespace wire {

absl::Status Handshake(PageCache& cache, const Caller& caller, const pb::HandshakeRequest& req,
                       pb::HandshakeResponse* resp);
absl::Status RegisterCodec(PageCache& cache, const Caller& caller,
                           const pb::RegisterCodecRequest& req, pb::RegisterCodecResponse* resp);
// Allocates nothing per call once the calling thread's scratch has grown (besides what the
// response itself needs).
absl::Status Lookup(PageCache& cache, const Caller& caller, const pb::LookupRequest& req,
                    pb::LookupResponse* resp);
absl::Status Reserve(PageCache& cache, const Caller& caller, const pb::ReserveRequest& req,
                     pb::ReserveResponse* resp);
absl::Status Commit(PageCache& cache, const Caller& caller, const pb::CommitRequest& req,
                    pb::CommitResponse* resp);
absl::Status Abort(PageCache& cache, const Caller& caller, const pb::AbortRequest& req,
                   pb::AbortResponse* resp);
// One chunk of WritePages; returns the bytes copied.
absl::StatusOr<uint64_t> WriteChunk(PageCache& cache, const Caller& caller,
                                    const pb::WriteChunk& chunk);
absl::StatusOr<std::unique_ptr<ReadPlan>> PrepareRead(PageCache& cache, const Caller& caller,
                                                      const pb::ReadRequest& req);
absl::Status Release(PageCache& cache, const Caller& caller, const pb::ReleaseRequest& req,
                     pb::ReleaseResponse* resp);
absl::Status RenewLease(PageCache& cache, const Caller& caller, const pb::RenewLeaseRequest& req,
                        pb::RenewLeaseResponse* resp);
absl::Status Delete(PageCache& cache, const Caller& caller, const pb::DeleteRequest& req,
                    pb::DeleteResponse* resp);
absl::Status Clear(PageCache& cache, const Caller& caller, const pb::ClearRequest& req,
                   pb::ClearResponse* resp);
absl::Status UnregisterCodec(PageCache& cache, const Caller& caller,
                             const pb::UnregisterCodecRequest& req,
                             pb::UnregisterCodecResponse* resp);
absl::Status Stats(PageCache& cache, const Caller& caller, const pb::StatsRequest& req,
                   pb::StatsResponse* resp);
absl::Status PublishHandle(PageCache& cache, const Caller& caller,
                           const pb::PublishHandleRequest& req, pb::PublishHandleResponse* resp);
absl::Status OpenHandle(PageCache& cache, const Caller& caller, const pb::OpenHandleRequest& req,
                        pb::OpenHandleResponse* resp);
absl::Status CloseHandle(PageCache& cache, const Caller& caller,
                         const pb::CloseHandleRequest& req, pb::CloseHandleResponse* resp);

// The struct <-> message conversions the calls above use (exposed for tests and daemon logs).
void ToWire(const CacheStats& st, pb::StatsResponse* out);
void ToWire(const PageRef& ref, pb::PageRef* out);

}  // namespace wire
}  // namespace oscarkv::service
