"""liboscarkv_cuda_c.so's host functions (no GPU, no PyTorch; numpy only) against the client
library: page sizes, codec ids and rotation digests agree, and a page written by the CPU
reference quantize-write and finished by oscarkv_cuda_finish_page decodes with
oscarkv.decode_page to the rows written; the reference decode equals a numpy softmax."""
import ctypes

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed")

import oscarkv  # noqa: E402
from oscarkv import LibraryNotFoundError, PageKind  # noqa: E402
from oscarkv.torch import _capi  # noqa: E402

try:
    LIB = _capi.load()
except LibraryNotFoundError as e:  # a build without nvcc has no kernels library
    pytest.skip("liboscarkv_cuda_c.so not found (a CUDA build makes it): %s" % e,
                allow_module_level=True)


def c_profile(p: oscarkv.CodecProfile) -> _capi.Profile:
    c = _capi.Profile()
    c.model_id, c.model_revision = p.model_id.encode(), p.model_revision.encode()
    for f in ("num_layers", "num_kv_heads", "tp_rank", "tp_size", "head_dim", "page_tokens",
              "group_size", "sink_tokens", "recent_tokens"):
        setattr(c, f, getattr(p, f))
    ctypes.memmove(c.rotation_digest, p.rotation_digest, 32)
    return c


def ptr(a):
    return a.ctypes.data


def test_page_sizes_and_codec_ids_match_the_client_library():
    for shape in ("qwen3-8b", "refmodel"):
        p = oscarkv.CodecProfile.builtin(shape)
        c = c_profile(p)
        for kind in (PageKind.INT2, PageKind.BF16):
            n = ctypes.c_uint64()
            _capi.check(LIB.oscarkv_cuda_page_bytes(ctypes.byref(c), int(kind), ctypes.byref(n)))
            assert n.value == p.page_bytes(kind)
        out = (ctypes.c_uint8 * 16)()
        _capi.check(LIB.oscarkv_cuda_codec_id(ctypes.byref(c), out))
        assert bytes(out) == p.codec_id


def test_builtin_hadamard_digest_matches_the_client_library():
    L, H, d = 2, 2, 128
    m = np.empty((L, 2, H, d, d), np.float32)
    _capi.check(LIB.oscarkv_cuda_builtin_rotations(1, L, H, d, ptr(m)))
    assert np.allclose(m[0, 0, 0] @ m[0, 0, 0].T, np.eye(d), atol=1e-5)
    clips = np.ones((L, 2, H), np.float32)
    dg = (ctypes.c_uint8 * 32)()
    _capi.check(LIB.oscarkv_cuda_rotation_digest(L, H, d, ptr(m), ptr(clips), None, dg))
    assert bytes(dg) == oscarkv.Rotation.from_arrays(L, H, d, m.tobytes(), clips.tobytes()).digest
    with pytest.raises(oscarkv.InvalidArgumentError, match="unknown set"):
        _capi.check(LIB.oscarkv_cuda_builtin_rotations(7, L, H, d, ptr(m)))


def test_reference_write_finish_and_decode_round_trip():
    p = oscarkv.CodecProfile.builtin("refmodel")
    L, H, d, T = p.num_layers, p.num_kv_heads, p.head_dim, p.page_tokens
    c = c_profile(p)
    rng = np.random.default_rng(4)
    n = 40
    rows = rng.standard_normal((2, n, H, d)).astype(np.float32)  # K, V of layer 3
    bf = (rows.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bf16 bits
    size = p.page_bytes(PageKind.BF16)
    page = np.zeros(size, np.uint8)
    ptrs = (ctypes.c_void_p * 1)(ptr(page))
    kinds = np.array([int(PageKind.BF16)], np.uint8)
    dst_page = np.zeros(n, np.int32)
    dst_slot = np.arange(n, dtype=np.int32)
    w = _capi.Write()
    w.num_layers, w.num_kv_heads, w.head_dim, w.group_size, w.page_tokens = L, H, d, 128, T
    w.first_layer, w.layer_count = 3, 1
    w.k_src, w.v_src = ptr(bf[0]), ptr(bf[1])
    w.src_layer_stride, w.src_token_stride, w.src_head_stride = n * H * d, H * d, d
    w.num_tokens = n
    w.page_ptrs, w.page_kinds = ctypes.addressof(ptrs), ptr(kinds)
    w.dst_page, w.dst_slot = ptr(dst_page), ptr(dst_slot)
    _capi.check(LIB.oscarkv_cuda_reference_quantize_write(ctypes.byref(w), None))
    _capi.check(LIB.oscarkv_cuda_finish_page(ctypes.byref(c), int(PageKind.BF16), n, ptr(page),
                                             size))
    got = np.asarray(oscarkv.decode_page(p, page.tobytes()))  # checks header and checksum
    want = (bf.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(got[3], want)  # [L, 2, token_count, H, d]
    # Reference decode (identity rotations) against a numpy softmax over the same rows.
    hq = 8
    q = rng.standard_normal((1, hq, d)).astype(np.float32)
    out = np.empty((1, hq, d), np.float32)
    lse = np.empty((1, hq), np.float32)
    indptr = np.array([0, 1], np.int32)
    ids = np.array([0], np.int32)
    sizes = (ctypes.c_uint64 * 1)(size)
    _capi.check(LIB.oscarkv_cuda_reference_decode(
        ctypes.byref(c), None, ctypes.addressof(ptrs), sizes, 1, ptr(indptr), 1, ptr(ids), 3,
        ptr(q), hq, 1, 0.0, ptr(out), ptr(lse)))
    k, v = want[0], want[1]  # [n, H, d]
    for j in range(hq):
        s = k[:, j // (hq // H)] @ q[0, j] / np.sqrt(d)
        pr = np.exp(s - s.max())
        np.testing.assert_allclose(out[0, j], (pr / pr.sum()) @ v[:, j // (hq // H)], rtol=1e-4,
                                   atol=1e-5)
