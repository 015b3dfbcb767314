"""The value rotation folded into the output projection (oscarkv.torch.fold): the fold is exact
algebra (float64), the ops' rotated outputs (unrotate_output off) through a folded W_o equal the
unrotated outputs through W_o -- on the CPU references and on the GPU kernels, decode and
extend -- and a transformers-style model is folded, refolded and unfolded in place.

Needs PyTorch and liboscarkv_cuda_c.so (the CPU references are in it); the GPU tests also a GPU.
"""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: oscarkv.torch needs it")

from oscarkv import LibraryNotFoundError  # noqa: E402

try:
    from oscarkv.torch import _capi  # noqa: E402
    _capi.load()
except LibraryNotFoundError as e:
    pytest.skip("liboscarkv_cuda_c.so not found (needs a CUDA build): %s" % e,
                allow_module_level=True)

from oscarkv.torch import KVCodec, PagedKVCache  # noqa: E402
from oscarkv.torch.fold import (FOLD_ATTR, fold_model_value_rotations,  # noqa: E402
                                fold_value_rotation, folded_digest, unfold_model_value_rotations)

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
D = 128


def random_orthogonal(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(n, d, d, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]


def random_codec(layers=2, heads=2, seed=0):
    """A codec with a random orthogonal rotation per (layer, K|V, KV head): a fold that mixed
    up heads, layers, K and V or R and R^T would not pass with it."""
    m = random_orthogonal(layers * 2 * heads, D, seed).float().view(layers, 2, heads, D, D)
    return KVCodec(layers, heads, m, name="random")


def test_fold_is_exact_algebra_cpu():
    hq, h, out = 8, 2, 48
    r = random_orthogonal(h, D, 1)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(out, hq * D, generator=g, dtype=torch.float64)
    o = torch.randn(5, hq, D, generator=g, dtype=torch.float64)  # attention output, model basis
    # the rotated basis the pages give: o'_j = o_j R_{j // 4}
    o_rot = torch.einsum("thd,hde->the", o, r.repeat_interleave(hq // h, 0))
    w2 = fold_value_rotation(w, r, hq)
    torch.testing.assert_close(o_rot.reshape(5, -1) @ w2.t(), o.reshape(5, -1) @ w.t(),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fold_value_rotation(w2, r, hq, inverse=True), w, rtol=1e-12,
                               atol=1e-12)
    assert w2.dtype == w.dtype and not torch.equal(w2, w)
    with pytest.raises(ValueError):
        fold_value_rotation(w, r, 6)  # W has 8 heads' columns, not 6
    with pytest.raises(ValueError):
        fold_value_rotation(w[:, :-1], r, hq)


def _cache(device, codec, lengths, seed=3, hq=8):
    g = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(codec, hq, len(lengths), max(lengths) + 64, device=device,
                         max_step_tokens=sum(lengths) + 64)
    cache.reset(len(lengths))
    cache.begin_step(lengths)
    L, H = codec.num_layers, codec.num_kv_heads
    for l in range(L):
        k = torch.randn(sum(lengths), H, D, generator=g).to(device)
        cache.write(l, k, torch.randn(sum(lengths), H, D, generator=g).to(device) * 2)
    cache.begin_step([1] * len(lengths))  # flushes the prompt's history pages to INT2
    for l in range(L):
        r = torch.randn(len(lengths), H, D, generator=g).to(device)
        cache.write(l, r, -r)
    return cache


def _check_decode(device, tol):
    codec = random_codec()
    cache = _cache(device, codec, [700, 90])
    g = torch.Generator().manual_seed(4)
    hq = 8
    w = torch.randn(64, hq * D, generator=g).to(device)
    for layer in range(2):
        q = torch.randn(2, hq, D, generator=g).to(device)
        plain = cache.decode(layer, q).clone()
        rotated = cache.decode(layer, q, unrotate=False).clone()
        assert (rotated - plain).norm() > 0.5 * plain.norm()  # a different basis indeed
        w2 = fold_value_rotation(w, codec.matrices[layer, 1], hq)
        want = plain.reshape(2, -1) @ w.t()
        got = rotated.reshape(2, -1) @ w2.t()
        assert ((got - want).norm() / want.norm()).item() < tol, layer
        # the rotated output is the unrotated one times R_V of its KV head
        rv = codec.matrices[layer, 1].to(device).repeat_interleave(hq // 2, 0)
        back = torch.einsum("thd,hde->the", plain, rv)
        assert ((rotated - back).norm() / back.norm()).item() < tol, layer


def test_folded_decode_equals_unrotated_decode_cpu():
    _check_decode("cpu", 1e-5)


@gpu
def test_folded_decode_equals_unrotated_decode_gpu():
    _check_decode("cuda", 1e-4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
def test_folded_extend_equals_unrotated_extend(device):
    codec = random_codec(seed=5)
    cache = _cache(device, codec, [300, 70], seed=6)
    g = torch.Generator().manual_seed(7)
    new = [33, 65]
    cache.begin_step(new)
    n, hq = sum(new), 8
    k = torch.randn(n, 2, D, generator=g).to(device)
    v = torch.randn(n, 2, D, generator=g).to(device)
    q = torch.randn(n, hq, D, generator=g).to(device)
    for layer in range(2):
        cache.write(layer, k, v)
    w = torch.randn(32, hq * D, generator=g).to(device)
    plain = cache.extend(1, q, k, v).clone()
    rotated = cache.extend(1, q, k, v, unrotate=False).clone()
    want = plain.reshape(n, -1) @ w.t()
    got = rotated.reshape(n, -1) @ fold_value_rotation(w, codec.matrices[1, 1], hq).t()
    # the GPU extend's own unrotation is the less exact side (2e-4 seen on the H200)
    assert ((got - want).norm() / want.norm()).item() < (1e-5 if device == "cpu" else 1e-3)


class _Attn(torch.nn.Module):  # the attributes fold_model_value_rotations looks for
    def __init__(self, idx, hq):
        super().__init__()
        self.layer_idx = idx
        self.o_proj = torch.nn.Linear(hq * D, 40, bias=False, dtype=torch.float64)


class _Model(torch.nn.Module):
    def __init__(self, layers, hq):
        super().__init__()
        self.config = type("Cfg", (), {"num_attention_heads": hq})()
        self.layers = torch.nn.ModuleList(_Attn(i, hq) for i in range(layers))


def test_model_fold_refold_unfold_cpu():
    torch.manual_seed(8)
    m = _Model(2, 8)
    orig = [a.o_proj.weight.detach().clone() for a in m.layers]
    a, b = random_codec(seed=9), random_codec(seed=10)
    da, db = a.rotation_digest(), b.rotation_digest()
    assert da != db
    assert fold_model_value_rotations(m, a) == 2
    for i, layer in enumerate(m.layers):
        assert folded_digest(layer) == da
        torch.testing.assert_close(layer.o_proj.weight,
                                   fold_value_rotation(orig[i], a.matrices[i, 1], 8))
    w1 = m.layers[0].o_proj.weight.detach().clone()
    fold_model_value_rotations(m, a)  # the same codec again: left as it is
    assert torch.equal(m.layers[0].o_proj.weight, w1)
    fold_model_value_rotations(m, b)  # another codec: unfolded, then folded with b's R_V
    for i, layer in enumerate(m.layers):
        assert folded_digest(layer) == db
        torch.testing.assert_close(layer.o_proj.weight,
                                   fold_value_rotation(orig[i], b.matrices[i, 1], 8))
    assert unfold_model_value_rotations(m) == 2
    for i, layer in enumerate(m.layers):
        assert getattr(layer, FOLD_ATTR, None) is None
        torch.testing.assert_close(layer.o_proj.weight, orig[i], rtol=1e-6, atol=1e-7)
