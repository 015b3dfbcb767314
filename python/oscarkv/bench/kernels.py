"""Fused per-layer kernels (Triton) of the bench model's non-attention work, shared by every side.

A decode step of a 36-layer model at batch 1 moves 384 MB of weights per layer in ~90 us; the
eager torch form of the same layer added ~10 small kernels (norms, RoPE via roll/addcmul, the k
copy-back, SiLU and the product, addmm's copy of its input), each a few microseconds even
under CUDA graphs. These three kernels do that work in three launches:

    rms_norm(x, w, eps)                      y = x / rms(x) * w, one program per row
    qk_norm_rope(qkv, qkn, pos, inv_freq, q_out, k_out, v_out, ...)
        per-head RMSNorm of the q and k heads (weights qkn), rotate-half RoPE at pos[t] (angles
        computed in f32 from inv_freq), q written to q_out (any float dtype, e.g. the INT2
        decoder's f32 query buffer), k to k_out (default: back into qkv), v copied to v_out
        when given (a dense cache's slot) -- one program per (token, head)
    silu_mul(gu)                             silu(gu[:, :N]) * gu[:, N:], N = gu.shape[1] / 2

Contracts: bf16 inputs with a contiguous last dimension; every output a caller's view (strides
passed through), so a side can point q/k/v at its cache without a copy. Launches go to torch's
current stream with no host synchronisation, so CUDA graphs capture them. Triton is imported
lazily: without it (or without CUDA) the bench model runs its eager torch form.
"""
from typing import Optional

import torch

try:  # optional: the CPU machines of CI have no Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


def pdl_supported() -> bool:
    """Whether gemv configs may set pdl: Triton with griddepcontrol (tl.extra.cuda.gdc_wait)
    and a CUDA GPU of compute capability 9.0 or later."""
    return (available() and hasattr(getattr(getattr(tl, "extra", None), "cuda", None), "gdc_wait")
            and torch.cuda.get_device_capability()[0] >= 9)


if triton is not None:
    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, eps,
                         N: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < N
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_y + offs, (x * r * w).to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _qk_norm_rope_kernel(qkv_ptr, stride_qkv, qkn_ptr, pos_ptr, inv_ptr,
                             q_ptr, sq_t, sq_h, k_ptr, sk_t, sk_h, v_ptr, sv_t, sv_h, rot_ptr, eps,
                             pp_ptr, dpage_ptr, dslot_ptr, kvrot_ptr, gl,
                             HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
                             WRITE_V: tl.constexpr, ROT: tl.constexpr, BC: tl.constexpr,
                             PAGE: tl.constexpr, PT: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1)
        cb = tl.program_id(2)  # ROT: the block of BC output columns of the q head's y @ R
        offs = tl.arange(0, D)
        src = qkv_ptr + t * stride_qkv + j * D
        if j < HQ + H:
            half = (offs + D // 2) % D  # rotate-half partner of each element
            x = tl.load(src + offs).to(tl.float32)
            xr = tl.load(src + half).to(tl.float32)
            r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
            xn = x * r * tl.load(qkn_ptr + j * D + offs).to(tl.float32)
            xnr = xr * r * tl.load(qkn_ptr + j * D + half).to(tl.float32)
            f = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_ptr + offs % (D // 2))
            sgn = tl.where(offs < D // 2, -1.0, 1.0)
            y = xn * tl.cos(f) + xnr * tl.sin(f) * sgn
            if j < HQ:
                if ROT:
                    # z[c] = sum_i y[i] R[i, c], R = R_K of the head's KV head (row-major d x d)
                    cols = cb * BC + tl.arange(0, BC)
                    rm = tl.load(rot_ptr + (j // (HQ // H)) * D * D + offs[:, None] * D
                                 + cols[None, :])
                    z = tl.sum(y[:, None] * rm, axis=0)
                    tl.store(q_ptr + t * sq_t + j * sq_h + cols, z.to(q_ptr.dtype.element_ty))
                else:
                    tl.store(q_ptr + t * sq_t + j * sq_h + offs, y.to(q_ptr.dtype.element_ty))
            else:
                if PAGE:  # k @ R_K as bf16 into its BF16 page slot (PagedKVCache's layout)
                    cols = cb * BC + tl.arange(0, BC)
                    rm = tl.load(kvrot_ptr + (j - HQ) * D * D + offs[:, None] * D + cols[None, :])
                    z = tl.sum(y[:, None] * rm, axis=0)
                    page = tl.load(pp_ptr + tl.load(dpage_ptr + t)).to(tl.pointer_type(tl.bfloat16))
                    el = 32 + ((gl * 2 * H + (j - HQ)) * PT + tl.load(dslot_ptr + t)) * D
                    tl.store(page + el + cols, z.to(tl.bfloat16))
                else:
                    if cb == 0:
                        tl.store(k_ptr + t * sk_t + (j - HQ) * sk_h + offs,
                                 y.to(k_ptr.dtype.element_ty))
        else:
            if PAGE:  # v @ R_V likewise
                cols = cb * BC + tl.arange(0, BC)
                hv = j - HQ - H
                vrow = tl.load(src + offs).to(tl.float32)
                rm = tl.load(kvrot_ptr + (H + hv) * D * D + offs[:, None] * D + cols[None, :])
                z = tl.sum(vrow[:, None] * rm, axis=0)
                page = tl.load(pp_ptr + tl.load(dpage_ptr + t)).to(tl.pointer_type(tl.bfloat16))
                el = 32 + (((gl * 2 + 1) * H + hv) * PT + tl.load(dslot_ptr + t)) * D
                tl.store(page + el + cols, z.to(tl.bfloat16))
            else:
                if WRITE_V:
                    if cb == 0:
                        vrow = tl.load(src + offs)  # (own name: scf.if results must match)
                        tl.store(v_ptr + t * sv_t + (j - HQ - H) * sv_h + offs,
                                 vrow.to(v_ptr.dtype.element_ty))

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, stride_gu, stride_out, N: tl.constexpr,
                         BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        g = tl.load(gu_ptr + t * stride_gu + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + t * stride_gu + N + offs, mask=mask, other=0.0).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(out_ptr + t * stride_out + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


    @triton.jit
    def _gemv_input(xrow, nw_ptr, k0, ks, K: tl.constexpr, NORM: tl.constexpr,
                    SWIGLU_IN: tl.constexpr):
        """Columns k0 + ks of the GEMV's input row in f32 (SWIGLU_IN: silu(gate) * up, rounded
        to bf16; NORM: times the norm weight), and their raw squares (the norm's sum)."""
        if SWIGLU_IN:
            gv = tl.load(xrow + k0 + ks).to(tl.float32)
            uv = tl.load(xrow + K + k0 + ks).to(tl.float32)
            xv = (gv / (1.0 + tl.exp(-gv)) * uv).to(tl.bfloat16).to(tl.float32)
        else:
            xv = tl.load(xrow + k0 + ks).to(tl.float32)
        sq = xv * xv
        if NORM:
            xv = xv * tl.load(nw_ptr + k0 + ks).to(tl.float32)
        return xv, sq

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, y_ptr, res_ptr, nw_ptr, N, stride_x, stride_y, stride_r, eps,
                     K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     NORM: tl.constexpr, RESID: tl.constexpr, SWIGLU: tl.constexpr,
                     SWIGLU_IN: tl.constexpr, PDL: tl.constexpr):
        # One input row (program_id 1) times BLOCK_N rows of W [*, K] (row-major, K contiguous).
        # SWIGLU_IN: the input row is [gate K | up K], read as silu(gate) * up (bf16-rounded).
        m = tl.program_id(1).to(tl.int64)
        rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        ks = tl.arange(0, BLOCK_K)
        xrow = x_ptr + m * stride_x
        # RMSNorm of the input row in the same pass: the sum of squares gathers with the
        # products of x * norm weight, and 1/rms scales the row sums at the end (one read of x)
        ss = tl.zeros([BLOCK_K], tl.float32)
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        if SWIGLU:
            acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        wrow = w_ptr + rows[:, None] * K + ks[None, :]
        if PDL:
            # Launched as a programmatic dependent of the kernel ahead: the first W tile (which
            # no kernel writes) loads while that kernel finishes; x and every store wait for
            # it (griddepcontrol.wait); the kernel after this one may launch from then on.
            # The loop keeps one W tile in flight ahead of the products.
            w = tl.load(wrow, mask=rmask[:, None], other=0.0)
            if SWIGLU:
                w2 = tl.load(wrow + N * K, mask=rmask[:, None], other=0.0)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
            for k0 in range(0, K, BLOCK_K):
                xv, sq = _gemv_input(xrow, nw_ptr, k0, ks, K, NORM, SWIGLU_IN)
                if NORM:
                    ss += sq
                more = rmask[:, None] & (k0 + BLOCK_K < K)
                wn = tl.load(wrow + k0 + BLOCK_K, mask=more, other=0.0)
                acc += w.to(tl.float32) * xv[None, :]
                w = wn
                if SWIGLU:
                    wn2 = tl.load(wrow + N * K + k0 + BLOCK_K, mask=more, other=0.0)
                    acc2 += w2.to(tl.float32) * xv[None, :]
                    w2 = wn2
        else:
            for k0 in range(0, K, BLOCK_K):
                xv, sq = _gemv_input(xrow, nw_ptr, k0, ks, K, NORM, SWIGLU_IN)
                if NORM:
                    ss += sq
                w = tl.load(wrow + k0, mask=rmask[:, None], other=0.0)
                acc += w.to(tl.float32) * xv[None, :]
                if SWIGLU:  # the up row of each gate row: N rows further
                    w2 = tl.load(wrow + N * K + k0, mask=rmask[:, None], other=0.0)
                    acc2 += w2.to(tl.float32) * xv[None, :]
        y = tl.sum(acc, axis=1)
        if NORM:
            rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
            y = y * rstd
        if SWIGLU:
            y = y.to(tl.bfloat16).to(tl.float32)  # rounded as the unfused GEMM's output is
            u = tl.sum(acc2, axis=1)
            if NORM:
                u = u * rstd
            u = u.to(tl.bfloat16).to(tl.float32)
            y = y / (1.0 + tl.exp(-y)) * u
        if RESID:
            y += tl.load(res_ptr + m * stride_r + rows, mask=rmask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * stride_y + rows, y.to(y_ptr.dtype.element_ty), mask=rmask)


GEMV_CONFIG = dict(BLOCK_N=8, BLOCK_K=512, num_warps=4)  # see --gemv-probe


def gemv(x: torch.Tensor, w: torch.Tensor, out: Optional[torch.Tensor] = None,
         residual: Optional[torch.Tensor] = None, norm: Optional[torch.Tensor] = None,
         eps: float = 1e-6, swiglu: bool = False, config: Optional[dict] = None,
         swiglu_in: bool = False) -> torch.Tensor:
    """For a few rows (decode at batch 1): y = f(x) @ w.T (+ residual), bf16 out, f32 sums.
    x [M, K] (bf16 or f32; f32 is read as is: no cast kernel); w [N', K] contiguous bf16;
    norm: RMSNorm weight [K] applied to x first; swiglu: w holds gate rows then up rows
    (N' = 2N), y = silu(x w_gate.T) * (x w_up.T) [M, N]. The norm is applied in the same pass
    (row sums of x * weight scaled by 1/rms at the end), not rounded to bf16 in between as an
    unfused norm's output is. residual may be out itself (in place: each program reads only
    its own rows of it), never x. config: BLOCK_N, BLOCK_K, num_warps, optionally
    num_stages, and pdl (launched as a programmatic dependent of the kernel ahead, its first
    weight tile loaded before it waits for that kernel: Hopper and later). swiglu_in: x [M, 2K] holds gate then
    up columns (a gate/up GEMM's output) and is read as silu(gate) * up, rounded to bf16 as
    silu_mul's output is (no silu_mul kernel before a down projection)."""
    _check_rows("x", x)
    Kd = x.shape[1] // 2 if swiglu_in else x.shape[1]
    if (w.dim() != 2 or not w.is_contiguous() or w.shape[1] != Kd or w.dtype != torch.bfloat16
            or (swiglu_in and (x.shape[1] % 2 or norm is not None))):
        raise ValueError("w must be contiguous bf16 [N, %d]%s" % (
            Kd, " (swiglu_in: x [M, 2K], no norm)" if swiglu_in else ""))
    M = x.shape[0]
    N = w.shape[0] // 2 if swiglu else w.shape[0]
    if norm is not None and (norm.numel() != Kd or residual is x or out is x):
        raise ValueError("norm needs a [K] weight and an input that is not the output")
    y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device) if out is None else out
    _check_rows("out", y)
    if y.shape != (M, N) or (residual is not None and residual.shape != (M, N)):
        raise ValueError("out / residual must be [%d, %d]" % (M, N))
    cfg = dict(GEMV_CONFIG if config is None else config)
    if Kd % cfg["BLOCK_K"]:
        raise ValueError("K %d is not a multiple of BLOCK_K %d" % (Kd, cfg["BLOCK_K"]))
    r = residual if residual is not None else y
    launch = {"num_stages": cfg["num_stages"]} if "num_stages" in cfg else {}
    if cfg.get("pdl"):
        if x.device.type != "cuda" or not pdl_supported():
            raise ValueError("gemv config pdl needs Triton's griddepcontrol on a CUDA GPU >= 9.0")
        launch["launch_pdl"] = True
    if M:
        _gemv_kernel[(triton.cdiv(N, cfg["BLOCK_N"]), M)](
            x, w, y, r, norm if norm is not None else w, N, x.stride(0), y.stride(0), r.stride(0),
            eps, K=Kd, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], NORM=norm is not None,
            RESID=residual is not None, SWIGLU=swiglu, SWIGLU_IN=swiglu_in,
            PDL=bool(cfg.get("pdl")), num_warps=cfg["num_warps"], **launch)
    return y


def _check_rows(name: str, t: torch.Tensor) -> None:
    if t.dim() != 2 or t.stride(-1) != 1:
        raise ValueError("%s must be 2-D with a contiguous last dimension" % name)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float,
             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [T, N] -> x * rsqrt(mean(x^2) + eps) * w (f32 math, x's dtype)."""
    _check_rows("x", x)
    T, N = x.shape
    y = torch.empty_like(x) if out is None else out
    BLOCK = triton.next_power_of_2(N)
    if T:
        _rms_norm_kernel[(T,)](x, w, y, x.stride(0), y.stride(0), eps, N=N, BLOCK=BLOCK,
                               num_warps=8 if BLOCK >= 4096 else 4)
    return y


def _view3(name: str, t: torch.Tensor, T: int, heads: int, d: int) -> None:
    if t.shape != (T, heads, d) or t.stride(-1) != 1:
        raise ValueError("%s must be [%d, %d, %d] with a contiguous last dimension (got %s)"
                         % (name, T, heads, d, tuple(t.shape)))


def qk_norm_rope(qkv: torch.Tensor, qkn: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor,
                 q_out: torch.Tensor, k_out: Optional[torch.Tensor], v_out: Optional[torch.Tensor],
                 q_heads: int, kv_heads: int, head_dim: int, eps: float,
                 q_rot: Optional[torch.Tensor] = None, page_write=None) -> None:
    """qkv [T, (q_heads + 2 kv_heads) * head_dim] (q, k, v heads in that order); qkn
    [q_heads + kv_heads, head_dim]; pos [T] int; inv_freq f32 [head_dim / 2]. Writes the normed,
    rotated q heads to q_out [T, q_heads, d], k heads to k_out [T, kv_heads, d] (None: in place
    in qkv) and, if v_out is given, copies the v heads there. q_rot f32 [kv_heads, d, d]: q head
    j is written as y @ q_rot[j // (q_heads / kv_heads)] (f32 math; the INT2 decoder's rotated
    query, PagedKVCache.query_rotation), so the decode launch needs no rotation of its own.
    page_write (PagedKVCache.bf16_write_target of the layer; needs q_rot): k and v are stored
    instead as bf16 k @ R_K / v @ R_V straight into their BF16 page slots, the cache's write()
    of the step left out; qkv's k heads stay as they are."""
    _check_rows("qkv", qkv)
    T = qkv.shape[0]
    hq, h, d = q_heads, kv_heads, head_dim
    if qkv.shape[1] != (hq + 2 * h) * d or qkn.shape != (hq + h, d) or not qkn.is_contiguous():
        raise ValueError("qkv / qkn do not match %d q heads, %d kv heads of %d" % (hq, h, d))
    if pos.shape != (T,) or inv_freq.dtype != torch.float32 or inv_freq.numel() != d // 2:
        raise ValueError("pos must be [T]; inv_freq f32 [head_dim / 2]")
    if q_rot is not None and (q_rot.shape != (h, d, d) or q_rot.dtype != torch.float32
                              or not q_rot.is_contiguous() or hq % h or d % 32):
        raise ValueError("q_rot must be contiguous f32 [%d, %d, %d]" % (h, d, d))
    if k_out is None:
        k_out = qkv.view(T, hq + 2 * h, d)[:, hq:hq + h]
    _view3("q_out", q_out, T, hq, d)
    _view3("k_out", k_out, T, h, d)
    if v_out is not None:
        _view3("v_out", v_out, T, h, d)
    vo = v_out if v_out is not None else k_out
    bc = 32  # ROT: 4 programs per q head at d = 128, each reading a 128 x 32 slab of R
    pw = page_write
    if pw is not None:  # PagedKVCache.bf16_write_target: k, v rotated into their page slots
        ptrs, dpage, dslot, kvrot, gl, page_tokens = pw
        if (q_rot is None or v_out is not None or kvrot.shape != (2, h, d, d)
                or kvrot.dtype != torch.float32 or not kvrot.is_contiguous()
                or dpage.shape != (T,) or dslot.shape != (T,) or ptrs.dtype != torch.int64):
            raise ValueError("page_write needs q_rot, no v_out, f32 [2, %d, %d, %d] rotations "
                             "and [T] destinations" % (h, d, d))
    else:
        ptrs = dpage = dslot = kvrot = inv_freq
        gl, page_tokens = 0, 64
    if T:
        _qk_norm_rope_kernel[(T, hq + h + (h if v_out is not None or pw is not None else 0),
                              1 if q_rot is None else d // bc)](
            qkv, qkv.stride(0), qkn, pos, inv_freq.contiguous(),
            q_out, q_out.stride(0), q_out.stride(1), k_out, k_out.stride(0), k_out.stride(1),
            vo, vo.stride(0), vo.stride(1), q_rot if q_rot is not None else inv_freq, eps,
            ptrs, dpage, dslot, kvrot, gl,
            HQ=hq, H=h, D=d, WRITE_V=v_out is not None, ROT=q_rot is not None, BC=bc,
            PAGE=pw is not None, PT=page_tokens, num_warps=1 if q_rot is None else 4)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu [T, 2N] -> silu(gu[:, :N]) * gu[:, N:] [T, N] (f32 math)."""
    _check_rows("gu", gu)
    T, n2 = gu.shape
    N = n2 // 2
    out = torch.empty(T, N, dtype=gu.dtype, device=gu.device)
    BLOCK = 1024
    if T:
        _silu_mul_kernel[(T, triton.cdiv(N, BLOCK))](gu, out, gu.stride(0), out.stride(0), N=N,
                                                     BLOCK=BLOCK, num_warps=4)
    return out
