/* liboscarkv_cuda_c.so: a plain-C ABI over the CUDA kernels (kernels/cuda) for FFI users -- the
   Python package's torch ops (python/oscarkv/torch_ops.py) call it through ctypes with raw
   device pointers and a cudaStream_t, so nothing is compiled against PyTorch or Python.

   Contract: every function returning int returns 0 on success or an absl::StatusCode (3
   INVALID_ARGUMENT, 9 FAILED_PRECONDITION, 13 INTERNAL, ...); the message of the calling
   thread's last failure is oscarkv_cuda_last_error(). Launch functions enqueue on `stream` (a
   cudaStream_t; NULL is the legacy default stream) with no host synchronisation and no
   allocation, so they can be captured in CUDA graphs. Create / update / prepare functions may
   allocate or synchronise: call them outside capture. Handles are not thread-safe per object.
   Pointers named `host` are host memory; all other buffer pointers are device memory. The
   reference functions run the kernels' CPU references (kernels/cuda/.../reference.h) on host
   memory, for tests.

   Depends on the CUDA runtime (linked statically) and the C++ runtime only. */
#ifndef OSCARKV_CUDA_OSCARKV_CUDA_C_H_
#define OSCARKV_CUDA_OSCARKV_CUDA_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OSCARKV_CUDA_C_ABI_VERSION 1

int oscarkv_cuda_abi_version(void);
/* The calling thread's last error message ("" if none); valid until its next failing call. */
const char* oscarkv_cuda_last_error(void);
/* Number of CUDA devices usable by this process (0 when no driver / device). */
int oscarkv_cuda_device_count(void);

/* The codec fields that fix a page's layout and its codec id (docs/FORMAT.md §2). */
typedef struct oscarkv_cuda_profile {
  char model_id[128];
  char model_revision[64];
  uint32_t num_layers, num_kv_heads, tp_rank, tp_size, head_dim, page_tokens, group_size;
  uint32_t sink_tokens, recent_tokens;
  uint8_t rotation_digest[32]; /* all zero: no rotation artifact */
} oscarkv_cuda_profile;

/* Page kinds (docs/FORMAT.md): 1 INT2, 2 BF16. */
int oscarkv_cuda_page_bytes(const oscarkv_cuda_profile* profile, int kind, uint64_t* out);
int oscarkv_cuda_codec_id(const oscarkv_cuda_profile* profile, uint8_t out[16]);
/* Fills the 64-byte header of a host page (page_bytes long, payload already written) for
   `token_count` tokens of `kind`, checksum included. */
int oscarkv_cuda_finish_page(const oscarkv_cuda_profile* profile, int kind, uint32_t token_count,
                             uint8_t* host_page, uint64_t page_bytes);
/* Built-in rotation sets, matrices f32 [layers][2][kv_heads][d][d] (x' = x R) into host memory:
   which 0 = identity (naive INT2), 1 = Hadamard (QuaRot-style); clips are 1 (no clip). */
int oscarkv_cuda_builtin_rotations(int which, uint32_t layers, uint32_t kv_heads, uint32_t d,
                                   float* host_matrices);
/* RotationSet::Digest of these arrays (range_modes may be NULL: all min-max). */
int oscarkv_cuda_rotation_digest(uint32_t layers, uint32_t kv_heads, uint32_t d,
                                 const float* host_matrices, const float* host_clips,
                                 const uint8_t* host_range_modes, uint8_t out[32]);

/* ---- quantize-on-write (quantize_write.h) ---- */
size_t oscarkv_cuda_rotation_fragment_bytes(void);
/* `count` row-major f32 128x128 matrices (device) -> fragments (device, count * fragment bytes). */
int oscarkv_cuda_prepare_rotations(const float* matrices, int count, void* fragments, void* stream);

typedef struct oscarkv_cuda_write {
  uint32_t num_layers, num_kv_heads, head_dim, group_size, page_tokens;
  uint32_t first_layer, layer_count;
  /* bf16 rows: element (layer i, K|V, token t, head h, c) at
     src + i*layer_stride + t*token_stride + h*head_stride + c (elements). */
  const uint16_t* k_src;
  const uint16_t* v_src;
  int64_t src_layer_stride, src_token_stride, src_head_stride;
  int32_t num_tokens;
  /* token t -> slot dst_slot[t] of page-table entry dst_page[t]. */
  uint8_t* const* page_ptrs;
  const uint8_t* page_kinds;
  const int32_t* dst_page;
  const int32_t* dst_slot;
  const void* rot_fragments;  /* [layer_count][2][kv_heads] fragments, NULL: rows already rotated */
  const float* clips;         /* [layer_count][2][kv_heads] or NULL */
  const uint8_t* range_modes; /* [layer_count][2][kv_heads] or NULL (then range_mode) */
  uint8_t range_mode;
  uint8_t range_modes_fixed_only;
} oscarkv_cuda_write;

int oscarkv_cuda_quantize_write(const oscarkv_cuda_write* w, void* stream);

/* ---- paged attention (decode_attention.h, decode_runner.h, extend_attention.h) ---- */
typedef struct oscarkv_cuda_shape {
  uint32_t num_layers, num_kv_heads, num_q_heads, head_dim, group_size, page_tokens;
} oscarkv_cuda_shape;

typedef struct oscarkv_cuda_table {
  const uint8_t* const* page_ptrs;  /* [num_pages] */
  const uint8_t* page_kinds;        /* [num_pages] */
  const uint16_t* page_token_counts; /* [num_pages] */
  const int32_t* seq_page_indptr;   /* [num_seqs + 1] */
  const int32_t* seq_page_ids;      /* CSR indices into the page arrays */
  int32_t num_seqs;
} oscarkv_cuda_table;

typedef struct oscarkv_cuda_attn_io {
  const float* q;      /* decode [num_seqs][Hq][d]; extend [total_new][Hq][d]; unrotated */
  const float* rot_k;  /* [kv_heads][d][d] of the layer, NULL: q already rotated */
  const float* rot_v;  /* [kv_heads][d][d], used when unrotate_output */
  int32_t unrotate_output;
  float softmax_scale; /* <= 0: 1/sqrt(d) */
  float* out;          /* same shape as q */
  float* lse;          /* [rows][Hq] or NULL */
} oscarkv_cuda_attn_io;

typedef struct oscarkv_cuda_decoder oscarkv_cuda_decoder;
/* A graph-capturable decoder for at most max_seqs sequences of max_pages_per_seq pages
   (PagedDecoder::CreateForCapture on the current device). */
int oscarkv_cuda_decoder_create(const oscarkv_cuda_shape* shape, int32_t max_seqs,
                                int32_t max_pages_per_seq, oscarkv_cuda_decoder** out);
/* Re-plans for a batch: host CSR arrays (num_seqs + 1 indptr entries, num_entries ids) and the
   kinds of the num_pages page-table entries; enqueues the plan's copy on `stream`. */
int oscarkv_cuda_decoder_update(oscarkv_cuda_decoder* dec, const int32_t* host_indptr,
                                int32_t num_seqs, const int32_t* host_ids, int32_t num_entries,
                                const uint8_t* host_kinds, int32_t num_pages, void* stream);
/* One decode step of `layer` over the planned batch (q/out/lse hold max_seqs rows). */
int oscarkv_cuda_decoder_run(const oscarkv_cuda_decoder* dec, uint32_t layer,
                             const oscarkv_cuda_table* table, const oscarkv_cuda_attn_io* io,
                             void* stream);
void oscarkv_cuda_decoder_destroy(oscarkv_cuda_decoder* dec);

typedef struct oscarkv_cuda_extend_plan oscarkv_cuda_extend_plan;
int oscarkv_cuda_extend_plan_create(const oscarkv_cuda_shape* shape, int32_t max_seqs,
                                    int32_t max_new_tokens, oscarkv_cuda_extend_plan** out);
/* New tokens of sequence b are rows [q_indptr[b], q_indptr[b+1]) (device); k_new/v_new bf16
   rotated rows [total_new][kv_heads][d]. */
int oscarkv_cuda_extend_run(const oscarkv_cuda_extend_plan* plan, uint32_t layer,
                            const oscarkv_cuda_table* table, const int32_t* q_indptr,
                            int32_t max_new_tokens, const uint16_t* k_new, const uint16_t* v_new,
                            const oscarkv_cuda_attn_io* io, void* stream);
void oscarkv_cuda_extend_plan_destroy(oscarkv_cuda_extend_plan* plan);

/* ---- CPU references (every pointer host memory) ---- */
/* Rotation set for the references: matrices [num_layers][2][kv_heads][d][d] (NULL: rows are
   already rotated / identity), clips [num_layers][2][kv_heads] (NULL: 1), range modes likewise. */
typedef struct oscarkv_cuda_ref_rotations {
  const float* matrices;
  const float* clips;
  const uint8_t* range_modes;
} oscarkv_cuda_ref_rotations;

int oscarkv_cuda_reference_quantize_write(const oscarkv_cuda_write* host_w,
                                          const oscarkv_cuda_ref_rotations* rot);
/* Pages: host_pages[i] (page_bytes[i] long, valid header: oscarkv_cuda_finish_page) per entry;
   out [rows][Hq][d], lse [rows][Hq]. */
int oscarkv_cuda_reference_decode(const oscarkv_cuda_profile* profile,
                                  const oscarkv_cuda_ref_rotations* rot,
                                  const uint8_t* const* host_pages, const uint64_t* page_bytes,
                                  int32_t num_pages, const int32_t* host_indptr, int32_t num_seqs,
                                  const int32_t* host_ids, uint32_t layer, const float* host_q,
                                  uint32_t num_q_heads, int unrotate_output, float softmax_scale,
                                  float* host_out, float* host_lse);
int oscarkv_cuda_reference_extend(const oscarkv_cuda_profile* profile,
                                  const oscarkv_cuda_ref_rotations* rot,
                                  const uint8_t* const* host_pages, const uint64_t* page_bytes,
                                  int32_t num_pages, const int32_t* host_indptr, int32_t num_seqs,
                                  const int32_t* host_ids, uint32_t layer,
                                  const int32_t* host_q_indptr, const float* host_q,
                                  const uint16_t* host_k_new, const uint16_t* host_v_new,
                                  uint32_t num_q_heads, int unrotate_output, float softmax_scale,
                                  float* host_out, float* host_lse);

#ifdef __cplusplus
}
#endif

#endif /* OSCARKV_CUDA_OSCARKV_CUDA_C_H_ */
