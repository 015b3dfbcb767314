#include "oscarkv/pd/handoff.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#ifdef OSCARKV_PD_HAS_UCX
#include "oscarkv/client/ucx_loader.h"
#endif
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::pd {
namespace {

using Json = nlohmann::json;

absl::Status Annotate(const absl::Status& s, const std::string& what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", std::string(s.message())));
}

}  // namespace

uint64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string EncodeManifest(const HandoffManifest& m) {
  const CodecProfile& p = m.profile;
  Json j;
  j["format"] = "oscarkv-pd-manifest/1";
  j["handle"] = m.handle;
  j["codec_id"] = p.Id().Hex();
  j["profile"] = {{"model_id", p.model_id},
                  {"model_revision", p.model_revision},
                  {"num_layers", p.num_layers},
                  {"num_kv_heads", p.num_kv_heads},
                  {"tp_rank", p.tp_rank},
                  {"tp_size", p.tp_size},
                  {"head_dim", p.head_dim},
                  {"page_tokens", p.page_tokens},
                  {"group_size", p.group_size},
                  {"scale_dtype", static_cast<uint32_t>(p.scale_dtype)},
                  {"sink_tokens", p.sink_tokens},
                  {"recent_tokens", p.recent_tokens},
                  {"rotation_digest", HexEncode(p.rotation_digest.data(), 32)}};
  j["tokens"] = m.tokens;
  j["prompt_tokens"] = m.prompt_tokens;
  Json plan = Json::array();
  for (size_t i = 0; i < m.plan.size(); ++i) {
    plan.push_back({{"kind", PageKindName(m.plan[i].kind)},
                    {"first", m.plan[i].first_token},
                    {"count", m.plan[i].token_count},
                    {"checksum", i < m.checksums.size() ? m.checksums[i] : 0}});
  }
  j["plan"] = plan;
  j["created_unix_ms"] = m.created_unix_ms;
  j["expires_unix_ms"] = m.expires_unix_ms;
  return j.dump();
}

absl::StatusOr<HandoffManifest> DecodeManifest(const std::string& text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError("handoff manifest is not valid JSON");
  }
  try {
    if (j.at("format").get<std::string>() != "oscarkv-pd-manifest/1") {
      return absl::InvalidArgumentError(absl::StrCat("unsupported handoff manifest format '",
                                                     j.at("format").get<std::string>(), "'"));
    }
    HandoffManifest m;
    m.handle = j.at("handle").get<std::string>();
    const Json& pj = j.at("profile");
    CodecProfile& p = m.profile;
    p.model_id = pj.at("model_id").get<std::string>();
    p.model_revision = pj.at("model_revision").get<std::string>();
    p.num_layers = pj.at("num_layers").get<uint32_t>();
    p.num_kv_heads = pj.at("num_kv_heads").get<uint32_t>();
    p.tp_rank = pj.at("tp_rank").get<uint32_t>();
    p.tp_size = pj.at("tp_size").get<uint32_t>();
    p.head_dim = pj.at("head_dim").get<uint32_t>();
    p.page_tokens = pj.at("page_tokens").get<uint32_t>();
    p.group_size = pj.at("group_size").get<uint32_t>();
    p.scale_dtype = static_cast<ScaleDtype>(pj.at("scale_dtype").get<uint32_t>());
    p.sink_tokens = pj.at("sink_tokens").get<uint32_t>();
    p.recent_tokens = pj.at("recent_tokens").get<uint32_t>();
    const std::string digest = pj.at("rotation_digest").get<std::string>();
    if (digest.size() != 64) return absl::DataLossError("manifest: bad rotation_digest");
    for (size_t i = 0; i < 32; ++i) {
      p.rotation_digest[i] = static_cast<uint8_t>(std::stoul(digest.substr(2 * i, 2), nullptr, 16));
    }
    OSCARKV_RETURN_IF_ERROR(p.Validate());
    if (p.Id().Hex() != j.at("codec_id").get<std::string>()) {
      return absl::DataLossError("manifest: codec_id does not match its profile");
    }
    m.tokens = j.at("tokens").get<std::vector<int32_t>>();
    m.prompt_tokens = j.at("prompt_tokens").get<uint32_t>();
    for (const Json& e : j.at("plan")) {
      const std::string kind = e.at("kind").get<std::string>();
      PlannedPage pp;
      if (kind == PageKindName(PageKind::kInt2)) {
        pp.kind = PageKind::kInt2;
      } else if (kind == PageKindName(PageKind::kBf16)) {
        pp.kind = PageKind::kBf16;
      } else {
        return absl::DataLossError(absl::StrCat("manifest: unknown page kind '", kind, "'"));
      }
      pp.first_token = e.at("first").get<uint32_t>();
      pp.token_count = e.at("count").get<uint32_t>();
      m.plan.push_back(pp);
      m.checksums.push_back(e.at("checksum").get<uint64_t>());
    }
    m.created_unix_ms = j.at("created_unix_ms").get<uint64_t>();
    m.expires_unix_ms = j.at("expires_unix_ms").get<uint64_t>();
    return m;
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("handoff manifest: ", e.what()));
  }
}

TransferStats PlanBytes(const CodecProfile& profile, const std::vector<PlannedPage>& plan) {
  TransferStats s;
  const uint64_t int2 = GeometryFor(profile, PageKind::kInt2).page_bytes();
  const uint64_t bf16 = GeometryFor(profile, PageKind::kBf16).page_bytes();
  for (const PlannedPage& p : plan) {
    ++s.pages;
    if (p.kind == PageKind::kInt2) {
      ++s.int2_pages;
      s.page_bytes += int2;
    } else {
      ++s.bf16_pages;
      s.page_bytes += bf16;
    }
    s.bf16_equivalent_bytes += bf16;
  }
  return s;
}

std::vector<BlockKey> HandoffPageKeys(const client::Codec& codec, const std::string& handle,
                                      uint32_t pages) {
  std::vector<BlockKey> keys;
  keys.reserve(pages);
  for (uint32_t i = 0; i < pages; ++i)
    keys.push_back(client::HandleClient::HandleTailKey(codec, handle, i));
  return keys;
}

absl::StatusOr<TransferStats> PublishHandoff(client::HandleClient& client,
                                             const client::Codec& codec, HandoffManifest manifest,
                                             const SequencePages& pages) {
  const auto t0 = std::chrono::steady_clock::now();
  if (manifest.handle.empty()) return absl::InvalidArgumentError("transfer handle name is empty");
  if (!(manifest.profile.Id() == codec.id)) {
    return absl::InvalidArgumentError("manifest profile does not match the registered codec");
  }
  if (pages.plan.size() != pages.pages.size() || pages.pages.empty()) {
    return absl::InvalidArgumentError("sequence pages: plan and pages disagree or are empty");
  }
  manifest.plan = pages.plan;
  manifest.checksums.clear();
  for (size_t i = 0; i < pages.pages.size(); ++i) {
    auto hdr = ParsePageHeader(pages.pages[i], manifest.profile, /*verify_checksum=*/true);
    if (!hdr.ok()) return Annotate(hdr.status(), absl::StrCat("page ", i, " before publish"));
    manifest.checksums.push_back(hdr->checksum);
  }
  const std::vector<BlockKey> keys = HandoffPageKeys(codec, manifest.handle, pages.pages.size());
  std::vector<client::PageWrite> writes;
  for (size_t i = 0; i < pages.pages.size(); ++i) {
    writes.push_back({keys[i], pages.plan[i].kind, pages.pages[i]});
  }
  const uint64_t ttl =
      manifest.expires_unix_ms ? manifest.expires_unix_ms - manifest.created_unix_ms : 0;
  const std::string text = EncodeManifest(manifest);
  auto published = client.Publish(codec, manifest.handle, writes, text,
                                  static_cast<uint32_t>(std::min<uint64_t>(ttl, UINT32_MAX)));
  if (!published.ok()) {
    return Annotate(published.status(),
                    absl::StrCat("publishing transfer handle '", manifest.handle, "' on ",
                                 client.client().options().address));
  }
  TransferStats stats = PlanBytes(manifest.profile, manifest.plan);
  stats.manifest_bytes = text.size();
  stats.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

absl::StatusOr<OpenedHandoff> OpenHandoff(client::HandleClient& client, const client::Codec& codec,
                                          const std::string& handle, const OpenOptions& options,
                                          client::UcxLoader* ucx) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string where =
      absl::StrCat("transfer handle '", handle, "' on ", client.client().options().address);
  const CodecProfile& profile = codec.profile;
  auto info = client.Open(handle);
  if (!info.ok()) {
    if (absl::IsNotFound(info.status())) {
      return absl::NotFoundError(absl::StrCat(where,
                                              " not found (never published, closed, or "
                                              "expired): ",
                                              std::string(info.status().message())));
    }
    return Annotate(info.status(), absl::StrCat("opening ", where));
  }
  (void)client.client().Release(info->lease_id);  // Load below takes its own lease
  OSCARKV_ASSIGN_OR_RETURN(HandoffManifest manifest, DecodeManifest(info->metadata));
  if (manifest.handle != handle) {
    return absl::DataLossError(
        absl::StrCat(where, ": manifest names handle '", manifest.handle, "'"));
  }
  if (!(info->codec_id == codec.id) || !(manifest.profile.Id() == codec.id)) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": published with codec ", info->codec_id.Hex(), " (page ",
                     manifest.profile.page_tokens, ", sink ", manifest.profile.sink_tokens,
                     ", recent ", manifest.profile.recent_tokens, "), the decoder uses ",
                     codec.id.Hex(), " (page ", profile.page_tokens, ", sink ", profile.sink_tokens,
                     ", recent ", profile.recent_tokens, ")"));
  }
  const uint64_t now = options.now_unix_ms ? options.now_unix_ms : UnixMs();
  if (manifest.expires_unix_ms != 0 && now > manifest.expires_unix_ms) {
    if (options.consume) (void)client.Close(handle);
    return absl::DeadlineExceededError(absl::StrCat(
        where, " expired ", now - manifest.expires_unix_ms, " ms ago (published with a ",
        manifest.expires_unix_ms - manifest.created_unix_ms, " ms ttl)"));
  }
  // The plan must be the one kernels' page planner gives for these tokens.
  const uint32_t stored_tokens = manifest.tokens.size() > 0 ? manifest.tokens.size() - 1 : 0;
  const std::vector<PlannedPage> expect = PlanSequencePages(profile, stored_tokens);
  bool plan_ok = expect.size() == manifest.plan.size() &&
                 manifest.checksums.size() == expect.size() && info->pages.size() == expect.size();
  for (size_t i = 0; plan_ok && i < expect.size(); ++i) {
    plan_ok = expect[i].kind == manifest.plan[i].kind &&
              expect[i].first_token == manifest.plan[i].first_token &&
              expect[i].token_count == manifest.plan[i].token_count;
  }
  if (!plan_ok) {
    return absl::DataLossError(absl::StrCat(where, ": page plan does not match ", stored_tokens,
                                            " tokens under this codec"));
  }
  absl::StatusOr<client::HandlePages> loaded;
  if (ucx != nullptr) {
#ifdef OSCARKV_PD_HAS_UCX
    loaded = ucx->LoadHandle(codec, handle);
#else
    return absl::UnimplementedError("this build of oscarkv::pd has no UCX loader");
#endif
  } else {
    loaded = client.Load(codec, handle);
  }
  if (!loaded.ok()) return Annotate(loaded.status(), absl::StrCat("loading the pages of ", where));
  if (loaded->pages.size() != manifest.plan.size()) {
    return absl::DataLossError(absl::StrCat(where, ": ", loaded->pages.size(),
                                            " pages, the manifest lists ", manifest.plan.size()));
  }
  for (size_t i = 0; i < loaded->pages.size(); ++i) {
    const std::vector<uint8_t>& page = loaded->pages[i];
    auto hdr = ParsePageHeader(page, profile, /*verify_checksum=*/true);
    if (!hdr.ok()) return Annotate(hdr.status(), absl::StrCat(where, ": page ", i));
    if (hdr->checksum != manifest.checksums[i]) {
      return absl::DataLossError(
          absl::StrCat(where, ": page ", i, " is not the page that was published (checksum)"));
    }
    if (static_cast<PageKind>(hdr->kind) != manifest.plan[i].kind ||
        hdr->token_count != manifest.plan[i].token_count) {
      return absl::DataLossError(
          absl::StrCat(where, ": page ", i, " kind/token count differ from the plan"));
    }
  }
  OpenedHandoff out;
  out.pages.plan = manifest.plan;
  out.pages.pages = std::move(loaded->pages);
  out.stats = PlanBytes(profile, manifest.plan);
  out.stats.page_bytes = loaded->bytes;
  out.stats.manifest_bytes = info->metadata.size();
  out.manifest = std::move(manifest);
  if (options.consume) (void)client.Close(handle);
  out.stats.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace oscarkv::pd
