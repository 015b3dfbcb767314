"""The bench model's fused Triton kernels (oscarkv/bench/kernels.py) against plain torch, and the
fused model step against its eager form on every side (gpu marker).

The kernel tests also run without a GPU under Triton's interpreter (TRITON_INTERPRET=1, CPU
tensors); everything is skipped without PyTorch and Triton.
"""
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
pytest.importorskip("triton", reason="Triton is not installed")

from oscarkv.bench import kernels as K  # noqa: E402

DEV = ("cuda" if torch.cuda.is_available()
       else "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else None)
needs_dev = pytest.mark.skipif(DEV is None, reason="needs a CUDA GPU (or TRITON_INTERPRET=1)")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def ref_rms(x, w, eps):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()


@needs_dev
def test_rms_norm_equals_torch():
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(5, 4096, device=DEV, generator=g).to(torch.bfloat16) * 3
    w = torch.rand(4096, device=DEV, generator=g).to(torch.bfloat16) + 0.5
    y = K.rms_norm(x, w, 1e-6)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    torch.testing.assert_close(y.float(), ref_rms(x, w, 1e-6), rtol=1e-2, atol=1e-2)
    # rows of a strided view (the kernel takes the row stride)
    big = torch.randn(3, 8192, device=DEV, generator=g).to(torch.bfloat16)
    torch.testing.assert_close(K.rms_norm(big[:, :4096], w, 1e-6).float(),
                               ref_rms(big[:, :4096], w, 1e-6), rtol=1e-2, atol=1e-2)


def ref_rope(x, pos, inv_freq):
    """HF Qwen3 rotate-half RoPE, f32: x [T, heads, d]."""
    f = pos.float()[:, None] * inv_freq[None, :]
    cos = torch.cat([f.cos(), f.cos()], -1)[:, None]
    sin = torch.cat([f.sin(), f.sin()], -1)[:, None]
    d = x.shape[-1]
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


@needs_dev
@pytest.mark.parametrize("dense_v", [False, True])
def test_qk_norm_rope_equals_torch(dense_v):
    hq, h, d, T, eps = 4, 2, 128, 3, 1e-6
    g = torch.Generator(device=DEV).manual_seed(1)
    qkv = torch.randn(T, (hq + 2 * h) * d, device=DEV, generator=g).to(torch.bfloat16)
    qkn = (torch.rand(hq + h, d, device=DEV, generator=g) + 0.5).to(torch.bfloat16)
    pos = torch.tensor([0, 7, 40000], device=DEV)
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=DEV).float() / d))
    orig = qkv.clone()
    heads = orig.view(T, hq + 2 * h, d)
    want = ref_rope(ref_rms(heads[:, :hq + h], qkn, eps), pos, inv)
    q = torch.full((T + 2, hq, d), 7.0, device=DEV)[:T]  # f32, as the INT2 decoder reads it
    kd = vd = None
    if dense_v:  # a dense cache's slot: [B, h, N, d][:, :, slot] has strides (h N d, N d, 1)
        kc = torch.zeros(T, h, 5, d, device=DEV, dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        kd, vd = kc[:, :, 3], vc[:, :, 3]
    K.qk_norm_rope(qkv, qkn, pos, inv, q, kd, vd, hq, h, d, eps)
    torch.testing.assert_close(q, want[:, :hq], rtol=2e-2, atol=2e-2)
    out = qkv.view(T, hq + 2 * h, d)
    torch.testing.assert_close(out[:, :hq], heads[:, :hq], rtol=0, atol=0)  # q not written back
    torch.testing.assert_close(out[:, hq + h:], heads[:, hq + h:], rtol=0, atol=0)  # v untouched
    if dense_v:
        torch.testing.assert_close(kd.float(), want[:, hq:], rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(vd, heads[:, hq + h:], rtol=0, atol=0)
        assert not kc[:, :, :3].any() and not vc[:, :, 4].any()  # only the slot is written
        torch.testing.assert_close(out[:, hq:hq + h], heads[:, hq:hq + h], rtol=0, atol=0)
    else:
        torch.testing.assert_close(out[:, hq:hq + h].float(), want[:, hq:], rtol=2e-2, atol=2e-2)


@needs_dev
@pytest.mark.parametrize("dense_v", [False, True])
def test_qk_norm_rope_with_q_rot_writes_the_rotated_query(dense_v):
    """q_rot: each q head comes out as (its normed, RoPE'd row) @ R of its KV head -- compared
    in float64 against the kernel's own unrotated rows, so an R^T or a head mix-up fails; the
    k / v outputs are those of the call without q_rot."""
    hq, h, d, T, eps = 8, 2, 128, 3, 1e-6
    g = torch.Generator(device=DEV).manual_seed(2)
    qkv = torch.randn(T, (hq + 2 * h) * d, device=DEV, generator=g).to(torch.bfloat16)
    qkn = (torch.rand(hq + h, d, device=DEV, generator=g) + 0.5).to(torch.bfloat16)
    pos = torch.tensor([0, 9, 70000], device=DEV)
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=DEV).float() / d))
    rot = torch.linalg.qr(torch.randn(h, d, d, dtype=torch.float64,
                                      generator=torch.Generator().manual_seed(3)))[0]
    rot32 = rot.float().to(DEV).contiguous()
    outs = []
    for q_rot in (None, rot32):
        x = qkv.clone()
        q = torch.zeros(T, hq, d, device=DEV)
        kd = vd = None
        if dense_v:
            kd = torch.zeros(T, h, d, device=DEV, dtype=torch.bfloat16)
            vd = torch.zeros_like(kd)
        K.qk_norm_rope(x, qkn, pos, inv, q, kd, vd, hq, h, d, eps, q_rot=q_rot)
        outs.append((q, x, kd, vd))
    (q0, x0, k0, v0), (q1, x1, k1, v1) = outs
    kvh = torch.arange(hq) // (hq // h)
    want = torch.einsum("thi,hic->thc", q0.double().cpu(), rot[kvh])
    torch.testing.assert_close(q1.double().cpu(), want, rtol=0, atol=2e-5)
    assert (q1 - q0).abs().max() > 0.1  # the rotation did something
    torch.testing.assert_close(x1, x0, rtol=0, atol=0)
    if dense_v:
        torch.testing.assert_close(k1, k0, rtol=0, atol=0)
        torch.testing.assert_close(v1, v0, rtol=0, atol=0)
    with pytest.raises(ValueError):
        K.qk_norm_rope(qkv, qkn, pos, inv, q1, None, None, hq, h, d, eps, q_rot=rot32[:1])


@needs_dev
def test_silu_mul_equals_torch():
    g = torch.Generator(device=DEV).manual_seed(2)
    gu = torch.randn(3, 2 * 3000, device=DEV, generator=g).to(torch.bfloat16) * 4
    y = K.silu_mul(gu)
    a, b = gu.float().chunk(2, -1)
    torch.testing.assert_close(y.float(), torch.nn.functional.silu(a) * b, rtol=1e-2, atol=1e-2)


@needs_dev
def test_bad_shapes_are_errors():
    x = torch.zeros(2, 256, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError):
        K.rms_norm(x.t(), torch.ones(2, device=DEV, dtype=torch.bfloat16), 1e-6)
    with pytest.raises(ValueError):
        K.qk_norm_rope(x, torch.ones(3, 128, device=DEV, dtype=torch.bfloat16),
                       torch.zeros(2, device=DEV, dtype=torch.long),
                       torch.ones(64, device=DEV), torch.empty(2, 1, 128, device=DEV), None,
                       None, 1, 1, 128, 1e-6)  # 256 columns are not (1 + 2) * 128


@needs_dev
@pytest.mark.parametrize("mode", ["plain", "norm", "residual_f32_in", "swiglu", "swiglu_in"])
def test_gemv_equals_torch(mode):
    g = torch.Generator(device=DEV).manual_seed(4)
    Kd, N = 1024, 72  # N not a multiple of the row block: masked rows
    x = torch.randn(1, Kd, device=DEV, generator=g).to(torch.bfloat16)
    w = (torch.randn(2 * N if mode == "swiglu" else N, Kd, device=DEV, generator=g) * 0.05).to(torch.bfloat16)
    nw = (torch.rand(Kd, device=DEV, generator=g) + 0.5).to(torch.bfloat16)
    if mode == "plain":
        y, want = K.gemv(x, w), x.float() @ w.float().t()
    elif mode == "norm":
        y = K.gemv(x, w, norm=nw, eps=1e-6)
        want = ref_rms(x, nw, 1e-6).to(torch.bfloat16).float() @ w.float().t()
    elif mode == "residual_f32_in":
        x32 = torch.randn(1, Kd, device=DEV, generator=g)
        r = torch.randn(1, N, device=DEV, generator=g).to(torch.bfloat16)
        want = r.float() + x32 @ w.float().t()
        y = K.gemv(x32, w, out=r, residual=r)  # in place, as the model's x += a W_o^T
        assert y is r
    elif mode == "swiglu_in":  # x2 holds gate | up; read as silu_mul's output
        x2 = torch.randn(1, 2 * Kd, device=DEV, generator=g).to(torch.bfloat16)
        r = torch.randn(1, N, device=DEV, generator=g).to(torch.bfloat16)
        want = r.float() + K.silu_mul(x2).float() @ w.float().t()
        y = K.gemv(x2, w, out=r, residual=r, swiglu_in=True)
        with pytest.raises(ValueError):
            K.gemv(x, w, swiglu_in=True)  # x is [1, K], not [1, 2K]
    else:
        y = K.gemv(x, w, norm=nw, eps=1e-6, swiglu=True)
        hn = ref_rms(x, nw, 1e-6).to(torch.bfloat16).float()
        gate, up = (hn @ w.float().t()).chunk(2, -1)
        want = torch.nn.functional.silu(gate) * up
    assert y.shape == want.shape and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))
    for cf in ({"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4},):  # another configuration
        if mode == "plain":
            torch.testing.assert_close(K.gemv(x, w, config=cf).float(), want, rtol=2e-2,
                                       atol=2e-2 * float(want.abs().max()))
    with pytest.raises(ValueError):
        K.gemv(x, w, norm=nw, out=x)  # the normed input may not be the output
    if DEV == "cuda" and K.pdl_supported():  # launched as a programmatic dependent
        cf = {"BLOCK_N": 8, "BLOCK_K": 256, "num_warps": 4, "pdl": True}
        if mode == "swiglu":
            got = K.gemv(x, w, norm=nw, eps=1e-6, swiglu=True, config=cf)
        elif mode == "norm":
            got = K.gemv(x, w, norm=nw, eps=1e-6, config=cf)
        elif mode == "plain":
            got = K.gemv(x, w, config=cf)
        else:
            got = None
        if got is not None:
            torch.testing.assert_close(got.float(), want, rtol=2e-2,
                                       atol=2e-2 * float(want.abs().max()))


SMALL = dict(layers=2, hidden=512, q_heads=32, kv_heads=8, head_dim=128, inter=1024, vocab=1000,
             rope_theta=1e6, eps=1e-6)


@gpu
@pytest.mark.parametrize("side", ["int2", "bf16-sdpa", "bf16-pages"])
@pytest.mark.parametrize("form,batch", [("fused", 2), ("gemv", 1)])
def test_fused_step_equals_eager_step(side, form, batch):
    """The fused layer (batch 2: Triton kernels around cuBLAS; batch 1: the GEMV form) and the
    eager layer give the same logits on the same cache (each step writes the same slot, so the
    two steps see the same history)."""
    pytest.importorskip("oscarkv.torch")
    from oscarkv.bench import model as M
    m = M.Model(SMALL, form=form)
    s = (M.SdpaSide(m, batch, 1000) if side == "bf16-sdpa"
         else M.PagedSide(m, M.int2_codec(SMALL, side == "bf16-pages", 1128), batch, 1000))
    s.ids = torch.tensor([3, 17][:batch], device="cuda")
    fused = s.step().float()
    m.form = "eager"
    eager = s.step().float()
    cos = torch.nn.functional.cosine_similarity(fused, eager, dim=-1)
    assert bool((cos > 0.999).all()), cos
    torch.testing.assert_close(fused, eager, rtol=5e-2, atol=5e-2 * float(eager.abs().max()))
    # and under a CUDA graph (the bench's form), the fused step again
    m.form = form
    g, out = M.capture(s.step)
    g.replay()
    torch.testing.assert_close(out.float(), fused, rtol=2e-2, atol=2e-2 * float(fused.abs().max()))


@gpu
def test_gemv_step_with_pdl_launches_equals_eager_step():
    """Every projection a GEMV launched as a programmatic dependent of the kernel ahead (the
    probe's pdl configs), in a CUDA graph: the eager step's logits."""
    pytest.importorskip("oscarkv.torch")
    if not K.pdl_supported():
        pytest.skip("this Triton / GPU has no griddepcontrol")
    from oscarkv.bench import model as M
    m = M.Model(SMALL, form="gemv")
    cf = dict(BLOCK_N=4, BLOCK_K=512, num_warps=4, pdl=True)
    m.gemv_pick = dict(qkv=cf, o=cf, gate_up=cf, down=cf, lm_head=cf)
    s = M.PagedSide(m, M.int2_codec(SMALL), 1, 1000)
    s.ids = torch.tensor([11], device="cuda")
    g, out = M.capture(s.step)
    g.replay()
    got = out.float().clone()
    m.form = "eager"
    want = s.step().float()
    assert bool((torch.nn.functional.cosine_similarity(got, want, dim=-1) > 0.999).all())
    torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2 * float(want.abs().max()))


@gpu
def test_gemv_step_with_down_reading_gate_up_equals_eager_step():
    """The gemv form with gate_up on cuBLAS and down reading its output as silu(gate) * up
    (the probe's down_si pick) gives the eager step's logits."""
    pytest.importorskip("oscarkv.torch")
    from oscarkv.bench import model as M
    m = M.Model(SMALL, form="gemv")
    cf = dict(BLOCK_N=4, BLOCK_K=512, num_warps=4)
    m.gemv_pick = dict(qkv=cf, o=cf, down_si=cf)
    s = M.PagedSide(m, M.int2_codec(SMALL), 1, 1000)
    s.ids = torch.tensor([9], device="cuda")
    got = s.step().float()
    m.form = "eager"
    want = s.step().float()
    assert bool((torch.nn.functional.cosine_similarity(got, want, dim=-1) > 0.999).all())
    torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2 * float(want.abs().max()))


@gpu
@pytest.mark.parametrize("side", ["int2", "bf16-pages"])
def test_layer_major_step_equals_page_major_step(side):
    """The same step on a layer-major pool (one region per layer) and on whole pages gives the
    same logits on the GPU: the same pages, written, flushed and decoded the same way."""
    pytest.importorskip("oscarkv.torch")
    from oscarkv.bench import model as M
    m = M.Model(SMALL, form="fused")
    got = {}
    try:
        for layout in M.LAYOUTS:
            M.LAYOUT["paged"] = layout
            s = M.PagedSide(m, M.int2_codec(SMALL, side == "bf16-pages", 1128), 2, 1000)
            s.ids = torch.tensor([3, 17], device="cuda")
            got[layout] = s.step().float()
    finally:
        M.LAYOUT["paged"] = M.LAYOUTS[0]
    a, b = got.values()
    torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3 * float(b.abs().max()))


@gpu
@pytest.mark.parametrize("side", ["int2", "bf16-pages"])
def test_folded_step_equals_unrotating_step(side):
    """The paged sides' default -- R_V folded into their W_o, the decode's output left rotated --
    gives the logits of the unrotating launch on the model's W_o (gemv form, batch 1)."""
    pytest.importorskip("oscarkv.torch")
    from oscarkv.bench import model as M
    m = M.Model(SMALL, form="gemv")
    got = {}
    for fold in (True, False):
        s = M.PagedSide(m, M.int2_codec(SMALL, side == "bf16-pages", 1128), 1, 1000, fold=fold)
        s.ids = torch.tensor([5], device="cuda")
        got[fold] = s.step().float()
        assert (s.o is not None) == fold
    assert not torch.equal(M.folded_o(m, M.int2_codec(SMALL))[0], m.layers[0]["o"])
    a, b = got[True], got[False]
    assert bool((torch.nn.functional.cosine_similarity(a, b, dim=-1) > 0.9999).all())
    torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2 * float(b.abs().max()))


@gpu
@pytest.mark.parametrize("side", ["int2", "bf16-pages"])
@pytest.mark.parametrize("layout", ["page-major", "layer-major"])
def test_fused_write_stores_what_the_write_launch_stores(side, layout):
    """FUSED_WRITE: the q/k kernel stores each layer's new K/V row (rotated, bf16) into its BF16
    page slot in place of the cache's write launch (gemv form, batch 1). The pool after the
    step holds the launch's values where the launch wrote (within bf16 rounding: the launch
    rotates the bf16-rounded k) and is unchanged elsewhere; the logits agree."""
    pytest.importorskip("oscarkv.torch")
    from oscarkv.bench import model as M
    m = M.Model(SMALL, form="gemv")
    pools, logits = {}, {}
    try:
        M.LAYOUT["paged"] = layout
        for fw in (False, True):
            M.FUSED_WRITE["on"] = fw
            s = M.PagedSide(m, M.int2_codec(SMALL, side == "bf16-pages", 1128), 1, 1000)
            s.ids = torch.tensor([5], device="cuda")
            before = s.cache.pool.clone()
            logits[fw] = s.step().float()
            assert s.fused_write == fw and not s._written
            pools[fw] = (before, s.cache.pool.clone())
    finally:
        M.FUSED_WRITE["on"] = False
        M.LAYOUT["paged"] = M.LAYOUTS[0]
    (b0, a0), (b1, a1) = pools[False], pools[True]
    assert torch.equal(b0, b1)
    changed = (a0 != b0).view(-1, 2).any(1)  # bf16 elements the write launch changed
    assert int(changed.sum()) >= SMALL["layers"] * 2 * SMALL["kv_heads"] * 100
    assert torch.equal(a1.view(-1, 2)[~changed], b1.view(-1, 2)[~changed])
    w0 = a0.view(torch.bfloat16)[changed].float()
    w1 = a1.view(torch.bfloat16)[changed].float()
    torch.testing.assert_close(w1, w0, rtol=3e-2, atol=3e-2 * float(w0.abs().max()))
    assert ((w1 - w0).norm() / w0.norm()).item() < 1e-2
    torch.testing.assert_close(logits[True], logits[False], rtol=2e-2,
                               atol=2e-2 * float(logits[False].abs().max()))
