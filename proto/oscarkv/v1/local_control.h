// Frames of oscarkvd's same-host control socket: the fast path for Handshake, Lookup and
// Release that a client on the daemon's host uses instead of gRPC (HandshakeResponse.local_socket
// names it). The socket is a unix-domain SOCK_SEQPACKET socket, so every send() is exactly one
// frame and every recv() returns exactly one frame. Both ends are on one host: the integers of
// the headers are in host byte order.
//
//   request:  RequestHeader  (16 bytes) + the serialized request message of `method`
//   response: ResponseHeader (24 bytes) + `message_bytes` of error text + the serialized response
//             message (present only when code == 0)
//
// Messages are the oscarkv.v1 protobufs of the gRPC API (HandshakeRequest/Response,
// LookupRequest/Response, ReleaseRequest/Response) and mean exactly what they mean there; codes
// are the gRPC status codes the same call would return over gRPC.
//
// Rules
// * The first frame on a connection is a Handshake (same wire-version check as gRPC's); any
//   other method first is refused with FAILED_PRECONDITION and the connection closed.
// * Responses carry the request's id; a connection may have many requests in flight (pipelining)
//   and answers come in request order.
// * A malformed frame (short, wrong magic or frame version, unknown method, unparsable message,
//   over kMaxFrameBytes) gets one INVALID_ARGUMENT response with id 0 when possible and the
//   daemon closes that connection; other connections are unaffected.
// * Leases taken over this socket are the same leases as over gRPC: they end at Release or at
//   their deadline, never because a connection closed.
#pragma once

#include <cstdint>
#include <cstring>

namespace oscarkv::v1::local {

inline constexpr uint32_t kMagic = 0x4c564b4fu;  // "OKVL" in memory on little-endian hosts
inline constexpr uint16_t kFrameVersion = 1;
// Largest frame either side sends or accepts. Both ends size SO_SNDBUF for it and refuse the
// connection when the kernel grants less.
inline constexpr uint32_t kMaxFrameBytes = 384 * 1024;
// Lookups of at most this many keys fit a frame both ways (a key is 18 request bytes; a pinned
// page's PageRef at most 48 response bytes). Larger lookups go over gRPC.
inline constexpr uint32_t kMaxLookupKeys = (kMaxFrameBytes - 4096) / 64;

// kAttachStaging / kStageWrite: isolated shared memory (HandshakeResponse.shm_isolated); their
// frames carry AttachStagingRequest/Response (with SCM_RIGHTS descriptors) and
// StageWriteRequest/Response. kAttachLoadStaging / kStageRead: the load side for callers that
// do not map the pool (tenants): AttachLoadStagingRequest/Response (the answer carries the
// region's read-only descriptor) and StageReadRequest/Response. A descriptor sent with any
// other frame than AttachStaging is closed unread.
// kReserve: ReserveRequest/Response, the gRPC Reserve for the connection's caller (same checks,
// quotas and answers), so a same-host store needs no gRPC round trip; served by daemons whose
// AttachStagingResponse says reserve_frames. At most kMaxReserveItems items (INVALID_ARGUMENT
// above, nothing reserved); an answer that would not fit a frame is RESOURCE_EXHAUSTED and its
// reservation aborted, so nothing stays reserved that the client was not told of.
enum class Method : uint16_t {
  kHandshake = 1,
  kLookup = 2,
  kRelease = 3,
  kAttachStaging = 4,
  kStageWrite = 5,
  kStageRead = 6,
  kAttachLoadStaging = 7,
  kReserve = 8
};

// Reserves of at most this many items fit a frame both ways (an item is at most 21 request
// bytes; a result, a reserved slot's PageRef or a short error, stays well under 256 bytes).
inline constexpr uint32_t kMaxReserveItems = 1024;

struct RequestHeader {
  uint32_t magic = kMagic;
  uint16_t version = kFrameVersion;
  uint16_t method = 0;
  uint64_t id = 0;
};
static_assert(sizeof(RequestHeader) == 16);

struct ResponseHeader {
  uint32_t magic = kMagic;
  uint16_t version = kFrameVersion;
  uint16_t method = 0;
  uint64_t id = 0;
  uint32_t code = 0;           // gRPC status code
  uint32_t message_bytes = 0;  // error text following the header
};
static_assert(sizeof(ResponseHeader) == 24);

}  // namespace oscarkv::v1::local
