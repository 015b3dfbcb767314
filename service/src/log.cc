#include "oscarkv/service/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>

#include "absl/strings/str_cat.h"

namespace oscarkv::service {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

void AppendValue(std::string* out, std::string_view v) {
  const bool quote = v.empty() || v.find_first_of(" \"=\t\n") != std::string_view::npos;
  if (!quote) {
    out->append(v.data(), v.size());
    return;
  }
  out->push_back('"');
  for (char c : v) {
    if (c == '"' || c == '\\') out->push_back('\\');
    if (c == '\n') {
      out->append("\\n");
      continue;
    }
    out->push_back(c);
  }
  out->push_back('"');
}

}  // namespace

absl::Status SetLogLevel(const std::string& name) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
    if (name == LevelName(l)) {
      g_level.store(static_cast<int>(l));
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown log level '", name, "'"));
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void LogEvent(LogLevel level, std::string_view event, std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm;
  gmtime_r(&t, &tm);
  char ts[80];
  std::snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  std::string line = absl::StrCat("ts=", ts, " level=", LevelName(level), " event=");
  AppendValue(&line, event);
  for (const auto& [k, v] : fields) {
    line.push_back(' ');
    line.append(k.data(), k.size());
    line.push_back('=');
    AppendValue(&line, v);
  }
  line.push_back('\n');
  // One write(2) per line keeps lines from concurrent threads whole.
  ssize_t rc = write(STDERR_FILENO, line.data(), line.size());
  (void)rc;
}

}  // namespace oscarkv::service
