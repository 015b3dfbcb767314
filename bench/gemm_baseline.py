#!/usr/bin/env python3
"""BF16 GEMM times of given shapes (PyTorch torch.matmul, cuBLAS): the projections of a prefill
step beside quantize-on-write in oscarkv's kernel bench (which runs this in the same device call).

--shapes MxNxK,... : C[M][N] = A[M][K] · B[K][N], bf16 in and out. Prints one JSON object per
shape on stdout: {"M", "N", "K", "us", "tflops"}. Timing: CUDA events around back-to-back calls,
median over samples; inputs are random (never zeros).
"""
import argparse
import json
import statistics
import sys

import torch


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
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--samples", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    for spec in args.shapes.split(","):
        m, n, k = (int(x) for x in spec.split("x"))
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)

        def fn():
            torch.matmul(a, b, out=c)

        single = time_batch(fn, 2, 3)
        reps = max(2, min(100, int(2000.0 / max(single, 1.0))))
        us = time_batch(fn, reps, args.samples)
        print(json.dumps({"M": m, "N": n, "K": k, "us": us, "tflops": 2.0 * m * n * k / (us * 1e-6) / 1e12}),
              flush=True)
        del a, b, c
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
