"""oscarkv.transformers: run a transformers causal LM (Qwen3 family) on oscarkv's paged INT2 KV
cache.

    from oscarkv.transformers import OscarkvCache, install
    install()                                    # registers attention "oscarkv"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="oscarkv")
    cache = OscarkvCache.for_model(model, codec, max_seqs=1, max_seq_tokens=4096)
    out = model.generate(ids, past_key_values=cache, max_new_tokens=64)

Each forward's K/V go through quantize-on-write into the cache's pages (post-RoPE keys,
rotated); a one-token step reads them with the paged decode kernel, a longer one (the prompt,
or a chunk of it) with the extend kernel (earlier pages plus the chunk's own rows, causally).
With `client` and `client_codec` set, a prompt whose first full pages are cached in the daemon
loads them into the cache's slots instead of recomputing them (prefix hit), and after the
prompt its full pages are stored. Batches must be unpadded (every row the same length).

for_model folds each layer's value rotation into its o_proj (fold_value_rotations=True, the
default; oscarkv.torch.fold): the attention then returns its output in the rotated value basis
and the kernels skip the output's unrotation. The folded model computes correctly only through
this attention with this codec (oscarkv.torch.unfold_model_value_rotations undoes the fold);
a layer whose attention module has no o_proj keeps the unrotation.
"""
import threading
from typing import Any, List, Optional, Sequence, Tuple

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin

from .torch import KVCodec, PagedKVCache
from .torch.fold import fold_model_value_rotations, folded_digest

_active = threading.local()


class _Layer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, owner: "OscarkvCache", idx: int) -> None:
        super().__init__()
        self.owner, self.idx = owner, idx
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        return self.owner._update(self.idx, key_states, value_states)

    def get_seq_length(self) -> int:
        return self.owner._past

    def get_mask_sizes(self, query_length: int) -> Tuple[int, int]:
        return self.owner._past + query_length, 0

    def get_max_length(self) -> int:
        return self.owner.paged.max_seq_tokens

    def reset(self) -> None:
        pass


class OscarkvCache(Cache):
    """A transformers Cache whose K/V live in a PagedKVCache (INT2 history, BF16 sink/tail)."""

    def __init__(self, paged: PagedKVCache, client: Any = None, client_codec: Any = None) -> None:
        self.paged = paged
        # the digest an attention module's o_proj must be folded with for rotated outputs
        self.value_basis = paged.codec.rotation_digest()
        super().__init__(layers=[_Layer(self, i) for i in range(paged.codec.num_layers)])
        self._past = 0
        self._started = False
        self.client, self.client_codec = client, client_codec
        self.prefix_hit_tokens = 0  # tokens the last prompt loaded from the daemon

    @staticmethod
    def for_model(model: Any, codec: KVCodec, max_seqs: int = 1, max_seq_tokens: int = 4096,
                  fold_value_rotations: bool = True, **kw) -> "OscarkvCache":
        """A cache for `model` (its device, query heads); fold_value_rotations: R_V of each layer
        folded into its o_proj (in place, once per codec; see the module docstring)."""
        cfg = model.config
        paged = PagedKVCache(codec, cfg.num_attention_heads, max_seqs, max_seq_tokens,
                             device=model.device, max_step_tokens=kw.pop("max_step_tokens", 4096),
                             int2_slots=kw.pop("int2_slots", None),
                             bf16_slots=kw.pop("bf16_slots", None))
        cache = OscarkvCache(paged, **kw)
        if fold_value_rotations:
            fold_model_value_rotations(model, codec, cache.value_basis)
        return cache

    def _update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        B, H, q_len, d = k.shape
        p = self.paged
        if layer == 0:
            if not self._started:
                p.reset(B)
                self._started = True
            elif B != p.active:
                raise ValueError("OscarkvCache: batch size changed from %d to %d" % (p.active, B))
            p.begin_step([q_len] * B)
        _active.cache = self
        kt = k.transpose(1, 2).reshape(B * q_len, H, d)
        vt = v.transpose(1, 2).reshape(B * q_len, H, d)
        p.write(layer, kt, vt)
        if layer == p.codec.num_layers - 1:
            self._past += q_len
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._past

    # ---- the daemon's prefix cache ----

    def load_prefix(self, tokens: Sequence[int]) -> int:
        """Before a request: loads the longest cached run of the prompt's full pages from the
        daemon into the cache's slots (as stored: INT2 pages stay INT2) and returns how many
        tokens it covers (at least one prompt token is always left to compute)."""
        if self.client is None:
            return 0
        p = self.paged
        T = p.codec.page_tokens
        keys = self.client_codec.block_keys(list(tokens))[:max(0, (len(tokens) - 1) // T)]
        if not keys:
            return 0
        cap = max(p.pb, p.pi)
        bufs = [bytearray(cap) for _ in keys]
        sizes: List[int] = []
        m = self.client.load_into(self.client_codec, keys, bufs, sizes)
        p.reset(1)
        # the page kind is header byte 6 (docs/FORMAT.md §1.1)
        p.load_pages(0, [(bufs[i][6], memoryview(bufs[i])[:sizes[i]]) for i in range(m)], m * T)
        self._started = m > 0
        self._past = m * T
        self.prefix_hit_tokens = m * T
        return m * T

    def store_prefix(self, tokens: Sequence[int]) -> int:
        """After a request: stores the pages of the prompt's full blocks (`tokens`) that the
        daemon does not hold yet; returns how many were stored."""
        if self.client is None:
            return 0
        p = self.paged
        T = p.codec.page_tokens
        keys = self.client_codec.block_keys(list(tokens))
        pages = p.sequence_pages(0)[:len(keys)]
        have = self.client.exists(self.client_codec, keys[:len(pages)])
        todo = [(keys[i], kind, p.export_page(slot)) for i, (kind, slot, count) in enumerate(pages)
                if count == T and not have[i]]
        if todo:
            self.client.store(self.client_codec, todo)
        return len(todo)

    def reset(self) -> None:
        self._past = 0
        self._started = False

    @property
    def batch_size(self) -> int:
        return self.paged.active if self._started else -1


def oscarkv_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      scaling: Optional[float] = None, dropout: float = 0.0,
                      **kwargs) -> Tuple[torch.Tensor, None]:
    """transformers attention function over the active OscarkvCache's pages. query [B, Hq, q, d];
    key/value: this step's rows [B, H, q, d] (already written to pages by the cache)."""
    cache = getattr(_active, "cache", None)
    if cache is None:
        raise RuntimeError("attention 'oscarkv' needs past_key_values=OscarkvCache(...)")
    if scaling is not None and abs(scaling - query.shape[-1] ** -0.5) > 1e-6:
        raise ValueError("oscarkv attention supports the default 1/sqrt(head_dim) scaling only")
    B, Hq, q_len, d = query.shape
    p = cache.paged
    layer = module.layer_idx
    folded = folded_digest(module)  # o_proj folded with this codec: rotated output
    if folded is not None and folded != cache.value_basis:
        raise ValueError("layer %d's o_proj is folded with another codec's value rotations "
                         "(OscarkvCache.for_model refolds it)" % layer)
    unrotate = folded is None
    if q_len == 1:
        out = p.decode(layer, query[:, :, 0, :], unrotate=unrotate)
    else:
        q = query.transpose(1, 2).reshape(B * q_len, Hq, d)
        H = key.shape[1]
        k = key.transpose(1, 2).reshape(B * q_len, H, d)
        v = value.transpose(1, 2).reshape(B * q_len, H, d)
        out = p.extend(layer, q, k, v, unrotate=unrotate)
    return out.view(B, q_len, Hq, d).to(query.dtype), None


def generate(model: Any, input_ids: torch.Tensor, cache: OscarkvCache, **kw) -> torch.Tensor:
    """model.generate for one sequence through `cache`, with its daemon (if set) as a prefix
    cache: the prompt's cached pages are loaded instead of recomputed, and its full pages are
    stored afterwards."""
    if input_ids.shape[0] != 1:
        raise ValueError("generate: one sequence at a time")
    tokens = input_ids[0].tolist()
    cache.reset()
    cache.load_prefix(tokens)
    out = model.generate(input_ids, past_key_values=cache, **kw)
    cache.store_prefix(tokens)
    return out


def install() -> None:
    """Registers the attention function as attn_implementation="oscarkv" (idempotent)."""
    AttentionInterface.register("oscarkv", oscarkv_attention)


install()
