// The GPU sides of the same-node handoff: CUDA IPC and NCCL send/recv between a prefill process
// (GPU 0) and a decode process (GPU 1). Built when the CUDA runtime is found; NCCL when libnccl
// is (OSCARKV_PD_HAS_NCCL). Every wait is bounded by the timeout and by the control socket: a
// peer that dies turns into UNAVAILABLE within one poll period, and an NCCL communicator that
// may be stuck is aborted (its kernels poll the abort flag), never destroyed or waited on.
#include "oscarkv/pd/gpu_handoff.h"

#include <cuda_runtime.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "oscarkv/util/cuda_status.h"
#include "oscarkv/util/status_macros.h"
#ifdef OSCARKV_PD_HAS_NCCL
#include <nccl.h>
#endif

namespace oscarkv::pd::gpu {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
Clock::time_point Deadline(int timeout_ms) {
  return Clock::now() + std::chrono::milliseconds(timeout_ms);
}

#define OSCARKV_CUDA(expr) OSCARKV_RETURN_IF_ERROR(CudaStatus((expr), #expr))

void EnterStage(const StageHook& hook, std::string_view stage) {
  if (hook) hook(stage);
}

template <typename T>
std::string ToHex(const T& v) {
  return HexEncode(reinterpret_cast<const uint8_t*>(&v), sizeof(T));
}
template <typename T>
absl::Status FromHex(const std::string& hex, T* out, const char* what) {
  return DecodeHexInto(hex, std::span<uint8_t>(reinterpret_cast<uint8_t*>(out), sizeof(T)), what);
}

// A pending frame during a transfer can only be the peer's kError; EOF means it died.
absl::Status CheckPeer(int fd) {
  if (absl::Status s = PeerAlive(fd); !s.ok()) return s;
  char c;
  if (::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 1) {
    auto m = RecvMessage(fd, 1000);
    if (!m.ok()) return m.status();
    if (m->type == MsgType::kError) {
      return absl::UnavailableError(absl::StrCat("the peer gave up: ", m->body));
    }
    return absl::DataLossError(
        absl::StrCat("unexpected '", MsgTypeName(m->type), "' frame during a transfer"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Message> Expect(int fd, MsgType want, int timeout_ms) {
  OSCARKV_ASSIGN_OR_RETURN(Message m, RecvMessage(fd, timeout_ms));
  if (m.type == MsgType::kError) {
    return absl::UnavailableError(absl::StrCat("the peer gave up: ", m.body));
  }
  if (m.type != want) {
    return absl::DataLossError(absl::StrCat("expected a '", MsgTypeName(want), "' frame, got '",
                                            MsgTypeName(m.type), "'"));
  }
  return m;
}

// ---- RAII handles ----------------------------------------------------------------------------
struct DeviceBuffer {
  void* ptr = nullptr;
  int device = 0;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) {
      cudaSetDevice(device);
      cudaFree(ptr);
    }
  }
  absl::Status Allocate(int dev, size_t n) {
    device = dev;
    bytes = n;
    OSCARKV_CUDA(cudaSetDevice(dev));
    return CudaStatus(cudaMalloc(&ptr, n), "cudaMalloc");
  }
};

struct PinnedBuffer {
  uint8_t* ptr = nullptr;
  size_t bytes = 0;
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr) cudaFreeHost(ptr);
  }
  absl::Status Allocate(size_t n) {
    bytes = n;
    return CudaStatus(cudaMallocHost(reinterpret_cast<void**>(&ptr), n), "cudaMallocHost");
  }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() = default;
  Stream(const Stream&) = delete;
  ~Stream() {
    if (s) cudaStreamDestroy(s);
  }
};

struct Event {
  cudaEvent_t e = nullptr;
  bool imported = false;
  Event() = default;
  Event(const Event&) = delete;
  ~Event() {
    if (e) cudaEventDestroy(e);
  }
};

struct IpcMapping {
  void* ptr = nullptr;
  IpcMapping() = default;
  IpcMapping(const IpcMapping&) = delete;
  ~IpcMapping() {
    if (ptr) cudaIpcCloseMemHandle(ptr);
  }
};

// Waits for `stream` to drain, watching the peer and the deadline.
absl::Status WaitStream(cudaStream_t stream, int fd, Clock::time_point deadline, const char* what) {
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return CudaStatus(q, what);
    OSCARKV_RETURN_IF_ERROR(CheckPeer(fd));
    if (Clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, " did not finish in time"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

#ifdef OSCARKV_PD_HAS_NCCL
absl::Status Nccl(ncclResult_t r, ncclComm_t comm, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(r),
                                          last && *last ? absl::StrCat(" (", last, ")") : ""));
}

// A non-blocking communicator of two ranks. Destroyed after a clean finish; aborted otherwise.
class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  ~Communicator() {
    if (comm_) ncclCommAbort(comm_);
  }

  absl::Status Init(const ncclUniqueId& id, int rank, int fd, int timeout_ms) {
    if (!std::getenv("NCCL_NVLS_ENABLE")) ::setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    OSCARKV_RETURN_IF_ERROR(
        Nccl(ncclCommInitRankConfig(&comm_, 2, id, rank, &cfg), comm_, "ncclCommInitRankConfig"));
    return WaitReady(fd, Deadline(timeout_ms), "NCCL communicator init");
  }

  // Waits until the communicator has no operation in progress (enqueued or finished).
  absl::Status WaitReady(int fd, Clock::time_point deadline, const char* what) {
    for (;;) {
      ncclResult_t st = ncclSuccess;
      OSCARKV_RETURN_IF_ERROR(Nccl(ncclCommGetAsyncError(comm_, &st), comm_, what));
      if (st == ncclSuccess) return absl::OkStatus();
      if (st != ncclInProgress) return Nccl(st, comm_, what);
      OSCARKV_RETURN_IF_ERROR(CheckPeer(fd));
      if (Clock::now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(what, " did not finish in time"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Waits for the stream, also watching the communicator's asynchronous error.
  absl::Status WaitStream(cudaStream_t stream, int fd, Clock::time_point deadline,
                          const char* what) {
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return CudaStatus(q, what);
      ncclResult_t st = ncclSuccess;
      ncclCommGetAsyncError(comm_, &st);
      if (st != ncclSuccess && st != ncclInProgress) return Nccl(st, comm_, what);
      OSCARKV_RETURN_IF_ERROR(CheckPeer(fd));
      if (Clock::now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(what, " did not finish in time"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Clean shutdown: finalize (bounded), then destroy; on any problem the destructor aborts.
  void Close(int fd, int timeout_ms) {
    if (!comm_) return;
    if (Nccl(ncclCommFinalize(comm_), comm_, "ncclCommFinalize").ok() &&
        WaitReady(fd, Deadline(timeout_ms), "ncclCommFinalize").ok()) {
      ncclCommDestroy(comm_);
      comm_ = nullptr;
    }
  }

  ncclComm_t get() const { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
};
#endif

// Sends the error to the peer (best effort) so it stops at once instead of timing out.
absl::Status Tell(int fd, absl::Status s) {
  if (!s.ok() && !absl::IsUnavailable(s)) {
    (void)SendMessage(fd, MsgType::kError, s.ToString(), 1000);
  }
  return s;
}

// ---- prefill side ----------------------------------------------------------------------------
struct Served {
  RequestLayout layout;
  DeviceBuffer buffer;
  Event ready;  // interprocess; recorded before each IPC offer
};

absl::StatusOr<ServeStats> Serve(int fd, std::vector<HostRequest> requests, const ServeOptions& o) {
  ServeStats stats;
  OSCARKV_CUDA(cudaSetDevice(o.device));
  Stream stream;
  OSCARKV_CUDA(cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  std::vector<std::unique_ptr<Served>> served;
  HelloFrame hello;
  hello.device = o.device;
  hello.pid = ::getpid();
  const auto t0 = Clock::now();
  for (HostRequest& r : requests) {
    auto s = std::make_unique<Served>();
    s->layout = std::move(r.layout);
    if (r.bytes.size() < s->layout.total_bytes) {
      return absl::InvalidArgumentError("host request shorter than its layout");
    }
    OSCARKV_RETURN_IF_ERROR(s->buffer.Allocate(o.device, s->layout.total_bytes));
    OSCARKV_CUDA(
        cudaMemcpy(s->buffer.ptr, r.bytes.data(), s->layout.total_bytes, cudaMemcpyHostToDevice));
    stats.uploaded_bytes += s->layout.total_bytes;
    std::vector<uint8_t>().swap(r.bytes);
    OSCARKV_CUDA(
        cudaEventCreateWithFlags(&s->ready.e, cudaEventDisableTiming | cudaEventInterprocess));
    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
    OSCARKV_CUDA(cudaIpcGetMemHandle(&mh, s->buffer.ptr));
    OSCARKV_CUDA(cudaIpcGetEventHandle(&eh, s->ready.e));
    hello.requests.push_back(
        {.layout = EncodeLayout(s->layout), .ipc_mem = ToHex(mh), .ipc_event = ToHex(eh)});
    served.push_back(std::move(s));
  }
  stats.upload_ms = MsSince(t0);
#ifdef OSCARKV_PD_HAS_NCCL
  Communicator comm;
  ncclUniqueId id{};
  if (o.nccl) {
    OSCARKV_RETURN_IF_ERROR(Nccl(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
    hello.nccl_id = ToHex(id);
  }
#else
  if (o.nccl) return absl::UnimplementedError("this build has no NCCL");
#endif
  OSCARKV_RETURN_IF_ERROR(SendMessage(fd, MsgType::kHello, EncodeHello(hello), o.timeout_ms));
  EnterStage(o.on_stage, "hello");
#ifdef OSCARKV_PD_HAS_NCCL
  if (o.nccl) {
    const auto t1 = Clock::now();
    OSCARKV_RETURN_IF_ERROR(comm.Init(id, /*rank=*/0, fd, o.timeout_ms));
    stats.nccl_init_ms = MsSince(t1);
  }
#endif
  for (;;) {
    OSCARKV_ASSIGN_OR_RETURN(Message m, RecvMessage(fd, o.timeout_ms));
    if (m.type == MsgType::kBye) break;
    if (m.type == MsgType::kError) {
      return absl::UnavailableError(absl::StrCat("the decode side gave up: ", m.body));
    }
    if (m.type != MsgType::kWant) {
      return absl::DataLossError(absl::StrCat("unexpected '", MsgTypeName(m.type), "' frame"));
    }
    OSCARKV_ASSIGN_OR_RETURN(WantFrame w, ParseWant(m.body));
    const std::string& name = w.request;
    const std::string& mech = w.mechanism;
    Served* s = nullptr;
    for (auto& x : served) {
      if (x->layout.name == name) s = x.get();
    }
    if (!s) return absl::NotFoundError(absl::StrCat("no request named '", name, "'"));
    if (mech == "ipc") {
      OSCARKV_CUDA(cudaEventRecord(s->ready.e, stream.s));
      OSCARKV_RETURN_IF_ERROR(SendMessage(fd, MsgType::kOffer, "", o.timeout_ms));
      EnterStage(o.on_stage, "ipc-offer");
      ++stats.served_ipc;
    } else if (mech == "nccl") {
#ifdef OSCARKV_PD_HAS_NCCL
      if (!o.nccl) return absl::FailedPreconditionError("NCCL was not set up (--mechanisms)");
      OSCARKV_RETURN_IF_ERROR(SendMessage(fd, MsgType::kOffer, "", o.timeout_ms));
      EnterStage(o.on_stage, "nccl-send");
      const auto deadline = Deadline(o.timeout_ms);
      OSCARKV_RETURN_IF_ERROR(
          Nccl(ncclSend(s->buffer.ptr, s->layout.total_bytes, ncclUint8, 1, comm.get(), stream.s),
               comm.get(), "ncclSend"));
      OSCARKV_RETURN_IF_ERROR(comm.WaitReady(fd, deadline, "ncclSend (enqueue)"));
      OSCARKV_RETURN_IF_ERROR(comm.WaitStream(stream.s, fd, deadline, "ncclSend"));
      ++stats.served_nccl;
#else
      return absl::UnimplementedError("this build has no NCCL");
#endif
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown mechanism '", mech, "'"));
    }
    // The decode side says when it holds the pages; until then the buffer stays as it is.
    OSCARKV_RETURN_IF_ERROR(Expect(fd, MsgType::kDone, o.timeout_ms).status());
  }
#ifdef OSCARKV_PD_HAS_NCCL
  comm.Close(fd, o.timeout_ms);
#endif
  return stats;
}

// ---- decode side -----------------------------------------------------------------------------
struct Remote {
  RequestLayout layout;
  cudaIpcMemHandle_t mem{};
  cudaIpcEventHandle_t event{};
  IpcMapping mapping;
  Event ready;
};

absl::StatusOr<DecodeStats> Decode(int fd, const CodecProfile& profile, const DecodeOptions& o,
                                   const OnVerified& on_verified) {
  DecodeStats stats;
  const bool want_ipc =
      std::find(o.mechanisms.begin(), o.mechanisms.end(), "ipc") != o.mechanisms.end();
  const bool want_nccl =
      std::find(o.mechanisms.begin(), o.mechanisms.end(), "nccl") != o.mechanisms.end();
  OSCARKV_CUDA(cudaSetDevice(o.device));
  Stream stream;
  OSCARKV_CUDA(cudaStreamCreateWithFlags(&stream.s, cudaStreamNonBlocking));
  Event e0, e1;
  // Declared before the communicator so that it is aborted before they are freed (cudaFree
  // would wait for an NCCL kernel that a dead peer left spinning).
  DeviceBuffer dst, src;
  PinnedBuffer host;
  OSCARKV_CUDA(cudaEventCreate(&e0.e));
  OSCARKV_CUDA(cudaEventCreate(&e1.e));

  OSCARKV_ASSIGN_OR_RETURN(Message hm, Expect(fd, MsgType::kHello, o.timeout_ms));
  OSCARKV_ASSIGN_OR_RETURN(const HelloFrame hello, ParseHello(hm.body));
  std::vector<std::unique_ptr<Remote>> remotes;
  uint64_t max_bytes = 0;
  for (const HelloRequest& r : hello.requests) {
    auto x = std::make_unique<Remote>();
    OSCARKV_ASSIGN_OR_RETURN(x->layout, DecodeLayout(r.layout));
    if (x->layout.codec_id != profile.Id().Hex()) {
      return absl::FailedPreconditionError(
          absl::StrCat("request '", x->layout.name, "' was written under codec ",
                       x->layout.codec_id, ", this decoder uses ", profile.Id().Hex()));
    }
    OSCARKV_RETURN_IF_ERROR(FromHex(r.ipc_mem, &x->mem, "ipc_mem"));
    OSCARKV_RETURN_IF_ERROR(FromHex(r.ipc_event, &x->event, "ipc_event"));
    max_bytes = std::max(max_bytes, x->layout.total_bytes);
    remotes.push_back(std::move(x));
  }
  if (want_ipc) {
    const auto t0 = Clock::now();
    for (auto& x : remotes) {
      OSCARKV_CUDA(cudaIpcOpenMemHandle(&x->mapping.ptr, x->mem, cudaIpcMemLazyEnablePeerAccess));
      OSCARKV_CUDA(cudaIpcOpenEventHandle(&x->ready.e, x->event));
    }
    stats.ipc_open_ms = MsSince(t0);
  }
#ifdef OSCARKV_PD_HAS_NCCL
  Communicator comm;
  if (want_nccl) {
    if (hello.nccl_id.empty()) {
      return absl::FailedPreconditionError("the prefill side did not set up NCCL");
    }
    ncclUniqueId id;
    OSCARKV_RETURN_IF_ERROR(FromHex(hello.nccl_id, &id, "nccl_id"));
    const auto t0 = Clock::now();
    OSCARKV_RETURN_IF_ERROR(comm.Init(id, /*rank=*/1, fd, o.timeout_ms));
    stats.nccl_init_ms = MsSince(t0);
  }
#else
  if (want_nccl) return absl::UnimplementedError("this build has no NCCL");
#endif

  OSCARKV_RETURN_IF_ERROR(dst.Allocate(o.device, max_bytes));
  OSCARKV_RETURN_IF_ERROR(host.Allocate(max_bytes));
  if (o.peer_bound) {
    OSCARKV_RETURN_IF_ERROR(src.Allocate(o.source_device, max_bytes));
    OSCARKV_CUDA(cudaMemset(src.ptr, 0x5A, max_bytes));
    OSCARKV_CUDA(cudaDeviceSynchronize());
    OSCARKV_CUDA(cudaSetDevice(o.device));
    const cudaError_t pe = cudaDeviceEnablePeerAccess(o.source_device, 0);
    if (pe != cudaErrorPeerAccessAlreadyEnabled) OSCARKV_CUDA(pe);
    cudaGetLastError();
  }
  OSCARKV_CUDA(cudaSetDevice(o.device));

  std::vector<std::string> mechs;
  if (o.peer_bound) mechs.push_back("peer");
  mechs.insert(mechs.end(), o.mechanisms.begin(), o.mechanisms.end());
  for (auto& x : remotes) {
    const uint64_t bytes = x->layout.total_bytes;
    std::vector<Sample> samples(mechs.size());
    for (size_t k = 0; k < mechs.size(); ++k) {
      samples[k].request = x->layout.name;
      samples[k].mechanism = mechs[k];
      samples[k].bytes = bytes;
    }
    for (uint32_t rep = 0; rep < o.warmup + o.reps; ++rep) {
      for (size_t k = 0; k < mechs.size(); ++k) {
        const std::string& mech = mechs[k];
        const bool verify = rep == o.warmup && mech != "peer";
        if (verify) {
          // Poison the destination so a transfer that moved nothing cannot verify.
          OSCARKV_CUDA(cudaMemsetAsync(dst.ptr, 0xEE, bytes, stream.s));
          OSCARKV_CUDA(cudaStreamSynchronize(stream.s));
        }
        const auto deadline = Deadline(o.timeout_ms);
        const auto t0 = Clock::now();
        if (mech == "peer") {
          OSCARKV_CUDA(cudaEventRecord(e0.e, stream.s));
          OSCARKV_CUDA(
              cudaMemcpyPeerAsync(dst.ptr, o.device, src.ptr, o.source_device, bytes, stream.s));
          OSCARKV_CUDA(cudaEventRecord(e1.e, stream.s));
          OSCARKV_RETURN_IF_ERROR(WaitStream(stream.s, fd, deadline, "cudaMemcpyPeerAsync"));
        } else {
          const std::string want = EncodeWant({.request = x->layout.name, .mechanism = mech});
          OSCARKV_RETURN_IF_ERROR(SendMessage(fd, MsgType::kWant, want, o.timeout_ms));
          OSCARKV_RETURN_IF_ERROR(Expect(fd, MsgType::kOffer, o.timeout_ms).status());
          if (mech == "ipc") {
            OSCARKV_CUDA(cudaStreamWaitEvent(stream.s, x->ready.e, 0));
            OSCARKV_CUDA(cudaEventRecord(e0.e, stream.s));
            OSCARKV_CUDA(
                cudaMemcpyAsync(dst.ptr, x->mapping.ptr, bytes, cudaMemcpyDefault, stream.s));
            OSCARKV_CUDA(cudaEventRecord(e1.e, stream.s));
            EnterStage(o.on_stage, "ipc-copy");
            OSCARKV_RETURN_IF_ERROR(WaitStream(stream.s, fd, deadline, "IPC peer copy"));
          } else {
#ifdef OSCARKV_PD_HAS_NCCL
            EnterStage(o.on_stage, "nccl-recv");
            OSCARKV_CUDA(cudaEventRecord(e0.e, stream.s));
            OSCARKV_RETURN_IF_ERROR(
                Nccl(ncclRecv(dst.ptr, bytes, ncclUint8, 0, comm.get(), stream.s), comm.get(),
                     "ncclRecv"));
            OSCARKV_RETURN_IF_ERROR(comm.WaitReady(fd, deadline, "ncclRecv (enqueue)"));
            OSCARKV_CUDA(cudaEventRecord(e1.e, stream.s));
            OSCARKV_RETURN_IF_ERROR(comm.WaitStream(stream.s, fd, deadline, "ncclRecv"));
#endif
          }
          OSCARKV_RETURN_IF_ERROR(SendMessage(fd, MsgType::kDone, "", o.timeout_ms));
        }
        const double wall = MsSince(t0);
        float gpu = 0;
        OSCARKV_CUDA(cudaEventElapsedTime(&gpu, e0.e, e1.e));
        if (rep >= o.warmup) {
          samples[k].wall_ms.push_back(wall);
          samples[k].gpu_ms.push_back(gpu);
        }
        if (verify) {
          OSCARKV_CUDA(cudaMemcpy(host.ptr, dst.ptr, bytes, cudaMemcpyDeviceToHost));
          const std::span<const uint8_t> h(host.ptr, bytes);
          if (absl::Status s = VerifyBuffer(profile, x->layout, h); !s.ok()) {
            return absl::DataLossError(
                absl::StrCat("request '", x->layout.name, "' over ", mech, ": ", s.message()));
          }
          samples[k].verified = true;
          if (on_verified) OSCARKV_RETURN_IF_ERROR(on_verified(x->layout, mech, h));
        }
      }
    }
    for (auto& s : samples) stats.samples.push_back(std::move(s));
  }
  OSCARKV_RETURN_IF_ERROR(SendMessage(fd, MsgType::kBye, "", o.timeout_ms));
#ifdef OSCARKV_PD_HAS_NCCL
  comm.Close(fd, o.timeout_ms);
#endif
  return stats;
}

}  // namespace

Capabilities Probe() {
  Capabilities c;
  c.cuda = true;
  const cudaError_t e = cudaGetDeviceCount(&c.devices);
  if (e != cudaSuccess) {
    c.devices = 0;
    c.note = absl::StrCat("no CUDA device: ", cudaGetErrorString(e));
  }
#ifdef OSCARKV_PD_HAS_NCCL
  c.nccl = ncclGetVersion(&c.nccl_version) == ncclSuccess;
  if (!c.nccl) c.note += " libnccl did not load;";
#else
  c.note += c.note.empty() ? "built without NCCL" : "; built without NCCL";
#endif
  return c;
}

absl::StatusOr<ServeStats> ServePrefill(int fd, std::vector<HostRequest> requests,
                                        const ServeOptions& options) {
  auto r = Serve(fd, std::move(requests), options);  // every device resource is freed here
  if (!r.ok()) (void)Tell(fd, r.status());
  return r;
}

absl::StatusOr<DecodeStats> RunDecode(int fd, const CodecProfile& profile,
                                      const DecodeOptions& options, const OnVerified& on_verified) {
  auto r = Decode(fd, profile, options, on_verified);
  if (!r.ok()) (void)Tell(fd, r.status());
  return r;
}

}  // namespace oscarkv::pd::gpu
