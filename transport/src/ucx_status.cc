#include "absl/strings/str_cat.h"
#include "oscarkv/transport/ucx_handles.h"

namespace oscarkv::transport {

absl::Status FromUcs(ucs_status_t status, const std::string& what) {
  if (status == UCS_OK) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", ucs_status_string(status));
  switch (status) {
    case UCS_INPROGRESS:
      return absl::UnavailableError(absl::StrCat(msg, " (still in progress)"));
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_OUT_OF_RANGE:
      return absl::InvalidArgumentError(msg);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(msg);
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_ELEM:
      return absl::UnimplementedError(msg);
    case UCS_ERR_TIMED_OUT:
      return absl::DeadlineExceededError(msg);
    case UCS_ERR_CANCELED:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace oscarkv::transport
