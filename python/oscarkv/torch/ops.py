"""The kernels as PyTorch custom ops (torch.library), each with a fake (meta) implementation so
torch.compile traces them, and each launch enqueued on torch's current CUDA stream with no host
synchronisation and no device allocation beyond its output tensors -- so CUDA graphs capture
them. CPU tensors run the kernels' CPU references (the same functions the GPU tests compare to).

    torch.ops.oscarkv.quantize_write(pool, page_ptrs, page_kinds, dst_page, dst_slot, k, v, ...)
    out, lse = torch.ops.oscarkv.paged_decode(q, pool, page_ptrs, ..., rotations, layer, decoder, ...)
    out, lse = torch.ops.oscarkv.paged_extend(q, k_new, v_new, q_indptr, pool, ..., plan, ...)

Pages live in a flat uint8 `pool` tensor; `page_ptrs` (int64) holds the address of every
page-table entry inside it (docs/FORMAT.md layout), `page_kinds` (uint8: 1 INT2, 2 BF16) and
`page_token_counts` (int16) describe each entry, and sequences refer to entries CSR-style
(`seq_page_indptr`, `seq_page_ids`, int32). PagedKVCache (cache.py) owns all of these.
"""
import ctypes
from typing import Optional, Sequence, Tuple

import torch

from . import _capi

INT2, BF16 = 1, 2
_HEADER = 64


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _stream(t: torch.Tensor) -> Optional[int]:
    if t.device.type != "cuda":
        return None
    return torch.cuda.current_stream(t.device).cuda_stream


def page_bytes(num_layers: int, num_kv_heads: int, head_dim: int, group_size: int,
               page_tokens: int, kind: int) -> int:
    """Bytes of one page (header included), as FORMAT.md and PageGeometry compute them."""
    seg = (page_tokens * head_dim // 4 + page_tokens * (head_dim // group_size) * 4
           if kind == INT2 else page_tokens * head_dim * 2)
    return _HEADER + num_layers * 2 * num_kv_heads * seg


def _cpu_profile(num_layers, num_kv_heads, head_dim, group_size, page_tokens) -> _capi.Profile:
    p = _capi.Profile()
    p.model_id = b"oscarkv.torch/cpu-reference"
    p.model_revision = b"0"
    p.num_layers, p.num_kv_heads, p.tp_rank, p.tp_size = num_layers, num_kv_heads, 0, 1
    p.head_dim, p.page_tokens, p.group_size = head_dim, page_tokens, group_size
    p.sink_tokens, p.recent_tokens = 64, 256
    return p


# ---- quantize-on-write ----

@torch.library.custom_op("oscarkv::quantize_write", mutates_args=("pool",))
def quantize_write(pool: torch.Tensor, page_ptrs: torch.Tensor, page_kinds: torch.Tensor,
                   dst_page: torch.Tensor, dst_slot: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, rot_fragments: Optional[torch.Tensor],
                   rotations: Optional[torch.Tensor], clips: Optional[torch.Tensor],
                   range_modes: Optional[torch.Tensor], num_layers: int, first_layer: int,
                   group_size: int, page_tokens: int, range_mode: int,
                   range_modes_fixed_only: bool) -> None:
    """Writes rows k, v (bf16 [layer_count, tokens, kv_heads, head_dim], last dim contiguous)
    into their page slots: token t -> slot dst_slot[t] of entry dst_page[t]. On CUDA the rows
    are rotated by `rot_fragments` (prepare_rotations of layers first_layer.., or None: rows are
    already rotated); on CPU by `rotations` (f32 [num_layers][2][kv_heads][d][d] or None).
    clips / range_modes are [layer_count][2][kv_heads] (or None). Mutates `pool`."""
    w = _write_params(page_ptrs, page_kinds, dst_page, dst_slot, k, v, rot_fragments, clips,
                      range_modes, num_layers, first_layer, group_size, page_tokens, range_mode,
                      range_modes_fixed_only)
    if w.num_tokens == 0:
        return
    if pool.device.type == "cuda":
        _capi.check(_capi.load().oscarkv_cuda_quantize_write(ctypes.byref(w), _stream(pool)))
        return
    rot = _capi.RefRotations(_ptr(rotations), None, None)
    if rotations is None:
        w.rot_fragments = None
    _capi.check(_capi.load().oscarkv_cuda_reference_quantize_write(ctypes.byref(w),
                                                                    ctypes.byref(rot)))


@quantize_write.register_fake
def _(pool, page_ptrs, page_kinds, dst_page, dst_slot, k, v, rot_fragments, rotations, clips,
      range_modes, num_layers, first_layer, group_size, page_tokens, range_mode,
      range_modes_fixed_only) -> None:
    return None


def _write_params(page_ptrs, page_kinds, dst_page, dst_slot, k, v, rot_fragments, clips,
                  range_modes, num_layers, first_layer, group_size, page_tokens, range_mode,
                  fixed_only) -> _capi.Write:
    if k.dtype != torch.bfloat16 or v.dtype != torch.bfloat16 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError("k and v must be bf16 [layer_count, tokens, kv_heads, head_dim] of one shape")
    if k.stride(-1) != 1 or v.stride() != k.stride():
        raise ValueError("k and v need a contiguous last dimension and equal strides")
    if dst_page.dtype != torch.int32 or dst_slot.dtype != torch.int32 or dst_page.numel() < k.shape[1]:
        raise ValueError("dst_page / dst_slot must be int32 with one entry per token")
    lc, n, h, d = k.shape
    w = _capi.Write()
    w.num_layers, w.num_kv_heads, w.head_dim = num_layers, h, d
    w.group_size, w.page_tokens, w.first_layer, w.layer_count = group_size, page_tokens, first_layer, lc
    w.k_src, w.v_src = k.data_ptr(), v.data_ptr()
    w.src_layer_stride, w.src_token_stride, w.src_head_stride = k.stride(0), k.stride(1), k.stride(2)
    w.num_tokens = n
    w.page_ptrs, w.page_kinds = page_ptrs.data_ptr(), page_kinds.data_ptr()
    w.dst_page, w.dst_slot = dst_page.data_ptr(), dst_slot.data_ptr()
    w.rot_fragments, w.clips, w.range_modes = _ptr(rot_fragments), _ptr(clips), _ptr(range_modes)
    w.range_mode, w.range_modes_fixed_only = range_mode, 1 if fixed_only else 0
    return w


# ---- attention over pages ----

def _table(page_ptrs, page_kinds, page_token_counts, seq_page_indptr, seq_page_ids) -> _capi.Table:
    for name, t, dt in (("page_ptrs", page_ptrs, torch.int64), ("page_kinds", page_kinds, torch.uint8),
                        ("page_token_counts", page_token_counts, torch.int16),
                        ("seq_page_indptr", seq_page_indptr, torch.int32),
                        ("seq_page_ids", seq_page_ids, torch.int32)):
        if t.dtype != dt or not t.is_contiguous():
            raise ValueError("%s must be a contiguous %s tensor" % (name, dt))
    return _capi.Table(page_ptrs.data_ptr(), page_kinds.data_ptr(), page_token_counts.data_ptr(),
                       seq_page_indptr.data_ptr(), seq_page_ids.data_ptr(),
                       seq_page_indptr.numel() - 1)


def _check_q(q: torch.Tensor, rotations: torch.Tensor, layer: int) -> None:
    if q.dtype != torch.float32 or q.dim() != 3 or not q.is_contiguous():
        raise ValueError("q must be contiguous f32 [rows, num_q_heads, head_dim]")
    if (rotations.dtype != torch.float32 or rotations.dim() != 5 or not rotations.is_contiguous()
            or not 0 <= layer < rotations.shape[0]):
        raise ValueError("rotations must be contiguous f32 [layers, 2, kv_heads, d, d] holding layer %d"
                         % layer)


def _host_pages(pool, page_ptrs, page_kinds, page_token_counts, seq_page_indptr, seq_page_ids,
                num_layers, h, d, group, ptok):
    """CPU path: copies of the referenced entries' pages with valid headers (the references
    parse them); entries no sequence refers to are passed as empty."""
    prof = _cpu_profile(num_layers, h, d, group, ptok)
    base = pool.data_ptr()
    ptrs, kinds, counts = page_ptrs.tolist(), page_kinds.tolist(), page_token_counts.tolist()
    used = set(seq_page_ids[:int(seq_page_indptr[-1])].tolist())
    bufs, addrs, sizes = [], [], []
    for i, (addr, kind, count) in enumerate(zip(ptrs, kinds, counts)):
        if i not in used:
            addrs.append(None)
            sizes.append(0)
            continue
        size = page_bytes(num_layers, h, d, group, ptok, kind)
        off = addr - base
        if off < 0 or off + size > pool.numel():
            raise ValueError("page address outside the pool")
        buf = (ctypes.c_uint8 * size).from_buffer_copy(pool[off:off + size].numpy().tobytes())
        _capi.check(_capi.load().oscarkv_cuda_finish_page(ctypes.byref(prof), kind, count, buf,
                                                          size))
        bufs.append(buf)
        addrs.append(ctypes.addressof(buf))
        sizes.append(size)
    arr = (ctypes.c_void_p * max(1, len(addrs)))(*addrs)
    sz = (ctypes.c_uint64 * max(1, len(sizes)))(*sizes)
    return prof, bufs, arr, sz, len(addrs)


@torch.library.custom_op("oscarkv::paged_decode", mutates_args=())
def paged_decode(q: torch.Tensor, pool: torch.Tensor, page_ptrs: torch.Tensor,
                 page_kinds: torch.Tensor, page_token_counts: torch.Tensor,
                 seq_page_indptr: torch.Tensor, seq_page_ids: torch.Tensor,
                 rotations: torch.Tensor, layer: int, decoder: int, num_layers: int,
                 group_size: int, page_tokens: int, softmax_scale: float,
                 unrotate_output: bool = True,
                 rotated_query: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """One decode step of `layer`: q f32 [rows, Hq, d] (unrotated, one token per sequence) over
    the sequences' pages; returns (out f32 [rows, Hq, d] in the model's value space -- or, with
    unrotate_output False, in the rotated value basis: o R_V, for an o_proj the rotation is
    folded into (fold.py) --, lse f32 [rows, Hq]). rotated_query: q is already in the rotated
    key basis, q @ R_K of its KV head (rotations[layer, 0, h], row vector times matrix; the
    softmax scale is still applied here), so the launch skips the query rotation. On CUDA
    `decoder` is a PagedDecoder.handle planned for this table (rows = its capacity; rows past
    the batch get 0 / -inf); on CPU it is ignored."""
    _check_q(q, rotations, layer)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if q.device.type == "cuda":
        table = _table(page_ptrs, page_kinds, page_token_counts, seq_page_indptr, seq_page_ids)
        io = _capi.AttnIO(q.data_ptr(), None if rotated_query else rotations[layer, 0].data_ptr(),
                          rotations[layer, 1].data_ptr(), 1 if unrotate_output else 0,
                          softmax_scale, out.data_ptr(), lse.data_ptr())
        _capi.check(_capi.load().oscarkv_cuda_decoder_run(decoder, layer, ctypes.byref(table),
                                                          ctypes.byref(io), _stream(q)))
        return out, lse
    h, d = rotations.shape[2], rotations.shape[3]
    prof, bufs, arr, sz, npages = _host_pages(pool, page_ptrs, page_kinds, page_token_counts,
                                              seq_page_indptr, seq_page_ids, num_layers, h, d, group_size,
                                              page_tokens)
    if rotated_query:  # the reference's R_K of this layer is the identity then
        rotations = rotations.clone()
        rotations[layer, 0] = torch.eye(d, dtype=torch.float32)
    rot = _capi.RefRotations(rotations.data_ptr(), None, None)
    n = seq_page_indptr.numel() - 1
    out.zero_()
    lse.fill_(float("-inf"))
    _capi.check(_capi.load().oscarkv_cuda_reference_decode(
        ctypes.byref(prof), ctypes.byref(rot), arr, sz, npages, seq_page_indptr.data_ptr(), n,
        seq_page_ids.data_ptr(), layer, q.data_ptr(), q.shape[1], 1 if unrotate_output else 0,
        softmax_scale, out.data_ptr(), lse.data_ptr()))
    return out, lse


@paged_decode.register_fake
def _(q, pool, page_ptrs, page_kinds, page_token_counts, seq_page_indptr, seq_page_ids, rotations,
      layer, decoder, num_layers, group_size, page_tokens, softmax_scale, unrotate_output=True,
      rotated_query=False):
    return torch.empty_like(q), q.new_empty(q.shape[:2])


@torch.library.custom_op("oscarkv::paged_extend", mutates_args=())
def paged_extend(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                 q_indptr: torch.Tensor, pool: torch.Tensor, page_ptrs: torch.Tensor,
                 page_kinds: torch.Tensor, page_token_counts: torch.Tensor,
                 seq_page_indptr: torch.Tensor, seq_page_ids: torch.Tensor,
                 rotations: torch.Tensor, layer: int, plan: int, max_new_tokens: int,
                 num_layers: int, group_size: int, page_tokens: int, softmax_scale: float,
                 unrotate_output: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """Extend (chunked prefill) of `layer`: new tokens [q_indptr[b], q_indptr[b+1]) of sequence b
    attend to its pages and causally to each other. q f32 [total, Hq, d] unrotated; k_new /
    v_new bf16 [total, kv_heads, d] ROTATED rows (as pages hold them). Returns (out f32 [total,
    Hq, d] in model space -- rotated value basis with unrotate_output False --, lse f32
    [total, Hq]). On CUDA `plan` is an ExtendPlan.handle."""
    _check_q(q, rotations, layer)
    if k_new.dtype != torch.bfloat16 or not k_new.is_contiguous() or not v_new.is_contiguous():
        raise ValueError("k_new / v_new must be contiguous bf16 [total, kv_heads, d]")
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if q.device.type == "cuda":
        table = _table(page_ptrs, page_kinds, page_token_counts, seq_page_indptr, seq_page_ids)
        io = _capi.AttnIO(q.data_ptr(), rotations[layer, 0].data_ptr(),
                          rotations[layer, 1].data_ptr(), 1 if unrotate_output else 0,
                          softmax_scale, out.data_ptr(), lse.data_ptr())
        _capi.check(_capi.load().oscarkv_cuda_extend_run(
            plan, layer, ctypes.byref(table), q_indptr.data_ptr(), max_new_tokens,
            k_new.data_ptr(), v_new.data_ptr(), ctypes.byref(io), _stream(q)))
        return out, lse
    h, d = rotations.shape[2], rotations.shape[3]
    prof, bufs, arr, sz, npages = _host_pages(pool, page_ptrs, page_kinds, page_token_counts,
                                              seq_page_indptr, seq_page_ids, num_layers, h, d, group_size,
                                              page_tokens)
    rot = _capi.RefRotations(rotations.data_ptr(), None, None)
    n = seq_page_indptr.numel() - 1
    _capi.check(_capi.load().oscarkv_cuda_reference_extend(
        ctypes.byref(prof), ctypes.byref(rot), arr, sz, npages, seq_page_indptr.data_ptr(), n,
        seq_page_ids.data_ptr(), layer, q_indptr.data_ptr(), q.data_ptr(), k_new.data_ptr(),
        v_new.data_ptr(), q.shape[1], 1 if unrotate_output else 0, softmax_scale, out.data_ptr(),
        lse.data_ptr()))
    return out, lse


@paged_extend.register_fake
def _(q, k_new, v_new, q_indptr, pool, page_ptrs, page_kinds, page_token_counts, seq_page_indptr,
      seq_page_ids, rotations, layer, plan, max_new_tokens, num_layers, group_size, page_tokens,
      softmax_scale, unrotate_output=True):
    return torch.empty_like(q), q.new_empty(q.shape[:2])


# ---- plans (host objects; create and update them outside graph capture) ----

def _shape(num_layers, num_kv_heads, num_q_heads, head_dim, group_size, page_tokens) -> _capi.Shape:
    return _capi.Shape(num_layers, num_kv_heads, num_q_heads, head_dim, group_size, page_tokens)


class PagedDecoder:
    """A graph-capturable decode plan (PagedDecoder::CreateForCapture) for at most max_seqs
    sequences of max_pages_per_seq page-table entries, on the current CUDA device. update()
    re-plans it for a batch (host work plus an enqueued copy); a captured paged_decode replays
    over whatever batch the last update planned."""

    def __init__(self, num_layers: int, num_kv_heads: int, num_q_heads: int, max_seqs: int,
                 max_pages_per_seq: int, head_dim: int = 128, group_size: int = 128,
                 page_tokens: int = 64) -> None:
        self.max_seqs = max_seqs
        h = ctypes.c_void_p()
        s = _shape(num_layers, num_kv_heads, num_q_heads, head_dim, group_size, page_tokens)
        _capi.check(_capi.load().oscarkv_cuda_decoder_create(ctypes.byref(s), max_seqs,
                                                             max_pages_per_seq, ctypes.byref(h)))
        self._h = h
        self.handle: int = h.value or 0  # the int the ops take

    def update(self, indptr: Sequence[int], ids: Sequence[int], kinds: Sequence[int],
               stream: Optional[int] = None) -> None:
        """Plans for sequences indptr (len num_seqs + 1) / ids over entries of `kinds`."""
        ip = (ctypes.c_int32 * len(indptr))(*indptr)
        ii = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        kk = kinds if isinstance(kinds, (bytes, bytearray)) else bytes(kinds)
        if stream is None and torch.cuda.is_available():
            stream = torch.cuda.current_stream().cuda_stream
        _capi.check(_capi.load().oscarkv_cuda_decoder_update(
            self._h, ip, len(indptr) - 1, ii, len(ids), kk, len(kk), stream))

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and h.value and _capi._lib is not None:
            _capi._lib.oscarkv_cuda_decoder_destroy(h)
            self._h = ctypes.c_void_p()


class ExtendPlan:
    """A capturable extend plan (PlanExtend) for at most max_seqs sequences of max_new_tokens."""

    def __init__(self, num_layers: int, num_kv_heads: int, num_q_heads: int, max_seqs: int,
                 max_new_tokens: int, head_dim: int = 128, group_size: int = 128,
                 page_tokens: int = 64) -> None:
        self.max_seqs, self.max_new_tokens = max_seqs, max_new_tokens
        h = ctypes.c_void_p()
        s = _shape(num_layers, num_kv_heads, num_q_heads, head_dim, group_size, page_tokens)
        _capi.check(_capi.load().oscarkv_cuda_extend_plan_create(ctypes.byref(s), max_seqs,
                                                                 max_new_tokens, ctypes.byref(h)))
        self._h = h
        self.handle: int = h.value or 0  # the int the ops take

    def __del__(self) -> None:
        h = getattr(self, "_h", None)
        if h is not None and h.value and _capi._lib is not None:
            _capi._lib.oscarkv_cuda_extend_plan_destroy(h)
            self._h = ctypes.c_void_p()


def prepare_rotations(matrices: torch.Tensor) -> torch.Tensor:
    """The write kernels' form of f32 [..., 128, 128] rotation matrices (CUDA): uint8
    [count * fragment_bytes], count = matrices.numel() / 128^2, in the matrices' order."""
    if matrices.device.type != "cuda" or matrices.dtype != torch.float32 or not matrices.is_contiguous():
        raise ValueError("matrices must be contiguous f32 CUDA tensors")
    count = matrices.numel() // (128 * 128)
    frag = _capi.load().oscarkv_cuda_rotation_fragment_bytes()
    out = torch.empty(count * frag, dtype=torch.uint8, device=matrices.device)
    _capi.check(_capi.load().oscarkv_cuda_prepare_rotations(matrices.data_ptr(), count,
                                                            out.data_ptr(), _stream(matrices)))
    return out
