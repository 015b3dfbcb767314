#include "oscarkv/allocator/page_pool.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"

namespace oscarkv {

namespace {
constexpr size_t kSlotAlign = 64;
size_t RoundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

struct PagePool::SizeClass {
  SizeClassId id = 0;
  size_t slot_bytes = 0;
  uint32_t slots_per_span = 0;
  size_t span_chunks = 0;
  Span* partial = nullptr;  // spans with at least one free slot (doubly linked)
  size_t spans = 0;
  size_t used = 0;
};

struct PagePool::Span {
  SizeClass* cls = nullptr;
  uint64_t start = 0;
  size_t first_chunk = 0;
  uint32_t slots = 0;
  std::vector<uint32_t> free_list;  // stack of free slot indices
  std::unique_ptr<std::atomic<uint32_t>[]> refs;
  Span* prev = nullptr;
  Span* next = nullptr;
  bool in_partial = false;
};

PagePool::PagePool(std::unique_ptr<Arena> arena, PagePoolOptions options)
    : arena_(std::move(arena)),
      options_(options),
      num_chunks_(arena_->size() / options.chunk_bytes) {
  chunk_used_bits_.assign((num_chunks_ + 63) / 64, 0);
  // Bits past the last chunk count as used so runs never extend beyond the arena.
  for (size_t i = num_chunks_; i < chunk_used_bits_.size() * 64; ++i) {
    chunk_used_bits_[i / 64] |= uint64_t{1} << (i % 64);
  }
  chunks_free_ = num_chunks_;
  chunk_owner_ = std::make_unique<std::atomic<Span*>[]>(num_chunks_);
  for (size_t i = 0; i < num_chunks_; ++i) chunk_owner_[i].store(nullptr);
}

PagePool::~PagePool() {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < num_chunks_;) {
    Span* s = chunk_owner_[i].load();
    if (s == nullptr) {
      ++i;
      continue;
    }
    i = s->first_chunk + s->cls->span_chunks;  // every chunk of the span points at it
    delete s;
  }
}

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(std::unique_ptr<Arena> arena,
                                                           PagePoolOptions options) {
  if (arena == nullptr) return absl::InvalidArgumentError("page pool: no arena");
  if (options.chunk_bytes < 4096 || !std::has_single_bit(options.chunk_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page pool: chunk_bytes must be a power of two >= 4096, got ", options.chunk_bytes));
  }
  if (arena->size() < options.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("page pool: arena of ", arena->size(),
                                                   " bytes is smaller than one chunk (",
                                                   options.chunk_bytes, " bytes)"));
  }
  if (options.max_size_classes == 0) options.max_size_classes = 1;
  return std::unique_ptr<PagePool>(new PagePool(std::move(arena), options));
}

absl::StatusOr<SizeClassId> PagePool::SizeClassFor(size_t bytes) {
  const size_t usable = num_chunks_ * options_.chunk_bytes;
  if (bytes == 0) return absl::InvalidArgumentError("page pool: slot size 0");
  const size_t slot = RoundUp(bytes, kSlotAlign);
  if (slot > usable) {
    return absl::InvalidArgumentError(absl::StrCat("page pool: a ", bytes,
                                                   "-byte slot does not fit in the ", usable,
                                                   "-byte pool"));
  }
  absl::MutexLock lock(&mu_);
  for (const auto& c : classes_) {
    if (c->slot_bytes == slot) return c->id;
  }
  if (classes_.size() >= options_.max_size_classes) {
    return absl::ResourceExhaustedError(absl::StrCat("page pool: more than ",
                                                     options_.max_size_classes,
                                                     " distinct page sizes"));
  }
  auto c = std::make_unique<SizeClass>();
  c->id = static_cast<SizeClassId>(classes_.size());
  c->slot_bytes = slot;
  // Small pools get small spans so several classes can coexist.
  const size_t target =
      std::max(options_.chunk_bytes, std::min(options_.target_span_bytes, usable / 8));
  const size_t want_slots = std::max<size_t>(1, target / slot);
  c->span_chunks = std::min(num_chunks_, RoundUp(want_slots * slot, options_.chunk_bytes) /
                                             options_.chunk_bytes);
  c->slots_per_span = static_cast<uint32_t>(c->span_chunks * options_.chunk_bytes / slot);
  classes_.push_back(std::move(c));
  return classes_.back()->id;
}

size_t PagePool::SlotBytes(SizeClassId cls) const {
  absl::MutexLock lock(&mu_);
  return cls < classes_.size() ? classes_[cls]->slot_bytes : 0;
}

namespace {
template <typename S>
void ListPush(S** head, S* s) {
  s->prev = nullptr;
  s->next = *head;
  if (*head != nullptr) (*head)->prev = s;
  *head = s;
  s->in_partial = true;
}
template <typename S>
void ListRemove(S** head, S* s) {
  if (s->prev != nullptr) s->prev->next = s->next;
  if (s->next != nullptr) s->next->prev = s->prev;
  if (*head == s) *head = s->next;
  s->prev = s->next = nullptr;
  s->in_partial = false;
}
}  // namespace

bool PagePool::FindFreeRunLocked(size_t n, size_t* first) {
  size_t run = 0;
  for (size_t w = 0; w < chunk_used_bits_.size(); ++w) {
    const uint64_t bits = chunk_used_bits_[w];
    if (bits == ~uint64_t{0}) {
      run = 0;
      continue;
    }
    if (bits == 0) {
      if (run + 64 >= n) {
        *first = w * 64 - run;
        return true;
      }
      run += 64;
      continue;
    }
    for (size_t b = 0; b < 64; ++b) {
      if (bits & (uint64_t{1} << b)) {
        run = 0;
      } else if (++run == n) {
        *first = w * 64 + b + 1 - n;
        return true;
      }
    }
  }
  return false;
}

void PagePool::MarkChunksLocked(size_t first, size_t n, bool used) {
  for (size_t i = first; i < first + n; ++i) {
    const uint64_t bit = uint64_t{1} << (i % 64);
    if (used) {
      chunk_used_bits_[i / 64] |= bit;
    } else {
      chunk_used_bits_[i / 64] &= ~bit;
    }
  }
  if (used) {
    chunks_free_ -= n;
  } else {
    chunks_free_ += n;
  }
}

PagePool::Span* PagePool::NewSpanLocked(SizeClass& cls) {
  size_t first = 0;
  if (cls.span_chunks > chunks_free_ || !FindFreeRunLocked(cls.span_chunks, &first)) {
    return nullptr;
  }
  MarkChunksLocked(first, cls.span_chunks, true);
  auto* s = new Span;
  s->cls = &cls;
  s->first_chunk = first;
  s->start = uint64_t{first} * options_.chunk_bytes;
  s->slots = cls.slots_per_span;
  s->free_list.resize(s->slots);
  // Hand out low offsets first (pop from the back).
  for (uint32_t i = 0; i < s->slots; ++i) s->free_list[i] = s->slots - 1 - i;
  s->refs = std::make_unique<std::atomic<uint32_t>[]>(s->slots);
  for (uint32_t i = 0; i < s->slots; ++i) s->refs[i].store(0, std::memory_order_relaxed);
  for (size_t i = first; i < first + cls.span_chunks; ++i) {
    chunk_owner_[i].store(s, std::memory_order_release);
  }
  ++cls.spans;
  ListPush(&cls.partial, s);
  return s;
}

absl::StatusOr<uint64_t> PagePool::Allocate(SizeClassId id) {
  absl::MutexLock lock(&mu_);
  if (id >= classes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("page pool: unknown size class ", id));
  }
  SizeClass& cls = *classes_[id];
  Span* s = cls.partial;
  if (s == nullptr) s = NewSpanLocked(cls);
  if (s == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("page pool full: no free ", cls.slot_bytes,
                                                     "-byte slot (", bytes_used(), " of ",
                                                     capacity_bytes(), " bytes in use)"));
  }
  const uint32_t index = s->free_list.back();
  s->free_list.pop_back();
  if (s->free_list.empty()) ListRemove(&cls.partial, s);
  s->refs[index].store(1, std::memory_order_release);
  ++cls.used;
  bytes_used_.fetch_add(cls.slot_bytes, std::memory_order_relaxed);
  slots_used_.fetch_add(1, std::memory_order_relaxed);
  return s->start + uint64_t{index} * cls.slot_bytes;
}

PagePool::Span* PagePool::SpanOf(uint64_t offset) const {
  const size_t chunk = offset / options_.chunk_bytes;
  if (chunk >= num_chunks_) return nullptr;
  return chunk_owner_[chunk].load(std::memory_order_acquire);
}

absl::Status PagePool::CheckSlot(uint64_t offset, SizeClassId* cls) const {
  absl::MutexLock lock(&mu_);
  Span* s = SpanOf(offset);
  if (s == nullptr || offset < s->start) {
    return absl::NotFoundError(absl::StrCat("offset ", offset, " is not in a slot"));
  }
  const uint64_t rel = offset - s->start;
  if (rel % s->cls->slot_bytes != 0 || rel / s->cls->slot_bytes >= s->slots) {
    return absl::NotFoundError(absl::StrCat("offset ", offset, " is not a slot start"));
  }
  if (s->refs[rel / s->cls->slot_bytes].load(std::memory_order_acquire) == 0) {
    return absl::NotFoundError(absl::StrCat("slot at offset ", offset, " is free"));
  }
  if (cls != nullptr) *cls = s->cls->id;
  return absl::OkStatus();
}

absl::Status PagePool::SpanOfSlot(uint64_t offset, SpanInfo* info) const {
  SizeClassId cls;
  if (absl::Status s = CheckSlot(offset, &cls); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  Span* s = SpanOf(offset);
  if (s == nullptr) return absl::NotFoundError("slot was freed");
  info->start = s->start;
  info->slot_bytes = s->cls->slot_bytes;
  info->slots = s->slots;
  info->cls = s->cls->id;
  return absl::OkStatus();
}

void PagePool::Ref(uint64_t offset) {
  Span* s = SpanOf(offset);
  s->refs[(offset - s->start) / s->cls->slot_bytes].fetch_add(1, std::memory_order_relaxed);
}

uint32_t PagePool::RefCount(uint64_t offset) const {
  Span* s = SpanOf(offset);
  if (s == nullptr) return 0;
  return s->refs[(offset - s->start) / s->cls->slot_bytes].load(std::memory_order_acquire);
}

bool PagePool::Unref(uint64_t offset) {
  Span* s = SpanOf(offset);
  if (s == nullptr) return false;
  const uint32_t index = static_cast<uint32_t>((offset - s->start) / s->cls->slot_bytes);
  std::atomic<uint32_t>& ref = s->refs[index];
  uint32_t cur = ref.load(std::memory_order_relaxed);
  do {
    if (cur == 0) return false;  // already free: a caller bug, never a double free
  } while (!ref.compare_exchange_weak(cur, cur - 1, std::memory_order_acq_rel));
  if (cur != 1) return false;
  absl::MutexLock lock(&mu_);
  FreeSlotLocked(s, index);
  return true;
}

void PagePool::FreeSlotLocked(Span* s, uint32_t index) {
  SizeClass& cls = *s->cls;
  s->free_list.push_back(index);
  --cls.used;
  bytes_used_.fetch_sub(cls.slot_bytes, std::memory_order_relaxed);
  slots_used_.fetch_sub(1, std::memory_order_relaxed);
  if (s->free_list.size() == s->slots) {
    // Whole span free: give its chunks back so any class can use them.
    if (s->in_partial) ListRemove(&cls.partial, s);
    const size_t n = cls.span_chunks;
    for (size_t i = s->first_chunk; i < s->first_chunk + n; ++i) {
      chunk_owner_[i].store(nullptr, std::memory_order_release);
    }
    MarkChunksLocked(s->first_chunk, n, false);
    --cls.spans;
    delete s;
    return;
  }
  if (!s->in_partial) ListPush(&cls.partial, s);
}

PagePoolStats PagePool::Stats() const {
  absl::MutexLock lock(&mu_);
  PagePoolStats st;
  st.arena_bytes = arena_->size();
  st.chunk_bytes = options_.chunk_bytes;
  st.chunks_total = num_chunks_;
  st.chunks_free = chunks_free_;
  st.slots_used = slots_used();
  st.bytes_used = bytes_used();
  for (const auto& c : classes_) {
    st.classes.push_back({c->slot_bytes, c->slots_per_span, c->span_chunks, c->spans, c->used});
  }
  return st;
}

}  // namespace oscarkv
