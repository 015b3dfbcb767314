// Shared by the C ABI's translation units: the thread-local last error and the status helpers.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace oscarkv::c_abi {

// The message of the last error on this thread (oscarkv_last_error()).
std::string& LastError();

inline int Fail(const absl::Status& s) {
  LastError() = std::string(s.message());
  return static_cast<int>(s.code());
}
inline int Fail(int code, const char* message) {
  LastError() = message;
  return code;
}
inline int Ok() {
  LastError().clear();
  return 0;
}

}  // namespace oscarkv::c_abi
