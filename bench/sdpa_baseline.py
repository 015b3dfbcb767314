#!/usr/bin/env python3
"""BF16 decode-attention baseline: PyTorch SDPA with enable_gqa=True at Qwen3-8B shape.

Prints one JSON object per shape on stdout: {"B", "L", "sdpa_us", "bytes", "samples"}.
Timing: CUDA events around a batch of back-to-back calls, median over samples (the same method
as oscarkv's kernel bench, which runs this script in the same device call).
"""
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x32768,1x100000,8x32768,32x32768")
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--samples", type=int, default=30)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    for spec in args.shapes.split(","):
        b, l = (int(x) for x in spec.split("x"))
        q = torch.randn(b, args.q_heads, 1, args.head_dim, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, args.kv_heads, l, args.head_dim, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, args.kv_heads, l, args.head_dim, device=dev, dtype=torch.bfloat16)

        def fn():
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        bytes_read = k.numel() * 2 + v.numel() * 2
        # ~2 ms per batch so launch gaps do not dominate small shapes.
        single = time_batch(fn, 3, 3)
        reps = max(3, min(200, int(2000.0 / max(single, 1.0))))
        us = time_batch(fn, reps, args.samples)
        print(json.dumps({"B": b, "L": l, "sdpa_us": us, "bytes": bytes_read,
                          "samples": args.samples, "reps": reps}), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
