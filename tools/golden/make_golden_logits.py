#!/usr/bin/env python3
"""Golden logits of the reference model from an independent implementation (transformers).

Loads ../shared/refmodel with transformers.Qwen3ForCausalLM, upcasts the bf16 weights to fp32
(the C++ engine computes in fp32 from bf16 weights too), runs one forward pass over a fixed
byte string and writes engine/testdata/golden_logits.safetensors:
  input_ids  int32 [T]
  logits     float32 [T, vocab]
Run once; the engine test compares against this file.

usage: make_golden_logits.py [--model DIR] [--out FILE]
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

TEXT = (b"The git-rebase command reapplies commits on top of another base tip. "
        b"SELECT name FROM sqlite_master WHERE type='table';\n"
        b"def f(x):\n    return x * 2\n")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("OSCARKV_REFMODEL",
                                                      os.path.join(root, "..", "shared", "refmodel")))
    ap.add_argument("--out", default=os.path.join(root, "engine", "testdata", "golden_logits.safetensors"))
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    ids = torch.tensor([list(TEXT)], dtype=torch.long)
    with torch.no_grad():
        logits = model(ids).logits[0].float().contiguous()
    nll = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:]).item()
    save_file({"input_ids": ids[0].to(torch.int32).contiguous(), "logits": logits},
              a.out, metadata={"model": a.model, "dtype": "fp32 compute, bf16 weights",
                               "bits_per_byte": f"{nll / 0.6931471805599453:.6f}"})
    print(f"{a.out}: {len(TEXT)} tokens, bits/byte {nll / 0.6931471805599453:.4f}")


if __name__ == "__main__":
    main()
