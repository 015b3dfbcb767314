#include "oscarkv/proto/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace oscarkv {

// Both enums number their codes as google.rpc.Code does.
static_assert(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED) ==
              static_cast<int>(absl::StatusCode::kUnauthenticated));
static_assert(static_cast<int>(grpc::StatusCode::DATA_LOSS) ==
              static_cast<int>(absl::StatusCode::kDataLoss));

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  if (what.empty()) return absl::Status(code, s.error_message());
  return absl::Status(code, absl::StrCat(what, ": ", s.error_message()));
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace oscarkv
