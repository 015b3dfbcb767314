// Context, MemoryRegion and Capabilities.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "blob.h"
#include "oscarkv/transport/transport.h"

namespace oscarkv::transport {
namespace {

absl::Status SetConfig(ucp_config_t* config, const char* name, const std::string& value) {
  return FromUcs(ucp_config_modify(config, name, value.c_str()),
                 absl::StrCat("UCX config ", name, "=", value));
}

// UCX 1.13 has no structured query for the resources a context opened; its info dump lists them
// as "#     resource <n>  :  md <m>  dev <d>  flags -- <tl>/<device>".
std::vector<std::string> ParseTransports(ucp_context_h context) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  if (f == nullptr) return {};
  ucp_context_print_info(context, f);
  std::fclose(f);
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(absl::string_view(buf, size), '\n')) {
    if (!absl::StrContains(line, "resource") || !absl::StrContains(line, "flags")) continue;
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.empty()) continue;
    std::string tl(words.back());
    if (tl.find('/') == std::string::npos) continue;
    if (std::find(out.begin(), out.end(), tl) == out.end()) out.push_back(tl);
  }
  std::free(buf);
  return out;
}

// True if every page of [addr, addr + length) is mapped in this process.
bool IsMapped(const void* addr, size_t length) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(addr) + length;
  constexpr size_t kChunkPages = 4096;
  std::vector<unsigned char> vec(kChunkPages);
  for (uintptr_t p = begin; p < end; p += kChunkPages * page) {
    const size_t len = std::min<uintptr_t>(kChunkPages * page, end - p);
    if (mincore(reinterpret_cast<void*>(p), len, vec.data()) != 0) return false;
  }
  return true;
}

}  // namespace

bool Capabilities::HasTransport(absl::string_view name) const {
  for (const std::string& t : transports) {
    if (absl::string_view(t).substr(0, t.find('/')) == name) return true;
  }
  return false;
}

std::string Capabilities::ToString() const {
  return absl::StrCat("tls=", tls_requested.empty() ? "(default)" : tls_requested,
                      " transports=[", absl::StrJoin(transports, ","),
                      "] cuda_memory=", cuda_memory ? "yes" : "no",
                      " peer_failure_detection=", peer_failure_detection ? "yes" : "no");
}

absl::StatusOr<std::unique_ptr<Context>> Context::Create(const ContextOptions& options) {
  ucp_config_t* raw_config = nullptr;
  if (absl::Status s = FromUcs(ucp_config_read(nullptr, nullptr, &raw_config), "ucp_config_read");
      !s.ok()) {
    return s;
  }
  UcpConfigPtr config(raw_config);
  if (!options.tls.empty()) {
    if (absl::Status s = SetConfig(config.get(), "TLS", options.tls); !s.ok()) return s;
  }
  if (!options.net_devices.empty()) {
    if (absl::Status s = SetConfig(config.get(), "NET_DEVICES", options.net_devices); !s.ok()) {
      return s;
    }
  }
  if (options.keepalive_interval > absl::ZeroDuration()) {
    const std::string v = absl::StrCat(absl::ToInt64Milliseconds(options.keepalive_interval), "ms");
    if (absl::Status s = SetConfig(config.get(), "KEEPALIVE_INTERVAL", v); !s.ok()) return s;
  }

  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // Register/Export from any thread
  params.name = options.name.c_str();
  ucp_context_h raw = nullptr;
  if (absl::Status s = FromUcs(ucp_init(&params, config.get(), &raw),
                               absl::StrCat("ucp_init (UCX_TLS=",
                                            options.tls.empty() ? "default" : options.tls, ")"));
      !s.ok()) {
    return s;
  }
  std::unique_ptr<Context> ctx(new Context());
  ctx->context_.reset(raw);
  ctx->options_ = options;

  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(raw, &attr) == UCS_OK) {
    ctx->caps_.cuda_memory = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }
  ctx->caps_.tls_requested = options.tls.empty()
                                 ? (std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "")
                                 : options.tls;
  ctx->caps_.transports = ParseTransports(raw);
  for (const char* tl : {"tcp", "rc_verbs", "rc_mlx5", "ud_verbs", "ud_mlx5", "dc_mlx5"}) {
    ctx->caps_.peer_failure_detection |= ctx->caps_.HasTransport(tl);
  }
  if (ctx->caps_.transports.empty()) {
    return absl::UnavailableError(absl::StrCat("UCX opened no transport for UCX_TLS=",
                                               ctx->caps_.tls_requested));
  }
  return ctx;
}

Context::~Context() = default;

absl::StatusOr<std::unique_ptr<MemoryRegion>> Context::Register(void* addr, size_t length,
                                                                MemoryType type) {
  if (addr == nullptr || length == 0) {
    return absl::InvalidArgumentError("Register: null address or zero length");
  }
  if (type == MemoryType::kCuda && !caps_.cuda_memory) {
    return absl::FailedPreconditionError(
        "Register: this UCX has no CUDA memory support; stage GPU buffers through registered "
        "host memory");
  }
  if (type == MemoryType::kHost && !IsMapped(addr, length)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Register: [", absl::Hex(reinterpret_cast<uintptr_t>(addr)), ", +", length,
        ") is not mapped host memory"));
  }
  return Map(addr, length, type, /*allocate=*/false);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Context::Allocate(size_t length) {
  if (length == 0) return absl::InvalidArgumentError("Allocate: zero length");
  return Map(nullptr, length, MemoryType::kHost, /*allocate=*/true);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Context::Map(void* addr, size_t length,
                                                           MemoryType type, bool allocate) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = addr;
  params.length = length;
  params.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
  params.memory_type = type == MemoryType::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  ucp_mem_h memh = nullptr;
  if (absl::Status s = FromUcs(ucp_mem_map(context_.get(), &params, &memh), "ucp_mem_map");
      !s.ok()) {
    return s;
  }
  UcpMemPtr mem(memh, UcpMemDeleter{context_.get()});
  if (allocate) {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    if (absl::Status s = FromUcs(ucp_mem_query(memh, &attr), "ucp_mem_query"); !s.ok()) return s;
    addr = attr.address;
    length = std::min(length, attr.length);
  }
  void* rkey_buf = nullptr;
  size_t rkey_size = 0;
  if (absl::Status s = FromUcs(ucp_rkey_pack(context_.get(), memh, &rkey_buf, &rkey_size),
                               "ucp_rkey_pack");
      !s.ok()) {
    return s;
  }
  UcpRkeyBufferPtr rkey(rkey_buf);
  std::string out;
  out.reserve(blob::kMemoryHeader + rkey_size);
  blob::Put<uint32_t>(out, blob::kMemoryMagic);
  blob::Put<uint16_t>(out, blob::kVersion);
  blob::Put<uint16_t>(out, 0);
  blob::Put<uint64_t>(out, reinterpret_cast<uint64_t>(addr));
  blob::Put<uint64_t>(out, length);
  blob::Put<uint32_t>(out, static_cast<uint32_t>(rkey_size));
  out.append(static_cast<const char*>(rkey_buf), rkey_size);
  return std::unique_ptr<MemoryRegion>(
      new MemoryRegion(static_cast<uint8_t*>(addr), length, std::move(mem), std::move(out)));
}

bool MemoryRegion::Contains(const void* p, size_t n) const {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base_);
  return a >= b && n <= length_ && a - b <= length_ - n;
}

bool RemoteMemory::Contains(uint64_t addr, size_t n) const {
  return addr >= base_ && n <= length_ && addr - base_ <= length_ - n;
}

const char* DirectionName(Direction d) { return d == Direction::kGet ? "get" : "put"; }

}  // namespace oscarkv::transport
