// Internal to page_checksum.cc: the page copy with its checksum in one SIMD loop (AVX-512F, or
// AVX2 where the CPU has no AVX-512). Each 64-byte stripe is loaded once into registers, stored
// to the destination and folded into XXH3's accumulators from those same registers, so the hash
// adds no pass over the bytes (not even one from L2) and runs under the copy's memory time. The
// value hashed is exactly the value written: the checksum still vouches for the copy, not for a
// source that may change.
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

// The instruction sets the fused loop is built for, best first.
enum class FusedIsa { kAvx512, kAvx2, kNone };
// The best one this CPU (and the OS) run; kNone: the portable copy-then-hash path only.
FusedIsa BestFusedIsa();
// True when BestFusedIsa() is not kNone.
bool FusedCopyAvailable();
// Whether this CPU runs `isa` (tests run every one it does).
bool FusedIsaSupported(FusedIsa isa);

// Copies n bytes (n >= kFusedMinBytes, no overlap) and returns the page checksum of the copy.
// Only when FusedCopyAvailable().
uint64_t FusedCopyWithChecksum(uint8_t* dst, const uint8_t* src, size_t n);

// The same loop over a page that arrives in pieces, in order: XXH3's accumulators and the next
// stripe are carried from one piece to the next. A stripe that straddles two pieces is read back
// from the destination (at most 72 bytes per piece, still in L1), so the destination's bytes
// before the current offset must not change between pieces.
struct FusedCopyState {
  alignas(64) uint64_t acc[8];
  uint64_t page_bytes;   // n: known up front (XXH3's long loop needs the input length)
  uint64_t stripes;      // stripes of the long loop, before the last one
  uint64_t next_stripe;  // logical stripe to fold next
  uint64_t copied;       // bytes of the page written so far
  FusedIsa isa;          // the loop the page runs in, chosen by FusedCopyBegin
};

// Starts a page of n bytes (n >= kFusedMinBytes) on `isa` (default: BestFusedIsa(); it must be
// supported and not kNone).
void FusedCopyBegin(FusedCopyState* st, size_t n, FusedIsa isa = BestFusedIsa());
// Writes page[st->copied, +len) from src[0, len) (len <= n - st->copied, no overlap) and folds it.
void FusedCopyNext(FusedCopyState* st, uint8_t* page, const uint8_t* src, size_t len);
// The page checksum once st->copied == n.
uint64_t FusedCopyDigest(const FusedCopyState& st, const uint8_t* page);

}  // namespace oscarkv::checksum_internal
