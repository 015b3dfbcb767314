"""Host memory of caller objects as (address, nbytes) for the C ABI, without copies.

Accepted: objects with the buffer protocol (bytes, bytearray, memoryview, array.array, mmap,
numpy arrays), torch CPU tensors (data_ptr), and any host object exporting ``__dlpack__``
(through numpy.from_dlpack). Memory must be C-contiguous; writable for destinations.
"""
from __future__ import annotations

import ctypes
from typing import Any, Tuple

from .errors import InvalidArgumentError

_np: Any
try:  # numpy is optional: the CI path, and the only way to read non-bytes read-only buffers
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only where numpy is absent
    _np = None


def _torch_like(obj: Any) -> bool:
    return hasattr(obj, "data_ptr") and hasattr(obj, "element_size") and hasattr(obj, "is_cuda")


def host_buffer(obj: Any, writable: bool, what: str = "buffer") -> Tuple[int, int, Any]:
    """Returns (address, nbytes, keepalive) of obj's memory. Keep `keepalive` referenced until
    the C call that uses the address has returned."""
    if isinstance(obj, bytes):
        if writable:
            raise InvalidArgumentError("%s: bytes are read-only; pass a bytearray or an array"
                                       % what)
        return ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value or 0, len(obj), obj
    if _torch_like(obj):
        if obj.is_cuda:
            raise InvalidArgumentError("%s: a CUDA tensor; pass a host (or pinned) tensor" % what)
        if not obj.is_contiguous():
            raise InvalidArgumentError("%s: the tensor is not contiguous" % what)
        return int(obj.data_ptr()), int(obj.numel() * obj.element_size()), obj
    if _np is not None and isinstance(obj, _np.ndarray):
        return _numpy_buffer(obj, writable, what)
    try:
        mv = memoryview(obj)
    except TypeError:
        if hasattr(obj, "__dlpack__"):
            if _np is None:
                raise InvalidArgumentError("%s: a DLPack object needs numpy to be read" % what)
            try:
                arr = _np.from_dlpack(obj)
            except (RuntimeError, BufferError, TypeError) as e:
                raise InvalidArgumentError("%s: not host memory via DLPack (%s)" % (what, e))
            return _numpy_buffer(arr, writable, what, keep=obj)
        raise InvalidArgumentError("%s: %s has neither the buffer protocol nor __dlpack__"
                                   % (what, type(obj).__name__)) from None
    if not mv.c_contiguous:
        raise InvalidArgumentError("%s: memory is not C-contiguous" % what)
    if mv.nbytes == 0:
        return 0, 0, mv
    if not mv.readonly:
        raw = (ctypes.c_char * mv.nbytes).from_buffer(mv.cast("B"))
        return ctypes.addressof(raw), mv.nbytes, (raw, mv, obj)
    if writable:
        raise InvalidArgumentError("%s: memory is read-only" % what)
    if _np is not None:
        arr = _np.frombuffer(mv, dtype=_np.uint8)
        return int(arr.ctypes.data), mv.nbytes, (arr, mv, obj)
    copy = bytes(mv)  # read-only and no numpy: one copy (documented)
    return ctypes.cast(ctypes.c_char_p(copy), ctypes.c_void_p).value or 0, len(copy), copy


def _numpy_buffer(arr: Any, writable: bool, what: str, keep: Any = None) -> Tuple[int, int, Any]:
    if not arr.flags.c_contiguous:
        raise InvalidArgumentError("%s: the array is not C-contiguous" % what)
    if writable and not arr.flags.writeable:
        raise InvalidArgumentError("%s: the array is read-only" % what)
    return int(arr.ctypes.data), int(arr.nbytes), (arr, keep)


def new_bytes(n: int) -> Any:
    """A fresh (uninitialised) host buffer: a numpy uint8 array when numpy is present, else a
    bytearray."""
    if _np is not None:
        return _np.empty(n, dtype=_np.uint8)
    return bytearray(n)


def have_numpy() -> bool:
    return _np is not None
