// PagePool: fixed-size page slots carved out of one Arena.
//
// The arena is split into chunks (default 2 MiB, the huge-page size). A *size class* is a slot
// size (rounded up to 64 bytes); the pool assigns spans -- runs of contiguous chunks -- to size
// classes on demand and cuts each span into equal slots. A span whose slots are all free goes
// back to the chunk map at once, so memory moves between classes as the mix of page kinds
// changes. Slot offsets are 64-byte aligned (spans start on chunk boundaries).
//
// Costs: Allocate and Free are O(1) while a class has a span with a free slot (free lists);
// taking a new span scans the chunk bitmap (O(chunks / 64) words), once per span of many slots.
// Ref/Unref are lock-free atomics; only the Unref that frees takes the pool lock.
//
// Refcounts: Allocate returns a slot with refcount 1. Ref adds one (the caller must already hold
// a reference), Unref drops one and frees the slot at zero. Calling Ref/Unref/Data on an
// offset that is not an allocated slot is a caller bug; CheckSlot validates an offset first.
//
// Thread-safe. The pool owns its arena.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "oscarkv/allocator/arena.h"

namespace oscarkv {

struct PagePoolOptions {
  size_t chunk_bytes = size_t{2} << 20;         // power of two, >= 4096
  size_t target_span_bytes = size_t{32} << 20;  // spans hold about this much (>= one slot)
  uint32_t max_size_classes = 64;
};

using SizeClassId = uint32_t;

struct SizeClassStats {
  size_t slot_bytes = 0;
  size_t slots_per_span = 0;
  size_t span_chunks = 0;
  size_t spans = 0;
  size_t slots_used = 0;
};

// The span holding a slot: its slots are at start + i * slot_bytes, i < slots.
struct SpanInfo {
  uint64_t start = 0;
  size_t slot_bytes = 0;
  uint32_t slots = 0;
  SizeClassId cls = 0;
};

struct PagePoolStats {
  size_t arena_bytes = 0;
  size_t chunk_bytes = 0;
  size_t chunks_total = 0;
  size_t chunks_free = 0;
  size_t slots_used = 0;
  size_t bytes_used = 0;  // slot bytes of allocated slots
  std::vector<SizeClassStats> classes;
};

class PagePool {
 public:
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(std::unique_ptr<Arena> arena,
                                                          PagePoolOptions options = {});
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // The class for slots of `bytes` (created on first use; same bytes -> same id).
  // INVALID_ARGUMENT for 0 or a slot larger than the arena, RESOURCE_EXHAUSTED past
  // max_size_classes.
  absl::StatusOr<SizeClassId> SizeClassFor(size_t bytes);
  size_t SlotBytes(SizeClassId cls) const;

  // A free slot of class `cls` (refcount 1), as a byte offset into the arena.
  // RESOURCE_EXHAUSTED when no slot is free and no span can be formed; INVALID_ARGUMENT for an
  // unknown class.
  absl::StatusOr<uint64_t> Allocate(SizeClassId cls);

  void Ref(uint64_t offset);
  // Returns true when this call freed the slot.
  bool Unref(uint64_t offset);
  uint32_t RefCount(uint64_t offset) const;
  // OK if `offset` is the start of an allocated slot; then *cls is its class.
  absl::Status CheckSlot(uint64_t offset, SizeClassId* cls = nullptr) const;

  // The span containing the allocated slot at `offset` (NOT_FOUND otherwise). Eviction uses it
  // to free whole spans when another size class needs room.
  absl::Status SpanOfSlot(uint64_t offset, SpanInfo* info) const;

  uint8_t* Data(uint64_t offset) const { return arena_->base() + offset; }
  const Arena& arena() const { return *arena_; }
  size_t capacity_bytes() const { return arena_->size(); }
  size_t bytes_used() const { return bytes_used_.load(std::memory_order_relaxed); }
  size_t slots_used() const { return slots_used_.load(std::memory_order_relaxed); }
  PagePoolStats Stats() const;

 private:
  struct Span;
  struct SizeClass;
  PagePool(std::unique_ptr<Arena> arena, PagePoolOptions options);
  Span* SpanOf(uint64_t offset) const;
  Span* NewSpanLocked(SizeClass& cls) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeSlotLocked(Span* span, uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FindFreeRunLocked(size_t n, size_t* first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkChunksLocked(size_t first, size_t n, bool used) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<Arena> arena_;
  const PagePoolOptions options_;
  const size_t num_chunks_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> chunk_used_bits_ ABSL_GUARDED_BY(mu_);
  size_t chunks_free_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<SizeClass>> classes_ ABSL_GUARDED_BY(mu_);
  // chunk index -> owning span (nullptr when free). Entries of a live span are written before its
  // slots are handed out and cleared only after all are freed, so lock-free readers that hold a
  // slot reference always see their span.
  std::unique_ptr<std::atomic<Span*>[]> chunk_owner_;
  std::atomic<size_t> bytes_used_{0};
  std::atomic<size_t> slots_used_{0};
};

}  // namespace oscarkv
