"""Timing and inspection helpers of the bench: CUDA-event medians, CUDA-graph capture, kernel
tables of graph replays (torch.profiler) and the per-projection GEMV probe of the gemv form."""
from typing import Dict, List

import torch

from . import kernels as K


def median_time(fn, n: int = 20) -> float:
    """Median seconds of fn() by CUDA events."""
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def capture(fn):
    """fn() captured in a CUDA graph (after two eager warm-ups on a side stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def kernel_category(name: str) -> str:
    """The per-layer split the profile reports: gemm / attn_write / attn_decode / elementwise."""
    n = name.lower()
    if any(s in n for s in ("gemm", "gemv", "cutlass", "xmma", "nvjet", "splitk", "cublas")):
        return "gemm"
    if any(s in n for s in ("quantize", "index_copy", "scatter")):
        return "attn_write"
    if any(s in n for s in ("decode", "flash", "fmha", "cudnn", "attention", "queryprep", "merge",
                            "sdpa")):
        return "attn_decode"
    return "elementwise"


def profile_replays(g, label: str, layers: int, out_dir: str, step_s: float, n: int = 5) -> Dict:
    """Kernels of n graph replays under torch.profiler (CUDA activity): the top kernels and the
    per-step time by category, appended to out_dir/profile.txt; returns the summary."""
    import os
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            g.replay()
        torch.cuda.synchronize()
    kern = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0)
        if t and "CUDA" in str(getattr(e, "device_type", "CUDA")) and e.key not in (
                "cudaGraphLaunch", "cudaDeviceSynchronize"):
            kern.append((t / n, e.count / n, e.key))  # us per step, launches per step
    kern.sort(reverse=True)
    split: Dict[str, float] = {}
    launches: Dict[str, float] = {}
    for t, c, k in kern:
        cat = kernel_category(k)
        split[cat] = split.get(cat, 0.0) + t
        launches[cat] = launches.get(cat, 0.0) + c
    busy = sum(split.values())
    lines = ["%s: step %.1f us (graph replay median), kernels busy %.1f us, idle/gaps %.1f us"
             % (label, step_s * 1e6, busy, step_s * 1e6 - busy)]
    lines += ["  %-12s %9.1f us/step %7.2f us/layer %6.1f launches/layer" % (
        k, v, v / layers, launches[k] / layers) for k, v in sorted(split.items())]
    lines += ["  top kernels (us/step, launches/step, name):"]
    lines += ["  %9.1f %6.0f  %s" % (t, c, k[:150]) for t, c, k in kern[:25]]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "profile.txt"), "a") as f:  # one file: every replay's table
        f.write("\n".join(lines) + "\n\n")
    print("\n".join(lines[:2 + len(split)]))
    return dict(label=label, step_us=step_s * 1e6, busy_us=busy, split_us=split,
                launches_per_step=launches, top=[(t, c, k[:150]) for t, c, k in kern[:25]])


GEMV_CONFIGS = [dict(BLOCK_N=8, BLOCK_K=512, num_warps=4), dict(BLOCK_N=16, BLOCK_K=256, num_warps=4),
                dict(BLOCK_N=4, BLOCK_K=1024, num_warps=4), dict(BLOCK_N=16, BLOCK_K=512, num_warps=8)]


def gemv_probe(model, bw: float, reps: int = 20) -> List[Dict]:
    """Each projection of layer 0 (and lm_head) at one token: the cuBLAS form (with its norm /
    SiLU / residual kernels) against the Triton GEMV in each configuration; `reps` calls per CUDA
    graph, median replay / reps. Sets model.gemv_pick to the faster per projection (every side
    then runs the same choice). Returns rows (name, form, us, weight GB/s, vs copy bandwidth)."""
    c, l = model.cfg, model.layers[0]
    eps = c["eps"]
    x = torch.randn(1, c["hidden"], device="cuda", dtype=torch.bfloat16)
    a32 = torch.randn(1, c["q_heads"] * c["head_dim"], device="cuda")
    h_ = torch.randn(1, c["inter"], device="cuda", dtype=torch.bfloat16)
    cases = {
        "qkv": (l["qkv"], lambda: K.rms_norm(x, l["ln1"], eps) @ l["qkv"].t(),
                lambda cf: K.gemv(x, l["qkv"], norm=l["ln1"], eps=eps, config=cf)),
        "o": (l["o"], lambda: x.addmm_(a32.to(torch.bfloat16), l["o"].t()),
                      lambda cf: K.gemv(a32, l["o"], out=x, residual=x, config=cf)),
        "gate_up": (l["gu"], lambda: K.silu_mul(K.rms_norm(x, l["ln2"], eps) @ l["gu"].t()),
                         lambda cf: K.gemv(x, l["gu"], norm=l["ln2"], eps=eps, swiglu=True,
                                           config=cf)),
        "down": (l["down"], lambda: x.addmm_(h_, l["down"].t()),
                 lambda cf: K.gemv(h_, l["down"], out=x, residual=x, config=cf)),
        "lm_head": (model.lm_head, lambda: K.rms_norm(x, model.norm, eps) @ model.lm_head.t(),
                    lambda cf: K.gemv(x, model.lm_head, norm=model.norm, eps=eps, config=cf)),
    }
    rows, pick = [], {}
    for name, (w, cub, tri) in cases.items():
        forms = [("cublas", cub, None)] + [
            ("triton %d/%d/%d" % (cf["BLOCK_N"], cf["BLOCK_K"], cf["num_warps"]),
             (lambda cf=cf: tri(cf)), cf) for cf in GEMV_CONFIGS]
        for form, fn, cf in forms:
            try:
                x.normal_()  # the in-place forms grow x; keep it at unit scale
                g, _ = capture(lambda: [fn() for _ in range(reps)])
                t = median_time(g.replay, 10) / reps
                r = dict(name=name, form=form, us=t * 1e6, weight_GBps=w.numel() * 2 / t / 1e9,
                         vs_copy_bw=w.numel() * 2 / t / bw)
                if name not in pick or t < pick[name][0]:
                    pick[name] = (t, cf)
                print("  gemv probe %-13s %-18s %8.2f us  %7.0f GB/s  (%.2f of copy bw)"
                      % (name, form, r["us"], r["weight_GBps"], r["vs_copy_bw"]))
                rows.append(r)
                del g
            except Exception as e:
                print("  gemv probe %s %s failed: %s" % (name, form, str(e).splitlines()[0][:200]))
    model.gemv_pick = {n: cf for n, (_, cf) in pick.items() if cf is not None}
    print("  gemv form: %s" % ", ".join(
        "%s %s" % (n, "triton %d/%d/%d" % (cf["BLOCK_N"], cf["BLOCK_K"], cf["num_warps"])
                   if cf else "cublas") for n, (_, cf) in pick.items()))
    return rows
