// Definitions shared by the PageCache source files (not part of the public header).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "oscarkv/kernels/page_checksum.h"
#include "oscarkv/service/page_cache.h"

namespace oscarkv::service {

// A codec table slot. `live` and `tag` are what lock-free readers look at first: the other
// fields are written only while `live` is 0, before `live` publishes them (release), and read
// only under a CodecRef that saw `live` set (PageCache::CodecRef).
struct PageCache::Codec {
  std::atomic<uint64_t> live{0};  // the serial of the registration in this slot; 0 = free
  std::atomic<uint64_t> tag{0};   // MatchTag(ns, id) while live, 0 while not
  mutable std::atomic<uint32_t> users{0};  // CodecRefs held
  uint32_t owner = 0;             // the tenant charged for it (Quota::kCodecs)
  uint32_t index = 0;
  uint32_t ns = 0;  // the namespace it was registered in (tenants.h)
  CodecId id;
  CodecProfile profile;
  std::string profile_proto;  // the registration, serialized (persisted in the SSD tier)
  std::string tier_ns;        // its namespace's label in the SSD tier (PageTier::SavedCodec)
  uint64_t tier_tag = 0;      // ... and the tag its pages' tier keys carry
  uint64_t page_bytes[3] = {0, 0, 0};  // by PageKind value
  absl::StatusOr<SizeClassId> cls[3] = {absl::UnknownError(""), absl::UnknownError(""),
                                        absl::UnknownError("")};
};

struct PageCache::Reservation {
  struct Item {
    IndexKey key;
    uint64_t gen = 0;
    uint64_t offset = 0;
    uint64_t page_bytes = 0;
    PageKind kind = PageKind::kInt2;
    bool committed = false;
    bool released = false;  // aborted, expired or failed
    bool streamed = false;  // bytes came through WritePages: always verified here at Commit
    // WritePages (and StageWrite) copy each chunk into the slot and hash the bytes written in
    // the same pass (PageCopyChecksummer, page_checksum.h) while the page arrives in order from
    // offset 0: once `hash` has seen every byte, Commit compares its digest instead of reading
    // the page again. A chunk out of order (a gap, a rewrite) drops it, and Commit hashes the
    // whole slot (counted in commit_rehashes).
    std::unique_ptr<PageCopyChecksummer> hash;
    bool hash_broken = false;
  };
  uint64_t id = 0;
  uint32_t tenant = 0;
  const Codec* codec = nullptr;
  uint64_t codec_serial = 0;  // the registration it was made for (CodecRef::Acquire)
  int64_t deadline_ms = 0;
  // Serializes WritePages copies, Commit verification and Abort/expiry of this reservation, so a
  // page can never change between its checksum check and its publication.
  absl::Mutex mu;
  std::vector<Item> items ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<BlockKey, uint32_t> by_key ABSL_GUARDED_BY(mu);
  size_t pending ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace oscarkv::service
