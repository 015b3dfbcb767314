// Definitions shared by the PageCache source files (not part of the public header).
#pragma once

#include <string>

#include "oscarkv/service/page_cache.h"

namespace oscarkv::service {

struct PageCache::Codec {
  uint32_t index = 0;
  CodecId id;
  std::string id_bytes;
  CodecProfile profile;
  std::string profile_proto;  // the registration, serialized (persisted in the SSD tier)
  uint64_t page_bytes[3] = {0, 0, 0};  // by PageKind value
  absl::StatusOr<SizeClassId> cls[3] = {absl::UnknownError(""), absl::UnknownError(""),
                                        absl::UnknownError("")};
};

}  // namespace oscarkv::service
