#include "page_fetch.h"

#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "oscarkv/kernels/page_checksum.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/proto/codec_convert.h"
#include "oscarkv/util/status_macros.h"
#include "rpc_core.h"
#include "shm_mapping.h"

namespace oscarkv::client {
namespace {

namespace pb = ::oscarkv::v1;

std::string KeyBytes(const BlockKey& k) {
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}

}  // namespace

absl::StatusOr<PageRef> PageRefFromProto(const pb::PageRef& r) {
  PageRef out;
  if (r.key().size() != out.key.bytes.size()) {
    return absl::InternalError(absl::StrCat("daemon returned a ", r.key().size(), "-byte key"));
  }
  std::memcpy(out.key.bytes.data(), r.key().data(), out.key.bytes.size());
  auto kind = proto::FromProto(r.kind());
  if (!kind.ok()) return absl::InternalError(absl::StrCat("daemon: ", kind.status().message()));
  out.kind = *kind;
  out.offset = r.offset();
  out.bytes = r.bytes();
  out.token_count = r.token_count();
  return out;
}

std::vector<std::span<uint8_t>> OwnedBuffers(std::span<const PageRef> pages,
                                             std::vector<std::vector<uint8_t>>* owned) {
  const size_t first = owned->size();
  for (const PageRef& p : pages) owned->emplace_back(p.bytes);
  std::vector<std::span<uint8_t>> out;
  for (size_t i = first; i < owned->size(); ++i) out.emplace_back((*owned)[i]);
  return out;
}

absl::Status ShmPageSource::Fetch(uint64_t, std::span<const PageRef> pages,
                                  std::span<const std::span<uint8_t>> dst, bool hash,
                                  std::vector<std::optional<uint64_t>>* digests) {
  for (size_t i = 0; i < pages.size(); ++i) {
    if (!shm_.Contains(pages[i].offset, pages[i].bytes)) {
      return absl::InternalError("daemon leased a page outside its shared-memory segment");
    }
    const std::span<const uint8_t> src(shm_.data() + pages[i].offset, pages[i].bytes);
    if (hash) {
      (*digests)[i] = CopyPageWithChecksum(dst[i], src);  // one pass: copied, then hashed in L2
    } else {
      std::memcpy(dst[i].data(), src.data(), src.size());
    }
  }
  return absl::OkStatus();
}

absl::Status StreamPageSource::Fetch(uint64_t lease_id, std::span<const PageRef> pages,
                                     std::span<const std::span<uint8_t>> dst, bool hash,
                                     std::vector<std::optional<uint64_t>>* digests) {
  std::unordered_map<std::string, size_t> index;
  pb::ReadRequest req;
  req.set_lease_id(lease_id);
  if (by_key_) {
    for (size_t i = 0; i < pages.size(); ++i) {
      index.emplace(KeyBytes(pages[i].key), i);
      req.add_keys(KeyBytes(pages[i].key));
    }
  }
  auto ctx = rpc_.Context();
  auto reader = rpc_.stub().ReadPages(ctx.get(), req);
  // Pages whose chunks arrive in order are hashed chunk by chunk right after each copy.
  std::vector<std::unique_ptr<PageChecksummer>> hashers(pages.size());
  std::vector<uint64_t> got(pages.size(), 0);
  int64_t in_order = -1;  // !by_key_: the page the chunks are filling
  pb::ReadChunk chunk;
  absl::Status bad;
  while (reader->Read(&chunk)) {
    size_t i = 0;
    if (by_key_) {
      auto it = index.find(chunk.key());
      if (it == index.end()) {
        bad = absl::DataLossError("ReadPages: daemon sent a page that was not asked for");
        break;
      }
      i = it->second;
    } else {
      if (chunk.offset() == 0) ++in_order;
      if (in_order < 0 || in_order >= static_cast<int64_t>(pages.size()) ||
          chunk.key() != KeyBytes(pages[in_order].key)) {
        bad = absl::DataLossError("ReadPages: chunk does not match the lease's pages");
        break;
      }
      i = static_cast<size_t>(in_order);
    }
    const std::span<uint8_t> out = dst[i];
    if (chunk.page_bytes() != out.size() || chunk.offset() > out.size() ||
        chunk.data().size() > out.size() - chunk.offset()) {
      bad = absl::DataLossError("ReadPages: daemon sent a chunk outside the requested pages");
      break;
    }
    std::memcpy(out.data() + chunk.offset(), chunk.data().data(), chunk.data().size());
    if (hash && chunk.offset() == 0 && got[i] == 0) hashers[i] = std::make_unique<PageChecksummer>();
    if (hashers[i] != nullptr && hashers[i]->offset() == chunk.offset()) {
      hashers[i]->Update(out.subspan(chunk.offset(), chunk.data().size()));
    } else {
      hashers[i].reset();  // out of order: FetchVerified hashes the page after the copy
    }
    got[i] += chunk.data().size();
  }
  if (!bad.ok()) ctx->TryCancel();
  absl::Status s = FromGrpc(reader->Finish(), "ReadPages");
  if (!bad.ok()) return bad;
  OSCARKV_RETURN_IF_ERROR(s);
  for (size_t i = 0; i < pages.size(); ++i) {
    if (got[i] != dst[i].size()) {
      return absl::DataLossError(absl::StrCat("ReadPages: page ", i, " arrived with ", got[i],
                                              " of ", dst[i].size(), " bytes"));
    }
    if (hashers[i] != nullptr && hashers[i]->offset() == dst[i].size()) {
      (*digests)[i] = hashers[i]->Digest();
    }
  }
  return absl::OkStatus();
}

absl::Status FetchVerified(const Codec& codec, uint64_t lease_id, std::span<const PageRef> pages,
                           std::span<const std::span<uint8_t>> dst, PageSource& source,
                           bool verify_checksums, size_t first_index,
                           std::optional<size_t>* corrupt) {
  if (dst.size() < pages.size()) {
    return absl::InvalidArgumentError(absl::StrCat(pages.size(), " pages but ", dst.size(),
                                                   " destination buffers"));
  }
  std::vector<std::span<uint8_t>> out(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    const uint64_t want = codec.page_bytes(pages[i].kind);
    if (pages[i].bytes != want) {
      return absl::DataLossError(absl::StrCat("daemon says ", PageKindName(pages[i].kind),
                                              " page ", first_index + i, " is ", pages[i].bytes,
                                              " bytes; the codec's are ", want));
    }
    if (dst[i].size() < want) {
      return absl::InvalidArgumentError(absl::StrCat("buffer ", first_index + i, " holds ",
                                                     dst[i].size(), " bytes, the page is ", want));
    }
    out[i] = dst[i].subspan(0, want);
  }
  if (pages.empty()) return absl::OkStatus();
  std::vector<std::optional<uint64_t>> digests(pages.size());
  OSCARKV_RETURN_IF_ERROR(source.Fetch(lease_id, pages, out, verify_checksums, &digests));
  for (size_t i = 0; i < pages.size(); ++i) {
    // Header always; the checksum here only for pages the source did not hash in its copy.
    auto hdr = ParsePageHeader(out[i], codec.profile, verify_checksums && !digests[i]);
    absl::Status s = hdr.status();
    if (s.ok() && hdr->kind != static_cast<uint8_t>(pages[i].kind)) {
      s = absl::DataLossError(absl::StrCat("page header says kind ", int{hdr->kind},
                                           ", the daemon says ", PageKindName(pages[i].kind)));
    }
    if (s.ok() && verify_checksums && digests[i] && *digests[i] != StoredPageChecksum(out[i])) {
      s = absl::DataLossError("page checksum mismatch: the page is corrupt");
    }
    if (!s.ok()) {  // whatever is wrong with a page the daemon served, it is not that page
      if (corrupt != nullptr) *corrupt = i;
      return absl::DataLossError(absl::StrCat("loaded page ", first_index + i, " (key ",
                                              pages[i].key.Hex(), "): ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace oscarkv::client
