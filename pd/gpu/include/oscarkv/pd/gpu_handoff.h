// Same-node GPU->GPU prefill->decode handoff (issue 6 item 4): a prefill process holds a
// request's pages (BF16 sink, INT2 history, BF16 tail; FORMAT.md §1) in one buffer in its GPU's
// memory; a decode process on another GPU of the same host pulls them into its own GPU memory
// by (a) CUDA IPC -- the prefill's cudaMalloc buffer and an interprocess event, opened by the
// decode side and copied peer-to-peer -- or (b) NCCL send/recv between two ranks. The two
// processes talk over a unix socket (a socketpair made by the launcher): the prefill side sends
// a hello (the requests' buffer layouts, IPC handles, the NCCL unique id), then serves the
// decode side's requests until it says bye.
//
// CPU-only pieces (always built, unit-tested): the control-channel framing with timeouts and
// peer-death detection, the buffer layout of a request's pages (256-byte aligned slots), its
// JSON form, synthetic pages with valid headers and XXH3 checksums, and verification of a
// received buffer page by page. The GPU pieces (ServePrefill / RunDecode) need CUDA and, for
// NCCL, libnccl; without them they return UNIMPLEMENTED naming what the build lacks.
//
// Errors: UNAVAILABLE when the peer closed its end of the socket (it died or gave up);
// DEADLINE_EXCEEDED when a step ran past the timeout; DATA_LOSS for a malformed frame or a page
// that does not verify; FAILED_PRECONDITION for a codec mismatch or too few GPUs; INTERNAL for
// CUDA/NCCL errors (the message names the call). After any error every CUDA/NCCL resource is
// released (an NCCL communicator is aborted, never waited on).
//
// Thread-safety: the functions are stateless; one control socket serves one pair of processes.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/kernels/page_set.h"

namespace oscarkv::pd::gpu {

// ---- control channel -------------------------------------------------------------------------
// Frame: u32 magic "OKVH", u32 type, u64 body length (little-endian), then the body.
inline constexpr uint32_t kFrameMagic = 0x48564B4F;
inline constexpr uint64_t kMaxFrameBody = uint64_t{64} << 20;

enum class MsgType : uint32_t {
  kHello = 1,  // prefill -> decode: JSON {device, requests:[{layout, ipc_mem, ipc_event}], nccl_id}
  kWant = 2,   // decode -> prefill: JSON {request, mechanism}
  kOffer = 3,  // prefill -> decode: the pages are ready (IPC: event recorded; NCCL: send posted)
  kDone = 4,   // decode -> prefill: the pages are in the decode GPU's memory
  kError = 5,  // either way: body is the error message; the sender gives up
  kBye = 6,    // decode -> prefill: no more requests
};
const char* MsgTypeName(MsgType t);

struct Message {
  MsgType type;
  std::string body;
};

// Sends one frame (MSG_NOSIGNAL; a closed peer is UNAVAILABLE, not SIGPIPE).
absl::Status SendMessage(int fd, MsgType type, std::string_view body, int timeout_ms);
// Receives one frame within timeout_ms: UNAVAILABLE on EOF, DEADLINE_EXCEEDED on timeout,
// DATA_LOSS on a bad magic, type or length.
absl::StatusOr<Message> RecvMessage(int fd, int timeout_ms);
// Non-blocking liveness check that consumes nothing: UNAVAILABLE once the peer has closed its
// end (and no unread frame is pending), else OK.
absl::Status PeerAlive(int fd);

// ---- frame bodies ----------------------------------------------------------------------------
// The JSON bodies of the hello and want frames. The parsers take bytes from the peer process and
// never throw: a body that is not JSON, lacks a key or has a value of the wrong type is DATA_LOSS
// naming the frame and the field.
struct HelloRequest {
  std::string layout;     // EncodeLayout text (DecodeLayout checks it)
  std::string ipc_mem;    // hex of a cudaIpcMemHandle_t
  std::string ipc_event;  // hex of a cudaIpcEventHandle_t
};
struct HelloFrame {
  int device = 0;
  int64_t pid = 0;
  std::vector<HelloRequest> requests;
  std::string nccl_id;  // hex of an ncclUniqueId; empty when the prefill side set up no NCCL
};
struct WantFrame {
  std::string request;
  std::string mechanism;
};
std::string EncodeHello(const HelloFrame& hello);
absl::StatusOr<HelloFrame> ParseHello(std::string_view body);
std::string EncodeWant(const WantFrame& want);
absl::StatusOr<WantFrame> ParseWant(std::string_view body);
// Decodes lowercase hex of exactly out.size() bytes; DATA_LOSS naming `what` otherwise.
absl::Status DecodeHexInto(std::string_view hex, std::span<uint8_t> out, std::string_view what);

// ---- buffer layout ---------------------------------------------------------------------------
inline constexpr uint64_t kSlotAlignment = 256;

struct PageSlot {
  PageKind kind = PageKind::kBf16;
  uint32_t first_token = 0, token_count = 0;
  uint64_t offset = 0;    // from the buffer start, a multiple of kSlotAlignment
  uint64_t bytes = 0;     // the encoded page (header + payload)
  uint64_t checksum = 0;  // the page header's XXH3 checksum
};

// One request's pages in one device buffer.
struct RequestLayout {
  std::string name;
  std::string codec_id;         // CodecProfile::Id().Hex()
  std::vector<int32_t> tokens;  // prompt + first generated token (empty for synthetic pages)
  uint32_t prompt_tokens = 0;
  std::vector<PageSlot> slots;  // in sequence order
  uint64_t total_bytes = 0;     // buffer size: the slots plus alignment padding

  uint64_t page_bytes() const;
  uint32_t pages_of(PageKind kind) const;
};

// Slots for `plan` under `profile` (checksums 0 until packed or filled).
RequestLayout PlanLayout(const CodecProfile& profile, const std::vector<PlannedPage>& plan,
                         std::string name);
// The plan of the same tokens with every page BF16 (what an uncompressed handoff moves).
std::vector<PlannedPage> AllBf16Plan(const CodecProfile& profile, uint32_t tokens);

// Copies `pages` into `buffer` (layout.total_bytes) at the slots' offsets and records each
// page's header checksum. INVALID_ARGUMENT when the pages do not match the layout.
absl::Status PackPages(const SequencePages& pages, RequestLayout& layout,
                       std::span<uint8_t> buffer);
// Fills every slot with a synthetic page (valid header for `profile`, pseudo-random bytes from
// `seed` in the token slots below token_count and zero bytes in the rest, XXH3 checksum) and
// records the checksums; writes nothing outside the slots. INVALID_ARGUMENT when a slot is not
// the profile's page size, lies outside `buffer` or has no or too many tokens. Runs on
// `threads` threads.
absl::Status FillSynthetic(const CodecProfile& profile, RequestLayout& layout,
                           std::span<uint8_t> buffer, uint64_t seed, unsigned threads = 0);
// Checks every page of a received buffer: header against `profile`, XXH3 checksum, zero bytes
// in the unused token slots, and kind, token count and checksum against the layout. DATA_LOSS
// names the first bad page.
absl::Status VerifyBuffer(const CodecProfile& profile, const RequestLayout& layout,
                          std::span<const uint8_t> buffer, unsigned threads = 0);
// The pages of a verified buffer as the engine takes them.
SequencePages UnpackPages(const RequestLayout& layout, std::span<const uint8_t> buffer);

std::string EncodeLayout(const RequestLayout& layout);  // JSON text
// Strict parse: INVALID_ARGUMENT / DATA_LOSS for missing fields, overlapping or unaligned slots.
absl::StatusOr<RequestLayout> DecodeLayout(std::string_view json);

// Median of `v` (0 when empty).
double Median(std::vector<double> v);

// ---- GPU handoff -----------------------------------------------------------------------------
struct Capabilities {
  bool cuda = false;     // built with the CUDA runtime
  bool nccl = false;     // built with NCCL
  int devices = 0;       // CUDA devices visible (0 when the runtime has no driver/device)
  int nccl_version = 0;  // the loaded libnccl's version code
  std::string note;      // why something is missing
};
Capabilities Probe();

// A request as the prefill side holds it before upload.
struct HostRequest {
  RequestLayout layout;
  std::vector<uint8_t> bytes;  // layout.total_bytes
};

// Called as a side enters each named stage of the handoff (prefill: "hello", "ipc-offer",
// "nccl-send"; decode: "ipc-copy", "nccl-recv"), on the thread running it. Empty: nothing
// happens. Tests install a hook that fails the process there (oscarkv/testing/stage_hooks.h).
using StageHook = std::function<void(std::string_view stage)>;

struct ServeOptions {
  int device = 0;
  int peer_rank_device = 1;  // for the log only
  int timeout_ms = 30000;    // per step (a frame, an NCCL init, a transfer)
  bool nccl = true;          // set up an NCCL communicator (rank 0)
  StageHook on_stage;        // "hello", "ipc-offer", "nccl-send"
};
struct ServeStats {
  uint64_t uploaded_bytes = 0;
  uint32_t served_ipc = 0, served_nccl = 0;
  double upload_ms = 0, nccl_init_ms = 0;
};
// Uploads the requests into GPU `device` and serves the decode side over `fd` until it says
// bye. Frees every device resource before returning.
absl::StatusOr<ServeStats> ServePrefill(int fd, std::vector<HostRequest> requests,
                                        const ServeOptions& options);

struct DecodeOptions {
  int device = 1;
  int source_device = 0;  // the prefill's GPU (for the peer-copy bound)
  int timeout_ms = 30000;
  std::vector<std::string> mechanisms = {"ipc", "nccl"};
  bool peer_bound = true;  // time cudaMemcpyPeerAsync of the same bytes beside each handoff
  uint32_t warmup = 2, reps = 10;
  StageHook on_stage;  // "ipc-copy", "nccl-recv"
};

// Times of one (request, mechanism): wall = from sending the request to the pages being in the
// decode GPU's memory (stream synchronized); gpu = CUDA events around the copy / receive.
struct Sample {
  std::string request, mechanism;  // mechanism: "ipc", "nccl" or "peer" (the bound)
  uint64_t bytes = 0;
  std::vector<double> wall_ms, gpu_ms;
  bool verified = false;  // the first (non-warmup) rep was copied back and verified
};
struct DecodeStats {
  std::vector<Sample> samples;
  double ipc_open_ms = 0, nccl_init_ms = 0;
};
// Called once per (request, mechanism) with the verified host copy of the received buffer.
using OnVerified = std::function<absl::Status(
    const RequestLayout& layout, const std::string& mechanism, std::span<const uint8_t> host)>;
// Connects to the prefill side over `fd`, checks every request's codec id against `profile`,
// and for each request, rep and mechanism pulls the pages into GPU `device`. Frees every device
// resource (closing IPC handles, destroying or aborting the communicator) before returning.
absl::StatusOr<DecodeStats> RunDecode(int fd, const CodecProfile& profile,
                                      const DecodeOptions& options, const OnVerified& on_verified);

}  // namespace oscarkv::pd::gpu
