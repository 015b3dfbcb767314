// The two sides of a prefill->decode handoff on the reference engine.
//
// PrefillWorker runs a prompt through engine::Decoder::Prefill, takes the first greedy token,
// and publishes the sequence's pages (BF16 sink, INT2 history, BF16 tail) with a manifest under
// a transfer handle in its daemon (handoff.h). DecodeWorker, in another process (possibly on
// another host), opens the handle on that daemon, verifies every page, resumes a Decoder from
// the pages (Decoder::Resume) and generates greedily. Because the pages are the whole KV state,
// the decode side's tokens equal a single-process run with the same codec (ReferenceGenerate).
//
// Ownership: the workers borrow the model and the client; both must outlive them. Not
// thread-safe (one request at a time per worker).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"
#include "oscarkv/engine/model.h"
#include "oscarkv/kernels/rotation.h"
#include "oscarkv/pd/engine_codec.h"
#include "oscarkv/pd/handoff.h"

namespace oscarkv::pd {

struct PrefillResult {
  int32_t first_token = 0;
  uint32_t prompt_tokens = 0;
  TransferStats stats;  // what was published
  double prefill_ms = 0, publish_ms = 0;
};

class PrefillWorker {
 public:
  PrefillWorker(const engine::Model& model, EngineCodec codec, client::HandleClient& client)
      : model_(model), codec_(std::move(codec)), client_(client) {}
  // Prefills `prompt` (at least 1 token) and publishes under `handle`; ttl_ms 0 = no expiry.
  absl::StatusOr<PrefillResult> Run(const std::vector<int32_t>& prompt, const std::string& handle,
                                    uint64_t ttl_ms);

 private:
  const engine::Model& model_;
  EngineCodec codec_;
  client::HandleClient& client_;
};

struct DecodeResult {
  std::vector<int32_t> prompt;     // from the manifest
  std::vector<int32_t> generated;  // the prefill's first token, then `tokens` more
  SequencePages handed;            // the pages as loaded (before resuming)
  TransferStats stats;             // what was loaded
  double load_ms = 0, resume_ms = 0, generate_ms = 0;
};

class DecodeWorker {
 public:
  // `ucx`, when given, loads the pages by UCX RMA (its handles() should be `client`).
  DecodeWorker(const engine::Model& model, EngineCodec codec, client::HandleClient& client,
               client::UcxLoader* ucx = nullptr)
      : model_(model), codec_(std::move(codec)), client_(client), ucx_(ucx) {}
  absl::StatusOr<DecodeResult> Run(const std::string& handle, uint32_t tokens,
                                   const OpenOptions& options = {});

 private:
  const engine::Model& model_;
  EngineCodec codec_;
  client::HandleClient& client_;
  client::UcxLoader* ucx_;
};

// Stores the handed-over sink and INT2 history pages of the prompt (never the BF16 tail, whose
// blocks turn INT2 as a sequence grows) under the canonical block keys of their tokens
// (FORMAT.md §3) in `local` (the decode host's daemon), so later requests sharing the prefix
// hit there. Returns the store's result.
absl::StatusOr<client::StoreResult> CachePrefix(client::Client& local, const EngineCodec& codec,
                                                const std::vector<int32_t>& prompt,
                                                const SequencePages& pages);

}  // namespace oscarkv::pd
