// PagedDecoder: the engine's decode attention. Create plans a batch composition once (a split of
// every (sequence, KV head) into work items, copied to the device, plus a workspace); Run
// launches one decode step of one layer over it -- per layer, with the layer's inputs.
//
//   auto dec = PagedDecoder::Create(shape, seq_page_indptr, seq_page_ids, page_kinds, num_sms);
//   for each layer: dec->Run({table, q, rot_k, rot_v, ..., out, lse}, stream);
//
// Run enqueues its kernels on `stream` with no host synchronisation and no allocation. The
// launch options (which kernels, CTA sizes, how the partial results are merged) are chosen per
// plan from measurements; they are not part of this interface.
//
// CUDA graphs: CreateForCapture sizes a decoder for at most `capacity` (sequences, pages per
// sequence); Update re-plans it for a new batch and copies the plan into the same device buffers
// (enqueued on the stream), so one captured Run replays over changing lengths and page tables --
// the kernels read the plan and the page table (the contents of inputs.table's arrays, which the
// caller updates in place) from device memory; the grid sizes and launch options are fixed at
// creation. A graph captured from Run replays exactly what an eager Run after the same Update
// launches.
//
//   auto dec = PagedDecoder::CreateForCapture(shape, {max_seqs, max_pages_per_seq}, num_sms);
//   dec->Update(indptr, ids, kinds, stream);  dec->Run(inputs, stream);  // warm-up, eager
//   capture dec->Run(inputs, stream) into a graph; then per step:
//     write the new page table into inputs.table's arrays; dec->Update(...); replay the graph.
//
// Thread-safety: a PagedDecoder serves one Run at a time on one stream (its workspace holds the
// partial results and the merge's arrival counters); different decoders are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "oscarkv/cuda/decode_attention.h"

#include <cuda_runtime_api.h>

namespace oscarkv::cuda {

class PagedDecoder {
 public:
  // Plans from host copies of the page table (the CSR arrays and every page's kind); needs a
  // device. Errors: InvalidArgument for an unsupported shape or a malformed table; the CUDA
  // error of a failed allocation or copy.
  static absl::StatusOr<PagedDecoder> Create(const DecodeShape& shape,
                                             const std::vector<int32_t>& seq_page_indptr,
                                             const std::vector<int32_t>& seq_page_ids,
                                             const std::vector<uint8_t>& page_kinds, int num_sms);

  // A decoder for graph capture (see the top of this file): room for batches of at most
  // capacity.max_seqs sequences of at most capacity.max_pages_per_seq page-table entries each; no
  // batch planned yet (Update plans one; Run before the first Update is an error). Errors:
  // InvalidArgument for an unsupported shape or capacity; CUDA errors of the allocations.
  struct Capacity {
    int32_t max_seqs = 0;
    int32_t max_pages_per_seq = 0;
  };
  static absl::StatusOr<PagedDecoder> CreateForCapture(const DecodeShape& shape,
                                                       const Capacity& capacity, int num_sms);
  // Re-plans a decoder made by CreateForCapture for a new batch (host copies of its table, as
  // Create takes them; at most capacity.max_seqs sequences) and enqueues the plan's copy into the
  // decoder's device buffers on `stream` (ordered after earlier Runs on it; the host vectors may
  // be reused when it returns). Errors: InvalidArgument for a malformed table, a batch over the
  // capacity or a decoder made by Create; CUDA errors of the copies.
  absl::Status Update(const std::vector<int32_t>& seq_page_indptr,
                      const std::vector<int32_t>& seq_page_ids,
                      const std::vector<uint8_t>& page_kinds, cudaStream_t stream);

  // One decode step of shape().layer over the planned batch. inputs.table must describe the
  // batch the plan was made for (the same sequences, page kinds and page counts; its
  // num_seqs may be 0 for "as planned"); q, out and the tables are device pointers. A capture
  // decoder's q, out and lse hold capacity.max_seqs sequences (rows past the batch get output 0
  // and lse -inf).
  // Errors: InvalidArgument for missing or mismatched inputs; Internal for a CUDA launch error.
  absl::Status Run(const DecodeInputs& inputs, cudaStream_t stream) const;

  const DecodeShape& shape() const;
  int32_t num_seqs() const;
  // Bytes Run reads from the pages (K and V segments of the attended layer).
  size_t page_bytes_read() const;
  size_t workspace_bytes() const;

  PagedDecoder(PagedDecoder&&) noexcept;
  PagedDecoder& operator=(PagedDecoder&&) noexcept;
  ~PagedDecoder();

 private:
  struct State;
  friend struct DecoderAccess;
  PagedDecoder();
  std::unique_ptr<State> s_;
};

}  // namespace oscarkv::cuda
