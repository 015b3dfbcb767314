#!/usr/bin/env python3
"""Independent bits-per-byte check of `oscarkv eval`'s BF16 row with transformers.

Draws the same window offsets as the C++ harness (engine/src/eval.cc: SplitMix64 seeded with
--seed, offset = next() % (size - window + 1)), runs transformers' Qwen3ForCausalLM in fp32
(bf16 weights upcast; K/V not rounded) and prints the mean bpb over the windows and over the
recall probes (span || span, bpb on the repeat).

usage: bpb_transformers.py [--model DIR] [--text FILE] [--windows 16] [--seed 1]
"""
import argparse
import math
import os

import torch
from transformers import AutoModelForCausalLM

MASK = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ref = os.path.normpath(os.path.join(here, "..", "..", "..", "shared", "refmodel"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("OSCARKV_REFMODEL", ref))
    ap.add_argument("--text", default=None)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--window-bytes", type=int, default=2048)
    ap.add_argument("--recall-span", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    text = open(a.text or os.path.join(a.model, "val.txt"), "rb").read()
    state = a.seed
    windows, probes = [], []
    for _ in range(a.windows):
        state, r = splitmix64(state)
        windows.append(r % (len(text) - a.window_bytes + 1))
    for _ in range(a.windows if a.recall_span else 0):
        state, r = splitmix64(state)
        probes.append(r % (len(text) - a.recall_span + 1))
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager")
    model.eval()

    def nll(ids, start):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        lp = torch.log_softmax(logits.double(), -1)
        tgt = torch.tensor(ids[1:])
        per = -lp[:-1].gather(1, tgt[:, None])[:, 0]
        return per[start - 1:].sum().item(), len(ids) - start

    tot, n = 0.0, 0
    for off in windows:
        s, k = nll(list(text[off:off + a.window_bytes]), 1)
        tot, n = tot + s, n + k
    print(f"windows: {a.windows} x {a.window_bytes} bytes, seed {a.seed}: bpb {tot / n / math.log(2):.4f}")
    if probes:
        tot, n = 0.0, 0
        for off in probes:
            span = list(text[off:off + a.recall_span])
            s, k = nll(span + span, a.recall_span)
            tot, n = tot + s, n + k
        print(f"recall probes: {len(probes)} x 2x{a.recall_span} bytes: bpb on the repeat {tot / n / math.log(2):.4f}")


if __name__ == "__main__":
    main()
