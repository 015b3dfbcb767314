#include "oscarkv/pd/workers.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "oscarkv/engine/decode.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::pd {
namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

absl::StatusOr<PrefillResult> PrefillWorker::Run(const std::vector<int32_t>& prompt,
                                                 const std::string& handle, uint64_t ttl_ms) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  OSCARKV_RETURN_IF_ERROR(
      CheckContext(model_, prompt.size() + 1, "the prompt plus its first token"));
  PrefillResult r;
  r.prompt_tokens = prompt.size();
  const auto t0 = Clock::now();
  OSCARKV_ASSIGN_OR_RETURN(auto dec,
                           engine::Decoder::Create(model_, codec_.profile, codec_.rotations,
                                                   static_cast<uint32_t>(prompt.size() + 1)));
  OSCARKV_RETURN_IF_ERROR(dec->Prefill(prompt));
  const SequencePages pages = dec->pages();  // the prompt's pages, before the first token
  OSCARKV_ASSIGN_OR_RETURN(r.first_token, dec->Step());
  r.prefill_ms = MsSince(t0);

  OSCARKV_ASSIGN_OR_RETURN(client::Codec codec, client_.client().RegisterCodec(codec_.profile));
  HandoffManifest m;
  m.handle = handle;
  m.profile = codec_.profile;
  m.tokens = prompt;
  m.tokens.push_back(r.first_token);
  m.prompt_tokens = prompt.size();
  m.created_unix_ms = UnixMs();
  m.expires_unix_ms = ttl_ms ? m.created_unix_ms + ttl_ms : 0;
  const auto t1 = Clock::now();
  OSCARKV_ASSIGN_OR_RETURN(r.stats, PublishHandoff(client_, codec, std::move(m), pages));
  r.publish_ms = MsSince(t1);
  return r;
}

absl::StatusOr<DecodeResult> DecodeWorker::Run(const std::string& handle, uint32_t tokens,
                                               const OpenOptions& options) {
  DecodeResult r;
  OSCARKV_ASSIGN_OR_RETURN(client::Codec codec, client_.client().RegisterCodec(codec_.profile));
  const auto t0 = Clock::now();
  OSCARKV_ASSIGN_OR_RETURN(OpenedHandoff h, OpenHandoff(client_, codec, handle, options, ucx_));
  r.load_ms = MsSince(t0);
  r.stats = h.stats;
  const std::vector<int32_t>& seq = h.manifest.tokens;
  if (seq.size() < 2) return absl::DataLossError("handoff manifest holds fewer than 2 tokens");
  r.prompt.assign(seq.begin(), seq.end() - 1);
  OSCARKV_RETURN_IF_ERROR(
      CheckContext(model_, seq.size() + tokens + 1, "the handoff plus the generated tokens"));
  const auto t1 = Clock::now();
  OSCARKV_ASSIGN_OR_RETURN(auto dec,
                           engine::Decoder::Create(model_, codec_.profile, codec_.rotations,
                                                   static_cast<uint32_t>(seq.size() + tokens + 1)));
  OSCARKV_RETURN_IF_ERROR(dec->Resume(seq, h.pages));
  r.resume_ms = MsSince(t1);
  const auto t2 = Clock::now();
  OSCARKV_ASSIGN_OR_RETURN(std::vector<int32_t> more, dec->Generate(tokens));
  r.generate_ms = MsSince(t2);
  r.handed = std::move(h.pages);
  r.generated.push_back(seq.back());
  r.generated.insert(r.generated.end(), more.begin(), more.end());
  return r;
}

absl::StatusOr<client::StoreResult> CachePrefix(client::Client& local, const EngineCodec& codec,
                                                const std::vector<int32_t>& prompt,
                                                const SequencePages& pages) {
  OSCARKV_ASSIGN_OR_RETURN(client::Codec c, local.RegisterCodec(codec.profile));
  std::vector<uint32_t> ids(prompt.begin(), prompt.end());
  const std::vector<BlockKey> keys = client::Client::BlockKeys(c, ids);
  std::vector<client::PageWrite> writes;
  for (size_t i = 0; i < pages.plan.size() && i < keys.size(); ++i) {
    const PlannedPage& p = pages.plan[i];
    if (p.token_count != codec.profile.page_tokens ||
        p.first_token != i * codec.profile.page_tokens) {
      break;
    }
    // Sink and INT2 history pages only: a block in the BF16 tail becomes INT2 history once the
    // sequence grows, so its tail form is not the canonical page of its key.
    const bool sink = p.first_token < codec.profile.sink_tokens;
    if (p.kind != PageKind::kInt2 && !sink) break;
    writes.push_back({keys[i], p.kind, pages.pages[i]});
  }
  return local.Store(c, writes);
}

}  // namespace oscarkv::pd
