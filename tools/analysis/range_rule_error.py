#!/usr/bin/env python3
"""Error and bias of INT2 range rules on the reference model's real K/V.

Reads bench/testdata/refmodel_kv.bin (oscarkv_kv_dump: post-RoPE K and V of two layers, bf16) and,
per (layer, K|V, KV head), raw and Hadamard-rotated (a stand-in for a calibrated R), quantizes
every 128-channel row with
  * min-max (docs/FORMAT.md §1.3, in float64: the rule, not its bit-exact fp16 rounding),
  * unbiased v2 (§1.3.1 mode 3: 8 candidate ranges, each refit, the smallest error per row),
  * one fixed candidate per head (the candidate with the smallest total error over the head's
    rows, refit per row as in v2) -- a cheaper write rule: no per-row candidate search,
and prints the relative squared error sum(e^2)/sum(x^2) and the bias sum(e*x)/sum(x^2) of each,
with the fixed candidate and the share of rows whose own best candidate it is.

Float64 throughout, so figures agree with the codec's to ~3 digits, not bit for bit. It measures
rows, not bits per byte: a rule change still needs `oscarkv calibrate` / `oscarkv eval`.

Usage: tools/analysis/range_rule_error.py [path/to/refmodel_kv.bin]
"""
import struct
import sys

import numpy as np


def load(path):
    with open(path, 'rb') as f:
        if f.read(8) != b'OKVDUMP1':
            raise SystemExit(f'{path}: not an oscarkv_kv_dump file')
        layers, tokens, q_heads, kv_heads, d = struct.unpack('<5I', f.read(20))
        out = {}
        for _ in range(layers):
            (layer,) = struct.unpack('<I', f.read(4))
            for kv in 'KV':
                bits = np.frombuffer(f.read(tokens * kv_heads * d * 2), dtype=np.uint16).astype(np.uint32) << 16
                out[(layer, kv)] = bits.view(np.float32).reshape(tokens, kv_heads, d).astype(np.float64)
            f.read(q_heads * d * 4)
    return out, d


def hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def minmax(x):
    mn = x.min(1, keepdims=True)
    sc = (x.max(1, keepdims=True) - mn) / 3
    c = np.clip(np.floor((x - mn) / np.where(sc > 0, sc, 1) + 0.5), 0, 3)
    return mn + c * sc


def unbiased_candidates(x):
    """The 8 candidates of unbiased v2, each refit (or its range when the refit does not apply)."""
    g = x.shape[1]
    mn = x.min(1, keepdims=True)
    mx = x.max(1, keepdims=True)
    w = mx - mn
    u = np.clip((x - mn) / np.where(w > 0, w, 1), 0, 1)
    v = np.floor(98304 * u)
    lv = np.floor(v / 2048)
    delta = w / 98304
    v1 = v.sum(1, keepdims=True)
    v2 = (v * v).sum(1, keepdims=True)
    out = []
    for i in range(8):
        c = (lv >= 8 + i).astype(float) + (lv >= 24) + (lv >= 40 - i)
        c1 = c.sum(1, keepdims=True)
        y1 = (c * v).sum(1, keepdims=True)
        det = g * y1 - c1 * v1
        num = g * v2 - v1 * v1
        ok = (det > 0) & (num > 0)
        s = np.where(ok, num / np.where(det != 0, det, 1), 0)
        m = ((v1 + g / 2) - s * c1) / g
        lo = mn + (i / 32) * w
        scale = np.where(ok, s * delta, (mx - (i / 32) * w - lo) / 3)
        low = np.where(ok, mn + m * delta, lo)
        out.append(low + c * scale)
    return out


def stats(x, xh):
    e = xh - x
    xx = (x * x).sum()
    return (e * e).sum() / xx, (e * x).sum() / xx


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else 'bench/testdata/refmodel_kv.bin'
    if path in ('-h', '--help'):
        print(__doc__)
        return 0
    data, d = load(path)
    rot = hadamard(d)
    print('rows              | min-max relSE  bias | unbiased v2    relSE  bias | fixed candidate relSE  bias | i* | rows whose best is i*')
    for (layer, kv), a in sorted(data.items()):
        for rotated in (False, True):
            for h in range(a.shape[1]):
                x = a[:, h, :] @ rot if rotated else a[:, h, :]
                cands = unbiased_candidates(x)
                errs = np.stack([((xh - x) ** 2).sum(1) for xh in cands], 1)
                best = errs.argmin(1)
                xbest = np.stack([cands[b][n] for n, b in enumerate(best)])
                istar = int(errs.sum(0).argmin())
                print('L%d %s head %d %-4s | %.4f %+.4f | %.4f %+.4f | %.4f %+.4f | %d | %.2f' % (
                    layer, kv, h, 'rot' if rotated else 'raw', *stats(x, minmax(x)), *stats(x, xbest),
                    *stats(x, cands[istar]), istar, (best == istar).mean()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
