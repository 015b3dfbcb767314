"""`python -m oscarkv.bench model`: a Qwen3-8B-shaped model (random bf16 weights, no download) on
oscarkv's INT2 pages against the same model on a BF16 KV cache, every decode step a CUDA-graph
replay, in one run on one GPU.

Sides: int2 -- PagedKVCache (INT2 history, BF16 sink/tail; quantize-on-write + paged decode);
bf16-sdpa -- a dense BF16 cache read by SDPA (enable_gqa) over exactly the cached length;
bf16-pages -- BF16 pages read by oscarkv's paged decode kernel. The BF16 baseline of each figure
is the faster BF16 side. The model (embeddings, RMSNorm, fused QKV, q/k norm, RoPE, SwiGLU,
lm_head) is this file's own, the same for every side: cuBLAS GEMMs (residual adds in place, in
their epilogue) and, with Triton, three fused kernels per layer for the rest (kernels.py:
RMSNorm, q/k norm + RoPE writing q/k/v where the side reads them, SiLU*up); --model-kernels
eager runs the plain torch form instead. The paged sides fold each layer's value rotation into
their own copy of W_o (oscarkv.torch.fold, as oscarkv.transformers does on a model), so the
paged decode returns its output in the rotated basis with no unrotation (rows: v_fold;
--also unfold adds rows of the unrotating launch on the model's W_o). At batch 1 their q/k norm
+ RoPE kernel also writes the query rotated by R_K (rows: q_rotated; --also rotk adds rows of the
decode launch rotating it); --also fusedwrite adds rows where that kernel stores the step's K/V
into their BF16 page slots in place of the write launch. --decode-probe times the paged sides'
decode launches alone, back to back and after an L2-wide read (the model's L2 state).

Bounds: (weight bytes read per step + KV bytes read per step) / the copy bandwidth measured in
the same run (a device-to-device copy, read + write bytes over time).
"""
import argparse
import json
import time
import traceback
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from ..torch import BF16, INT2, KVCodec, PagedKVCache
from ..torch.fold import fold_value_rotation
from . import kernels as K
from .probes import capture, decode_probe, gemv_probe, median_time, profile_replays

QWEN3_8B = dict(layers=36, hidden=4096, q_heads=32, kv_heads=8, head_dim=128, inter=12288,
                vocab=151936, rope_theta=1e6, eps=1e-6)


# Forms of the model's non-attention work, every side the same: eager (plain torch ops), fused
# (kernels.py's three Triton kernels per layer around cuBLAS GEMMs), gemv (fused, and at one
# token per step the projections as Triton GEMVs with the norms / residual / SiLU*up folded in).
FORMS = ("eager", "fused", "gemv")


class Model:
    def __init__(self, cfg: Dict, device: str = "cuda", seed: int = 0,
                 form: Optional[str] = None) -> None:
        self.cfg = c = cfg
        # form of the per-layer non-attention work (FORMS); default: gemv where Triton is there
        self.form = form or ("gemv" if K.available() else "eager")
        if self.form not in FORMS:
            raise ValueError("model form %r: one of %s" % (self.form, ", ".join(FORMS)))
        # gemv form: projection (qkv, o, gate_up, down, lm_head) -> Triton GEMV config, or
        # absent: cuBLAS; down_si: with gate_up on cuBLAS, down as a GEMV reading its output as
        # silu(gate) * up (no silu_mul kernel). Every projection a GEMV until gemv_probe picks
        # the faster per shape.
        self.gemv_pick: Dict[str, Optional[dict]] = {
            p: dict(K.GEMV_CONFIG) for p in ("qkv", "o", "gate_up", "down", "lm_head")}
        g = torch.Generator(device=device).manual_seed(seed)
        d, hq, h = c["head_dim"], c["q_heads"], c["kv_heads"]

        def w(*shape, scale=0.02):
            return (torch.randn(*shape, device=device, dtype=torch.bfloat16, generator=g) * scale)
        self.embed = w(c["vocab"], c["hidden"])
        self.layers = []
        for _ in range(c["layers"]):
            self.layers.append(dict(
                ln1=torch.ones(c["hidden"], device=device, dtype=torch.bfloat16),
                ln2=torch.ones(c["hidden"], device=device, dtype=torch.bfloat16),
                qkv=w((hq + 2 * h) * d, c["hidden"]),
                # q_norm for the hq query heads and k_norm for the h KV heads, stacked
                qkn=torch.ones(hq + h, d, device=device, dtype=torch.bfloat16),
                o=w(c["hidden"], hq * d),
                gu=w(2 * c["inter"], c["hidden"]), down=w(c["hidden"], c["inter"])))
        self.norm = torch.ones(c["hidden"], device=device, dtype=torch.bfloat16)
        self.lm_head = w(c["vocab"], c["hidden"])
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, device=device).float() / d))
        self.inv_freq = inv

    def weight_bytes_per_step(self) -> int:
        """Bytes of the weights a decode step reads (all but the embedding table)."""
        n = self.lm_head.numel() + self.norm.numel()
        for l in self.layers:
            n += sum(t.numel() for t in l.values())
        return 2 * n

    def rope_tables(self, pos: torch.Tensor):
        """cos and signed sin [T, 1, d] of positions pos (rotate-half convention, HF Qwen3):
        rope(x) = x * cos + roll(x, d/2) * sin_signed."""
        f = pos.float()[:, None] * self.inv_freq[None, :]
        cos = torch.cat([f.cos(), f.cos()], -1)[:, None, :].to(torch.bfloat16)
        sin = torch.cat([-f.sin(), f.sin()], -1)[:, None, :].to(torch.bfloat16)
        return cos, sin

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, attn: "Attn") -> torch.Tensor:
        """ids, pos [T] (T tokens of the step, sequence-major); attn an Attn (where q/k/v go and
        attend(layer, q, k, v) -> [T, Hq, d]). Returns the hidden states [T, hidden]."""
        if self.form == "eager":
            return self.forward_eager(ids, pos, attn)
        c = self.cfg
        d, hq, h, eps = c["head_dim"], c["q_heads"], c["kv_heads"], c["eps"]
        x = self.embed[ids]
        T = x.shape[0]
        if self.form == "gemv" and T == 1:
            return self._forward_gemv(x, pos, attn)
        for i, l in enumerate(self.layers):
            qkv = K.rms_norm(x, l["ln1"], eps) @ l["qkv"].t()
            q = attn.q_buffer(T)
            kd, vd = attn.kv_dst(i, T)
            K.qk_norm_rope(qkv, l["qkn"], pos, self.inv_freq, q, kd, vd, hq, h, d, eps,
                           q_rot=attn.q_rotation(i), page_write=attn.page_write(i))
            heads = qkv.view(T, hq + 2 * h, d)
            k = kd if kd is not None else heads[:, hq:hq + h]
            v = vd if vd is not None else heads[:, hq + h:]
            a = attn.attend(i, q, k, v)
            x.addmm_(a.reshape(T, -1).to(x.dtype), attn.o_weight(i, l).t())  # in place: no copy of x
            gu = K.rms_norm(x, l["ln2"], eps) @ l["gu"].t()
            x.addmm_(K.silu_mul(gu), l["down"].t())
        return x

    def _forward_gemv(self, x: torch.Tensor, pos: torch.Tensor, attn: "Attn") -> torch.Tensor:
        """One token: each projection as gemv_pick says -- a Triton GEMV (its RMSNorm in the
        prologue, the residual add or SiLU*up in the epilogue, the attention's f32 output read
        as is) or cuBLAS with the fused form's kernels."""
        c = self.cfg
        d, hq, h, eps = c["head_dim"], c["q_heads"], c["kv_heads"], c["eps"]
        pick = self.gemv_pick
        for i, l in enumerate(self.layers):
            if pick.get("qkv"):
                qkv = K.gemv(x, l["qkv"], norm=l["ln1"], eps=eps, config=pick["qkv"])
            else:
                qkv = K.rms_norm(x, l["ln1"], eps) @ l["qkv"].t()
            q = attn.q_buffer(1)
            kd, vd = attn.kv_dst(i, 1)
            K.qk_norm_rope(qkv, l["qkn"], pos, self.inv_freq, q, kd, vd, hq, h, d, eps,
                           q_rot=attn.q_rotation(i), page_write=attn.page_write(i))
            heads = qkv.view(1, hq + 2 * h, d)
            k = kd if kd is not None else heads[:, hq:hq + h]
            v = vd if vd is not None else heads[:, hq + h:]
            a = attn.attend(i, q, k, v).reshape(1, -1)
            wo = attn.o_weight(i, l)
            if pick.get("o"):
                K.gemv(a, wo, out=x, residual=x, config=pick["o"])
            else:
                x.addmm_(a.to(x.dtype), wo.t())
            if pick.get("gate_up"):
                y = K.gemv(x, l["gu"], norm=l["ln2"], eps=eps, swiglu=True, config=pick["gate_up"])
            elif pick.get("down_si"):  # down reads the gate/up output as silu(gate) * up
                gu = K.rms_norm(x, l["ln2"], eps) @ l["gu"].t()
                K.gemv(gu, l["down"], out=x, residual=x, swiglu_in=True, config=pick["down_si"])
                continue
            else:
                y = K.silu_mul(K.rms_norm(x, l["ln2"], eps) @ l["gu"].t())
            if pick.get("down"):
                K.gemv(y, l["down"], out=x, residual=x, config=pick["down"])
            else:
                x.addmm_(y, l["down"].t())
        return x

    def forward_eager(self, ids: torch.Tensor, pos: torch.Tensor, attn: "Attn") -> torch.Tensor:
        """The same layer in plain torch ops (the form before the fused kernels; the tests'
        reference and the profile's comparison). q/k/v go where attn says, as in forward."""
        c = self.cfg
        d, hq, h, eps = c["head_dim"], c["q_heads"], c["kv_heads"], c["eps"]
        x = self.embed[ids]
        cos, sin = self.rope_tables(pos)
        T = x.shape[0]
        for i, l in enumerate(self.layers):
            y = F.rms_norm(x, (c["hidden"],), l["ln1"], eps)
            qkv = y @ l["qkv"].t()
            # q and k heads are adjacent in qkv: one norm and one RoPE for both
            qk = F.rms_norm(qkv[:, :(hq + h) * d].view(T, hq + h, d), (d,), None, eps) * l["qkn"]
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), sin)
            heads = qkv.view(T, hq + 2 * h, d)
            kd, vd = attn.kv_dst(i, T)
            q = attn.q_buffer(T)
            rot = attn.q_rotation(i)
            if rot is None:
                q.copy_(qk[:, :hq])
            else:  # the rotated query (q @ R_K of each head's KV head), as the fused kernel
                q.copy_(torch.einsum("tkgi,kic->tkgc", qk[:, :hq].float().view(T, h, hq // h, d),
                                     rot).reshape(T, hq, d))
            if kd is None:  # k back into qkv: k and v share strides (the INT2 write's input)
                kd = heads[:, hq:hq + h]
            kd.copy_(qk[:, hq:])
            if vd is not None:
                vd.copy_(heads[:, hq + h:])
            v = vd if vd is not None else heads[:, hq + h:]
            a = attn.attend(i, q, kd, v)
            x = torch.addmm(x, a.reshape(T, -1).to(x.dtype), attn.o_weight(i, l).t())
            y = F.rms_norm(x, (c["hidden"],), l["ln2"], eps)
            gu = y @ l["gu"].t()
            g_, u = gu.chunk(2, -1)
            x = torch.addmm(x, F.silu(g_) * u, l["down"].t())
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "gemv" and x.shape[0] == 1 and self.gemv_pick.get("lm_head"):
            return K.gemv(x, self.lm_head, norm=self.norm, eps=self.cfg["eps"],
                          config=self.gemv_pick["lm_head"])
        return F.rms_norm(x, (self.cfg["hidden"],), self.norm, self.cfg["eps"]) @ self.lm_head.t()


def copy_bandwidth(device: str = "cuda") -> float:
    """Bytes/s of a device-to-device copy (read + write), median of 20."""
    a = torch.empty(1 << 31, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    return 2 * a.numel() / median_time(lambda: b.copy_(a), 20)


# ---- sides ----

def plan_kinds(codec: KVCodec, n: int) -> List[int]:
    T = codec.page_tokens
    return [INT2 if codec.is_int2_page(i, n) else BF16 for i in range(-(-n // T))]


# How the paged sides' pool holds pages (PagedKVCache layer_major): page-major (whole FORMAT.md
# pages in slots; the default) or layer-major (one region per layer). On the H200 the two
# decoded equally fast at B=1 (32K, 100K) and layer-major's strided page copies made the TTFT
# hit slower (docs/results/python_torch.md); --also adds rows of the other.
LAYOUTS = ("page-major", "layer-major")
LAYOUT = dict(paged=LAYOUTS[0])


def paged_cache(model: Model, codec: KVCodec, batch: int, ctx: int, extra: int = 64,
                max_step_tokens: Optional[int] = None) -> PagedKVCache:
    """A cache of `batch` sequences of `ctx` tokens of real K/V pages (one page of each kind
    written by quantize-on-write from random rows, copied into every slot of its kind), in
    LAYOUT["paged"]."""
    kinds = plan_kinds(codec, ctx + extra)
    n2 = sum(1 for k in kinds if k == INT2)
    nb = len(kinds) - n2
    c = model.cfg
    cache = PagedKVCache(codec, c["q_heads"], batch, ctx + extra, int2_slots=batch * (n2 + 1) + 1,
                         bf16_slots=batch * (nb + 2) + 2,
                         max_step_tokens=max_step_tokens or max(batch, 64),
                         layer_major=LAYOUT["paged"] == "layer-major")
    T = codec.page_tokens
    # Template pages: slot 0 (BF16) and the first INT2 slot from 64 random rows.
    cache.reset(1)
    cache.begin_step([T])
    g = torch.Generator(device="cuda").manual_seed(1)
    for l in range(codec.num_layers):
        r = torch.randn(T, codec.num_kv_heads, codec.head_dim, device="cuda", generator=g)
        cache.write(l, r, r * 0.5)
    tb = cache.slot_rows(BF16)[:, 0].clone()  # slot 0 (every layer region)
    cache._flush(cache.pages[0][0], cache.n_bf16)  # an INT2 copy of the template
    ti = cache.slot_rows(INT2)[:, 0].clone()
    cache.reset(batch)
    cache._free_int2 = list(range(cache.num_slots - 1, cache.n_bf16 - 1, -1))
    cache._free_bf16 = list(range(cache.n_bf16 - 1, -1, -1))
    for b in range(batch):
        for i in range(-(-ctx // T)):
            kind = INT2 if codec.is_int2_page(i, ctx) else BF16
            s = cache._alloc(kind)
            cache.pages[b].append(s)
            cache.counts[s] = min(T, ctx - i * T)
        cache.lengths[b] = ctx
    cache.slot_rows(BF16).copy_(tb[:, None].expand(-1, cache.n_bf16, -1))
    cache.slot_rows(INT2).copy_(ti[:, None].expand(-1, cache.n_int2, -1))
    return cache


def paged_kv_bytes(cache: PagedKVCache) -> int:
    """K/V bytes one decode step reads from the pages (all layers, all sequences)."""
    c = cache.codec
    seg = {INT2: c.page_tokens * (c.head_dim // 4 + 4 * c.head_dim // c.group_size),
           BF16: c.page_tokens * c.head_dim * 2}
    n = 0
    for b in range(cache.active):
        for kind, _, _ in cache.sequence_pages(b):
            n += seg[kind] * 2 * c.num_kv_heads * c.num_layers
    return n


class Attn:
    """Where a step's q / k / v go and how a layer attends (the forward's callbacks). Default:
    q in a fresh bf16 buffer, k (normed, rotated) back into the QKV output, v left there."""

    def __init__(self, cfg: Dict) -> None:
        self.hq, self.d = cfg["q_heads"], cfg["head_dim"]

    def q_buffer(self, T: int) -> torch.Tensor:
        return torch.empty(T, self.hq, self.d, dtype=torch.bfloat16, device="cuda")

    def kv_dst(self, layer: int, T: int):
        """(k_dst, v_dst) [T, kv_heads, d] views to write this layer's rows to, or None."""
        return None, None

    def q_rotation(self, layer: int) -> Optional[torch.Tensor]:
        """f32 [kv_heads, d, d] the q/k-norm + RoPE kernel applies to each q head (q @ R of its
        KV head) for an attention that takes rotated queries, or None."""
        return None

    def page_write(self, layer: int):
        """PagedKVCache.bf16_write_target for the q/k kernel to store K/V itself, or None."""
        return None

    def o_weight(self, layer: int, l: Dict) -> torch.Tensor:
        """The output projection's weight of `layer` for this side's attention output (the
        model's; a side whose attention returns rotated outputs gives it with R_V folded in)."""
        return l["o"]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


# Whether the paged sides fold R_V into o_proj (oscarkv.torch.fold: the decode returns rotated
# outputs, no unrotation in its launch) -- what oscarkv.transformers does; --also unfold adds
# rows of the unrotating launch.
FOLD = dict(on=True)
# Whether the paged sides' q/k-norm + RoPE kernel writes the query already rotated by R_K
# (PagedKVCache.query_rotation; the decode launch then skips its query rotation); --also rotk
# adds rows of the decoder rotating the query itself.
ROTQ = dict(on=True)
DECODE_PROBE = dict(on=False)  # --decode-probe
# Whether the paged sides' q/k kernel also stores the step's K/V rows (rotated, bf16) into
# their BF16 page slots in place of the cache's write launch (--also fusedwrite adds rows).
FUSED_WRITE = dict(on=False)


def folded_o(model: Model, codec: KVCodec) -> List[torch.Tensor]:
    """Every layer's W_o with codec's R_V folded in (new tensors; the model's stay as they are)."""
    hq = model.cfg["q_heads"]
    return [fold_value_rotation(l["o"], codec.matrices[i, 1], hq) for i, l in enumerate(model.layers)]


class PagedSide(Attn):
    """The model on a PagedKVCache: q goes straight into the decoder's f32 query buffer; per
    layer one quantize-on-write launch (K and V from the QKV output, no copies) and the paged
    decode (rotated output into a folded o_proj unless fold is off)."""

    def __init__(self, model: Model, codec: KVCodec, batch: int, ctx: int,
                 fold: Optional[bool] = None) -> None:
        super().__init__(model.cfg)
        self.model, self.batch = model, batch
        self.fold = FOLD["on"] if fold is None else fold
        # At batch 1 only: the q/k kernel reads a 128 x 32 slab of R_K per (token, q head,
        # block), 2 MB per token from L2 -- 340 MB a layer at B=166, where the decoder's
        # rotation kernel (one CTA per sequence and KV head) reads 64 KB per CTA.
        self.rotq = ROTQ["on"] and batch == 1
        self.fused_write = FUSED_WRITE["on"] and self.rotq
        self._written = set()  # layers whose K/V the q/k kernel stored this forward
        self.o = folded_o(model, codec) if self.fold else None
        self.cache = paged_cache(model, codec, batch, ctx)
        self.cache.begin_step([1] * batch)
        self.ids = torch.zeros(batch, dtype=torch.long, device="cuda")
        self.pos = torch.full((batch,), ctx, dtype=torch.long, device="cuda")
        self.kv_bytes = paged_kv_bytes(self.cache)

    def q_buffer(self, T):
        return self.cache.query_buffer(T)

    def q_rotation(self, layer):
        return self.cache.query_rotation(layer) if self.rotq else None

    def o_weight(self, layer, l):
        return self.o[layer] if self.fold else l["o"]

    def page_write(self, layer):
        t = self.cache.bf16_write_target(layer) if self.fused_write else None
        if t is not None:
            self._written.add(layer)
        return t

    def attend(self, layer, q, k, v):
        if layer in self._written:
            self._written.discard(layer)
        else:
            self.cache.write(layer, k, v)
        return self.cache.decode(layer, q, unrotate=not self.fold, rotated_query=self.rotq)

    def step(self):
        return self.model.logits(self.model.forward(self.ids, self.pos, self))


class SdpaSide(Attn):
    """The model on a dense BF16 cache: k / v written straight into the cache's slot by the
    q/k-norm + RoPE kernel, SDPA (enable_gqa) over exactly the cached length."""

    def __init__(self, model: Model, batch: int, ctx: int) -> None:
        super().__init__(model.cfg)
        c = model.cfg
        self.model, self.batch, self.n = model, batch, ctx + 1
        self.k = [torch.zeros(batch, c["kv_heads"], ctx + 1, c["head_dim"], device="cuda",
                              dtype=torch.bfloat16) for _ in range(c["layers"])]
        self.v = [torch.zeros_like(t) for t in self.k]
        for t in self.k + self.v:
            t.normal_()
        self.ids = torch.zeros(batch, dtype=torch.long, device="cuda")
        self.pos = torch.full((batch,), ctx, dtype=torch.long, device="cuda")
        self.kv_bytes = 2 * 2 * batch * (ctx + 1) * c["kv_heads"] * c["head_dim"] * c["layers"]

    def kv_dst(self, layer, T):
        return self.k[layer][:, :, self.n - 1], self.v[layer][:, :, self.n - 1]

    def attend(self, layer, q, k, v):
        o = F.scaled_dot_product_attention(q.unsqueeze(2), self.k[layer][:, :, :self.n],
                                           self.v[layer][:, :, :self.n], enable_gqa=True)
        return o.squeeze(2)

    def step(self):
        return self.model.logits(self.model.forward(self.ids, self.pos, self))


def int2_codec(cfg: Dict, all_bf16: bool = False, max_tokens: int = 0) -> KVCodec:
    c = KVCodec.builtin("hadamard", cfg["layers"], cfg["kv_heads"],
                        sink_tokens=max_tokens if all_bf16 else 64)
    if all_bf16:
        c.name = "bf16-pages"
    return c


PROFILE: Dict = dict(dir="", results=[])  # --profile: where run_side's B=1 profiles go


def time_side(side, n: int = 20, label: str = "") -> float:
    g, _ = capture(side.step)
    for _ in range(3):
        g.replay()
    t = median_time(g.replay, n)
    if PROFILE["dir"] and label:
        try:
            PROFILE["results"].append(profile_replays(g, label, side.model.cfg["layers"],
                                                      PROFILE["dir"], t))
        except Exception as e:  # the figures stand without the profile
            print("  profile %s failed: %s" % (label, e))
    return t


def per_seq_bytes(cfg: Dict, side: str, ctx: int) -> int:
    if side == "int2":
        codec = int2_codec(cfg)
        kinds = plan_kinds(codec, ctx + 64)
        n2 = sum(1 for k in kinds if k == INT2)
        return (n2 + 1) * codec.page_bytes(INT2) + (len(kinds) - n2 + 2) * codec.page_bytes(BF16)
    return 2 * 2 * (ctx + 65) * cfg["kv_heads"] * cfg["head_dim"] * cfg["layers"]


def run_side(model: Model, name: str, batch: int, ctx: int) -> Dict:
    cfg = model.cfg
    if name == "bf16-sdpa":
        side = SdpaSide(model, batch, ctx)
    else:
        side = PagedSide(model, int2_codec(cfg, name == "bf16-pages", ctx + 128), batch, ctx)
    kernels = model.form
    layout = LAYOUT["paged"] if isinstance(side, PagedSide) else "dense"
    fold = bool(getattr(side, "fold", False))
    rotq = bool(getattr(side, "rotq", False))
    fw = bool(getattr(side, "fused_write", False))
    t = time_side(side, label="%s-%s-%s%s%s%s-b%d-%d" % (
        name, kernels, layout, "" if fold or layout == "dense" else "-unfold",
        "-rotk" if layout != "dense" and not rotq else "", "-fusedwrite" if fw else "", batch,
        ctx) if batch == 1 else "")
    r = dict(side=name, batch=batch, ctx=ctx, step_s=t, kv_bytes=side.kv_bytes,
             tokens_per_s=batch / t, model_kernels=kernels, page_layout=layout, v_fold=fold,
             q_rotated=rotq, fused_write=fw)
    if isinstance(side, PagedSide) and batch == 1 and DECODE_PROBE["on"]:
        r["decode_probe"] = decode_probe(side)
    if isinstance(side, PagedSide):
        t0 = time.perf_counter()
        for _ in range(5):
            side.cache.begin_step([1] * batch)
        r["host_plan_s"] = (time.perf_counter() - t0) / 5
    del side
    torch.cuda.empty_cache()
    return r


def max_batch(model: Model, name: str, ctx: int, margin: float) -> int:
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    per = per_seq_bytes(model.cfg, "int2" if name == "int2" else "bf16", ctx)
    return max(1, int((free - margin) // per))


def ttft(model: Model, prefix: int, new: int) -> Dict:
    """TTFT of a request whose first `prefix` tokens are cached (their pages in pinned host
    memory, as a daemon load delivers them) plus `new` tokens, against a full BF16 prefill of
    prefix + new tokens (SDPA; cuDNN or flash, the faster)."""
    cfg = model.cfg
    codec = int2_codec(cfg)
    cache = paged_cache(model, codec, 1, prefix, extra=new + 64, max_step_tokens=new)
    T = codec.page_tokens
    # Whole FORMAT.md pages (the header left zero: the kernels do not read it), as a load
    # delivers them, in pinned host memory.
    staged = [torch.cat([torch.zeros(64, dtype=torch.uint8, device="cuda"),
                         cache._page_view(s).reshape(-1)]).cpu().pin_memory()
              for s in cache.pages[0]]
    kinds = [k for k, _, _ in cache.sequence_pages(0)]
    page_bytes = sum(t.numel() for t in staged)
    ids = torch.randint(0, cfg["vocab"], (new,), device="cuda")
    pos = torch.arange(prefix, prefix + new, device="cuda")

    fold = FOLD["on"]
    wo = folded_o(model, codec) if fold else None

    class HitAttn(Attn):
        def q_buffer(self, T):  # extend's query: f32, contiguous
            return torch.empty(T, self.hq, self.d, dtype=torch.float32, device="cuda")

        def o_weight(self, layer, l):
            return wo[layer] if fold else l["o"]

        def attend(self, layer, q, k, v):
            cache.write(layer, k, v)
            return cache.extend(layer, q, k, v, unrotate=not fold)

    def prefill():
        x = model.forward(ids, pos, HitAttn(cfg))
        return model.logits(x[-1:])

    def load_pages_pinned():  # one H2D copy per page from pinned staging, as load_pages does
        cache.reset(1)
        for kind, t in zip(kinds, staged):
            s = cache._alloc(kind)
            cache.copy_page_in(s, t, non_blocking=True)
            cache.pages[0].append(s)
            cache.counts[s] = min(T, prefix - (len(cache.pages[0]) - 1) * T)
        cache.lengths[0] = prefix
        cache.begin_step([new])

    load_pages_pinned()
    g, _ = capture(prefill)

    def hit_pinned():
        load_pages_pinned()
        g.replay()

    ts = []
    for i in range(8):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        hit_pinned()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    hit_s = sorted(ts[2:])[len(ts[2:]) // 2]
    cache = g = staged = wo = None  # free the INT2 side before the BF16 prefill
    torch.cuda.empty_cache()
    # Full BF16 prefill of prefix + new tokens (causal), K/V kept in a dense BF16 cache.
    n = prefix + new
    ids2 = torch.randint(0, cfg["vocab"], (n,), device="cuda")
    pos2 = torch.arange(n, device="cuda")
    kc = [torch.empty(cfg["kv_heads"], n, cfg["head_dim"], device="cuda", dtype=torch.bfloat16)
          for _ in range(cfg["layers"])]
    vc = [torch.empty_like(t) for t in kc]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = cfg["q_heads"] // cfg["kv_heads"]

    class FullAttn(Attn):  # k / v written straight into the dense cache [kv_heads, n, d]
        def __init__(self, backend, expand):
            super().__init__(cfg)
            self.backend, self.expand = backend, expand

        def kv_dst(self, layer, T):
            return kc[layer].transpose(0, 1), vc[layer].transpose(0, 1)

        def attend(self, layer, q, k, v):
            backend, expand = self.backend, self.expand
            kk, vv = kc[layer][None], vc[layer][None]
            if expand:  # a backend without GQA support: K/V expanded to the query heads
                kk, vv = kk.repeat_interleave(gqa, 1), vv.repeat_interleave(gqa, 1)
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kk, vv,
                                                   is_causal=True, enable_gqa=not expand)
            return o[0].transpose(0, 1)

    def full(backend, expand=False):
        x = model.forward(ids2, pos2, FullAttn(backend, expand))
        return model.logits(x[-1:])

    best = None
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION):
        for expand in (False, True):
            try:
                full(backend, expand)
                torch.cuda.synchronize()
                ts = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    full(backend, expand)
                    torch.cuda.synchronize()
                    ts.append(time.perf_counter() - t0)
                t = sorted(ts)[1]
                print("  full prefill %d tokens, %s%s: %.1f ms" % (n, backend, " (K/V expanded)"
                                                                   if expand else "", t * 1e3))
                if best is None or t < best[0]:
                    best = (t, str(backend) + (" expanded" if expand else ""))
                break
            except RuntimeError as e:
                print("  prefill backend %s%s failed: %s" % (backend, " expanded" if expand else "",
                                                           str(e).splitlines()[0][:200]))
    return dict(prefix=prefix, new=new, hit_s=hit_s, hit_page_bytes=page_bytes, v_fold=fold,
                prefill_s=best[0], prefill_backend=best[1], ratio=best[0] / hit_s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oscarkv.bench model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="32768,100000", help="batch-1 decode contexts")
    ap.add_argument("--batch-ctx", type=int, default=32768, help="context of the max-batch runs")
    ap.add_argument("--max-batch", default="auto",
                    help="'auto' (largest that fits, per side), 'off', or INT2,BF16 batches")
    ap.add_argument("--margin-gb", type=float, default=8.0, help="memory left for activations")
    ap.add_argument("--ttft", default="32768,512", help="PREFIX,NEW for TTFT ('off' to skip)")
    ap.add_argument("--layers", type=int, default=0, help="override the layer count (smoke runs)")
    ap.add_argument("--json", default="", help="write the figures as JSON to this file ('-': stdout)")
    ap.add_argument("--model-kernels", choices=("auto",) + FORMS, default="auto",
                    help="form of the per-layer non-attention work, the same for every side: "
                    "eager (torch ops), fused (three Triton kernels per layer around cuBLAS), "
                    "gemv (fused + Triton GEMVs at batch 1); auto: gemv where Triton is there")
    ap.add_argument("--page-layout", choices=LAYOUTS, default=LAYOUTS[0],
                    help="how the paged sides' pool holds pages (PagedKVCache layer_major)")
    ap.add_argument("--also", default="",
                    help="comma list of further model forms / page layouts, 'unfold' (the "
                    "paged sides unrotating their output instead of a folded o_proj), 'rotk' "
                    "(the decode launch rotating the query instead of the q/k kernel) or "
                    "'fusedwrite' (the q/k kernel storing K/V in place of the write launch), to time "
                    "every batch-1 side with (extra rows: model_kernels / page_layout / v_fold "
                    "say which; the keys use --model-kernels, --page-layout and the fold)")
    ap.add_argument("--no-gemv-probe", action="store_true",
                    help="gemv form: skip timing each projection of one layer at batch 1 (cuBLAS "
                    "vs Triton GEMV configurations, CUDA graphs) and picking the faster per "
                    "projection; every projection then runs as a GEMV")
    ap.add_argument("--profile", default="", help="folder for torch.profiler kernel tables of "
                    "every batch-1 graph replay (per-layer split by kernel category)")
    ap.add_argument("--decode-probe", action="store_true",
                    help="paged sides at batch 1: also time the decode launches alone (a graph "
                    "of every layer's decode, nothing else; and each after an L2 flush)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("oscarkv bench model: needs a CUDA GPU")
        return 1
    cfg = dict(QWEN3_8B)
    if a.layers:
        cfg["layers"] = a.layers
    model = Model(cfg, form=None if a.model_kernels == "auto" else a.model_kernels)
    main_form = model.form
    PROFILE["dir"] = a.profile
    DECODE_PROBE["on"] = a.decode_probe
    LAYOUT["paged"] = a.page_layout
    bw = copy_bandwidth()
    wbytes = model.weight_bytes_per_step()
    out: Dict = dict(device=torch.cuda.get_device_name(), copy_bandwidth_Bps=bw,
                     weight_bytes=wbytes, config=cfg, runs=[],
                     model_kernels=model.form, page_layout=a.page_layout)
    print("device %s, copy bandwidth %.2f TB/s, weights read per step %.2f GB"
          % (out["device"], bw / 1e12, wbytes / 1e9))

    def report(r):
        r["bound_s"] = (wbytes + r["kv_bytes"]) / bw
        r["vs_bound"] = r["step_s"] / r["bound_s"]
        out["runs"].append(r)
        print("  %-10s %-5s %-11s %-6s%s B=%-4d ctx=%-6d step %8.3f ms  bound %8.3f ms (x%.2f)  %9.1f tok/s%s"
              % (r["side"], r["model_kernels"][:5], r["page_layout"],
                 "fold" if r.get("v_fold") else "-",
                 "" if r["page_layout"] == "dense" else (" rotq" if r.get("q_rotated") else " rotk")
                 + (" fw" if r.get("fused_write") else ""),
                 r["batch"], r["ctx"], r["step_s"] * 1e3,
                 r["bound_s"] * 1e3, r["vs_bound"], r["tokens_per_s"],
                 "  host plan %.2f ms" % (r["host_plan_s"] * 1e3) if "host_plan_s" in r else ""))
        return r

    def save():
        if a.json:
            text = json.dumps(out, indent=1, default=str)
            if a.json == "-":
                print(text)
            else:
                open(a.json, "w").write(text)

    if "gemv" in (main_form,) + tuple(a.also.split(",")) and not a.no_gemv_probe:
        try:
            out["gemv_probe"] = gemv_probe(model, bw)
        except Exception:  # the bench stands without the probe (every projection a GEMV)
            traceback.print_exc()
        out["gemv_pick"] = model.gemv_pick
        save()
    for ctx in [int(x) for x in a.contexts.split(",") if x]:
        res = {}
        for s in ("int2", "bf16-sdpa", "bf16-pages"):
            try:
                res[s] = report(run_side(model, s, 1, ctx))
            except Exception:  # report the others
                traceback.print_exc()
                torch.cuda.empty_cache()
            for extra in [f for f in a.also.split(",") if f and f not in (main_form, a.page_layout)]:
                if (extra in LAYOUTS or extra in ("unfold", "rotk", "fusedwrite")) and s == "bf16-sdpa":
                    continue  # a dense cache has no page layout and no rotation
                # the same side in another model form, page layout or unfolded (an extra row)
                if extra in LAYOUTS:
                    LAYOUT["paged"] = extra
                elif extra == "unfold":
                    FOLD["on"] = False
                elif extra == "rotk":
                    ROTQ["on"] = False
                elif extra == "fusedwrite":
                    FUSED_WRITE["on"] = True
                else:
                    model.form = extra
                try:
                    report(run_side(model, s, 1, ctx))
                except Exception:
                    traceback.print_exc()
                    torch.cuda.empty_cache()
                model.form, LAYOUT["paged"], FOLD["on"], ROTQ["on"] = main_form, a.page_layout, True, True
                FUSED_WRITE["on"] = False
        if "int2" not in res or len(res) < 2:
            continue
        # The BF16 baseline: the fastest BF16 row of this context in any form / layout timed
        # (--also rows included), so a form that helps INT2 more cannot weaken the baseline.
        bf = [r for r in out["runs"] if r["batch"] == 1 and r["ctx"] == ctx
              and r["side"].startswith("bf16")]
        bestr = min(bf, key=lambda r: r["step_s"])
        best = bestr["step_s"]
        tag = "%dk" % (ctx // 1024 if ctx % 1024 == 0 else round(ctx / 1000))  # 32768: 32k
        key = "decode_speedup_b1_" + tag
        out[key] = best / res["int2"]["step_s"]
        out["bf16_baseline_b1_" + tag] = "%s %s %s" % (bestr["side"], bestr["model_kernels"],
                                                       bestr["page_layout"])
        out["int2_vs_bound_b1_" + tag] = res["int2"]["vs_bound"]
        print("%s = %.3f" % (key, out[key]))
        save()
    if a.max_batch != "off":
        ctx = a.batch_ctx
        margin = a.margin_gb * 2**30
        if a.max_batch == "auto":
            bi, bb = max_batch(model, "int2", ctx, margin), max_batch(model, "bf16", ctx, margin)
        else:
            bi, bb = (int(x) for x in a.max_batch.split(","))
        print("max batch at %d: INT2 %d, BF16 %d (memory left %.0f GB)" % (ctx, bi, bb, a.margin_gb))
        try:
            ri = report(run_side(model, "int2", bi, ctx))
        except Exception:
            traceback.print_exc()
            torch.cuda.empty_cache()
            ri = None
        rb = []
        for s in ("bf16-sdpa", "bf16-pages"):
            try:
                rb.append(report(run_side(model, s, bb, ctx)))
            except Exception:
                traceback.print_exc()
                torch.cuda.empty_cache()
        out["max_batch_int2_32k"], out["max_batch_bf16_32k"] = bi, bb
        if ri and rb:
            best = max(r["tokens_per_s"] for r in rb)
            out["throughput_ratio_max_batch_32k"] = ri["tokens_per_s"] / best
            out["int2_vs_bound_max_batch_32k"] = ri["vs_bound"]
            print("throughput_ratio_max_batch_32k = %.3f (INT2 B=%d vs BF16 B=%d)"
                  % (out["throughput_ratio_max_batch_32k"], bi, bb))
        save()
    if a.ttft != "off":
        p, n = (int(x) for x in a.ttft.split(","))
        r = ttft(model, p, n)
        out["ttft"] = r
        out["ttft_prefix_hit_vs_prefill_32k"] = r["ratio"]
        print("TTFT prefix hit (%d cached + %d new): %.2f ms (%.0f MB of pages H2D); full BF16 "
              "prefill of %d: %.2f ms (%s); ttft_prefix_hit_vs_prefill_32k = %.2f"
              % (p, n, r["hit_s"] * 1e3, r["hit_page_bytes"] / 1e6, p + n, r["prefill_s"] * 1e3,
                 r["prefill_backend"], r["ratio"]))
    if PROFILE["results"]:
        out["profile"] = PROFILE["results"]
    save()
    return 0
