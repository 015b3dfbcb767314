"""oscarkv: the Python client of the oscarkv KV-cache service (INT2 OSCAR-compressed pages).

    import oscarkv
    client = oscarkv.connect("127.0.0.1:50051")
    codec = client.register_codec("qwen3-8b")
    keys = codec.block_keys(token_ids)
    client.store(codec, [(k, oscarkv.PageKind.INT2, page) for k, page in zip(keys, pages)])
    n = client.load_into(codec, keys, buffers)

Everything goes through liboscarkv_c.so (the C ABI) by ctypes: found via OSCARKV_LIBRARY, then
inside this package, then OSCARKV_BUILD_DIR / the source tree's build/, then the install prefix.
"""
from ._native import LibraryNotFoundError, library_path
from .client import Client, ConnectOptions, Lease, Stats, StoreResult, connect
from .codec import (Codec, CodecProfile, PageKind, Rotation, block_keys, build_page,
                    decode_page, read_safetensors)
from .errors import (AbortedError, AlreadyExistsError, CancelledError, DataLossError,
                     DeadlineExceededError, FailedPreconditionError, InternalError,
                     InvalidArgumentError, NotFoundError, OscarkvError, OutOfRangeError,
                     PermissionDeniedError, ResourceExhaustedError, StatusCode,
                     UnavailableError, UnimplementedError, UnknownError, error_class)

__version__ = "0.1.0"

__all__ = [
    "AbortedError", "AlreadyExistsError", "CancelledError", "Client", "Codec", "CodecProfile",
    "ConnectOptions", "DataLossError", "DeadlineExceededError", "FailedPreconditionError",
    "InternalError", "InvalidArgumentError", "Lease", "LibraryNotFoundError", "NotFoundError",
    "OscarkvError", "OutOfRangeError", "PageKind", "PermissionDeniedError",
    "ResourceExhaustedError", "Rotation", "Stats", "StatusCode", "StoreResult",
    "UnavailableError", "UnimplementedError", "UnknownError", "block_keys", "build_page",
    "connect", "decode_page", "error_class", "library_path", "read_safetensors",
]
