// Network addresses as users type them: "HOST:PORT", "[IPv6]:PORT" or "unix:/path".
//
// Checked before gRPC sees them, because gRPC is lenient in ways that surprise: a port above
// 65535 wraps to another port, and a bare word ("localhost", "foo") is sent to the DNS resolver
// and fails only at the deadline. Used by the daemon (listen addresses) and by the client
// library (the address it dials), so both refuse the same inputs with the same message.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace oscarkv {

struct HostPort {
  std::string host;       // without brackets; empty for a unix socket
  int port = 0;           // 0..65535
  std::string unix_path;  // set for "unix:/path"
};

struct HostPortRules {
  bool allow_unix = true;       // "unix:/path" (a path of at most 100 bytes)
  bool allow_port_zero = true;  // listening on port 0 picks a free port; dialing it cannot work
};

// INVALID_ARGUMENT naming the text and what is wrong with it.
inline absl::StatusOr<HostPort> ParseHostPort(absl::string_view text, HostPortRules rules = {}) {
  const std::string shown = absl::StrCat("'", text, "'");
  HostPort a;
  if (text.rfind("unix:", 0) == 0) {
    if (!rules.allow_unix) {
      return absl::InvalidArgumentError(
          absl::StrCat(shown, ": unix sockets are not supported here"));
    }
    a.unix_path = std::string(text.substr(5));
    if (a.unix_path.empty() || a.unix_path.size() > 100) {
      return absl::InvalidArgumentError(
          absl::StrCat(shown, ": a unix socket path must be 1..100 bytes"));
    }
    return a;
  }
  const std::string expected =
      absl::StrCat(shown, ": expected HOST:PORT", rules.allow_unix ? " or unix:/path" : "");
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(expected);
  }
  absl::string_view host = text.substr(0, colon), port = text.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return absl::InvalidArgumentError(expected);
    host = host.substr(1, host.size() - 2);
    for (char c : host) {
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') {
        return absl::InvalidArgumentError(absl::StrCat(shown, ": not an IPv6 address in [...]"));
      }
    }
  } else {
    if (host.find(':') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(shown, ": an IPv6 host goes in brackets, e.g. [::1]:50051"));
    }
    for (char c : host) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' &&
          c != '_') {
        return absl::InvalidArgumentError(absl::StrCat(shown, ": '", std::string(1, c),
                                                       "' cannot appear in a host name"));
      }
    }
  }
  int p = -1;
  const bool digits = !port.empty() && port.size() <= 5 &&
                      port.find_first_not_of("0123456789") == absl::string_view::npos;
  const int lo = rules.allow_port_zero ? 0 : 1;
  if (!digits || !absl::SimpleAtoi(port, &p) || p < lo || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(shown, ": the port must be ", lo, "..65535"));
  }
  a.host = std::string(host);
  a.port = p;
  return a;
}

}  // namespace oscarkv
