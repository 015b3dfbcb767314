// Structured logs: one line per event on stderr, key=value pairs after a timestamp and level:
//   ts=2026-11-30T02:45:01.123Z level=info event=ready listen=127.0.0.1:50051
// Values containing spaces, quotes or '=' are double-quoted. Thread-safe (one write per line).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"

namespace oscarkv::service {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

absl::Status SetLogLevel(const std::string& name);
bool LogEnabled(LogLevel level);

using LogField = std::pair<std::string_view, std::string>;
void LogEvent(LogLevel level, std::string_view event, std::initializer_list<LogField> fields = {});

}  // namespace oscarkv::service
