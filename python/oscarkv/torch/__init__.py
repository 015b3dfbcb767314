"""oscarkv.torch: oscarkv's CUDA kernels as PyTorch ops, and a paged INT2 + BF16 KV cache.

    from oscarkv.torch import KVCodec, PagedKVCache
    codec = KVCodec.builtin("hadamard", num_layers=36, num_kv_heads=8)   # or from_artifact(dir)
    cache = PagedKVCache(codec, num_q_heads=32, max_seqs=8, max_seq_tokens=32768)
    cache.reset(batch); cache.begin_step([1] * batch)
    for layer in ...: cache.write(layer, k, v); out = cache.decode(layer, q)

The ops (torch.ops.oscarkv.quantize_write / paged_decode / paged_extend) are registered on
import; see ops.py. They call liboscarkv_cuda_c.so (the kernels' C ABI) through ctypes on the
current CUDA stream, so CUDA graphs capture them and torch.compile traces them (fake impls).
"""
from .cache import KVCodec, PagedKVCache
from .ops import (BF16, INT2, ExtendPlan, PagedDecoder, page_bytes, paged_decode, paged_extend,
                  prepare_rotations, quantize_write)

__all__ = ["BF16", "INT2", "ExtendPlan", "KVCodec", "PagedDecoder", "PagedKVCache", "page_bytes",
           "paged_decode", "paged_extend", "prepare_rotations", "quantize_write"]
