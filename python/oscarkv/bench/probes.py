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


def _cfg(n, k, w, stages=None, pdl=False):
    c = dict(BLOCK_N=n, BLOCK_K=k, num_warps=w)
    if stages is not None:
        c["num_stages"] = stages
    if pdl:
        c["pdl"] = True
    return c


# Triton GEMV configurations the probe tries per projection (BLOCK_N rows x BLOCK_K columns a
# step, warps, software-pipeline stages, pdl: launched as a programmatic dependent of the
# kernel ahead, its first weight tile loading while that kernel ends): the picks of the last
# H200 run (bench/results/h200_torch_bench_model.json) and their neighbours.
GEMV_CONFIGS = {
    "qkv": [_cfg(8, 512, 4), _cfg(8, 512, 4, 1), _cfg(8, 1024, 8), _cfg(8, 512, 4, pdl=True),
            _cfg(4, 512, 4, pdl=True)],
    "o": [_cfg(4, 512, 4), _cfg(8, 512, 4), _cfg(4, 512, 4, pdl=True), _cfg(8, 512, 4, pdl=True)],
    "gate_up": [_cfg(8, 1024, 8), _cfg(8, 512, 4), _cfg(8, 1024, 8, pdl=True),
                _cfg(8, 512, 4, pdl=True)],
    "down": [_cfg(2, 2048, 4), _cfg(4, 1024, 4), _cfg(2, 2048, 4, pdl=True),
             _cfg(4, 1024, 4, pdl=True)],
    "down_si": [_cfg(4, 1024, 4), _cfg(4, 1024, 4, pdl=True)],
    "lm_head": [_cfg(8, 512, 4), _cfg(8, 512, 4, pdl=True)],
}


def config_name(cf: dict) -> str:
    return "triton %d/%d/%d%s%s" % (cf["BLOCK_N"], cf["BLOCK_K"], cf["num_warps"],
                                    "/s%d" % cf["num_stages"] if "num_stages" in cf else "",
                                    "/pdl" if cf.get("pdl") else "")


def gemv_probe(model, bw: float, reps: int = 20) -> List[Dict]:
    """Each projection at one token: the cuBLAS form (with its norm / SiLU / residual kernels)
    against the Triton GEMV in each configuration of GEMV_CONFIGS; `reps` calls per CUDA graph,
    each on the next layer's matrix (so the weights come from DRAM as in the model, not from
    L2), median replay / reps. Sets model.gemv_pick to the faster per projection (every side
    then runs the same choice). Returns rows (name, form, us, weight GB/s, vs copy bandwidth)."""
    c, layers = model.cfg, model.layers
    eps = c["eps"]
    x = torch.randn(1, c["hidden"], device="cuda", dtype=torch.bfloat16)
    a32 = torch.randn(1, c["q_heads"] * c["head_dim"], device="cuda")
    h_ = torch.randn(1, c["inter"], device="cuda", dtype=torch.bfloat16)
    gu_ = torch.randn(1, 2 * c["inter"], device="cuda", dtype=torch.bfloat16)
    # gate_up's cuBLAS form leaves silu(gate) * up to the down projection (timed there: "down"
    # forms on h plus one silu_mul, or "down_si" reading the gate/up output itself)
    cases = {
        "qkv": ("qkv", lambda l: K.rms_norm(x, l["ln1"], eps) @ l["qkv"].t(),
                lambda l, cf: K.gemv(x, l["qkv"], norm=l["ln1"], eps=eps, config=cf)),
        "o": ("o", lambda l: x.addmm_(a32.to(torch.bfloat16), l["o"].t()),
              lambda l, cf: K.gemv(a32, l["o"], out=x, residual=x, config=cf)),
        "gate_up": ("gu", lambda l: K.rms_norm(x, l["ln2"], eps) @ l["gu"].t(),
                    lambda l, cf: K.gemv(x, l["gu"], norm=l["ln2"], eps=eps, swiglu=True,
                                         config=cf)),
        "down": ("down", lambda l: x.addmm_(h_, l["down"].t()),
                 lambda l, cf: K.gemv(h_, l["down"], out=x, residual=x, config=cf)),
        "down_si": ("down", None,
                    lambda l, cf: K.gemv(gu_, l["down"], out=x, residual=x, swiglu_in=True,
                                         config=cf)),
        "silu_mul": (None, lambda l: K.silu_mul(gu_), None),
    }
    head = dict(lm_head=model.lm_head)
    cases["lm_head"] = ("lm_head", lambda l: K.rms_norm(x, model.norm, eps) @ model.lm_head.t(),
                        lambda l, cf: K.gemv(x, model.lm_head, norm=model.norm, eps=eps, config=cf))
    rows, pick = [], {}
    for name, (key, cub, tri) in cases.items():
        mats = [head] if name == "lm_head" else layers  # lm_head: 1.2 GB, never in L2
        nbytes = 2 * (mats[0][key].numel() if key else gu_.numel())
        forms = ([("cublas", cub, None)] if cub else []) + [
            (config_name(cf), (lambda l, cf=cf: tri(l, cf)), cf)
            for cf in (GEMV_CONFIGS[name] if tri else [])]
        for form, fn, cf in forms:
            try:
                x.normal_()  # the in-place forms grow x; keep it at unit scale
                g, _ = capture(lambda: [fn(mats[r % len(mats)]) for r in range(reps)])
                t = median_time(g.replay, 10) / reps
                r = dict(name=name, form=form, us=t * 1e6, weight_GBps=nbytes / t / 1e9,
                         vs_copy_bw=nbytes / t / bw, matrices=min(reps, len(mats)))
                if name == "gate_up" and cf is None:
                    pick["gate_up_cublas"] = (t, None)
                elif name not in pick or t < pick[name][0]:
                    pick[name] = (t, cf)
                print("  gemv probe %-13s %-22s %8.2f us  %7.0f GB/s  (%.2f of copy bw)"
                      % (name, form, r["us"], r["weight_GBps"], r["vs_copy_bw"]))
                rows.append(r)
                del g
            except Exception as e:
                print("  gemv probe %s %s failed: %s" % (name, form, str(e).splitlines()[0][:200]))
    mlp = pick_mlp(pick)
    for n in ("gate_up", "gate_up_cublas", "down", "down_si", "silu_mul"):
        pick.pop(n, None)
    pick.update(mlp)
    model.gemv_pick = {n: cf for n, (_, cf) in pick.items() if cf is not None}
    print("  gemv form: %s" % ", ".join(
        "%s %s" % (n, config_name(cf) if cf else "cublas") for n, (_, cf) in pick.items()))
    return rows


def pick_mlp(pick: Dict) -> Dict:
    """The fastest of the MLP's forms from the probe's per-case best (seconds, config):
    gate_up as a GEMV with SiLU*up in its epilogue, then down on its output; or gate_up on
    cuBLAS, then silu_mul and down, or down reading the gate/up output (down_si). Returns
    {case: (seconds, config)} of the cases the chosen form runs (a config None: cuBLAS)."""
    big = (float("inf"), None)
    gu, down, si, silu = (pick.get(n, big) for n in ("gate_up", "down", "down_si", "silu_mul"))
    # gate_up's best may be cuBLAS (config None) or a GEMV: time each family apart
    forms = []
    if gu[1] is not None:
        forms.append((gu[0] + down[0], {"gate_up": gu, "down": down}))
    cub = pick.get("gate_up_cublas", big)
    forms.append((cub[0] + silu[0] + down[0], {"gate_up": (cub[0], None), "down": down}))
    if si[1] is not None:
        forms.append((cub[0] + si[0], {"gate_up": (cub[0], None), "down_si": si}))
    return min(forms, key=lambda f: f[0])[1]


def decode_probe(side, n: int = 20) -> Dict:
    """A paged side's decode launches alone at its planned batch (the step's query buffer, the
    side's fold): per layer, the median of a CUDA graph of every layer's decode and nothing
    else, with the query rotated by the q/k kernel (rotq: the launch skips its rotation) and
    rotated by the launch (rotk); then each decode after a read of 128 MB (> 2x the L2, as the
    model's weights pass through it between two decodes), the reads' own graph subtracted."""
    cache, layers = side.cache, side.model.cfg["layers"]
    q = cache.query_buffer(side.batch)
    flush = torch.ones(32 << 20, dtype=torch.float32, device=q.device)
    res: Dict = {}

    def graph(rotq: bool, cold: bool, decode: bool = True):
        def run():
            for i in range(layers):
                if cold:
                    flush.sum()
                if decode:
                    cache.decode(i, q, unrotate=not side.fold, rotated_query=rotq)
        g, _ = capture(run)
        for _ in range(3):
            g.replay()
        return median_time(g.replay, n)

    reads = graph(False, True, decode=False)
    res["l2_read_128mb_us"] = reads / layers * 1e6
    for rotq in (True, False):
        tag = "rotq" if rotq else "rotk"
        res["decode_us_per_layer_" + tag] = graph(rotq, False) / layers * 1e6
        res["decode_cold_us_per_layer_" + tag] = (graph(rotq, True) - reads) / layers * 1e6
    print("    decode probe (B=%d): %s" % (side.batch, ", ".join(
        "%s %.1f" % (k, v) for k, v in res.items())))
    return res
