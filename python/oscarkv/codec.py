"""Codec profiles, codec ids, block keys, rotation sets and the page builder -- no daemon needed.

Everything here is computed by liboscarkv_c.so (the same C++ code the daemon and the C++ client
use), so keys, ids and page bytes are identical to theirs (docs/FORMAT.md).
"""
from __future__ import annotations

import array
import ctypes
import enum
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, List, Optional, Sequence, Union

from . import _native
from ._buffers import have_numpy, host_buffer, new_bytes
from .errors import InvalidArgumentError, make_error

Buffer = Any  # anything with the buffer protocol, __dlpack__, or a torch CPU tensor


class PageKind(enum.IntEnum):
    """Page kinds (FORMAT.md §1): INT2 history pages, BF16 sink/tail pages."""
    INT2 = 1
    BF16 = 2


def check(code: int) -> None:
    """Raises the exception of a non-zero C status code with the thread's last error."""
    if code != 0:
        msg = _native.load().oscarkv_last_error().decode("utf-8", "replace")
        raise make_error(code, msg)


@dataclass(frozen=True)
class CodecProfile:
    """Everything that fixes a page's layout and meaning (FORMAT.md §2). Its codec id tags every
    page and block key, so pages of different profiles never mix."""
    model_id: str
    model_revision: str
    num_layers: int
    num_kv_heads: int
    tp_rank: int = 0
    tp_size: int = 1
    head_dim: int = 128
    page_tokens: int = 64
    group_size: int = 128
    scale_dtype: int = 1  # fp16
    sink_tokens: int = 64
    recent_tokens: int = 256
    rotation_digest: bytes = bytes(32)  # all zero: no rotation artifact

    @staticmethod
    def builtin(shape: str) -> "CodecProfile":
        """A built-in shape: "qwen3-8b" or "refmodel"."""
        c = _native.CodecProfileC()
        check(_native.load().oscarkv_builtin_profile(shape.encode(), ctypes.byref(c)))
        return CodecProfile._from_c(c)

    def with_rotation(self, rotation: "Rotation") -> "CodecProfile":
        """This profile with the rotation's digest (the codec of pages built with it)."""
        d = dict(self.__dict__)
        d["rotation_digest"] = rotation.digest
        return CodecProfile(**d)

    @property
    def codec_id(self) -> bytes:
        """The 16-byte codec id (validates the profile)."""
        out = (ctypes.c_uint8 * 16)()
        check(_native.load().oscarkv_codec_id(ctypes.byref(self._to_c()), out))
        return bytes(out)

    def page_bytes(self, kind: PageKind) -> int:
        """Bytes of one page of `kind`, header included."""
        n = ctypes.c_uint64()
        check(_native.load().oscarkv_page_size(ctypes.byref(self._to_c()), int(kind),
                                               ctypes.byref(n)))
        return n.value

    def _to_c(self) -> _native.CodecProfileC:
        if len(self.rotation_digest) != 32:
            raise InvalidArgumentError("rotation_digest must be 32 bytes")
        c = _native.CodecProfileC()
        c.model_id = self.model_id.encode("utf-8")
        c.model_revision = self.model_revision.encode("utf-8")
        for name in ("num_layers", "num_kv_heads", "tp_rank", "tp_size", "head_dim",
                     "page_tokens", "group_size", "scale_dtype", "sink_tokens", "recent_tokens"):
            v = int(getattr(self, name))
            if not 0 <= v < 2**32:
                raise InvalidArgumentError("%s=%d is not a u32" % (name, v))
            setattr(c, name, v)
        ctypes.memmove(c.rotation_digest, self.rotation_digest, 32)
        return c

    @staticmethod
    def _from_c(c: _native.CodecProfileC) -> "CodecProfile":
        return CodecProfile(
            model_id=c.model_id.decode("utf-8"), model_revision=c.model_revision.decode("utf-8"),
            num_layers=c.num_layers, num_kv_heads=c.num_kv_heads, tp_rank=c.tp_rank,
            tp_size=c.tp_size, head_dim=c.head_dim, page_tokens=c.page_tokens,
            group_size=c.group_size, scale_dtype=c.scale_dtype, sink_tokens=c.sink_tokens,
            recent_tokens=c.recent_tokens, rotation_digest=bytes(c.rotation_digest))


@dataclass(frozen=True)
class Codec:
    """A codec registered with a daemon (Client.register_codec), or a local one
    (Codec.local(profile)) for block keys and pages without a daemon."""
    profile: CodecProfile
    id: bytes
    int2_page_bytes: int
    bf16_page_bytes: int
    rotation: Optional["Rotation"] = field(default=None, compare=False)

    @staticmethod
    def local(profile: Union[CodecProfile, str],
              rotation: Optional["Rotation"] = None) -> "Codec":
        """The codec of `profile` (a CodecProfile or a built-in shape name) computed here."""
        p = CodecProfile.builtin(profile) if isinstance(profile, str) else profile
        if rotation is not None:
            p = p.with_rotation(rotation)
        return Codec(p, p.codec_id, p.page_bytes(PageKind.INT2), p.page_bytes(PageKind.BF16),
                     rotation)

    @property
    def page_tokens(self) -> int:
        return self.profile.page_tokens

    def page_bytes(self, kind: PageKind) -> int:
        return self.int2_page_bytes if PageKind(kind) == PageKind.INT2 else self.bf16_page_bytes

    def block_keys(self, tokens: Any, tenant_salt: Union[bytes, str] = b"") -> List[bytes]:
        """Canonical chained keys of every full block of `tokens` (FORMAT.md §3)."""
        return block_keys(self, tokens, tenant_salt)

    def build_page(self, kind: PageKind, rows: Any, token_count: Optional[int] = None,
                   dtype: Optional[str] = None, rotated: bool = False) -> Any:
        """Page bytes from K/V rows; see :func:`build_page`. Uses this codec's rotation unless
        `rotated` says the rows already are."""
        return build_page(self.profile, kind, rows, token_count=token_count, dtype=dtype,
                          rotation=None if rotated else self.rotation)

    def decode_page(self, page: Buffer) -> Any:
        return decode_page(self.profile, page)

    def _to_c(self) -> _native.CodecC:
        c = _native.CodecC()
        ctypes.memmove(c.codec_id, self.id, 16)
        c.page_tokens = self.profile.page_tokens
        c.int2_page_bytes = self.int2_page_bytes
        c.bf16_page_bytes = self.bf16_page_bytes
        return c


def _tokens_u32(tokens: Any) -> Any:
    if have_numpy():
        import numpy as np
        if isinstance(tokens, np.ndarray):
            if tokens.dtype != np.uint32:
                if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**32):
                    raise InvalidArgumentError("token ids must be in [0, 2^32)")
                tokens = tokens.astype(np.uint32)
            return np.ascontiguousarray(tokens)
    if isinstance(tokens, array.array) and tokens.typecode == "I" and tokens.itemsize == 4:
        return tokens
    try:
        return array.array("I", tokens)
    except (OverflowError, TypeError) as e:
        raise InvalidArgumentError("token ids must be integers in [0, 2^32): %s" % e) from None


def block_keys(codec: Union[Codec, CodecProfile, str], tokens: Any,
               tenant_salt: Union[bytes, str] = b"") -> List[bytes]:
    """Canonical chained block keys (16 bytes each) of every full block of `tokens` (a
    sequence of ints, array('I') or a numpy integer array). A trailing partial block gets no
    key. `tenant_salt` isolates tenants (empty: a shared cache)."""
    if not isinstance(codec, Codec):
        codec = Codec.local(codec)
    toks = _tokens_u32(tokens)
    salt = tenant_salt.encode("utf-8") if isinstance(tenant_salt, str) else bytes(tenant_salt)
    addr, nbytes, keep = host_buffer(toks, writable=False, what="tokens")
    n_tokens = nbytes // 4
    max_keys = n_tokens // max(codec.page_tokens, 1)
    out = (ctypes.c_uint8 * (16 * max(max_keys, 1)))()
    n = ctypes.c_size_t()
    cc = codec._to_c()
    check(_native.load().oscarkv_block_keys(ctypes.byref(cc), salt, len(salt), addr, n_tokens,
                                            ctypes.addressof(out), max_keys, ctypes.byref(n)))
    del keep
    raw = bytes(out)
    return [raw[16 * i:16 * i + 16] for i in range(n.value)]


# ---- rotation sets ----

class Rotation:
    """The rotations and clip ratios of an INT2 OSCAR codec. Build with from_artifact(path) (what
    `oscarkv calibrate` writes) or from_arrays(...). Immutable; safe to share across threads."""

    def __init__(self, handle: int, layers: int, kv_heads: int, head_dim: int) -> None:
        self._handle: Optional[ctypes.c_void_p] = ctypes.c_void_p(handle)
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        d = (ctypes.c_uint8 * 32)()
        check(_native.load().oscarkv_rotation_digest(self._handle, d))
        self.digest: bytes = bytes(d)

    def __del__(self) -> None:
        h = getattr(self, "_handle", None)
        if h is not None and h.value and _native._lib is not None:
            _native._lib.oscarkv_rotation_free(h)
            self._handle = None

    @property
    def handle(self) -> Optional[ctypes.c_void_p]:
        return self._handle

    @staticmethod
    def from_arrays(layers: int, kv_heads: int, head_dim: int, matrices: Buffer, clips: Buffer,
                    range_modes: Optional[Buffer] = None) -> "Rotation":
        """matrices f32 [layers][2][kv_heads][d][d] (x' = x·R, each orthogonal), clips f32
        [layers][2][kv_heads] in (0, 1], range_modes u8 [layers][2][kv_heads] or None."""
        n = layers * 2 * kv_heads
        m_addr, m_bytes, mk = host_buffer(matrices, False, "matrices")
        c_addr, c_bytes, ck = host_buffer(clips, False, "clips")
        if m_bytes != n * head_dim * head_dim * 4 or c_bytes != n * 4:
            raise InvalidArgumentError(
                "matrices must be %d f32 and clips %d f32 for %d layers x 2 x %d heads, d=%d; "
                "got %d and %d bytes" % (n * head_dim * head_dim, n, layers, kv_heads, head_dim,
                                         m_bytes, c_bytes))
        r_addr = None
        rk = None
        if range_modes is not None:
            r_addr, r_bytes, rk = host_buffer(range_modes, False, "range_modes")
            if r_bytes != n:
                raise InvalidArgumentError("range_modes must be %d bytes, got %d" % (n, r_bytes))
        h = ctypes.c_void_p()
        check(_native.load().oscarkv_rotation_create(layers, kv_heads, head_dim, m_addr, c_addr,
                                                     r_addr, ctypes.byref(h)))
        del mk, ck, rk
        return Rotation(h.value or 0, layers, kv_heads, head_dim)

    @staticmethod
    def from_artifact(path: Union[str, os.PathLike]) -> "Rotation":
        """Reads a rotation artifact folder (or its rotations.safetensors) written by
        `oscarkv calibrate`; checks the digest recorded in rotations.json when present."""
        p = Path(path)
        tensors_path = p / "rotations.safetensors" if p.is_dir() else p
        tensors, _ = read_safetensors(tensors_path)
        try:
            k0 = tensors["layers.0.k_rotation"]
            kv_heads, head_dim = k0[1][0], k0[1][1]
            layers = tensors["k_clip"][1][0]
        except (KeyError, IndexError):
            raise InvalidArgumentError("%s is not an oscarkv rotation artifact (no "
                                       "layers.0.k_rotation / k_clip)" % tensors_path) from None
        mats, clips, modes = [], [], []
        has_modes = "k_range_mode" in tensors
        row = kv_heads * 4
        for l in range(layers):
            for kv in ("k", "v"):
                name = "layers.%d.%s_rotation" % (l, kv)
                dt, shape, data = tensors.get(name, ("", [], b""))
                if dt != "F32" or list(shape) != [kv_heads, head_dim, head_dim]:
                    raise InvalidArgumentError("%s: %s must be F32 [%d, %d, %d]"
                                               % (tensors_path, name, kv_heads, head_dim,
                                                  head_dim))
                mats.append(data)
                cdt, cshape, cdata = tensors["%s_clip" % kv]
                if cdt != "F32" or list(cshape) != [layers, kv_heads]:
                    raise InvalidArgumentError("%s: %s_clip must be F32 [%d, %d]"
                                               % (tensors_path, kv, layers, kv_heads))
                clips.append(cdata[l * row:(l + 1) * row])
                if has_modes:
                    mdt, mshape, mdata = tensors["%s_range_mode" % kv]
                    if mdt != "U8" or list(mshape) != [layers, kv_heads]:
                        raise InvalidArgumentError("%s: %s_range_mode must be U8 [%d, %d]"
                                                   % (tensors_path, kv, layers, kv_heads))
                    modes.append(mdata[l * kv_heads:(l + 1) * kv_heads])
        rot = Rotation.from_arrays(layers, kv_heads, head_dim, b"".join(mats), b"".join(clips),
                                   b"".join(modes) if has_modes else None)
        meta = tensors_path.parent / "rotations.json"
        if meta.is_file():
            recorded = json.loads(meta.read_text()).get("digest")
            if recorded and recorded != rot.digest.hex():
                raise InvalidArgumentError("%s records digest %s, its tensors digest to %s"
                                           % (meta, recorded, rot.digest.hex()))
        return rot


_ST_DTYPES = {"F32": 4, "U8": 1, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "F64": 8}


def read_safetensors(path: Union[str, os.PathLike]):
    """Minimal safetensors reader: {name: (dtype, shape, raw bytes)}, metadata dict."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise InvalidArgumentError("%s: not a safetensors file (too short)" % path)
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > len(data) - 8 or hlen > 100 << 20:
        raise InvalidArgumentError("%s: safetensors header length %d out of range" % (path, hlen))
    try:
        header = json.loads(data[8:8 + hlen])
    except ValueError as e:
        raise InvalidArgumentError("%s: bad safetensors header: %s" % (path, e)) from None
    base = 8 + hlen
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        n = 1
        for dim in t["shape"]:
            n *= dim
        if not (0 <= begin <= end <= len(data) - base) or \
                end - begin != n * _ST_DTYPES.get(t["dtype"], 0):
            raise InvalidArgumentError("%s: tensor %s has bad offsets or size" % (path, name))
        out[name] = (t["dtype"], t["shape"], data[base + begin:base + end])
    return out, meta


# ---- the page builder ----

_DTYPES = {"f32": 1, "float32": 1, "bf16": 2, "bfloat16": 2}


def _rows_dtype(rows: Any, dtype: Optional[str]) -> int:
    if dtype is not None:
        if dtype not in _DTYPES:
            raise InvalidArgumentError("dtype must be 'f32' or 'bf16', not %r" % dtype)
        return _DTYPES[dtype]
    name = str(getattr(rows, "dtype", "")).replace("torch.", "")
    if name in _DTYPES:
        return _DTYPES[name]
    raise InvalidArgumentError("pass dtype='f32' or 'bf16' for rows of dtype %r (bf16 rows in "
                               "numpy: a uint16 array with dtype='bf16')" % (name or type(rows)))


def build_page(profile: Union[CodecProfile, Codec], kind: PageKind, rows: Any,
               token_count: Optional[int] = None, dtype: Optional[str] = None,
               rotation: Optional[Rotation] = None, out: Optional[Buffer] = None) -> Any:
    """Encodes one page (header, payload, checksum) from K/V rows.

    rows: [num_layers, 2 (K, V), token_count, num_kv_heads, head_dim], f32 or bf16 (a numpy
    float32 array, a torch float32/bfloat16 CPU tensor, or raw memory with `dtype` and
    `token_count`). rotation None: rows are already rotated (INT2 rows then unclipped).
    Returns a new uint8 array (or writes `out`, which must be exactly the page size).
    """
    if isinstance(profile, Codec):
        if rotation is None:
            rotation = profile.rotation
        profile = profile.profile
    kind = PageKind(kind)
    code = _rows_dtype(rows, dtype)
    per_token = profile.num_layers * 2 * profile.num_kv_heads * profile.head_dim
    shape = getattr(rows, "shape", None)
    if shape is not None and len(shape) == 5:
        want = (profile.num_layers, 2, shape[2], profile.num_kv_heads, profile.head_dim)
        if tuple(shape) != want:
            raise InvalidArgumentError("rows have shape %s, the profile needs %s"
                                       % (tuple(shape), want))
        if token_count is None:
            token_count = int(shape[2])
    addr, nbytes, keep = host_buffer(rows, False, "rows")
    elem = 4 if code == 1 else 2
    if token_count is None:
        token_count = nbytes // (per_token * elem)
    if nbytes != token_count * per_token * elem:
        raise InvalidArgumentError("rows hold %d bytes; %d tokens need %d"
                                   % (nbytes, token_count, token_count * per_token * elem))
    size = profile.page_bytes(kind)
    if out is None:
        out = new_bytes(size)
    o_addr, o_bytes, okeep = host_buffer(out, True, "out")
    check(_native.load().oscarkv_build_page(
        ctypes.byref(profile._to_c()), rotation.handle if rotation is not None else None,
        int(kind), code, addr, token_count, o_addr, o_bytes))
    del keep, okeep
    return out


def decode_page(profile: Union[CodecProfile, Codec], page: Buffer) -> Any:
    """Checks a page (header, codec id, checksum: DataLossError on mismatch) and dequantizes it
    into f32 rows [num_layers, 2, token_count, num_kv_heads, head_dim] (rotated space); a numpy
    array when numpy is present, else a flat array('f')."""
    if isinstance(profile, Codec):
        profile = profile.profile
    p = profile
    cap = p.num_layers * 2 * p.page_tokens * p.num_kv_heads * p.head_dim
    rows: Any
    if have_numpy():
        import numpy as np
        rows = np.empty(cap, dtype=np.float32)
    else:
        rows = array.array("f", bytes(cap * 4))
    r_addr, _, rkeep = host_buffer(rows, True, "rows")
    addr, nbytes, keep = host_buffer(page, False, "page")
    tc = ctypes.c_uint32()
    kind = ctypes.c_int()
    check(_native.load().oscarkv_decode_page(ctypes.byref(p._to_c()), addr, nbytes, r_addr, cap,
                                             ctypes.byref(tc), ctypes.byref(kind)))
    del keep, rkeep
    n = p.num_layers * 2 * tc.value * p.num_kv_heads * p.head_dim
    if have_numpy():
        return rows[:n].reshape(p.num_layers, 2, tc.value, p.num_kv_heads, p.head_dim)
    return rows[:n]
