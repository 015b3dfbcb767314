"""KVCodec (what a page holds: shape, windows, rotations) and PagedKVCache (the pages of a batch
of sequences in one device pool, with the C++ page plan's windows and flushes).

Page plan (kernels/include/oscarkv/kernels/page_set.h, PlanSequencePages): for N tokens, page
size T, sink S, recent R: the first ceil(S/T) pages are BF16 (sink); the following full pages
that end at or before N - R are INT2 (history); the rest are BF16 (tail, R..R+T-1 tokens). A
step that brings a sequence to N tokens first flushes every BF16 page the plan for N makes
INT2 and whose rows are all written (one unrotated quantize-write from the BF16 page into a
new INT2 page), then writes the step's rows -- straight into INT2 pages when a whole page of
new rows is history already (a long prompt), into BF16 pages otherwise.

Slots: the pool holds `bf16_slots` BF16 pages then `int2_slots` INT2 pages (each slot's kind is
fixed, so the page table's kinds never change); page-table entry i is slot i. Loaded pages
(load_pages) are copied into slots as they are -- INT2 pages stay INT2. With layer_major=True
the pool holds one such region per layer, each slot there a one-layer page (the ops then run
with one-layer geometry and per-layer page_ptrs rows); pages in and out stay whole FORMAT.md
pages (export_page gathers, copy_page_in scatters in one strided copy).
"""
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import _capi, ops
from .ops import _HEADER, BF16, INT2


class KVCodec:
    """The KV codec of a model: page geometry, sink/recent windows and the per (layer, K|V, KV
    head) rotations (x' = x R), clip ratios and range modes of INT2 rows."""

    def __init__(self, num_layers: int, num_kv_heads: int, matrices: torch.Tensor,
                 clips: Optional[torch.Tensor] = None, range_modes: Optional[torch.Tensor] = None,
                 head_dim: int = 128, page_tokens: int = 64, group_size: int = 128,
                 sink_tokens: int = 64, recent_tokens: int = 256,
                 model_id: str = "oscarkv.torch", model_revision: str = "main",
                 name: str = "custom") -> None:
        n = (num_layers, 2, num_kv_heads)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.page_tokens, self.group_size = page_tokens, group_size
        self.sink_tokens, self.recent_tokens = sink_tokens, recent_tokens
        self.model_id, self.model_revision, self.name = model_id, model_revision, name
        self.matrices = matrices.detach().to("cpu", torch.float32).contiguous().view(
            *n, head_dim, head_dim)
        self.clips = (torch.ones(n) if clips is None else clips.detach().to("cpu", torch.float32)
                      .contiguous().view(n))
        self.range_modes = (None if range_modes is None
                            else range_modes.detach().to("cpu", torch.uint8).contiguous().view(n))
        if head_dim != 128 or group_size not in (64, 128) or page_tokens % 64 or not 64 <= page_tokens <= 256:
            raise ValueError("the kernels support head_dim 128, group 64/128, page_tokens 64..256 "
                             "(a multiple of 64)")

    @staticmethod
    def builtin(kind: str, num_layers: int, num_kv_heads: int, **kw) -> "KVCodec":
        """kind "naive" (identity rotations) or "hadamard" (QuaRot-style), clip 1, min-max."""
        which = {"naive": 0, "identity": 0, "hadamard": 1}.get(kind)
        if which is None:
            raise ValueError("builtin codec %r: naive or hadamard" % kind)
        d = kw.get("head_dim", 128)
        m = torch.empty(num_layers, 2, num_kv_heads, d, d, dtype=torch.float32)
        _capi.check(_capi.load().oscarkv_cuda_builtin_rotations(which, num_layers, num_kv_heads,
                                                                d, m.data_ptr()))
        return KVCodec(num_layers, num_kv_heads, m, name=kind, **kw)

    @staticmethod
    def from_artifact(path: Union[str, Path], **kw) -> "KVCodec":
        """A rotation artifact written by `oscarkv calibrate` (folder or rotations.safetensors)."""
        from ..codec import read_safetensors
        p = Path(path)
        tensors, _ = read_safetensors(p / "rotations.safetensors" if p.is_dir() else p)
        k0 = tensors["layers.0.k_rotation"][1]
        h, d = k0[0], k0[1]
        layers = tensors["k_clip"][1][0]
        mats, clips, modes = [], [], []
        for l in range(layers):
            for kv in ("k", "v"):
                mats.append(torch.frombuffer(bytearray(tensors["layers.%d.%s_rotation" % (l, kv)][2]),
                                             dtype=torch.float32).view(h, d, d))
                c = torch.frombuffer(bytearray(tensors["%s_clip" % kv][2]), dtype=torch.float32)
                clips.append(c.view(layers, h)[l])
                if "%s_range_mode" % kv in tensors:
                    m = torch.frombuffer(bytearray(tensors["%s_range_mode" % kv][2]), dtype=torch.uint8)
                    modes.append(m.view(layers, h)[l])
        return KVCodec(layers, h, torch.stack(mats), torch.stack(clips),
                       torch.stack(modes) if modes else None, head_dim=d, name="oscar", **kw)

    @property
    def sink_pages(self) -> int:
        return -(-self.sink_tokens // self.page_tokens)

    def page_bytes(self, kind: int) -> int:
        return ops.page_bytes(self.num_layers, self.num_kv_heads, self.head_dim, self.group_size,
                              self.page_tokens, kind)

    def rotation_digest(self) -> bytes:
        out = (_capi.ctypes.c_uint8 * 32)()
        _capi.check(_capi.load().oscarkv_cuda_rotation_digest(
            self.num_layers, self.num_kv_heads, self.head_dim, self.matrices.data_ptr(),
            self.clips.data_ptr(), None if self.range_modes is None else self.range_modes.data_ptr(),
            out))
        return bytes(out)

    def client_profile(self):
        """The oscarkv.CodecProfile of these pages (register it with a daemon to store them)."""
        from ..codec import CodecProfile
        return CodecProfile(model_id=self.model_id, model_revision=self.model_revision,
                            num_layers=self.num_layers, num_kv_heads=self.num_kv_heads,
                            head_dim=self.head_dim, page_tokens=self.page_tokens,
                            group_size=self.group_size, sink_tokens=self.sink_tokens,
                            recent_tokens=self.recent_tokens,
                            rotation_digest=self.rotation_digest())

    def c_profile(self) -> _capi.Profile:
        p = _capi.Profile()
        p.model_id = self.model_id.encode()
        p.model_revision = self.model_revision.encode()
        p.num_layers, p.num_kv_heads, p.tp_rank, p.tp_size = self.num_layers, self.num_kv_heads, 0, 1
        p.head_dim, p.page_tokens, p.group_size = self.head_dim, self.page_tokens, self.group_size
        p.sink_tokens, p.recent_tokens = self.sink_tokens, self.recent_tokens
        _capi.ctypes.memmove(p.rotation_digest, self.rotation_digest(), 32)
        return p

    def is_int2_page(self, i: int, n: int) -> bool:
        """Whether page i of a sequence of n tokens is INT2 in the page plan."""
        T = self.page_tokens
        return i >= self.sink_pages and (i + 1) * T <= n - self.recent_tokens


class PagedKVCache:
    """Pages of up to `max_seqs` sequences of up to `max_seq_tokens` tokens each, on `device`.

    Per step: begin_step(new tokens per sequence) plans the step (flushes, slots of the new
    rows, the page table it uploads); then per layer write(layer, k, v) stores the new rows
    and decode(layer, q) / extend(layer, q, k, v) attends. Not thread-safe."""

    def __init__(self, codec: KVCodec, num_q_heads: int, max_seqs: int, max_seq_tokens: int,
                 device: Union[str, torch.device] = "cuda", int2_slots: Optional[int] = None,
                 bf16_slots: Optional[int] = None, max_step_tokens: int = 4096,
                 layer_major: bool = False) -> None:
        self.codec, self.num_q_heads = codec, num_q_heads
        # layer_major: the pool holds one region per layer, each slot a one-layer page there
        # (header + that layer's K/V segments), so a layer's decode reads one contiguous region
        # instead of a segment of every page spread over the whole pool. Pages in and out
        # (export_page / load_pages) are still whole FORMAT.md pages.
        self.layer_major = layer_major
        self.geo_layers = 1 if layer_major else codec.num_layers  # layers of a pool page
        self.device = torch.device(device)
        self.max_seqs, self.max_seq_tokens, self.max_step_tokens = max_seqs, max_seq_tokens, max_step_tokens
        T = codec.page_tokens
        self.max_pages = -(-max_seq_tokens // T)
        if int2_slots is None:
            int2_slots = max_seqs * self.max_pages
        if bf16_slots is None:
            tail = -(-(codec.recent_tokens + T) // T) + 1
            bf16_slots = max_seqs * (codec.sink_pages + tail) + -(-max_step_tokens // T) + max_seqs
        self.pb, self.pi = codec.page_bytes(BF16), codec.page_bytes(INT2)  # whole pages
        geo = (self.geo_layers, codec.num_kv_heads, codec.head_dim, codec.group_size, T)
        self.sb, self.si = ops.page_bytes(*geo, BF16), ops.page_bytes(*geo, INT2)  # pool slots
        self.n_bf16, self.n_int2 = bf16_slots, int2_slots
        self.num_slots = bf16_slots + int2_slots
        dev = self.device
        self.region = bf16_slots * self.sb + int2_slots * self.si  # bytes of one layer region
        regions = codec.num_layers if layer_major else 1
        self.pool = torch.zeros(regions * self.region, dtype=torch.uint8, device=dev)
        base = self.pool.data_ptr()
        addrs = [[base + r * self.region + i * self.sb for i in range(bf16_slots)]
                 + [base + r * self.region + bf16_slots * self.sb + i * self.si
                    for i in range(int2_slots)] for r in range(regions)]
        # [num_slots], or [layers, num_slots] when layer_major (the entries of each layer)
        self.page_ptrs = torch.tensor(addrs if layer_major else addrs[0], dtype=torch.int64,
                                      device=dev)
        self.kinds_host = bytes([BF16] * bf16_slots + [INT2] * int2_slots)
        self.page_kinds = torch.tensor(list(self.kinds_host), dtype=torch.uint8, device=dev)
        self.counts = np.zeros(self.num_slots, dtype=np.int16)  # valid tokens per slot
        self.page_token_counts = torch.zeros(self.num_slots, dtype=torch.int16, device=dev)
        self.prefix_token_counts = torch.zeros(self.num_slots, dtype=torch.int16, device=dev)
        self.seq_page_indptr = torch.zeros(max_seqs + 1, dtype=torch.int32, device=dev)
        self.seq_page_ids = torch.zeros(max(1, max_seqs * self.max_pages), dtype=torch.int32, device=dev)
        self.prefix_indptr = torch.zeros(max_seqs + 1, dtype=torch.int32, device=dev)
        self.prefix_ids = torch.zeros(max(1, max_seqs * self.max_pages), dtype=torch.int32, device=dev)
        self.q_indptr = torch.zeros(max_seqs + 1, dtype=torch.int32, device=dev)
        self.dst_page = torch.zeros(max_step_tokens, dtype=torch.int32, device=dev)
        self.dst_slot = torch.zeros(max_step_tokens, dtype=torch.int32, device=dev)
        self.rotations = codec.matrices.to(dev).contiguous()
        self.clips = codec.clips.to(dev).contiguous()
        self.range_modes = None if codec.range_modes is None else codec.range_modes.to(dev).contiguous()
        self.fixed_only = codec.range_modes is None or all(
            m == 0 or 16 <= m <= 23 for m in codec.range_modes.flatten().tolist())
        self.clips_used = None if bool((self.clips == 1).all()) else self.clips
        self.fragments = ops.prepare_rotations(self.rotations) if dev.type == "cuda" else None
        self.frag_bytes = _capi.load().oscarkv_cuda_rotation_fragment_bytes()
        self._free_bf16 = list(range(bf16_slots - 1, -1, -1))
        self._free_int2 = list(range(self.num_slots - 1, bf16_slots - 1, -1))
        self.pages: List[List[int]] = [[] for _ in range(max_seqs)]
        self.lengths = [0] * max_seqs
        self._settled = [0] * max_seqs  # leading pages known to be sink or INT2 history
        self.active = 0  # sequences of the current batch: 0..active-1
        self._decoder = None
        self._extend = None
        self._qbuf: Optional[torch.Tensor] = None
        self._table_dirty = True  # the sequences' page lists changed since the last upload
        self._plan_stale = True  # the decode plan predates the page table
        self._step_new: List[int] = []
        self._step_total = 0
        self._step_max_new = 0

    # ---- sequences ----

    def reset(self, num_seqs: int) -> None:
        """Starts a batch of `num_seqs` empty sequences (frees every page)."""
        if not 0 < num_seqs <= self.max_seqs:
            raise ValueError("batch of %d sequences (capacity %d)" % (num_seqs, self.max_seqs))
        for b in range(self.max_seqs):
            for s in self.pages[b]:
                self._free(s)
            self.pages[b] = []
            self.lengths[b] = 0
            self._settled[b] = 0
        self.active = num_seqs
        self._table_dirty = True

    def _alloc(self, kind: int) -> int:
        free = self._free_int2 if kind == INT2 else self._free_bf16
        if not free:
            raise MemoryError("PagedKVCache: no free %s slot (raise %s_slots)"
                              % ("INT2" if kind == INT2 else "BF16", "int2" if kind == INT2 else "bf16"))
        return free.pop()

    def _free(self, slot: int) -> None:
        self.counts[slot] = 0
        (self._free_bf16 if slot < self.n_bf16 else self._free_int2).append(slot)

    def _kind(self, slot: int) -> int:
        return BF16 if slot < self.n_bf16 else INT2

    def _slot_ptr(self, slot: int, layer: int = 0) -> int:
        """Address of slot's pool page (of `layer`'s region when layer_major)."""
        base = self.pool.data_ptr() + (layer * self.region if self.layer_major else 0)
        return (base + slot * self.sb if slot < self.n_bf16
                else base + self.n_bf16 * self.sb + (slot - self.n_bf16) * self.si)

    def slot_rows(self, kind: int) -> torch.Tensor:
        """uint8 view [regions, slots of kind, pool page bytes] of the pool (regions: layers
        when layer_major, else 1): every slot of one kind, for bulk copies."""
        r = self.codec.num_layers if self.layer_major else 1
        v = self.pool.view(r, self.region)
        if kind == BF16:
            return v[:, :self.n_bf16 * self.sb].view(r, self.n_bf16, self.sb)
        return v[:, self.n_bf16 * self.sb:].view(r, self.n_int2, self.si)

    def _page_view(self, slot: int) -> torch.Tensor:
        """The pool bytes of slot's page past its header: [regions, segment bytes] (the layers
        in FORMAT.md order: whole page minus the header, split by region)."""
        rows = self.slot_rows(self._kind(slot))
        i = slot if slot < self.n_bf16 else slot - self.n_bf16
        return rows[:, i, _HEADER:]

    def _ptrs(self, layer: int) -> torch.Tensor:
        return self.page_ptrs[layer] if self.layer_major else self.page_ptrs

    def _geo(self, layer: int):
        """(layer argument of the ops, rotations argument) for `layer`."""
        if self.layer_major:
            return 0, self.rotations[layer:layer + 1]
        return layer, self.rotations

    # ---- steps ----

    def begin_step(self, new_tokens: Sequence[int]) -> None:
        """Plans a step in which sequence b gains new_tokens[b] tokens (for b < active)."""
        c, T = self.codec, self.codec.page_tokens
        if len(new_tokens) != self.active:
            raise ValueError("begin_step: %d counts for %d sequences" % (len(new_tokens), self.active))
        total = sum(new_tokens)
        if total > self.max_step_tokens:
            raise ValueError("step of %d tokens (max_step_tokens %d)" % (total, self.max_step_tokens))
        counts = self.counts
        extend = max(new_tokens, default=0) > 1 or total != self.active
        flushes: List[Tuple[int, int]] = []
        dst_page: List[int] = []
        dst_slot: List[int] = []
        prefix_fix: List[Tuple[int, int]] = []  # (slot, tokens before this step) of touched pages
        pids: List[int] = []
        pindptr, q_indptr = [0], [0]
        dirty = self._table_dirty
        for b, m in enumerate(new_tokens):
            n0, n1 = self.lengths[b], self.lengths[b] + m
            if n1 > self.max_seq_tokens:
                raise ValueError("sequence %d would reach %d tokens (max_seq_tokens %d)"
                                 % (b, n1, self.max_seq_tokens))
            pages = self.pages[b]
            # Flush the complete BF16 pages that the plan for n1 makes history (in order).
            i = max(self._settled[b], c.sink_pages)
            while i < len(pages) and c.is_int2_page(i, n1):
                if pages[i] < self.n_bf16:
                    if (i + 1) * T > n0:
                        break  # holds rows of this step: flushed by a later step
                    d = self._alloc(INT2)
                    flushes.append((pages[i], d))
                    pages[i] = d
                    counts[d] = T
                    dirty = True
                i += 1
            self._settled[b] = i
            first = n0 // T  # pages before it are full and untouched by this step
            if extend:
                for i in range(first, len(pages)):
                    prefix_fix.append((pages[i], max(0, n0 - i * T)))
                pids += pages[:-(-n0 // T)]
                pindptr.append(len(pids))
            for p in range(n0, n1):
                i = p // T
                if i == len(pages):
                    direct = c.is_int2_page(i, n1) and i * T >= n0
                    pages.append(self._alloc(INT2 if direct else BF16))
                    prefix_fix.append((pages[i], 0))
                    dirty = True
                dst_page.append(pages[i])
                dst_slot.append(p % T)
            for i in range(first, len(pages)):
                counts[pages[i]] = min(T, n1 - i * T)
            self.lengths[b] = n1
            q_indptr.append(q_indptr[-1] + m)
        # Flushes read rows written in earlier steps (stream order), before this step's writes.
        for src, dst in flushes:
            self._flush(src, dst)
            self._free(src)
        pin = self.device.type == "cuda"
        self._upload_counts(self.page_token_counts, counts, pin)
        if extend:
            pcounts = counts.copy()
            for slot, v in prefix_fix:
                pcounts[slot] = v
            self._upload_counts(self.prefix_token_counts, pcounts, pin)
            self._upload(self.q_indptr, q_indptr, pin)
            self._upload(self.prefix_indptr, pindptr, pin)
            self._upload(self.prefix_ids, pids, pin)
        if dirty:  # the page table (and so the decode plan) changed
            ids, indptr = [], [0]
            for b in range(self.active):
                ids += self.pages[b]
                indptr.append(len(ids))
            self._upload(self.seq_page_indptr, indptr, pin)
            self._upload(self.seq_page_ids, ids, pin)
            self._indptr_host, self._ids_host = indptr, ids
            self._plan_stale = True
        self._upload(self.dst_page, dst_page, pin)
        self._upload(self.dst_slot, dst_slot, pin)
        self._step_new, self._step_total = list(new_tokens), total
        self._step_all_bf16 = all(self._kind(x) == BF16 for x in dst_page)
        self._step_max_new = max(new_tokens) if new_tokens else 0
        if pin and not extend and (self._plan_stale or self._decoder is None):
            self._plan_decode()
            self._plan_stale = False
        self._table_dirty = False

    @staticmethod
    def _upload_counts(dst: torch.Tensor, counts: "np.ndarray", pin: bool) -> None:
        src = torch.from_numpy(counts)
        dst.copy_(src.pin_memory() if pin else src, non_blocking=pin)

    @staticmethod
    def _upload(dst: torch.Tensor, values: List[int], pin: bool) -> None:
        if not values:
            return
        src = torch.tensor(values, dtype=dst.dtype)
        dst[:len(values)].copy_(src.pin_memory() if pin else src, non_blocking=pin)

    def _plan_decode(self) -> None:
        c = self.codec
        if self._decoder is None:
            # Twice the sequences: the capture decoder sizes its work-item grid from uniform
            # (all-INT2 / all-BF16) batches, and a batch of mixed pages splits into more items.
            self._decoder = ops.PagedDecoder(self.geo_layers, c.num_kv_heads, self.num_q_heads,
                                             2 * self.max_seqs, self.max_pages, c.head_dim,
                                             c.group_size, c.page_tokens)
        self._decoder.update(self._indptr_host, self._ids_host, self.kinds_host)

    def _flush(self, src: int, dst: int) -> None:
        """BF16 page `src` (rotated rows, all layers) -> INT2 page `dst`, no rotation."""
        c, T = self.codec, self.codec.page_tokens
        L, H, d = self.geo_layers, c.num_kv_heads, c.head_dim
        dst_page = torch.full((T,), dst, dtype=torch.int32)
        dst_slot = torch.arange(T, dtype=torch.int32)
        if self.device.type == "cuda":
            dst_page = dst_page.to(self.device, non_blocking=True)
            dst_slot = dst_slot.to(self.device, non_blocking=True)
        # One write of all layers; layer_major: one per layer region (its one-layer pages).
        for r, seg in enumerate(self._page_view(src)):
            rows = seg.view(torch.bfloat16).view(L, 2, H, T, d)
            k = rows[:, 0].permute(0, 2, 1, 3)  # [L, T, H, d], strides of the page layout
            v = rows[:, 1].permute(0, 2, 1, 3)
            lm = slice(r, r + 1) if self.layer_major else slice(None)
            ops.quantize_write(self.pool, self._ptrs(r), self.page_kinds, dst_page, dst_slot, k,
                               v, None, None,
                               None if self.clips_used is None else self.clips_used[lm],
                               None if self.range_modes is None else self.range_modes[lm], L, 0,
                               c.group_size, T, 0, self.fixed_only)

    # ---- per layer ----

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Stores this step's rows of `layer`: k, v [total_new, kv_heads, d] in the model's basis
        (bf16 or f32), sequence-major in begin_step's order."""
        c, H = self.codec, self.codec.num_kv_heads
        n = self._step_total
        k = k.to(torch.bfloat16).reshape(1, n, H, c.head_dim)
        v = v.to(torch.bfloat16).reshape(1, n, H, c.head_dim)
        if k.stride(-1) != 1 or k.stride() != v.stride():
            k, v = k.contiguous(), v.contiguous()
        per = 2 * H
        frag = None
        if self.fragments is not None:
            fb = self.frag_bytes
            frag = self.fragments[layer * per * fb:(layer + 1) * per * fb]
        clips = None if self.clips_used is None else self.clips_used[layer]
        modes = None if self.range_modes is None else self.range_modes[layer]
        gl, rot = self._geo(layer)
        ops.quantize_write(self.pool, self._ptrs(layer), self.page_kinds, self.dst_page[:n],
                           self.dst_slot[:n], k, v, frag,
                           rot if self.device.type != "cuda" else None, clips, modes,
                           self.geo_layers, gl, c.group_size, c.page_tokens, 0, self.fixed_only)

    def query_buffer(self, rows: int) -> torch.Tensor:
        """The decode's f32 query rows [rows, Hq, d] on CUDA (after begin_step of a decode
        step): a q written here is read by decode() in place, without a conversion copy. Rows
        past the batch stay zero (the decoder plans rows for its capacity, reads none past it)."""
        if self._decoder is None:
            raise ValueError("query_buffer: no decode step planned (begin_step first)")
        if not 0 <= rows <= self._decoder.max_seqs:
            raise ValueError("query_buffer: %d rows (capacity %d)" % (rows, self._decoder.max_seqs))
        if self._qbuf is None:
            c = self.codec
            self._qbuf = torch.zeros(self._decoder.max_seqs, self.num_q_heads, c.head_dim,
                                     dtype=torch.float32, device=self.device)
        return self._qbuf[:rows]

    def bf16_write_target(self, layer: int):
        """For a kernel that stores this step's K/V rows itself instead of write(layer, ...):
        (page_ptrs, dst_page, dst_slot, rotations f32 [2, kv_heads, d, d] (R_K, R_V), layer
        index inside a pool page, page tokens) when every new token of the step lands
        in a BF16 page (a decode step's recent page), else None (then write() must run). Row t
        of K (V) goes, as bf16 (row @ R), to element ((l * 2 + kv) * H + h) * T + dst_slot[t]
        (times d) past the 64-byte header of page page_ptrs[dst_page[t]] (FORMAT.md)."""
        if self.device.type != "cuda" or not getattr(self, "_step_all_bf16", False):
            return None
        gl, rot = self._geo(layer)
        n = self._step_total
        return (self._ptrs(layer), self.dst_page[:n], self.dst_slot[:n], rot[gl], gl,
                self.codec.page_tokens)

    def query_rotation(self, layer: int) -> torch.Tensor:
        """R_K of `layer`, f32 [kv_heads, d, d]: decode(rotated_query=True) takes q @ R_K[h]
        for every query head of KV head h (a kernel that makes q can apply it on the way)."""
        return self.rotations[layer, 0]

    def decode(self, layer: int, q: torch.Tensor, unrotate: bool = True,
               rotated_query: bool = False) -> torch.Tensor:
        """Attention of one new token per sequence (after write): q [active, Hq, d] ->
        out f32 [active, Hq, d] in the model's value space; unrotate=False: in the rotated
        value basis (o R_V), for an o_proj with R_V folded in (fold.py), one product less;
        rotated_query=True: q is already q @ query_rotation(layer) per KV head (the launch
        skips the query rotation)."""
        c = self.codec
        if self.device.type == "cuda":
            qb = self.query_buffer(q.shape[0])
            if q.data_ptr() != qb.data_ptr() or q.dtype != qb.dtype or q.stride() != qb.stride():
                qb.copy_(q)  # a query written elsewhere (query_buffer's rows need no copy)
            qp, dec = self._qbuf, self._decoder.handle
        else:
            qp, dec = q.to(torch.float32).contiguous(), 0
        gl, rot = self._geo(layer)
        out, _ = ops.paged_decode(qp, self.pool, self._ptrs(layer), self.page_kinds,
                                  self.page_token_counts, self.seq_page_indptr[:self.active + 1],
                                  self.seq_page_ids, rot, gl, dec, self.geo_layers,
                                  c.group_size, c.page_tokens, 0.0, unrotate, rotated_query)
        return out[:q.shape[0]]

    def extend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               unrotate: bool = True) -> torch.Tensor:
        """Attention of this step's new tokens to their sequences' earlier pages and causally to
        each other: q [total_new, Hq, d], k / v [total_new, kv_heads, d] in the model's basis;
        out in the model's value space (unrotate=False: the rotated basis, as decode)."""
        c = self.codec
        if self.device.type == "cuda" and self._extend is None:
            self._extend = ops.ExtendPlan(self.geo_layers, c.num_kv_heads, self.num_q_heads,
                                          self.max_seqs, self.max_step_tokens, c.head_dim,
                                          c.group_size, c.page_tokens)
        rk = torch.einsum("thd,hde->the", k.float(), self.rotations[layer, 0]).to(torch.bfloat16)
        rv = torch.einsum("thd,hde->the", v.float(), self.rotations[layer, 1]).to(torch.bfloat16)
        out, _ = ops.paged_extend(q.to(torch.float32).contiguous(), rk.contiguous(), rv.contiguous(),
                                  self.q_indptr[:self.active + 1], self.pool, self._ptrs(layer),
                                  self.page_kinds, self.prefix_token_counts,
                                  self.prefix_indptr[:self.active + 1], self.prefix_ids,
                                  *self._geo(layer)[::-1],
                                  self._extend.handle if self._extend is not None else 0,
                                  self._step_max_new, self.geo_layers, c.group_size,
                                  c.page_tokens, 0.0, unrotate)
        return out

    # ---- pages in and out ----

    def sequence_pages(self, b: int) -> List[Tuple[int, int, int]]:
        """(kind, slot, token_count) of sequence b's pages in token order."""
        return [(self._kind(s), s, int(self.counts[s])) for s in self.pages[b]]

    def export_page(self, slot: int) -> bytes:
        """The bytes of one page (header and checksum filled in), for storing in the daemon."""
        kind = self._kind(slot)
        size = self.pb if kind == BF16 else self.pi
        if self.layer_major:  # the layers' segments gathered behind a header finish_page fills
            buf = bytearray(_HEADER) + bytearray(self._page_view(slot).cpu().numpy().tobytes())
        else:
            off = self._slot_ptr(slot) - self.pool.data_ptr()
            buf = bytearray(self.pool[off:off + size].cpu().numpy().tobytes())
        arr = (_capi.ctypes.c_uint8 * size).from_buffer(buf)
        _capi.check(_capi.load().oscarkv_cuda_finish_page(_capi.ctypes.byref(self.codec.c_profile()),
                                                          kind, int(self.counts[slot]), arr, size))
        return bytes(buf)

    def copy_page_in(self, slot: int, src: torch.Tensor, non_blocking: bool = False) -> None:
        """Copies a whole page (uint8 [page bytes], FORMAT.md layout; pinned host memory for an
        asynchronous copy) into slot: one copy (layer_major: one strided copy into the layer
        regions, the header left out -- the kernels do not read it)."""
        size = self.pb if self._kind(slot) == BF16 else self.pi
        if src.dtype != torch.uint8 or src.numel() != size:
            raise ValueError("a %s page has %d bytes, got %d" % (
                "BF16" if self._kind(slot) == BF16 else "INT2", size, src.numel()))
        if self.layer_major:
            dst = self._page_view(slot)
            dst.copy_(src[_HEADER:].view(dst.shape), non_blocking=non_blocking)
        else:
            off = self._slot_ptr(slot) - self.pool.data_ptr()
            self.pool[off:off + size].copy_(src, non_blocking=non_blocking)

    def load_pages(self, b: int, pages: Sequence[Tuple[int, object]], tokens: int) -> None:
        """Appends whole pages (kind, bytes of one page as the daemon returns it) to the empty
        sequence b: one staging copy and one host-to-device copy per page, no conversion."""
        if self.lengths[b] != 0:
            raise ValueError("load_pages needs an empty sequence")
        T = self.codec.page_tokens
        for i, (kind, data) in enumerate(pages):
            size = self.pb if kind == BF16 else self.pi
            src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if src.numel() != size:
                raise ValueError("page %d: %d bytes, a %s page has %d" % (i, src.numel(),
                                 "BF16" if kind == BF16 else "INT2", size))
            s = self._alloc(kind)
            pin = self.device.type == "cuda"
            self.copy_page_in(s, src.pin_memory() if pin else src, non_blocking=pin)
            self.pages[b].append(s)
            self.counts[s] = min(T, tokens - i * T)
        self.lengths[b] = tokens
        self._table_dirty = True
