// Internal interface of the paged decode kernels: the plan, the kernel arguments with every
// launch option, and the launch. The product path is PagedDecoder (oscarkv/cuda/decode_runner.h),
// which plans, picks these options per plan and launches; this header is for the kernels' own
// sources, their GPU tests and bench/ (which times the alternatives beside the default to show
// that the default launch is the fastest configuration). Not installed, not for engines.
//
// Launch = plan (host) + run (device):
//   * PlanDecode splits every (sequence, KV head) into work items: runs of consecutive
//     64-token slices of one page kind, sized so the whole batch fills the GPU (split-KV).
//   * LaunchDecodeAttention runs one CTA per work item (an INT2 kernel and a BF16 kernel that
//     overlap; INT2 CTAs of 4 warps, or of 8 at about one per SM for B=1-like batches, see
//     int2_warps): the queries are rotated (q' = q·R_K, times the softmax scale) in every CTA or
//     once per (sequence, KV head) by a small kernel ahead of the INT2 kernel (rotate_in_cta),
//     then all query heads of the KV head are served from one read of each K/V slice, INT2 codes
//     turned into tensor-core operands in registers (no dequantization pass); the last CTA of
//     each (sequence, KV head) combines the partial results with their log-sum-exp (or a merge
//     kernel does, see fused_merge) and optionally multiplies by R_Vᵀ.
//
// Measurements behind the defaults are in bench/results/NOTES.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oscarkv/cuda/decode_attention.h"
#include "oscarkv/cuda/decode_runner.h"

#include <cuda_runtime_api.h>

namespace oscarkv::cuda {

inline constexpr int32_t kMaxItemSlices = 192;  // slices per work item, at most

// One CTA's work: slices [first_slice, first_slice + num_slices) of sequence `seq` (slice s is
// tokens [64*(s % spp), +64) of the sequence's page s / spp), KV head `kv_head`, all of kind
// `kind` (1 INT2, 2 BF16).
struct DecodeWorkItem {
  int32_t seq;
  int32_t kv_head;
  int32_t kind;
  int32_t first_slice;
  int32_t num_slices;
  int32_t page_entry = 0;  // seq_page_indptr[seq], filled by the planner (saves a lookup)
};

// DecodeWorkItem::kind of a capture decoder's padding slots (PagedDecoder::Update): the grid is
// fixed at capture for the capacity, the batch's items fill its first slots and the CTAs of the
// rest exit at once (no pair counts them, nothing reads their partials).
inline constexpr int32_t kPaddingItemKind = -1;

struct DecodePlan {
  std::vector<DecodeWorkItem> items;  // ordered by (seq, kv_head)
  std::vector<int32_t> item_indptr;   // [num_seqs * num_kv_heads + 1] into items
  std::vector<int32_t> order;         // item indices: the INT2 items, then the BF16 items
  // Items run by the INT2 kernel (the first entries of `order`): the INT2 items, plus the BF16
  // items when INT2 slices carry most of the cost (the INT2 kernel then runs every item, so
  // the few BF16 items do not wait for INT2 CTAs to leave); the rest run in the BF16 kernel.
  int32_t num_int2_items = 0;
  size_t int2_slices = 0, bf16_slices = 0;
  // Bytes the decode kernel reads from the pages (K and V segments of the attended layer).
  size_t page_bytes_read = 0;
  // (sequence, KV head) pairs without any item (empty sequences); their output is written by
  // the merge kernel, so such a plan cannot use DecodeParams::fused_merge.
  int32_t empty_pairs = 0;
  // Items that are halves of a split last part (PlanDecode's tail_items), last among the INT2
  // items in `order`.
  int32_t tail_items = 0;
};

// Host-side planning from host copies of the page table. `target_ctas` is the number of CTAs to
// aim for (0 = one wave for `num_sms`: 3 CTAs per SM, or 2 -- the BF16 kernel's residency -- when
// BF16 slices carry most of the cost; an INT2-dominated batch that would not fit one wave of 3
// per SM only because of its BF16 items gets 2 INT2 items per SM and its BF16 items in the
// third slots). session5_slots: the previous planner (without that last rule), for side-by-side
// benchmarks. tail_items (0 = off, the default): in a plan with more INT2 items than CTA slots,
// the last part of the last tail_items / 2 INT2 runs is split in two halves dispatched after every
// other INT2 item (an experiment for the bench, `--target-ctas tailN`; measured no faster).
// Errors: InvalidArgument on a malformed table.
absl::StatusOr<DecodePlan> PlanDecode(const DecodeShape& shape,
                                      const std::vector<int32_t>& seq_page_indptr,
                                      const std::vector<int32_t>& seq_page_ids,
                                      const std::vector<uint8_t>& page_kinds, int num_sms,
                                      int target_ctas = 0, bool session5_slots = false,
                                      int tail_items = 0);

// The INT2 kernel's products. kPackedInt8Values (the product path at GQA <= 4): the score
// product on int8 tensor cores (the rotated query as a 14-bit fixed point in int8 high and low
// parts, carried by the padding columns of the mma tiles), the value product on int8 tensor
// cores too (16-bit integer weights W = p·scale in per-warp units that shift when the running
// max moves); error ~1e-6..3e-5 relative at every item length; needs V scales >= 0 (every
// FORMAT.md range mode writes them so). kBaseline: fp16 operands 1024 + 2^k·code on both
// products, one query head per mma column -- the only kernel for GQA 5..8 (and what GQA > 4
// runs whatever the variant); its value product subtracts 1024·Σ W from large fp32 sums, so its
// error grows with the item length (~2e-4 for short items, 6-8e-3 at ~25 slices per warp).
// The other variants of the past (packed fp16 heads, split accumulators, int8 scores with fp16
// values) were superseded by kPackedInt8Values and removed (git history has them).
enum class DecodeVariant : int32_t {
  kBaseline = 0,
  kPackedInt8Values = 4,
};
// "baseline", "packed_int8_values".
const char* DecodeVariantName(DecodeVariant v);

// Everything one launch needs; pointers are device pointers.
struct DecodeParams {
  DecodeShape shape;
  PagedKVTable table;
  const DecodeWorkItem* items = nullptr;  // the plan, copied to the device
  int32_t num_items = 0;
  const int32_t* item_indptr = nullptr;   // [num_seqs * num_kv_heads + 1]
  const int32_t* item_order = nullptr;    // plan.order (INT2 items first)
  // items[item_order[i]] for every i (optional): a CTA's item in one load that does not wait
  // for the item_order load.
  const DecodeWorkItem* launch_items = nullptr;
  int32_t num_int2_items = 0;             // plan.num_int2_items
  // Capture decoders (nullptr otherwise): device count of the planned batch's (sequence, KV
  // head) pairs, written by PagedDecoder::Update. The rotation kernel's grid covers the
  // capacity; its CTAs of later pairs (sequences past the batch, whose only items are empty)
  // exit at once.
  const int32_t* active_pairs = nullptr;
  const float* q = nullptr;               // [num_seqs][num_q_heads][head_dim], unrotated
  const float* rot_k = nullptr;  // [num_kv_heads][d][d] R_K of `layer` (nullptr: q already rotated)
  const float* rot_v = nullptr;  // [num_kv_heads][d][d] R_V, used when unrotate_output
  bool unrotate_output = false;
  float softmax_scale = 0;       // <= 0: 1/sqrt(head_dim)
  // Splits each query into an fp16 high and low part for the INT2 score product (~fp32
  // accuracy); false uses one fp16 part (fewer tensor-core ops, ~1e-3 relative score error).
  bool precise_query = true;
  // INT2 kernel variant (see DecodeVariant); GQA > 4 always runs kBaseline.
  DecodeVariant variant = DecodeVariant::kPackedInt8Values;
  // Workspace for the partial results (DecodeWorkspaceBytes bytes, 256-byte aligned).
  void* workspace = nullptr;
  // The last CTA to finish an item of a (sequence, KV head) merges that pair's partials itself
  // (an arrival counter per pair in the workspace), instead of a separate merge kernel after the
  // whole grid. Needs a workspace whose counters are zero before the first launch (every
  // launch leaves them zero; PagedDecoder zeroes its workspace) and a plan with no empty pairs
  // (DecodePlan::empty_pairs == 0), and a 16-byte aligned `out`. PagedDecoder::Params() sets it
  // when the plan allows.
  bool fused_merge = false;
  // true (default): every INT2 CTA rotates its own queries (64 KiB of R_K and 512 FMA per
  // thread per CTA). false: a small kernel ahead of the INT2 kernel (one CTA of 256 threads per
  // (sequence, KV head)) rotates each pair's queries once into the workspace (and, see
  // prepared_fragments, builds their int8 fragments), and the INT2 kernel, launched as its
  // programmatic dependent, waits for them after its item, slice table and first K/V copies.
  // While the rotation kernel's CTAs run, the block scheduler places the INT2 CTAs on the other
  // SMs only (H200: 8 SMs at B=1, 64 at B=8 -- where it then stacks 3 INT2 items on 84 SMs
  // instead of 2 + a BF16 item: 56.6 -> 63.7 µs). PagedDecoder::Params() chooses per plan
  // (bench/results/NOTES.md session 13): B=1 x 100K 32.8 (in every CTA) -> 30.7 µs, B=32 x 32K
  // 181.6 -> 176.8, B=8 x 32K in every CTA. The BF16 kernel (BF16-heavy plans) always rotates
  // in its CTAs.
  bool rotate_in_cta = true;
  // With rotate_in_cta = false and an int8 score variant (packed_int8, packed_int8_values at
  // GQA <= 4): the rotation kernel also builds each pair's int8 query fragments (the score
  // product's B operands, per-head scales and Σ q: 64 bytes per lane, the same for every CTA
  // of the pair) and the INT2 CTAs load them instead of building them from the rotated queries
  // (no query area, no CTA barrier before the main loop; the query phase of a CTA is then its
  // wait for the rotation kernel plus one 64-byte load per lane: ~0.4 µs after it instead of
  // ~2.5). false: every CTA builds them. Same results either way. Ignored otherwise.
  bool prepared_fragments = true;
  // With rotate_in_cta = false: the INT2 CTAs wait for the rotation kernel and load their
  // prepared fragments (the BF16 items of the INT2 kernel: their rotated queries) before they
  // issue their first K/V copies instead of after them -- a load issued after them waits
  // behind the SM's outstanding copy bytes (H200, B=32 x 32K timeline, branch h-b32 of session
  // 15: the query phase of an INT2 item 3.7 -> 2.2 µs). The CTAs of the first wave then issue
  // their copies only once the rotation kernel is done; since the rotation kernel builds its
  // fragments on 8 warps (session 20) that is the better order for one-wave plans too (H200,
  // B=1 x 100K 28.9 -> 28.5-28.7 µs, 1 x 32K 18.8 -> 18.4; the timeline's wait for the rotation
  // kernel returns ~1.7 µs sooner without the CTA's own copies in flight), so
  // PagedDecoder::Params() sets it whenever it chooses the rotation kernel. Same results.
  bool fragments_before_copies = false;
  // fused_merge: the merging CTA copies each chunk of partials (up to 64 KiB) into shared memory
  // with one bulk (TMA) copy instead of 16-byte cp.async copies by every thread. Same results.
  // Measured (H200) within ~1% either way with 4-warp CTAs (B=1 x 100K 28.7-28.8 vs 29.0 us with
  // early_rotation; the merge is latency-bound, ~4 µs from the last partial to the output);
  // PagedDecoder::Params() sets it for plans of 4-warp CTAs. With 8-warp CTAs (256 threads issuing
  // the cp.async copies) the cp.async merge is faster: B=1 x 100K 25.3-25.4 vs 25.6-25.7 µs, 1 x
  // 32K 16.0-16.2 vs 16.1-16.4 (three rounds in one call, bench/results/NOTES.md session 23), so
  // Params() leaves it off for 8-warp plans (also when LaunchDecodeAttention then falls back to 4
  // warps for another variant or option).
  bool bulk_merge = false;
  // With rotate_in_cta = false: the rotation kernel is launched as a programmatic dependent of
  // the kernel before it on the stream, so its CTAs can start (and load R_K) while that kernel's
  // last CTAs finish; they wait for it (griddepcontrol.wait) before reading q or writing the
  // workspace, and the INT2 kernel can start only after that. Needs rot_k not written by that
  // kernel. Same results. Measured (H200, back-to-back launches): B=1 x 100K 30.7 -> 29.0 µs,
  // B=1 x 32K 19.8 -> 18.4, B=32 x 32K 176.8 -> 175.5 (the launch gap, not the kernel);
  // PagedDecoder::Params() sets it when the INT2 kernel is the launch's only kernel (a BF16
  // kernel ahead in the stream would let the rotation kernel's CTAs start early and hold SMs).
  bool early_rotation = false;
  // At most this many INT2-kernel CTAs resident per SM (1 or 2; 0: the kernel's own limit, 3),
  // by launching it with more dynamic shared memory than it uses, so the block scheduler cannot
  // stack a third CTA on an SM while other SMs hold one. Same results. PagedDecoder::Params()
  // sets 2 for plans of at most 2 per SM (B=1 with the rotation kernel: without it the BF16
  // items of 8 SMs ran as third CTAs beside two INT2 items, 32.4 vs 30.7 µs at B=1 x 100K).
  int32_t int2_ctas_per_sm = 0;
  // Warps per INT2-kernel CTA: 4 or 8 (InvalidArgument otherwise). 8 only takes effect for
  // packed_int8_values at GQA <= 4 with the rotation kernel and its prepared fragments (other
  // launches run the 4-warp kernel). Each warp streams its own slices through its own 3-slot
  // ring as in the 4-warp CTA; the registers (142 per thread) allow one 8-warp CTA per SM. With
  // a plan of about one CTA per SM, the one-wave batch keeps 8 warps per SM but has half the
  // items (half the partials to merge) and no second CTA on the SM whose warps compete for issue
  // and ends later (H200, B=1: 100K 28.4 -> 26.7-26.8 µs, 32K 18.2 -> 16.8-16.9; 6-warp CTAs two
  // per SM 28.6, 12-warp CTAs one per SM 29.0; bench/results/NOTES.md session 21). PagedDecoder
  // picks 8, with a plan for one CTA per SM, for the batches WantsWideInt2Ctas (decode_runner.h)
  // accepts: INT2-dominated, at most 2 INT2 CTAs per SM in the default plan, at least 8 INT2
  // slices per SM (B=1 from ~9K tokens). Results within float rounding of the 4-warp kernel's (the 8-warp CTAs'
  // partials and merge use ex2.approx and fast division, 26.95 -> 26.7 µs at B=1 x 100K).
  int32_t int2_warps = 4;
  // 8-warp INT2 CTAs with prepared fragments loaded before the copies: each warp issues the
  // copies of its first this-many slices (0..2) before it waits for the rotation kernel, the
  // rest of its first copies after the fragment loads. 0: all after (fragments_before_copies).
  // Same results. H200, B=1 x 100K, three rounds in one call: 1 slice 25.5-25.7 µs vs 0 slices
  // 25.7-26.1 and 2 slices 26.5-26.7 (the flood of copies delays the rotation kernel's end and
  // the wait); 1 x 32K 16.3-16.6 vs 16.5-16.7 vs 17.0 (bench/results/NOTES.md session 22).
  // PagedDecoder::Params() sets 1.
  int32_t early_slices = 0;
  // 8-warp INT2 CTAs: the K/V copies carry an L2 evict_first policy (else evict_normal), so the
  // streamed pages (read once per launch; 57.6 MB at B=1 x 100K, more than the 50 MB L2) leave
  // L2 before the data read again at every launch: R_K for the rotation kernel, the page and
  // slice tables, the kernel's code, the partials. Same results. H200, B=1 x 100K: 26.7-26.8 ->
  // 26.0 µs (slice tables loaded 0.6 µs sooner, the main loops start 0.3 µs sooner), 1 x 32K
  // 16.8-16.9 -> 16.6-16.7 (bench/results/NOTES.md session 22); PagedDecoder::Params() sets it.
  // Ignored by the 4-warp kernel.
  bool stream_evict_first = false;
  // INT2 items: each warp prefetches its next this-many slices after its first K/V copies into
  // L2 (prefetch.global.L2, fire and forget) before the CTA waits for its queries (the rotation
  // kernel, or its own rotation), hoping that HBM would otherwise idle in that prologue. 0: off
  // (the default). Same results. Measured slower at every shape (H200, 13:50 UTC 2026-11-30, two
  // rounds beside the default: B=1 x 100K 28.8-28.9 -> 29.3 / 29.8 / 31.7 / 33.2 us with 2 / 4 /
  // 8 / 16 slices, B=32 x 32K 170-171 -> 170-172 / 171-172 / 177 / 198): the first copies
  // already keep HBM busy during the wait (bench/results/NOTES.md session 18). Kept for A/B.
  int32_t l2_prefetch_slices = 0;
  // The W exchange of the fp16 value product (every variant but kPackedInt8Values) with query
  // head h in row h of its group, as before session 9. false (default): head h in row
  // ((h & 1) << 2) | (h >> 1), rows 72 halves apart, so the W stores and the B-fragment loads
  // hit 32 distinct banks. Same results; kept for side-by-side benchmarks.
  bool linear_w_rows = false;
  // Optional diagnostics of kPackedInt8Values (nullptr: none), three counters added to
  // atomically: [0] warp items whose weight units were set, [1] accumulator shifts (a weight
  // past the 16-bit range), [2] warp slices computed.
  uint32_t* int8_value_stats = nullptr;
  // With rotate_in_cta, the INT2 items of a (sequence, KV head) rotate its queries once: the
  // first of its CTAs to start (a ticket counter per pair in the workspace) rotates them and
  // publishes them in the workspace, the others wait for them. Needs zeroed tickets before the
  // first launch (every launch leaves them zero; PagedDecoder zeroes its workspace). Measured
  // slower than every CTA rotating its own queries (H200, B=1 x 100K: 36.2 vs 34.2 µs; the
  // publishing CTA's rotation takes ~6 µs), so off by default.
  bool share_rotation = false;
  // INT2 items with rotate_in_cta: the first K/V copies are issued after the query rotation
  // instead of before it, so its R_K loads (64 KiB per CTA) do not wait behind every CTA's
  // first copies (H200, B=1 x 100K: 34.2 vs 35.6 µs). false: copies first (always with the
  // rotation kernel, whose wait they overlap).
  bool copies_after_queries = true;
  float* out = nullptr;  // [num_seqs][num_q_heads][head_dim]
  float* lse = nullptr;  // [num_seqs][num_q_heads] (may be nullptr)
  // Diagnostics for the bench, never set by the product. debug_timeline: kDecodeTimelineWords
  // words per CTA of the INT2 kernel (blockIdx order), filled with the CTA's SM and phase
  // timestamps (DecodeTimelineSlot). debug_flags: kDecodeDebugNoMerge skips the fused merge's
  // work in the last CTA of each pair (the output is then incomplete).
  uint64_t* debug_timeline = nullptr;
  uint32_t debug_flags = 0;
};

inline constexpr uint32_t kDecodeDebugNoMerge = 1;
inline constexpr int kDecodeTimelineWords = 24;
// Words of a CTA's debug_timeline record: clock64 values unless named *_ns (%globaltimer).
enum DecodeTimelineSlot : int {
  kTlEntryNs = 0,
  kTlMeta = 1,        // smid | kind << 8 | num_slices << 16 | is_last << 32 | pair items << 40
  kTlEntry = 2,       // kernel entry
  kTlTable = 3,       // slice table loaded (after the barrier)
  kTlQuery = 4,       // rotated queries in shared memory
  kTlLoop = 5,        // query fragments built, main loop starts (thread 0)
  kTlWarpEnd = 6,     // 6..9: each warp's main loop done (its lane 0)
  kTlPartial = 10,    // the item's partial written
  kTlEnd = 11,        // CTA done (after the merge, if it merged)
  kTlEndNs = 12,
  kTlLoopNs = 13,
  kTlLoopsDone = 14,  // int2_warps 8: thread 0's main loop done and its copies landed (no barrier)
  kTlMerge = 15,      // the merging CTA: its merge starts (the arrival told it it is last)
  kTlWarpEnd4 = 16,   // 16..19: warps 4..7's main loops done (int2_warps 8)
  kTlEpilogue = 20,   // int2_warps 8: the INT2 epilogue done (thread 0, before FinishItem)
  kTlStates = 21,     // int2_warps 8: the warps' states in shared memory (after the barrier)
  kTlRotationEndNs = 22,  // the rotation kernel's CTA blockIdx.x (pair) done (%globaltimer)
  kTlRotationMarks = 23,  // ns before that: its wait returned | queries loaded << 21 | rotated << 42
};

// Partial outputs and (max, sum) pairs per item, one int32 arrival counter per
// (sequence, KV head) for fused_merge, the rotated queries of every sequence, two int32
// per (sequence, KV head) for share_rotation (ticket, published flag), then 2 KiB per
// (sequence, KV head) for prepared_fragments.
size_t DecodeWorkspaceBytes(const DecodeShape& shape, int32_t num_seqs, int32_t num_items);

// Enqueues the kernels on `stream` (query rotation, INT2 items, BF16 items, merge unless fused);
// no host synchronisation, no allocation. Errors: InvalidArgument for an unsupported shape,
// option or missing buffers; Internal for a CUDA launch error.
absl::Status LaunchDecodeAttention(const DecodeParams& params, cudaStream_t stream);

// Resident CTAs per SM of the 4-warp decode kernel (for planning and reports); needs a device.
int DecodeKernelOccupancy(int group_size);

// Whether PagedDecoder re-plans a batch for one 8-warp INT2 CTA per SM (DecodeParams::int2_warps)
// given its default plan: GQA <= 4 (packed_int8_values' 8-warp kernel), at most 2 INT2 CTAs
// per SM (one wave with the rotation kernel: B=1), every item in the INT2 kernel (an
// INT2-dominated batch; a BF16-heavy one keeps its BF16 kernel's two CTAs per SM), and at least
// 8 INT2 slices per SM (a slice per warp).
bool WantsWideInt2Ctas(const DecodeShape& shape, const DecodePlan& plan, int num_sms);

// PagedDecoder with a non-default plan, for benchmarks and tests: target_ctas, session5_slots
// and tail_items as PlanDecode's; wide_target: the 8-warp plan (where the default picks it) aimed
// at this many CTAs instead of num_sms. Any non-default target, session5_slots or tail_items keeps
// the 4-warp plan.
struct DecodePlanOptions {
  int target_ctas = 0;
  bool session5_slots = false;
  int tail_items = 0;
  int wide_target = 0;
};
absl::StatusOr<PagedDecoder> CreatePagedDecoder(const DecodeShape& shape,
                                                const std::vector<int32_t>& seq_page_indptr,
                                                const std::vector<int32_t>& seq_page_ids,
                                                const std::vector<uint8_t>& page_kinds,
                                                int num_sms, const DecodePlanOptions& options);

// The kernel arguments PagedDecoder::Run launches with (shape, plan, workspace and the options
// it picks for the plan), before the inputs; the caller sets table, q, out, lse, rotations and may
// change options, then calls LaunchDecodeAttention.
DecodeParams DecoderParams(const PagedDecoder& decoder);
const DecodePlan& DecoderPlan(const PagedDecoder& decoder);
// DecoderParams with the inputs filled in (what Run launches).
DecodeParams DecoderParams(const PagedDecoder& decoder, const DecodeInputs& inputs);

}  // namespace oscarkv::cuda
