// The buffer layout of a request's pages, its JSON form, synthetic pages and verification.
#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "oscarkv/pd/gpu_handoff.h"

namespace oscarkv::pd::gpu {
namespace {

using Json = nlohmann::json;

unsigned Threads(unsigned requested, size_t items) {
  unsigned t =
      requested ? requested : std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(t, items)));
}

// Runs fn(i) for i in [0, n) on `threads` threads; returns the first error by index.
absl::Status ParallelFor(size_t n, unsigned threads,
                         const std::function<absl::Status(size_t)>& fn) {
  std::vector<absl::Status> status(n);
  const unsigned t = Threads(threads, n);
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < t; ++w) {
    pool.emplace_back([&, w] {
      for (size_t i = w; i < n; i += t) status[i] = fn(i);
    });
  }
  for (auto& th : pool) th.join();
  for (auto& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string SlotName(size_t i, const PageSlot& s) {
  return absl::StrCat("page ", i, " (", PageKindName(s.kind), ", tokens ", s.first_token, "..",
                      s.first_token + s.token_count, ")");
}

}  // namespace

uint64_t RequestLayout::page_bytes() const {
  uint64_t b = 0;
  for (const auto& s : slots) b += s.bytes;
  return b;
}

uint32_t RequestLayout::pages_of(PageKind kind) const {
  return static_cast<uint32_t>(
      std::count_if(slots.begin(), slots.end(), [&](const PageSlot& s) { return s.kind == kind; }));
}

RequestLayout PlanLayout(const CodecProfile& profile, const std::vector<PlannedPage>& plan,
                         std::string name) {
  RequestLayout l;
  l.name = std::move(name);
  l.codec_id = profile.Id().Hex();
  uint64_t off = 0;
  for (const PlannedPage& p : plan) {
    PageSlot s;
    s.kind = p.kind;
    s.first_token = p.first_token;
    s.token_count = p.token_count;
    s.offset = off;
    s.bytes = GeometryFor(profile, p.kind).page_bytes();
    off = (off + s.bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
    l.slots.push_back(s);
  }
  l.total_bytes = off;
  return l;
}

std::vector<PlannedPage> AllBf16Plan(const CodecProfile& profile, uint32_t tokens) {
  std::vector<PlannedPage> plan;
  for (uint32_t t = 0; t < tokens; t += profile.page_tokens) {
    plan.push_back({PageKind::kBf16, t, std::min(profile.page_tokens, tokens - t)});
  }
  return plan;
}

absl::Status PackPages(const SequencePages& pages, RequestLayout& layout,
                       std::span<uint8_t> buffer) {
  if (pages.pages.size() != layout.slots.size() || pages.plan.size() != layout.slots.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout has ", layout.slots.size(), " slots, the sequence ", pages.pages.size(), " pages"));
  }
  if (buffer.size() < layout.total_bytes) {
    return absl::InvalidArgumentError("buffer smaller than the layout");
  }
  for (size_t i = 0; i < layout.slots.size(); ++i) {
    PageSlot& s = layout.slots[i];
    const auto& page = pages.pages[i];
    const PlannedPage& p = pages.plan[i];
    if (page.size() != s.bytes || p.kind != s.kind || p.first_token != s.first_token ||
        p.token_count != s.token_count || page.size() < kPageHeaderBytes) {
      return absl::InvalidArgumentError(absl::StrCat(SlotName(i, s), " does not match the plan"));
    }
    std::memcpy(buffer.data() + s.offset, page.data(), page.size());
    PageHeader h;
    std::memcpy(&h, page.data(), sizeof(h));
    s.checksum = h.checksum;
  }
  return absl::OkStatus();
}

absl::Status FillSynthetic(const CodecProfile& profile, RequestLayout& layout,
                           std::span<uint8_t> buffer, uint64_t seed, unsigned threads) {
  if (buffer.size() < layout.total_bytes) {
    return absl::InvalidArgumentError("buffer smaller than the layout");
  }
  // Every slot must be exactly its page and lie inside the buffer: a layout decoded from JSON
  // (or edited) is not trusted to have been made by PlanLayout.
  for (size_t i = 0; i < layout.slots.size(); ++i) {
    const PageSlot& s = layout.slots[i];
    const PageGeometry g = GeometryFor(profile, s.kind);
    if (s.bytes != g.page_bytes() || s.offset > buffer.size() ||
        buffer.size() - s.offset < s.bytes || s.token_count == 0 ||
        s.token_count > profile.page_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          SlotName(i, s), ": ", s.bytes, " bytes at offset ", s.offset, ", the profile's page is ",
          g.page_bytes(), " bytes of up to ", profile.page_tokens, " tokens"));
    }
  }
  const CodecId id = profile.Id();
  return ParallelFor(layout.slots.size(), threads, [&](size_t i) -> absl::Status {
    PageSlot& s = layout.slots[i];
    const PageGeometry g = GeometryFor(profile, s.kind);
    std::span<uint8_t> page = buffer.subspan(s.offset, s.bytes);
    uint64_t x = seed * 0x100000001B3ull + i;
    // Pseudo-random bytes for the token slots in use, zero bytes for the slots at and past
    // token_count (FORMAT.md §1.1), so a partial last page is a valid page.
    auto fill = [&](uint8_t* p, size_t used, size_t total) {
      size_t j = 0;
      for (; j + 8 <= used; j += 8) {
        const uint64_t r = SplitMix(x);
        std::memcpy(p + j, &r, 8);
      }
      for (; j < used; ++j) p[j] = static_cast<uint8_t>(SplitMix(x));
      std::memset(p + used, 0, total - used);
    };
    const size_t tc = s.token_count;
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        for (uint32_t head = 0; head < g.num_kv_heads; ++head) {
          uint8_t* seg = page.data() + g.segment_offset(l, kv, head);
          if (s.kind == PageKind::kInt2) {
            fill(seg, tc * g.code_row_bytes(), g.codes_bytes());
            fill(seg + g.codes_bytes(), tc * g.groups_per_row() * 4, g.scales_bytes());
          } else {
            fill(seg, tc * g.head_dim * 2, g.segment_bytes());
          }
        }
      }
    }
    PageHeader h{};
    h.magic = kPageMagic;
    h.format_version = kPageFormatVersion;
    h.kind = static_cast<uint8_t>(s.kind);
    h.scale_dtype = static_cast<uint8_t>(profile.scale_dtype);
    std::memcpy(h.codec_id, id.bytes.data(), 16);
    h.num_layers = static_cast<uint16_t>(profile.num_layers);
    h.num_kv_heads = static_cast<uint16_t>(profile.num_kv_heads);
    h.head_dim = static_cast<uint16_t>(profile.head_dim);
    h.group_size = static_cast<uint16_t>(profile.group_size);
    h.page_tokens = static_cast<uint16_t>(profile.page_tokens);
    h.token_count = static_cast<uint16_t>(s.token_count);
    h.payload_bytes = g.payload_bytes();
    std::memcpy(page.data(), &h, sizeof(h));
    h.checksum = ComputePageChecksum(page);
    std::memcpy(page.data(), &h, sizeof(h));
    s.checksum = h.checksum;
    return absl::OkStatus();
  });
}

absl::Status VerifyBuffer(const CodecProfile& profile, const RequestLayout& layout,
                          std::span<const uint8_t> buffer, unsigned threads) {
  if (buffer.size() < layout.total_bytes) {
    return absl::DataLossError(
        absl::StrCat("received ", buffer.size(), " bytes, the layout needs ", layout.total_bytes));
  }
  if (layout.codec_id != profile.Id().Hex()) {
    return absl::FailedPreconditionError(absl::StrCat("request '", layout.name,
                                                      "' was written under codec ", layout.codec_id,
                                                      ", the decoder uses ", profile.Id().Hex()));
  }
  return ParallelFor(layout.slots.size(), threads, [&](size_t i) -> absl::Status {
    const PageSlot& s = layout.slots[i];
    auto h = ParsePageHeader(buffer.subspan(s.offset, s.bytes), profile, /*verify_checksum=*/true);
    if (!h.ok()) {
      return absl::DataLossError(absl::StrCat(SlotName(i, s), ": ", h.status().message()));
    }
    if (auto unused = CheckUnusedSlotsZero(buffer.subspan(s.offset, s.bytes), *h); !unused.ok()) {
      return absl::DataLossError(absl::StrCat(SlotName(i, s), ": ", unused.message()));
    }
    if (h->checksum != s.checksum || h->kind != static_cast<uint8_t>(s.kind) ||
        h->token_count != s.token_count) {
      return absl::DataLossError(
          absl::StrCat(SlotName(i, s), ": header does not match the manifest (checksum ",
                       absl::Hex(h->checksum), " vs ", absl::Hex(s.checksum), ")"));
    }
    return absl::OkStatus();
  });
}

SequencePages UnpackPages(const RequestLayout& layout, std::span<const uint8_t> buffer) {
  SequencePages out;
  for (const PageSlot& s : layout.slots) {
    out.plan.push_back({s.kind, s.first_token, s.token_count});
    out.pages.emplace_back(buffer.begin() + s.offset, buffer.begin() + s.offset + s.bytes);
  }
  return out;
}

std::string EncodeLayout(const RequestLayout& l) {
  Json slots = Json::array();
  for (const PageSlot& s : l.slots) {
    slots.push_back({static_cast<int>(s.kind), s.first_token, s.token_count, s.offset, s.bytes,
                     absl::StrCat(absl::Hex(s.checksum, absl::kZeroPad16))});
  }
  Json j = {{"name", l.name},     {"codec_id", l.codec_id},
            {"tokens", l.tokens}, {"prompt_tokens", l.prompt_tokens},
            {"slots", slots},     {"total_bytes", l.total_bytes}};
  return j.dump();
}

absl::StatusOr<RequestLayout> DecodeLayout(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::DataLossError("layout: not a JSON object");
  RequestLayout l;
  try {
    l.name = j.at("name").get<std::string>();
    l.codec_id = j.at("codec_id").get<std::string>();
    l.tokens = j.at("tokens").get<std::vector<int32_t>>();
    l.prompt_tokens = j.at("prompt_tokens").get<uint32_t>();
    l.total_bytes = j.at("total_bytes").get<uint64_t>();
    uint64_t end = 0;
    for (const Json& e : j.at("slots")) {
      if (!e.is_array() || e.size() != 6) return absl::DataLossError("layout: bad slot entry");
      PageSlot s;
      const int kind = e[0].get<int>();
      if (kind != static_cast<int>(PageKind::kInt2) && kind != static_cast<int>(PageKind::kBf16)) {
        return absl::DataLossError(absl::StrCat("layout: bad page kind ", kind));
      }
      s.kind = static_cast<PageKind>(kind);
      s.first_token = e[1].get<uint32_t>();
      s.token_count = e[2].get<uint32_t>();
      s.offset = e[3].get<uint64_t>();
      s.bytes = e[4].get<uint64_t>();
      const std::string cs = e[5].get<std::string>();
      if (cs.size() != 16 || cs.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return absl::DataLossError("layout: bad checksum '" + cs + "'");
      }
      s.checksum = std::stoull(cs, nullptr, 16);
      if (s.offset % kSlotAlignment != 0 || s.offset < end || s.bytes < kPageHeaderBytes) {
        return absl::DataLossError(
            absl::StrCat("layout: slot ", l.slots.size(), " is unaligned, overlaps or is short"));
      }
      end = s.offset + s.bytes;
      l.slots.push_back(s);
    }
    if (end > l.total_bytes) return absl::DataLossError("layout: slots run past total_bytes");
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat("layout: ", e.what()));
  }
  return l;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace oscarkv::pd::gpu
