"""ctypes binding of liboscarkv_cuda_c.so (kernels/cuda/capi/include/oscarkv/cuda/oscarkv_cuda_c.h).

The library is looked up, in order: $OSCARKV_CUDA_LIBRARY, the package's _lib/ folder (bundled
by `pip install ./python` with OSCARKV_BUILD_DIR set), $OSCARKV_BUILD_DIR/kernels/cuda/capi/,
build/kernels/cuda/capi/ of the source tree, then the dynamic linker's path."""
import ctypes
import os
import threading
from pathlib import Path
from typing import List, Optional

from .. import errors
from .._native import LibraryNotFoundError

c_u8p = ctypes.POINTER(ctypes.c_uint8)
c_vp = ctypes.c_void_p


class Profile(ctypes.Structure):
    _fields_ = [("model_id", ctypes.c_char * 128), ("model_revision", ctypes.c_char * 64),
                ("num_layers", ctypes.c_uint32), ("num_kv_heads", ctypes.c_uint32),
                ("tp_rank", ctypes.c_uint32), ("tp_size", ctypes.c_uint32),
                ("head_dim", ctypes.c_uint32), ("page_tokens", ctypes.c_uint32),
                ("group_size", ctypes.c_uint32), ("sink_tokens", ctypes.c_uint32),
                ("recent_tokens", ctypes.c_uint32), ("rotation_digest", ctypes.c_uint8 * 32)]


class Write(ctypes.Structure):
    _fields_ = [("num_layers", ctypes.c_uint32), ("num_kv_heads", ctypes.c_uint32),
                ("head_dim", ctypes.c_uint32), ("group_size", ctypes.c_uint32),
                ("page_tokens", ctypes.c_uint32), ("first_layer", ctypes.c_uint32),
                ("layer_count", ctypes.c_uint32), ("k_src", c_vp), ("v_src", c_vp),
                ("src_layer_stride", ctypes.c_int64), ("src_token_stride", ctypes.c_int64),
                ("src_head_stride", ctypes.c_int64), ("num_tokens", ctypes.c_int32),
                ("page_ptrs", c_vp), ("page_kinds", c_vp), ("dst_page", c_vp), ("dst_slot", c_vp),
                ("rot_fragments", c_vp), ("clips", c_vp), ("range_modes", c_vp),
                ("range_mode", ctypes.c_uint8), ("range_modes_fixed_only", ctypes.c_uint8)]


class Shape(ctypes.Structure):
    _fields_ = [("num_layers", ctypes.c_uint32), ("num_kv_heads", ctypes.c_uint32),
                ("num_q_heads", ctypes.c_uint32), ("head_dim", ctypes.c_uint32),
                ("group_size", ctypes.c_uint32), ("page_tokens", ctypes.c_uint32)]


class Table(ctypes.Structure):
    _fields_ = [("page_ptrs", c_vp), ("page_kinds", c_vp), ("page_token_counts", c_vp),
                ("seq_page_indptr", c_vp), ("seq_page_ids", c_vp), ("num_seqs", ctypes.c_int32)]


class AttnIO(ctypes.Structure):
    _fields_ = [("q", c_vp), ("rot_k", c_vp), ("rot_v", c_vp), ("unrotate_output", ctypes.c_int32),
                ("softmax_scale", ctypes.c_float), ("out", c_vp), ("lse", c_vp)]


class RefRotations(ctypes.Structure):
    _fields_ = [("matrices", c_vp), ("clips", c_vp), ("range_modes", c_vp)]


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_NAME = "liboscarkv_cuda_c.so"


def candidates() -> List[str]:
    out = []
    if os.environ.get("OSCARKV_CUDA_LIBRARY"):
        out.append(os.environ["OSCARKV_CUDA_LIBRARY"])
    pkg = Path(__file__).resolve().parent.parent
    out.append(str(pkg / "_lib" / _NAME))
    if os.environ.get("OSCARKV_BUILD_DIR"):
        out.append(str(Path(os.environ["OSCARKV_BUILD_DIR"]) / "kernels" / "cuda" / "capi" / _NAME))
    out.append(str(pkg.parent.parent / "build" / "kernels" / "cuda" / "capi" / _NAME))
    out.append(_NAME)
    return out


def _declare(lib: ctypes.CDLL) -> None:
    i32, u32, f32 = ctypes.c_int32, ctypes.c_uint32, ctypes.c_float
    P = ctypes.POINTER
    sig = {
        "oscarkv_cuda_abi_version": ([], ctypes.c_int),
        "oscarkv_cuda_last_error": ([], ctypes.c_char_p),
        "oscarkv_cuda_device_count": ([], ctypes.c_int),
        "oscarkv_cuda_page_bytes": ([P(Profile), ctypes.c_int, P(ctypes.c_uint64)], ctypes.c_int),
        "oscarkv_cuda_codec_id": ([P(Profile), c_vp], ctypes.c_int),
        "oscarkv_cuda_finish_page": ([P(Profile), ctypes.c_int, u32, c_vp, ctypes.c_uint64],
                                     ctypes.c_int),
        "oscarkv_cuda_builtin_rotations": ([ctypes.c_int, u32, u32, u32, c_vp], ctypes.c_int),
        "oscarkv_cuda_rotation_digest": ([u32, u32, u32, c_vp, c_vp, c_vp, c_vp], ctypes.c_int),
        "oscarkv_cuda_rotation_fragment_bytes": ([], ctypes.c_size_t),
        "oscarkv_cuda_prepare_rotations": ([c_vp, ctypes.c_int, c_vp, c_vp], ctypes.c_int),
        "oscarkv_cuda_quantize_write": ([P(Write), c_vp], ctypes.c_int),
        "oscarkv_cuda_decoder_create": ([P(Shape), i32, i32, P(c_vp)], ctypes.c_int),
        "oscarkv_cuda_decoder_update": ([c_vp, c_vp, i32, c_vp, i32, c_vp, i32, c_vp],
                                        ctypes.c_int),
        "oscarkv_cuda_decoder_run": ([c_vp, u32, P(Table), P(AttnIO), c_vp], ctypes.c_int),
        "oscarkv_cuda_decoder_destroy": ([c_vp], None),
        "oscarkv_cuda_extend_plan_create": ([P(Shape), i32, i32, P(c_vp)], ctypes.c_int),
        "oscarkv_cuda_extend_run": ([c_vp, u32, P(Table), c_vp, i32, c_vp, c_vp, P(AttnIO), c_vp],
                                    ctypes.c_int),
        "oscarkv_cuda_extend_plan_destroy": ([c_vp], None),
        "oscarkv_cuda_reference_quantize_write": ([P(Write), P(RefRotations)], ctypes.c_int),
        "oscarkv_cuda_reference_decode": (
            [P(Profile), P(RefRotations), c_vp, c_vp, i32, c_vp, i32, c_vp, u32, c_vp, u32,
             ctypes.c_int, f32, c_vp, c_vp], ctypes.c_int),
        "oscarkv_cuda_reference_extend": (
            [P(Profile), P(RefRotations), c_vp, c_vp, i32, c_vp, i32, c_vp, u32, c_vp, c_vp,
             c_vp, c_vp, u32, ctypes.c_int, f32, c_vp, c_vp], ctypes.c_int),
    }
    for name, (args, res) in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res


def load() -> ctypes.CDLL:
    """The loaded library; raises oscarkv.LibraryNotFoundError listing every path tried."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidates():
            if os.sep in path and not os.path.isfile(path):
                tried.append(path + " (absent)")
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
                continue
            _declare(lib)
            if lib.oscarkv_cuda_abi_version() != 1:
                tried.append(path + " (ABI version %d, want 1)" % lib.oscarkv_cuda_abi_version())
                continue
            _lib = lib
            return lib
        raise LibraryNotFoundError(
            "liboscarkv_cuda_c.so not found; build it (cmake --build build --target "
            "oscarkv_cuda_c) and set OSCARKV_CUDA_LIBRARY or OSCARKV_BUILD_DIR. Tried: "
            + "; ".join(tried))


def check(code: int) -> None:
    """Raises the oscarkv exception of a non-zero status code with the library's message."""
    if code != 0:
        msg = load().oscarkv_cuda_last_error().decode("utf-8", "replace")
        raise errors.make_error(code, msg)
