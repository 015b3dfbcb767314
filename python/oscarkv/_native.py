"""Finds and loads liboscarkv_c.so and declares the C ABI (client/include/oscarkv/client/oscarkv_c.h).

The package never compiles against gRPC: every call goes through this shared library with
ctypes, which releases the GIL for the duration of each foreign call.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path
from typing import List, Optional

ABI_VERSION = 4
LIBRARY_NAME = "liboscarkv_c.so"

c_u8p = ctypes.POINTER(ctypes.c_uint8)
c_u32p = ctypes.POINTER(ctypes.c_uint32)
c_u64p = ctypes.POINTER(ctypes.c_uint64)
c_intp = ctypes.POINTER(ctypes.c_int)
c_sizep = ctypes.POINTER(ctypes.c_size_t)


class ConnectOptionsC(ctypes.Structure):
    _fields_ = [("address", ctypes.c_char_p), ("client_name", ctypes.c_char_p),
                ("data_path", ctypes.c_int), ("verify_checksums", ctypes.c_int),
                ("rpc_timeout_ms", ctypes.c_int64), ("lookup_path", ctypes.c_int)]


class TlsOptionsC(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("ca_file", ctypes.c_char_p),
                ("cert_file", ctypes.c_char_p), ("key_file", ctypes.c_char_p),
                ("server_name", ctypes.c_char_p), ("shared_namespace", ctypes.c_char_p)]


class CodecProfileC(ctypes.Structure):
    _fields_ = [("model_id", ctypes.c_char_p), ("model_revision", ctypes.c_char_p)] + [
        (n, ctypes.c_uint32) for n in (
            "num_layers", "num_kv_heads", "tp_rank", "tp_size", "head_dim", "page_tokens",
            "group_size", "scale_dtype", "sink_tokens", "recent_tokens")] + [
        ("rotation_digest", ctypes.c_uint8 * 32)]


class CodecC(ctypes.Structure):
    _fields_ = [("codec_id", ctypes.c_uint8 * 16), ("page_tokens", ctypes.c_uint32),
                ("int2_page_bytes", ctypes.c_uint64), ("bf16_page_bytes", ctypes.c_uint64)]


class PageC(ctypes.Structure):
    _fields_ = [("key", ctypes.c_void_p), ("kind", ctypes.c_int), ("data", ctypes.c_void_p),
                ("bytes", ctypes.c_size_t)]


class StoreResultC(ctypes.Structure):
    _fields_ = [("stored", ctypes.c_uint32), ("deduplicated", ctypes.c_uint32),
                ("failed", ctypes.c_uint32), ("first_error", ctypes.c_int)]


STATS_FIELDS = ("pool_bytes", "pool_used_bytes", "pages", "pinned_pages", "leases", "lookups",
                "hits", "misses", "evictions")


class StatsC(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in STATS_FIELDS]


class LibraryNotFoundError(ImportError):
    """liboscarkv_c.so could not be found or loaded; the message says where it looked."""


def candidate_paths() -> List[Path]:
    """Where the library is looked for, in order (OSCARKV_LIBRARY first)."""
    here = Path(__file__).resolve().parent
    out: List[Path] = [here / "_lib" / LIBRARY_NAME]
    build_dir = os.environ.get("OSCARKV_BUILD_DIR")
    if build_dir:
        out.append(Path(build_dir) / "client" / LIBRARY_NAME)
    if (here.parent / "pyproject.toml").is_file():
        # Imported from a source checkout (python/oscarkv): the repository's default build dir.
        out.append(here.parent.parent / "build" / "client" / LIBRARY_NAME)
    for prefix in ("/usr/local/lib", "/usr/local/lib64", "/usr/lib/x86_64-linux-gnu",
                   "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/lib64"):
        out.append(Path(prefix) / LIBRARY_NAME)
    return out


def _declare(lib: ctypes.CDLL) -> None:
    P = ctypes.POINTER
    v, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "oscarkv_last_error": (ctypes.c_char_p, []),
        "oscarkv_status_name": (ctypes.c_char_p, [i]),
        "oscarkv_abi_version": (i, []),
        "oscarkv_connect_options_init": (None, [P(ConnectOptionsC)]),
        "oscarkv_connect": (i, [P(ConnectOptionsC), P(v)]),
        "oscarkv_tls_options_init": (None, [P(TlsOptionsC)]),
        "oscarkv_connect_tls": (i, [P(ConnectOptionsC), P(TlsOptionsC), P(v)]),
        "oscarkv_close": (None, [v]),
        "oscarkv_uses_shm": (i, [v]),
        "oscarkv_uses_local_lookups": (i, [v]),
        "oscarkv_register_codec": (i, [v, P(CodecProfileC), P(CodecC)]),
        "oscarkv_unregister_codec": (i, [v, P(CodecC), i, c_u64p]),
        "oscarkv_builtin_profile": (i, [ctypes.c_char_p, P(CodecProfileC)]),
        "oscarkv_codec_id": (i, [P(CodecProfileC), c_u8p]),
        "oscarkv_page_size": (i, [P(CodecProfileC), i, c_u64p]),
        "oscarkv_block_keys": (i, [P(CodecC), ctypes.c_char_p, sz, v, sz, v, sz, c_sizep]),
        "oscarkv_rotation_create": (i, [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, v, v,
                                        v, P(v)]),
        "oscarkv_rotation_free": (None, [v]),
        "oscarkv_rotation_digest": (i, [v, c_u8p]),
        "oscarkv_build_page": (i, [P(CodecProfileC), v, i, i, v, ctypes.c_uint32, v, sz]),
        "oscarkv_decode_page": (i, [P(CodecProfileC), v, sz, v, sz, c_u32p, c_intp]),
        "oscarkv_lookup": (i, [v, P(CodecC), v, sz, c_u32p]),
        "oscarkv_exists": (i, [v, P(CodecC), v, sz, v]),
        "oscarkv_lookup_pinned": (i, [v, P(CodecC), v, sz, ctypes.c_uint32, c_u32p, P(v)]),
        "oscarkv_lease_deadline_ms": (ctypes.c_uint64, [v]),
        "oscarkv_release": (i, [v, v]),
        "oscarkv_store": (i, [v, P(CodecC), P(PageC), sz, P(StoreResultC), c_intp]),
        "oscarkv_delete": (i, [v, P(CodecC), v, sz, c_intp, c_u32p]),
        "oscarkv_load": (i, [v, P(CodecC), v, sz, P(v), c_sizep, c_u32p, c_u64p]),
        "oscarkv_stats_get": (i, [v, P(StatsC)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_path: Optional[str] = None


def _try_load(path: str, tried: List[str]) -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        tried.append("%s (%s)" % (path, e))
        return None


def load() -> ctypes.CDLL:
    """Loads the library once per process; raises LibraryNotFoundError saying how to fix it."""
    global _lib, _path
    with _lock:
        if _lib is not None:
            return _lib
        tried: List[str] = []
        lib = None
        env = os.environ.get("OSCARKV_LIBRARY")
        if env:
            lib = _try_load(env, tried)
            if lib is None:
                raise LibraryNotFoundError(
                    "OSCARKV_LIBRARY=%s could not be loaded: %s" % (env, tried[-1]))
            path = env
        else:
            path = ""
            for p in candidate_paths():
                if p.is_file():
                    lib = _try_load(str(p), tried)
                    if lib is not None:
                        path = str(p)
                        break
                else:
                    tried.append("%s (absent)" % p)
            if lib is None:
                found = ctypes.util.find_library("oscarkv_c")
                if found:
                    lib = _try_load(found, tried)
                    path = found
        if lib is None:
            raise LibraryNotFoundError(
                "liboscarkv_c.so not found. Build it (cmake --build build --target oscarkv_c: "
                "build/client/liboscarkv_c.so) and set OSCARKV_LIBRARY=/path/to/liboscarkv_c.so, "
                "or OSCARKV_BUILD_DIR=/path/to/build, or install it (cmake --install build "
                "--component client), or reinstall the package with OSCARKV_LIBRARY set so pip "
                "copies it into the package. Tried:\n  " + "\n  ".join(tried))
        try:
            _declare(lib)
        except AttributeError as e:
            raise LibraryNotFoundError("%s is not a liboscarkv_c.so of this version: %s"
                                       % (path, e)) from None
        got = lib.oscarkv_abi_version()
        if got != ABI_VERSION:
            raise LibraryNotFoundError("%s has C ABI version %d, this package needs %d: rebuild "
                                       "the library or reinstall the package" % (path, got,
                                                                                 ABI_VERSION))
        _lib, _path = lib, path
        return lib


def library_path() -> str:
    """The path of the loaded liboscarkv_c.so (loads it if needed)."""
    load()
    assert _path is not None
    return _path
