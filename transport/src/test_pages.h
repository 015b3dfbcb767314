// Test-only: deterministic real pages (EncodePage output) for transport tests and their peer.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/page_format.h"

namespace oscarkv::transport::testing {

// Page `index` of the pool seeded `seed`: rows drawn from a fixed PRNG, so any process
// regenerates the same bytes. `out` must be GeometryFor(profile, kind).page_bytes() long.
absl::Status FillPage(const CodecProfile& profile, PageKind kind, uint32_t seed, uint32_t index,
                      std::span<uint8_t> out);

// How many of the `n` consecutive pages at `pool` parse with a valid checksum.
size_t CountValidPages(const uint8_t* pool, size_t page_bytes, size_t n);

}  // namespace oscarkv::transport::testing
