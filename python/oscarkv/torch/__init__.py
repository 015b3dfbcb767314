"""oscarkv.torch: oscarkv's CUDA kernels as PyTorch ops, and a paged INT2 + BF16 KV cache.

    from oscarkv.torch import KVCodec, PagedKVCache
    codec = KVCodec.builtin("hadamard", num_layers=36, num_kv_heads=8)   # or from_artifact(dir)
    cache = PagedKVCache(codec, num_q_heads=32, max_seqs=8, max_seq_tokens=32768)
    cache.reset(batch); cache.begin_step([1] * batch)
    for layer in ...: cache.write(layer, k, v); out = cache.decode(layer, q)

The ops (torch.ops.oscarkv.quantize_write / paged_decode / paged_extend) are registered when
this package's names are first used; see ops.py. They call liboscarkv_cuda_c.so (the kernels'
C ABI, _capi.py, which alone needs no PyTorch) through ctypes on the current CUDA stream, so CUDA
graphs capture them and torch.compile traces them (fake impls).

fold_value_rotation(w_o, codec.matrices[layer, 1], num_q_heads) folds a layer's value rotation
into its output projection, so decode / extend can skip the output's unrotation (unrotate=False);
oscarkv.transformers does it when it installs a cache on a model (fold.py).
"""
import importlib
from typing import Any

_NAMES = {"KVCodec": "cache", "PagedKVCache": "cache", "BF16": "ops", "INT2": "ops",
          "ExtendPlan": "ops", "PagedDecoder": "ops", "page_bytes": "ops", "paged_decode": "ops",
          "paged_extend": "ops", "prepare_rotations": "ops", "quantize_write": "ops",
          "fold_value_rotation": "fold", "fold_model_value_rotations": "fold",
          "unfold_model_value_rotations": "fold"}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:  # PEP 562: import torch only when a torch name is used
    mod = _NAMES.get(name)
    if mod is None:
        raise AttributeError("module 'oscarkv.torch' has no attribute %r" % name)
    return getattr(importlib.import_module("." + mod, __name__), name)
