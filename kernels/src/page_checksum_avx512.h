// Internal to page_checksum.cc: the page copy with its checksum in one AVX-512 loop. Each
// 64-byte stripe is loaded once into a register, stored to the destination and folded into
// XXH3's accumulators from that same register, so the hash adds no pass over the bytes (not
// even one from L2) and runs under the copy's memory time. The value hashed is exactly the
// value written: the checksum still vouches for the copy, not for a source that may change.
//
// The result is XXH3-64 (seed 0, default secret) of header bytes [0, 56) then bytes [64, n):
// the page checksum of docs/FORMAT.md §1, bit-identical to the streaming PageChecksummer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace oscarkv::checksum_internal {

// Pages at least this long take the fused loop (XXH3's long-input path needs > 240 bytes of
// hashed input; the header's irregular first stripe needs 72 bytes).
inline constexpr size_t kFusedMinBytes = 1024;

// True when this CPU (and the OS) run AVX-512F code.
bool FusedCopyAvailable();

// Copies n bytes (n >= kFusedMinBytes, no overlap) and returns the page checksum of the copy.
// Only when FusedCopyAvailable().
uint64_t FusedCopyWithChecksum(uint8_t* dst, const uint8_t* src, size_t n);

}  // namespace oscarkv::checksum_internal
