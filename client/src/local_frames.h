// Request/answer frames on a dedicated connection of oscarkvd's local socket (frames:
// proto/oscarkv/v1/local_control.h), with descriptors passed by SCM_RIGHTS: what the shared-memory
// data paths need (shm_load_staging.h). Blocking; the connection's SO_RCVTIMEO bounds a receive.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"
#include "oscarkv/v1/local_control.h"

namespace oscarkv::client {

// Sends one request frame (`fd` >= 0: attached, SCM_RIGHTS; the caller keeps it). UNAVAILABLE
// when the connection is broken.
absl::Status SendLocalFrame(int sock, v1::local::Method method, uint64_t id,
                            const google::protobuf::MessageLite& msg, int fd = -1);

struct LocalAnswer {
  absl::Status status;  // the call's status (the daemon's code and message)
  const char* body = nullptr;  // the response message (OK only), inside the receive buffer
  size_t body_bytes = 0;
  int fd = -1;  // a descriptor that came with it: the caller owns it
};

// Receives one answer frame into `buf` (grown to kMaxFrameBytes once), expecting request `id`.
// A non-OK return means the connection can no longer be used (broken, closed, a malformed or
// out-of-order answer, or the daemon's id-0 refusal of the last frame).
absl::StatusOr<LocalAnswer> RecvLocalAnswer(int sock, uint64_t id, std::string* buf);

}  // namespace oscarkv::client
