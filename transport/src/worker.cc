// Worker and Endpoint.
#include <poll.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "blob.h"
#include "oscarkv/transport/transport.h"

namespace oscarkv::transport {
namespace {

int PollTimeoutMs(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  if (d >= absl::Seconds(3600)) return 3600 * 1000;
  return static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1))));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(Context& context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode =
      context.options().multi_threaded ? UCS_THREAD_MODE_MULTI : UCS_THREAD_MODE_SINGLE;
  ucp_worker_h raw = nullptr;
  if (absl::Status s = FromUcs(ucp_worker_create(context.raw(), &params, &raw),
                               "ucp_worker_create");
      !s.ok()) {
    return s;
  }
  std::unique_ptr<Worker> w(new Worker());
  w->context_ = &context;
  w->worker_.reset(raw);

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  if (absl::Status s = FromUcs(ucp_worker_get_address(raw, &addr, &addr_len),
                               "ucp_worker_get_address");
      !s.ok()) {
    return s;
  }
  UcpWorkerAddressPtr address(addr, UcpWorkerAddressDeleter{raw});
  std::string out;
  blob::Put<uint32_t>(out, blob::kAddressMagic);
  blob::Put<uint16_t>(out, blob::kVersion);
  blob::Put<uint16_t>(out, 0);
  blob::Put<uint32_t>(out, static_cast<uint32_t>(addr_len));
  out.append(reinterpret_cast<const char*>(addr), addr_len);
  w->address_ = std::move(out);

  if (absl::Status s = FromUcs(ucp_worker_get_efd(raw, &w->efd_), "ucp_worker_get_efd");
      !s.ok()) {
    return s;
  }
  return w;
}

Worker::~Worker() = default;

unsigned Worker::Progress() { return ucp_worker_progress(worker_.get()); }

void Worker::WaitForEvents(absl::Duration timeout) {
  if (Progress() != 0) return;
  // Arm, then re-check: UCS_ERR_BUSY means events arrived between the progress and the arm.
  const ucs_status_t s = ucp_worker_arm(worker_.get());
  if (s == UCS_ERR_BUSY) return;
  if (s != UCS_OK) return;  // no wakeup support: the caller's loop simply progresses again
  pollfd pfd{efd_, POLLIN, 0};
  (void)poll(&pfd, 1, PollTimeoutMs(timeout));
}

absl::StatusOr<std::unique_ptr<Endpoint>> Worker::Connect(absl::string_view peer_address,
                                                          const EndpointOptions& options) {
  if (peer_address.size() < blob::kAddressHeader ||
      blob::Get<uint32_t>(peer_address, 0) != blob::kAddressMagic) {
    return absl::InvalidArgumentError("Connect: not an oscarkv worker address blob");
  }
  if (blob::Get<uint16_t>(peer_address, 4) != blob::kVersion) {
    return absl::InvalidArgumentError("Connect: unsupported worker address version");
  }
  const uint32_t len = blob::Get<uint32_t>(peer_address, 8);
  if (len == 0 || peer_address.size() != blob::kAddressHeader + len) {
    return absl::InvalidArgumentError("Connect: truncated worker address blob");
  }
  if (options.peer_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("Connect: peer_timeout must be positive");
  }
  if (options.error_handling == EndpointOptions::ErrorHandling::kPeer &&
      !context_->capabilities().peer_failure_detection) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Connect: no transport of UCX_TLS=", context_->capabilities().tls_requested,
        " can detect peer failure (posix/sysv shared memory cannot in this UCX); add tcp to "
        "UCX_TLS or use EndpointOptions::ErrorHandling::kNone"));
  }
  std::unique_ptr<Endpoint> ep(new Endpoint());
  ep->worker_ = this;
  ep->options_ = options;

  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_NAME;
  params.address = reinterpret_cast<const ucp_address_t*>(peer_address.data() +
                                                           blob::kAddressHeader);
  const bool peer_mode = options.error_handling == EndpointOptions::ErrorHandling::kPeer;
  params.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = &Endpoint::OnError;
  params.err_handler.arg = ep.get();
  params.name = options.name.c_str();
  ucp_ep_h raw = nullptr;
  if (const ucs_status_t st = ucp_ep_create(worker_.get(), &params, &raw); st != UCS_OK) {
    if (st == UCS_ERR_UNREACHABLE && peer_mode) {
      return FromUcs(st, absl::StrCat("ucp_ep_create (UCX_TLS=",
                                      context_->capabilities().tls_requested,
                                      "): no transport that can detect peer failure reaches the "
                                      "peer; add tcp to UCX_TLS or use ErrorHandling::kNone"));
    }
    return FromUcs(st, "ucp_ep_create");
  }
  ep->ep_ = raw;
  return ep;
}

void Endpoint::OnError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* self = static_cast<Endpoint*>(arg);
  if (self->status_.ok()) {
    self->status_ = absl::UnavailableError(
        absl::StrCat("peer '", self->options_.name, "' failed: ", ucs_status_string(status)));
  }
}

void Endpoint::Abort(absl::Status reason) {
  if (status_.ok()) status_ = std::move(reason);
  Close(/*force=*/true);
}

void Endpoint::Close(bool force) {
  if (ep_ == nullptr) return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep_, &param);
  ep_ = nullptr;
  if (req == nullptr || UCS_PTR_IS_ERR(req)) return;
  UcpRequestPtr owned(req);
  // A graceful close waits for the peer to confirm; never longer than peer_timeout.
  const absl::Time deadline =
      absl::Now() + (force ? absl::Milliseconds(100) : options_.peer_timeout);
  while (ucp_request_check_status(req) == UCS_INPROGRESS && absl::Now() < deadline) {
    worker_->WaitForEvents(absl::Milliseconds(10));
  }
  // Still in progress: UCX frees the request when it completes (the worker's destruction at the
  // latest); the endpoint handle is not touched again.
}

Endpoint::~Endpoint() { Close(/*force=*/failed()); }

absl::StatusOr<std::unique_ptr<RemoteMemory>> Endpoint::ImportRemote(absl::string_view b) {
  if (b.size() < blob::kMemoryHeader || blob::Get<uint32_t>(b, 0) != blob::kMemoryMagic) {
    return absl::InvalidArgumentError("ImportRemote: not an oscarkv memory blob");
  }
  if (blob::Get<uint16_t>(b, 4) != blob::kVersion) {
    return absl::InvalidArgumentError("ImportRemote: unsupported memory blob version");
  }
  const uint64_t base = blob::Get<uint64_t>(b, 8);
  const uint64_t length = blob::Get<uint64_t>(b, 16);
  const uint32_t rkey_len = blob::Get<uint32_t>(b, 24);
  if (rkey_len == 0 || b.size() != blob::kMemoryHeader + rkey_len) {
    return absl::InvalidArgumentError("ImportRemote: truncated memory blob");
  }
  if (length == 0 || base + length < base) {
    return absl::InvalidArgumentError("ImportRemote: empty or wrapping remote region");
  }
  if (ep_ == nullptr || failed()) {
    return absl::UnavailableError(absl::StrCat("ImportRemote: endpoint failed: ",
                                               status_.message()));
  }
  ucp_rkey_h rkey = nullptr;
  if (absl::Status s = FromUcs(ucp_ep_rkey_unpack(ep_, b.data() + blob::kMemoryHeader, &rkey),
                               "ucp_ep_rkey_unpack");
      !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  return std::unique_ptr<RemoteMemory>(new RemoteMemory(base, length, UcpRkeyPtr(rkey)));
}

std::string Endpoint::Describe() const {
  if (ep_ == nullptr) return "";
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  if (f == nullptr) return "";
  ucp_ep_print_info(ep_, f);
  std::fclose(f);
  std::string out(buf, size);
  std::free(buf);
  return out;
}

std::vector<std::string> Endpoint::Transports() const {
  std::vector<std::string> out;
  const std::string info = Describe();
  // Lane lines look like "#   lane[0]:  3:tcp/lo.0 md[1] ..."; keep the "<tl>/<dev>" words.
  for (absl::string_view line : absl::StrSplit(info, '\n')) {
    if (!absl::StrContains(line, "lane[")) continue;
    for (absl::string_view w : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      const size_t slash = w.find('/');
      if (slash == absl::string_view::npos) continue;
      if (const size_t colon = w.find(':'); colon != absl::string_view::npos && colon < slash) {
        w.remove_prefix(colon + 1);
      }
      std::string tl(w);
      if (const size_t dot = tl.rfind('.'); dot != std::string::npos && dot > tl.find('/')) {
        tl.resize(dot);
      }
      if (std::find(out.begin(), out.end(), tl) == out.end()) out.push_back(tl);
      break;
    }
  }
  return out;
}

}  // namespace oscarkv::transport
