"""Quality of a model run through transformers on oscarkv's pages: bits per byte over the same
windows and recall probes as `oscarkv eval` (engine/src/eval.cc: SplitMix64 offsets seeded with
--seed), every position decoded one token at a time through the paged cache (the serving path:
quantize-on-write, flushes, paged decode), all windows in one batch."""
import math
import time
from typing import Dict, List

MASK = (1 << 64) - 1


def splitmix64(state: int):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def plan(size: int, windows: int, window_bytes: int, recall_span: int, seed: int):
    """The window and recall-probe offsets of `oscarkv eval` (PlanEval)."""
    state, w, r = seed, [], []
    for _ in range(windows):
        state, x = splitmix64(state)
        w.append(x % (size - window_bytes + 1))
    for _ in range(windows if recall_span else 0):
        state, x = splitmix64(state)
        r.append(x % (size - recall_span + 1))
    return w, r


def _teacher_forced_nll(model, cache_factory, seqs: List[List[int]], start: int) -> float:
    """Sum of next-byte NLL (nats) over predictions of tokens start..n-1, decoding one token
    per step for all sequences at once."""
    import torch
    ids = torch.tensor(seqs, device=model.device)
    cache = cache_factory(len(seqs), ids.shape[1])
    total = torch.zeros((), dtype=torch.float64, device=model.device)
    with torch.no_grad():
        for t in range(ids.shape[1] - 1):
            logits = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
            if t + 1 >= start:
                lp = torch.log_softmax(logits[:, -1].double(), -1)
                total -= lp.gather(1, ids[:, t + 1:t + 2]).sum()
    return float(total)


def evaluate(model_dir: str, text_path: str, codec_name: str = "hadamard", windows: int = 16,
             window_bytes: int = 2048, recall_span: int = 1000, seed: int = 1,
             device: str = "cuda", rotations: str = "") -> Dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from ..torch import KVCodec
    from ..transformers import OscarkvCache, install
    install()
    text = open(text_path, "rb").read()
    woff, roff = plan(len(text), windows, window_bytes, recall_span, seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="oscarkv").to(device)
    model.eval()
    cfg = model.config
    if rotations:
        codec = KVCodec.from_artifact(rotations)
    else:
        codec = KVCodec.builtin(codec_name, cfg.num_hidden_layers, cfg.num_key_value_heads)

    def factory(batch, tokens):
        return OscarkvCache.for_model(model, codec, max_seqs=batch, max_seq_tokens=tokens + 64,
                                      max_step_tokens=max(batch, 64))

    t0 = time.time()
    nll = _teacher_forced_nll(model, factory, [list(text[o:o + window_bytes]) for o in woff], 1)
    res = {"codec": codec.name, "windows": windows,
           "bpb": nll / (windows * (window_bytes - 1)) / math.log(2)}
    if roff:
        spans = [list(text[o:o + recall_span]) * 2 for o in roff]
        nll = _teacher_forced_nll(model, factory, spans, recall_span)
        res["recall_bpb"] = nll / (len(roff) * recall_span) / math.log(2)
    res["seconds"] = time.time() - t0
    return res
