// Prefill->decode handoff records: what a prefill worker publishes under a transfer handle and
// how a decode worker opens it (docs/ARCHITECTURE.md §4, flow 3).
//
// A handoff is a manifest plus the request's pages (BF16 sink, INT2 history, BF16 tail, in the
// order of kernels' page plan). The manifest carries the handle name, the codec profile, the
// tokens so far (the pages cover tokens[0, n-1); tokens[n-1] is the first generated token, which
// the decode side runs first), the page plan, every page's XXH3 checksum, and an expiry time.
//
// Transport: the client library's transfer handles (client/handles.h). Every page is stored
// under the handle-derived key HandleClient::HandleTailKey(codec, handle, i) -- never under its
// canonical prefix key, so a handoff always moves exactly the bytes its prefill produced (a
// prefix-cache page of the same tokens may differ: a block is BF16 tail in one sequence and INT2
// history in a longer one). The manifest is the handle's metadata. The daemon pins the pages
// until the handle is closed or its ttl passes. The decode side opens the handle by name on the
// prefill host's daemon (shared memory on the same host, else gRPC), re-checks every page
// against the profile and the manifest's checksums, and by default closes the handle afterwards.
//
// Errors: NOT_FOUND for an unknown, closed or expired handle; DEADLINE_EXCEEDED for one past the
// manifest's expiry (a clock-skew guard); DATA_LOSS for a page whose bytes do not verify (no
// decoder ever resumes from it); FAILED_PRECONDITION when the handle was published under another
// codec than the decoder's; ALREADY_EXISTS when the name holds other pages. Thread-safety: the
// functions are stateless; they may run concurrently on one HandleClient (which is thread-safe).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"
#include "oscarkv/client/handles.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/page_set.h"

namespace oscarkv::client {
class UcxLoader;  // client/ucx_loader.h (oscarkv::ucx_client)
}

namespace oscarkv::pd {

struct HandoffManifest {
  std::string handle;
  CodecProfile profile;
  std::vector<int32_t> tokens;      // prompt + first generated token
  std::vector<PlannedPage> plan;    // one per page, in sequence order
  std::vector<uint64_t> checksums;  // each page header's checksum, one per page
  uint64_t created_unix_ms = 0;
  uint64_t expires_unix_ms = 0;  // 0 = never
  uint32_t prompt_tokens = 0;
};

// JSON text of a manifest, and its strict parse (INVALID_ARGUMENT / DATA_LOSS on bad input).
std::string EncodeManifest(const HandoffManifest& m);
absl::StatusOr<HandoffManifest> DecodeManifest(const std::string& text);

// Bytes a handoff moved (or would have moved).
struct TransferStats {
  uint32_t pages = 0, int2_pages = 0, bf16_pages = 0;
  uint64_t page_bytes = 0;             // the pages as stored (INT2 history + BF16 sink/tail)
  uint64_t manifest_bytes = 0;         // the manifest (the handle's metadata)
  uint64_t bf16_equivalent_bytes = 0;  // the same tokens as all-BF16 pages
  double ms = 0;                       // wall time of the transfer
  uint64_t total_bytes() const { return page_bytes + manifest_bytes; }
};

// Stats of `plan` under `profile` (bytes per kind from the page geometry).
TransferStats PlanBytes(const CodecProfile& profile, const std::vector<PlannedPage>& plan);

// The keys of a handoff's pages (HandleClient::HandleTailKey of each index).
std::vector<BlockKey> HandoffPageKeys(const client::Codec& codec, const std::string& handle,
                                      uint32_t pages);

struct OpenOptions {
  bool consume = true;       // close the handle after a verified load
  uint64_t now_unix_ms = 0;  // 0 = the wall clock (tests set it to check expiry)
};

struct OpenedHandoff {
  HandoffManifest manifest;
  SequencePages pages;
  TransferStats stats;
};

// Publishes `pages` with `manifest` (its plan and checksums are filled in from `pages`); the
// handle's ttl is manifest.expires_unix_ms - created_unix_ms (0: the daemon's default).
absl::StatusOr<TransferStats> PublishHandoff(client::HandleClient& client,
                                             const client::Codec& codec, HandoffManifest manifest,
                                             const SequencePages& pages);

// Opens a handle published under `codec` and loads and verifies its pages: by UCX RMA gets from
// the daemon's pool when `ucx` is given (its handles() should be `client`), else through
// `client` (shared memory or gRPC ReadPages).
absl::StatusOr<OpenedHandoff> OpenHandoff(client::HandleClient& client, const client::Codec& codec,
                                          const std::string& handle,
                                          const OpenOptions& options = {},
                                          client::UcxLoader* ucx = nullptr);

uint64_t UnixMs();

}  // namespace oscarkv::pd
