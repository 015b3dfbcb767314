#!/usr/bin/env python3
"""BF16 attention baselines: PyTorch SDPA at Qwen3-8B shape (32 query heads, 8 KV heads, d=128).

Decode (--shapes BxL,...): one query token, enable_gqa=True; one JSON object per shape on stdout:
{"B", "L", "sdpa_us", "bytes", "samples"}.
Extend / chunked prefill (--extend BxPxC,...): C new tokens per sequence over P cached tokens,
dense BF16 K/V of P + C tokens, new token i attending to the P prefix tokens and new tokens
0..i (the causal mask aligned to the bottom right; plain causal when P = 0). Every backend that
runs (cuDNN, flash, memory-efficient) is timed; one JSON object per (shape, backend):
{"extend": [B, P, C], "backend", "us", "how", "max_diff"} or {"extend", "backend", "error"}.
Timing: CUDA events around a batch of back-to-back calls, median over samples (the same method
as oscarkv's kernel bench, which runs this script in the same device call). Decode with --graph
also reports "sdpa_graph_us": the same batch of calls captured in one CUDA graph and replayed
(how engines run a decode step; the kernel bench times its own launches that way too).
Decode L2: by default the calls cycle over copies of K/V ("copies") that together are >= 4x the
device's L2, so no call finds its K/V in L2 from the call before (as in a model step, where the
other layers' weights pass through L2 in between); --warm-l2 re-reads one copy. Each row says
which ("warm_l2").
"""
import math
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F


def time_batch(fn, reps, samples):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(out)


def time_graph(fn, reps, samples):
    """Median per-call time of `reps` calls of fn captured in one CUDA graph and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch requires
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1000.0 / reps)
    del g
    return statistics.median(out)


def extend_rows(args, dev):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    # flash first: its lower-right causal mask is native, so its output is the reference every
    # other backend's form must match (a form giving another mask is rejected, not timed).
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    for spec in args.extend.split(","):
        b, p, c = (int(x) for x in spec.split("x"))
        n = p + c
        q = torch.randn(b, args.q_heads, c, args.head_dim, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, args.kv_heads, n, args.head_dim, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, args.kv_heads, n, args.head_dim, device=dev, dtype=torch.bfloat16)
        rep = args.q_heads // args.kv_heads
        expanded = {}

        def kv(gqa):
            if gqa:
                return k, v
            if not expanded:
                expanded["k"] = k.repeat_interleave(rep, dim=1)
                expanded["v"] = v.repeat_interleave(rep, dim=1)
            return expanded["k"], expanded["v"]

        # Formulations of the same mask, tried in turn per backend (the first that runs is timed).
        # is_causal with P > 0 is a candidate too: a backend that aligns it to the bottom right
        # (as the mask here) passes the check against the reference, one aligning it to the top
        # left does not.
        forms = [("is_causal+gqa", True, lambda kk, vv: F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=True)),
                 ("is_causal", False, lambda kk, vv: F.scaled_dot_product_attention(q, kk, vv, is_causal=True))]
        bias = causal_lower_right(c, n)
        forms += [("causal_lower_right+gqa", True, lambda kk, vv: F.scaled_dot_product_attention(q, kk, vv, attn_mask=bias, enable_gqa=True)),
                  ("causal_lower_right", False, lambda kk, vv: F.scaled_dot_product_attention(q, kk, vv, attn_mask=bias))]
        mask = None
        if c * n <= (1 << 28):
            mask = torch.ones(c, n, dtype=torch.bool, device=dev).tril(diagonal=p)
            forms += [("bool_mask+gqa", True, lambda kk, vv: F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, enable_gqa=True)),
                      ("bool_mask", False, lambda kk, vv: F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask))]
        ref = None
        for name, backend in backends:
            err = None
            for how, gqa, f in forms:
                if ref is None and p > 0 and how.startswith("is_causal"):
                    err = f"{how}: no reference to check its mask alignment against"
                    continue
                try:
                    kk, vv = kv(gqa)
                    with sdpa_kernel([backend]):
                        out = f(kk, vv)
                        torch.cuda.synchronize()
                        diff = 0.0 if ref is None else float((out.float() - ref).abs().max())
                        if diff > 2e-2:
                            err = f"{how}: output differs from the reference by {diff:.3g} (another mask)"
                            continue
                        single = time_batch(lambda: f(kk, vv), 2, 2)
                        reps = max(2, min(50, int(20000.0 / max(single, 1.0))))
                        us = time_batch(lambda: f(kk, vv), reps, max(5, args.samples // 3))
                except Exception as e:  # noqa: BLE001 - a backend that does not run this form
                    err = f"{how}: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                    continue
                if ref is None:
                    ref = out.float()
                print(json.dumps({"extend": [b, p, c], "backend": name, "us": us, "how": how,
                                  "max_diff": diff}), flush=True)
                err = None
                break
            if err is not None:
                print(json.dumps({"extend": [b, p, c], "backend": name, "error": err}), flush=True)
            torch.cuda.empty_cache()
        del q, k, v, ref, mask, expanded
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x32768,1x100000,8x32768,32x32768")
    ap.add_argument("--extend", default="", help="BxPxC list: extend baselines instead of decode")
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--graph", action="store_true", help="decode: also time under CUDA-graph replay")
    ap.add_argument("--warm-l2", action="store_true",
                    help="decode: re-read one K/V copy (default: cycle over copies >= 4x the L2)")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    if args.extend:
        extend_rows(args, dev)
        return 0
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 << 20) or (64 << 20)
    for spec in args.shapes.split(","):
        b, l = (int(x) for x in spec.split("x"))
        q = torch.randn(b, args.q_heads, 1, args.head_dim, device=dev, dtype=torch.bfloat16)
        bytes_read = 2 * b * args.kv_heads * l * args.head_dim * 2
        copies = 1 if args.warm_l2 else max(1, min(64, math.ceil(4 * l2 / bytes_read)))
        kvs = []
        for _ in range(copies):
            kvs.append((torch.randn(b, args.kv_heads, l, args.head_dim, device=dev, dtype=torch.bfloat16),
                        torch.randn(b, args.kv_heads, l, args.head_dim, device=dev, dtype=torch.bfloat16)))
        turn = [0]

        def fn():
            # The next copy on every call (also while a graph is captured: the graph replays the
            # same cycle).
            k, v = kvs[turn[0] % copies]
            turn[0] += 1
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        # ~2 ms per batch so launch gaps do not dominate small shapes.
        single = time_batch(fn, 3, 3)
        reps = max(3, min(200, int(2000.0 / max(single, 1.0))))
        us = time_batch(fn, reps, args.samples)
        row = {"B": b, "L": l, "sdpa_us": us, "bytes": bytes_read, "samples": args.samples, "reps": reps,
               "copies": copies, "warm_l2": bool(args.warm_l2), "l2_bytes": l2}
        if args.graph:
            try:
                row["sdpa_graph_us"] = time_graph(fn, reps, args.samples)
            except Exception as e:  # noqa: BLE001 - report, keep the eager row
                row["sdpa_graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        print(json.dumps(row), flush=True)
        del q, kvs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
