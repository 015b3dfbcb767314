// The one conversion between the codec's types (CodecProfile, PageKind) and their protobuf
// messages, shared by the client library and the daemon (which never depend on each other).
#pragma once

#include "absl/status/statusor.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::proto {

v1::PageKind ToProto(PageKind kind);
// INVALID_ARGUMENT for a kind that is neither INT2 (1) nor BF16 (2).
absl::StatusOr<PageKind> FromProto(v1::PageKind kind);

// Every field; a rotation digest of zeros is sent as empty (the wire's "no rotation").
void ToProto(const CodecProfile& profile, v1::CodecProfile* out);
// Every field. INVALID_ARGUMENT for a scale_dtype other than 1 (fp16) or 0 (unset in proto3,
// read as fp16, the only dtype there is), a rotation digest neither empty nor 32 bytes, or a
// model id / revision over 1024 bytes. The profile itself is not validated (CodecProfile::
// Validate does that).
absl::StatusOr<CodecProfile> FromProto(const v1::CodecProfile& profile);

}  // namespace oscarkv::proto
