"""The page builder and reader (no daemon): INT2 error bound, BF16 exactness, the header, the
checksum, partial pages, bf16 input, rotation sets from arrays and from an artifact file."""
import hashlib
import json
import struct

import numpy as np
import pytest

import oscarkv
from oscarkv import PageKind

PROFILE = oscarkv.CodecProfile.builtin("refmodel")  # 8 layers, 2 KV heads, d 128, T 64


def rows(seed, tokens=64, p=PROFILE):
    rng = np.random.default_rng(seed)
    return rng.uniform(-2, 2, (p.num_layers, 2, tokens, p.num_kv_heads, p.head_dim)).astype(
        np.float32)


def bf16_round(x):
    b = x.view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return b.astype(np.uint32).view(np.float32)


def test_int2_page_header_and_error_bound():
    x = rows(1)
    page = oscarkv.build_page(PROFILE, PageKind.INT2, x)
    assert isinstance(page, np.ndarray) and page.dtype == np.uint8
    assert page.nbytes == PROFILE.page_bytes(PageKind.INT2) == 64 + 8 * 2 * 2 * 2304
    magic, version, kind, scale_dtype = struct.unpack_from("<IHBB", page, 0)
    assert (magic, version, kind, scale_dtype) == (0x50564B4F, 1, 1, 1)
    assert bytes(page[8:24]) == PROFILE.codec_id
    assert struct.unpack_from("<H", page, 34)[0] == 64  # token_count
    y = oscarkv.decode_page(PROFILE, page)
    assert y.shape == x.shape
    err = np.abs(y - x).max()
    assert 0 < err <= 4 / 3 / 2 + 1e-3  # |x - x^| <= scale/2, scale <= (max-min)/3
    # equal inputs give equal bytes
    assert np.array_equal(page, oscarkv.build_page(PROFILE, PageKind.INT2, x))


def test_bf16_page_is_exact_and_partial_pages_hold_their_tokens():
    x = rows(2, tokens=10)
    page = oscarkv.build_page(PROFILE, PageKind.BF16, x)
    assert page.nbytes == PROFILE.page_bytes(PageKind.BF16)
    y = oscarkv.decode_page(PROFILE, page)
    assert y.shape[2] == 10
    assert np.array_equal(y, bf16_round(x))
    # bf16 input (as uint16 bits) builds the same page
    bits = (bf16_round(x).view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(oscarkv.build_page(PROFILE, PageKind.BF16, bits, dtype="bf16"), page)


def test_checksum_catches_one_flipped_byte():
    page = oscarkv.build_page(PROFILE, PageKind.INT2, rows(3))
    page[5000] ^= 0x20
    with pytest.raises(oscarkv.DataLossError) as e:
        oscarkv.decode_page(PROFILE, page)
    assert e.value.code == oscarkv.StatusCode.DATA_LOSS


def test_builder_rejects_bad_input():
    with pytest.raises(oscarkv.InvalidArgumentError, match="shape"):
        oscarkv.build_page(PROFILE, PageKind.INT2, np.zeros((8, 2, 64, 2, 64), np.float32))
    with pytest.raises(oscarkv.InvalidArgumentError):
        oscarkv.build_page(PROFILE, PageKind.INT2, rows(1, tokens=65))
    with pytest.raises(oscarkv.InvalidArgumentError, match="dtype"):
        oscarkv.build_page(PROFILE, PageKind.INT2, rows(1).astype(np.float64))
    with pytest.raises(oscarkv.InvalidArgumentError):
        oscarkv.build_page(PROFILE, PageKind.INT2, rows(1), out=bytearray(10))
    # another codec's page is refused by the reader
    other = oscarkv.CodecProfile(**{**PROFILE.__dict__, "model_revision": "v2"})
    with pytest.raises(oscarkv.OscarkvError):
        oscarkv.decode_page(other, oscarkv.build_page(PROFILE, PageKind.INT2, rows(1)))


def random_rotations(layers, heads, d, seed):
    """Random orthogonal matrices without LAPACK: a normalised Hadamard matrix with randomly
    permuted rows and random signs (exactly orthogonal, a different one per head)."""
    rng = np.random.default_rng(seed)
    h = np.array([[1.0]])
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    h /= np.sqrt(d)
    m = np.empty((layers, 2, heads, d, d), np.float32)
    for idx in np.ndindex(layers, 2, heads):
        signs = rng.choice([-1.0, 1.0], size=(d, 1))
        m[idx] = (signs * h[rng.permutation(d)]).astype(np.float32)
    return m


def reference_digest(layers, heads, d, m, clips, modes=None):
    """FORMAT.md §2 / §1.3.1, written independently of the C++ RotationSet::Digest()."""
    h = hashlib.sha256(b"OSCARKV-ROT-V1" + struct.pack("<3I", layers, heads, d))
    h.update(m.astype("<f4").tobytes())
    h.update(clips.astype("<f4").tobytes())
    if modes is not None and modes.any():
        h.update(b"RANGE" + modes.astype(np.uint8).tobytes())
    return h.digest()


def write_artifact(dirpath, m, clips, modes=None):
    """A rotation artifact in the layout `oscarkv calibrate` writes (calibrate/artifact.h)."""
    layers, _, heads, d, _ = m.shape
    tensors, blobs, off = {}, [], 0

    def add(name, arr, dtype):
        nonlocal off
        b = arr.tobytes()
        tensors[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off,
                                                                                    off + len(b)]}
        blobs.append(b)
        off += len(b)

    for l in range(layers):
        add("layers.%d.k_rotation" % l, m[l, 0], "F32")
        add("layers.%d.v_rotation" % l, m[l, 1], "F32")
    add("k_clip", np.ascontiguousarray(clips[:, 0]), "F32")
    add("v_clip", np.ascontiguousarray(clips[:, 1]), "F32")
    if modes is not None:
        add("k_range_mode", np.ascontiguousarray(modes[:, 0]), "U8")
        add("v_range_mode", np.ascontiguousarray(modes[:, 1]), "U8")
    header = json.dumps(tensors).encode()
    (dirpath / "rotations.safetensors").write_bytes(struct.pack("<Q", len(header)) + header +
                                                    b"".join(blobs))
    return dirpath


def test_rotation_digest_artifact_and_rotated_pages(tmp_path):
    L, H, d = PROFILE.num_layers, PROFILE.num_kv_heads, PROFILE.head_dim
    m = random_rotations(L, H, d, seed=7)
    clips = np.full((L, 2, H), 0.95, np.float32)
    modes = np.zeros((L, 2, H), np.uint8)
    modes[0, 1, 1] = 21  # unbiased-fixed 5 on one head
    rot = oscarkv.Rotation.from_arrays(L, H, d, m, clips, modes)
    assert rot.digest == reference_digest(L, H, d, m, clips, modes)
    art = write_artifact(tmp_path, m, clips, modes)
    assert oscarkv.Rotation.from_artifact(art).digest == rot.digest
    (tmp_path / "rotations.json").write_text(json.dumps({"digest": rot.digest.hex()}))
    assert oscarkv.Rotation.from_artifact(art).digest == rot.digest
    (tmp_path / "rotations.json").write_text(json.dumps({"digest": "00" * 32}))
    with pytest.raises(oscarkv.InvalidArgumentError, match="digest"):
        oscarkv.Rotation.from_artifact(art)

    codec = oscarkv.Codec.local(PROFILE, rotation=rot)
    assert codec.profile.rotation_digest == rot.digest and codec.id != PROFILE.codec_id
    # BF16 pages are rotated, never clipped: unrotating the decoded rows gives the input back
    x = rows(4)
    y = codec.decode_page(codec.build_page(PageKind.BF16, x))
    back = np.einsum("lkthj,lkhij->lkthi", y, m)  # y R^T
    assert np.abs(back - x).max() < 0.05
    # a rotation whose digest is not the profile's is refused
    with pytest.raises(oscarkv.InvalidArgumentError, match="digest"):
        oscarkv.build_page(PROFILE, PageKind.INT2, x, rotation=rot)
    # non-orthogonal matrices and retired range modes are refused
    bad = m.copy()
    bad[0, 0, 0, 0, 0] += 0.1
    with pytest.raises(oscarkv.InvalidArgumentError, match="orthogonal"):
        oscarkv.Rotation.from_arrays(L, H, d, bad, clips)
    modes[0, 0, 0] = 2
    with pytest.raises(oscarkv.InvalidArgumentError, match="range mode"):
        oscarkv.Rotation.from_arrays(L, H, d, m, clips, modes)
