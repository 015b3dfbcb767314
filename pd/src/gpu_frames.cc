// The JSON bodies of the GPU handoff's hello and want frames. They come from another process,
// so every parse is checked: no nlohmann exception leaves this file.
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "oscarkv/pd/gpu_handoff.h"

namespace oscarkv::pd::gpu {
namespace {

using Json = nlohmann::json;

absl::Status Bad(const char* frame, const std::string& why) {
  return absl::DataLossError(absl::StrCat("bad '", frame, "' frame: ", why));
}

absl::StatusOr<Json> ParseObject(const char* frame, std::string_view body) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(frame, "not JSON");
  if (!j.is_object()) return Bad(frame, "not a JSON object");
  return j;
}

absl::Status GetString(const char* frame, const Json &j, const char *key, std::string *out) {
  const auto it = j.find(key);
  if (it == j.end()) return Bad(frame, absl::StrCat("missing '", key, "'"));
  if (!it->is_string()) return Bad(frame, absl::StrCat("'", key, "' must be a string"));
  *out = it->get_ref<const std::string &>();
  return absl::OkStatus();
}

template <typename Int>
absl::Status GetInt(const char* frame, const Json &j, const char *key, Int *out) {
  const auto it = j.find(key);
  if (it == j.end()) return Bad(frame, absl::StrCat("missing '", key, "'"));
  if (!it->is_number_integer()) return Bad(frame, absl::StrCat("'", key, "' must be an integer"));
  const int64_t v = it->get<int64_t>();
  if (v < 0 || static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<Int>::max())) {
    return Bad(frame, absl::StrCat("'", key, "' is out of range"));
  }
  *out = static_cast<Int>(v);
  return absl::OkStatus();
}

}  // namespace

std::string EncodeHello(const HelloFrame &h) {
  Json requests = Json::array();
  for (const HelloRequest &r : h.requests) {
    requests.push_back({{"layout", r.layout}, {"ipc_mem", r.ipc_mem}, {"ipc_event", r.ipc_event}});
  }
  Json j = {{"device", h.device}, {"pid", h.pid}, {"requests", std::move(requests)}};
  if (!h.nccl_id.empty()) j["nccl_id"] = h.nccl_id;
  return j.dump();
}

absl::StatusOr<HelloFrame> ParseHello(std::string_view body) {
  constexpr const char* kFrame = "hello";
  auto j = ParseObject(kFrame, body);
  if (!j.ok()) return j.status();
  HelloFrame h;
  if (absl::Status s = GetInt(kFrame, *j, "device", &h.device); !s.ok()) return s;
  if (absl::Status s = GetInt(kFrame, *j, "pid", &h.pid); !s.ok()) return s;
  const auto reqs = j->find("requests");
  if (reqs == j->end()) return Bad(kFrame, "missing 'requests'");
  if (!reqs->is_array()) return Bad(kFrame, "'requests' must be an array");
  for (const Json &r : *reqs) {
    if (!r.is_object()) return Bad(kFrame, "a request entry is not an object");
    HelloRequest x;
    for (auto [key, out] : {std::pair{"layout", &x.layout}, std::pair{"ipc_mem", &x.ipc_mem},
                            std::pair{"ipc_event", &x.ipc_event}}) {
      if (absl::Status s = GetString(kFrame, r, key, out); !s.ok()) return s;
    }
    h.requests.push_back(std::move(x));
  }
  if (j->contains("nccl_id")) {
    if (absl::Status s = GetString(kFrame, *j, "nccl_id", &h.nccl_id); !s.ok()) return s;
    if (h.nccl_id.empty()) return Bad(kFrame, "'nccl_id' is empty");
  }
  return h;
}

std::string EncodeWant(const WantFrame &w) {
  return Json{{"request", w.request}, {"mechanism", w.mechanism}}.dump();
}

absl::StatusOr<WantFrame> ParseWant(std::string_view body) {
  constexpr const char* kFrame = "want";
  auto j = ParseObject(kFrame, body);
  if (!j.ok()) return j.status();
  WantFrame w;
  if (absl::Status s = GetString(kFrame, *j, "request", &w.request); !s.ok()) return s;
  if (absl::Status s = GetString(kFrame, *j, "mechanism", &w.mechanism); !s.ok()) return s;
  return w;
}

absl::Status DecodeHexInto(std::string_view hex, std::span<uint8_t> out,
                           std::string_view what_name) {
  const absl::string_view what(what_name.data(), what_name.size());
  auto digit = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  if (hex.size() != 2 * out.size()) {
    return absl::DataLossError(absl::StrCat("hello: '", what, "' has ", hex.size(),
                                            " hex digits, expected ", 2 * out.size()));
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::DataLossError(absl::StrCat("hello: '", what, "' is not lowercase hex"));
    }
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return absl::OkStatus();
}

}  // namespace oscarkv::pd::gpu
