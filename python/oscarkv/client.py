"""The daemon client: connect, register codecs, store / lookup / load / release / delete / exists.

A :class:`Client` wraps one C ABI handle (liboscarkv_c.so). Every method may be called from many
threads at once; ctypes drops the GIL during each call, so threads overlap their I/O. The
``*_async`` methods are coroutines that run the same call on the client's thread pool
(``loop.run_in_executor``), so an asyncio engine never blocks its event loop.

Pages go in as any host buffer (bytes, bytearray, numpy arrays, torch CPU tensors, DLPack host
objects) and come out into caller memory: ``load_into`` writes straight into the given buffers
(no intermediate copy), ``load`` allocates fresh numpy arrays (bytearrays without numpy).
"""
from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, TypeVar, Union

from . import _native
from ._buffers import host_buffer, new_bytes
from .codec import Codec, CodecProfile, PageKind, Rotation, check
from .errors import (FailedPreconditionError, InvalidArgumentError, OscarkvError, StatusCode,
                     make_error)

T = TypeVar("T")
Buffer = Any
Keys = Union[Sequence[bytes], bytes, Any]

_DATA_PATHS = {"auto": 0, "shm": 1, "grpc": 2}
_LOOKUP_PATHS = {"auto": 0, "local": 1, "grpc": 2}


@dataclass
class ConnectOptions:
    """How to reach the daemon.

    address: "HOST:PORT" or "unix:/path". data_path: "auto" (shared memory when the daemon's
    pool is mapped on this host, else gRPC), "shm" or "grpc". lookup_path: "auto" (the daemon's
    local control socket when on this host), "local" or "grpc". verify_checksums: verify every
    loaded page's checksum (DataLossError on mismatch). rpc_timeout_ms: deadline of each RPC
    and of connect. threads: workers of the *_async methods.

    gRPC over TLS (a daemon started with --tls-cert): tls_ca is the CA bundle (PEM file) the
    daemon's certificate must chain to ("" = plaintext); tls_cert and tls_key (PEM files, both or
    neither) the client certificate a daemon with --tls-client-ca requires; tls_server_name the
    name checked against the daemon's certificate ("" = the address's host). A refused or
    unverifiable certificate raises UnavailableError; a missing file NotFoundError.

    shared_namespace: a shared namespace of the daemon's config (``shared_namespaces:``) that
    this client's tenant (its certificate) is a member of; stores and lookups then use that
    namespace, whose pages every member tenant sees ("" = the tenant's own). A non-member or an
    unknown name raises PermissionDeniedError at connect; lookups go over gRPC (lookup_path
    "local" raises InvalidArgumentError).
    """
    address: str = "127.0.0.1:50051"
    client_name: str = "oscarkv-python"
    data_path: str = "auto"
    lookup_path: str = "auto"
    verify_checksums: bool = True
    rpc_timeout_ms: int = 10000
    threads: int = 4
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_server_name: str = ""
    shared_namespace: str = ""


@dataclass
class StoreResult:
    """Outcome of a store: counts and one status code per page (StatusCode.OK = stored,
    ALREADY_EXISTS = deduplicated, anything else = not stored)."""
    stored: int
    deduplicated: int
    failed: int
    page_codes: List[int] = field(default_factory=list)


@dataclass
class Stats:
    pool_bytes: int
    pool_used_bytes: int
    pages: int
    pinned_pages: int
    leases: int
    lookups: int
    hits: int
    misses: int
    evictions: int


class Lease:
    """Pins of a pinned lookup: the matched pages stay cached until release() or the deadline.
    A context manager (releases on exit)."""

    def __init__(self, client: "Client", handle: int, matched: int) -> None:
        self._client = client
        self._handle: Optional[int] = handle
        self.matched = matched
        self.deadline_unix_ms: int = int(_native.load().oscarkv_lease_deadline_ms(handle))

    @property
    def released(self) -> bool:
        return self._handle is None

    def release(self) -> None:
        """Releases the pins (idempotent)."""
        h, self._handle = self._handle, None
        if h is not None:
            self._client._release_handle(h)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # the client may be closed; the lease then expires on the daemon
            pass


def _keys_bytes(keys: Keys) -> Tuple[bytes, int]:
    if isinstance(keys, (bytes, bytearray, memoryview)):
        raw = bytes(keys)
    elif hasattr(keys, "tobytes") and getattr(keys, "dtype", None) is not None:
        raw = keys.tobytes()  # a numpy uint8 [n, 16] array
    else:
        parts = list(keys)
        for i, k in enumerate(parts):
            if not isinstance(k, (bytes, bytearray)) or len(k) != 16:
                raise InvalidArgumentError("key %d is not 16 bytes" % i)
        raw = b"".join(bytes(k) for k in parts)
    if len(raw) % 16:
        raise InvalidArgumentError("keys must be 16 bytes each (got %d bytes)" % len(raw))
    return raw, len(raw) // 16


def _page_tuple(p: Any, i: int) -> Tuple[bytes, PageKind, Any]:
    try:
        key, kind, data = p
    except (TypeError, ValueError):
        raise InvalidArgumentError("page %d must be (key, kind, buffer)" % i) from None
    if not isinstance(key, (bytes, bytearray)) or len(key) != 16:
        raise InvalidArgumentError("page %d: key is not 16 bytes" % i)
    try:
        return bytes(key), PageKind(kind), data
    except ValueError:
        raise InvalidArgumentError("page %d: kind %r is not PageKind.INT2/BF16" % (i, kind)) \
            from None


class Client:
    """A connection to one oscarkvd. Create with :func:`connect`; close with close() or use it
    as a context manager. Thread-safe."""

    def __init__(self, options: ConnectOptions) -> None:
        if options.data_path not in _DATA_PATHS:
            raise InvalidArgumentError("data_path must be one of %s" % sorted(_DATA_PATHS))
        if options.lookup_path not in _LOOKUP_PATHS:
            raise InvalidArgumentError("lookup_path must be one of %s" % sorted(_LOOKUP_PATHS))
        lib = _native.load()
        o = _native.ConnectOptionsC()
        lib.oscarkv_connect_options_init(ctypes.byref(o))
        o.address = options.address.encode()
        o.client_name = options.client_name.encode()
        o.data_path = _DATA_PATHS[options.data_path]
        o.lookup_path = _LOOKUP_PATHS[options.lookup_path]
        o.verify_checksums = 1 if options.verify_checksums else 0
        o.rpc_timeout_ms = int(options.rpc_timeout_ms)
        tls = _native.TlsOptionsC()
        lib.oscarkv_tls_options_init(ctypes.byref(tls))
        tls_fields = {"ca_file": options.tls_ca, "cert_file": options.tls_cert,
                      "key_file": options.tls_key, "server_name": options.tls_server_name}
        for name, value in tls_fields.items():
            if value:
                setattr(tls, name, os.fsencode(value))
        if options.shared_namespace:
            tls.shared_namespace = options.shared_namespace.encode()
        h = ctypes.c_void_p()
        check(lib.oscarkv_connect_tls(ctypes.byref(o), ctypes.byref(tls), ctypes.byref(h)))
        self.options = options
        self._lib = lib
        self._h: Optional[int] = h.value
        self._cv = threading.Condition()
        self._inflight = 0
        self._executor: Optional[ThreadPoolExecutor] = None
        self._executor_lock = threading.Lock()

    # ---- lifecycle ----

    def close(self) -> None:
        """Waits for calls in flight, then closes the connection (idempotent). Leases still held
        expire on the daemon."""
        with self._cv:
            h, self._h = self._h, None
            while self._inflight:
                self._cv.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if h:
            self._lib.oscarkv_close(h)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None):
            self.close()

    def _call(self, fn: Callable[[int], T]) -> T:
        with self._cv:
            if not self._h:
                raise make_error(StatusCode.FAILED_PRECONDITION, "the client is closed")
            self._inflight += 1
            h = self._h
        try:
            return fn(h)
        finally:
            with self._cv:
                self._inflight -= 1
                if not self._inflight:
                    self._cv.notify_all()

    @property
    def uses_shared_memory(self) -> bool:
        """True when pages move through the daemon's shared-memory pool (same host)."""
        return bool(self._call(self._lib.oscarkv_uses_shm))

    @property
    def uses_local_lookups(self) -> bool:
        return bool(self._call(self._lib.oscarkv_uses_local_lookups))

    # ---- codecs ----

    def register_codec(self, profile: Union[CodecProfile, str],
                       rotation: Union[Rotation, str, os.PathLike, None] = None) -> Codec:
        """Registers (idempotently) a codec with the daemon. `profile`: a CodecProfile or a
        built-in shape ("qwen3-8b", "refmodel"). `rotation`: a Rotation or the path of a
        rotation artifact; its digest goes into the profile, and Codec.build_page uses it."""
        p = CodecProfile.builtin(profile) if isinstance(profile, str) else profile
        rot = None
        if rotation is not None:
            rot = rotation if isinstance(rotation, Rotation) else Rotation.from_artifact(rotation)
            p = p.with_rotation(rot)
        cp = p._to_c()
        out = _native.CodecC()
        self._call(lambda h: check(self._lib.oscarkv_register_codec(h, ctypes.byref(cp),
                                                                    ctypes.byref(out))))
        return Codec(p, bytes(out.codec_id), out.int2_page_bytes, out.bf16_page_bytes, rot)

    def unregister_codec(self, codec: Codec, drop_pages: bool = False) -> int:
        """Removes this tenant's registration of `codec` from the daemon, freeing its codec
        slot and quota (it no longer comes back after a restart). Raises FailedPreconditionError
        while the codec holds pages or transfer handles, unless `drop_pages` (then they are
        deleted first); NotFoundError when not registered (also a second call). Returns the pages
        removed."""
        cc = codec._to_c()
        removed = ctypes.c_uint64()
        self._call(lambda h: check(self._lib.oscarkv_unregister_codec(
            h, ctypes.byref(cc), 1 if drop_pages else 0, ctypes.byref(removed))))
        return removed.value

    # ---- lookups ----

    def lookup(self, codec: Codec, keys: Keys) -> int:
        """Length of the longest cached prefix of `keys` (nothing pinned)."""
        raw, n = _keys_bytes(keys)
        cc = codec._to_c()
        m = ctypes.c_uint32()
        self._call(lambda h: check(self._lib.oscarkv_lookup(h, ctypes.byref(cc), raw, n,
                                                            ctypes.byref(m))))
        return m.value

    def lookup_pinned(self, codec: Codec, keys: Keys, lease_ms: int = 0) -> Lease:
        """The longest cached prefix, pinned under a lease (release() it, or use `with`).
        lease_ms 0: the daemon's default."""
        raw, n = _keys_bytes(keys)
        cc = codec._to_c()
        m = ctypes.c_uint32()
        lease = ctypes.c_void_p()
        self._call(lambda h: check(self._lib.oscarkv_lookup_pinned(
            h, ctypes.byref(cc), raw, n, int(lease_ms), ctypes.byref(m), ctypes.byref(lease))))
        return Lease(self, lease.value or 0, m.value)

    def release(self, lease: Lease) -> None:
        """Releases a pinned lookup's lease (same as lease.release())."""
        lease.release()

    def _release_handle(self, handle: int) -> None:
        with self._cv:
            closed = not self._h
        if closed:
            self._lib.oscarkv_release(None, handle)  # frees the lease; the daemon expires it
            return
        self._call(lambda h: check(self._lib.oscarkv_release(h, handle)))

    def exists(self, codec: Codec, keys: Keys) -> List[bool]:
        """Per key (not a prefix): is it cached now? Nothing is pinned."""
        raw, n = _keys_bytes(keys)
        cc = codec._to_c()
        present = (ctypes.c_uint8 * max(n, 1))()
        self._call(lambda h: check(self._lib.oscarkv_exists(h, ctypes.byref(cc), raw, n,
                                                            present)))
        return [bool(present[i]) for i in range(n)]

    # ---- pages ----

    def store(self, codec: Codec, pages: Iterable[Tuple[bytes, PageKind, Buffer]]) -> StoreResult:
        """Stores pages, each (key, PageKind, buffer) with the page bytes of FORMAT.md §1 (e.g.
        from Codec.build_page). Keys already cached are skipped (deduplicated). Returns the
        result when every page was stored or deduplicated; otherwise raises the error of the
        first page that failed, with the StoreResult as ``.result``."""
        items = [_page_tuple(p, i) for i, p in enumerate(pages)]
        n = len(items)
        arr = (_native.PageC * max(n, 1))()
        keep = []
        for i, (key, kind, data) in enumerate(items):
            addr, nbytes, k = host_buffer(data, False, "page %d" % i)
            keep.append((key, k))
            arr[i].key = ctypes.cast(ctypes.c_char_p(key), ctypes.c_void_p)
            arr[i].kind = int(kind)
            arr[i].data = addr
            arr[i].bytes = nbytes
        cc = codec._to_c()
        res = _native.StoreResultC()
        codes = (ctypes.c_int * max(n, 1))()
        rc = self._call(lambda h: self._lib.oscarkv_store(h, ctypes.byref(cc), arr, n,
                                                          ctypes.byref(res), codes))
        msg = self._lib.oscarkv_last_error().decode("utf-8", "replace") if rc else ""
        del keep
        result = StoreResult(res.stored, res.deduplicated, res.failed,
                             [int(codes[i]) for i in range(n)])
        if rc:
            raise make_error(rc, msg, result=result)
        return result

    def load_into(self, codec: Codec, keys: Keys, buffers: Sequence[Buffer],
                  sizes: Optional[List[int]] = None) -> int:
        """Loads the longest cached prefix of `keys` straight into `buffers` (buffers[i] gets
        page i; each at least that page's size; writable host memory of any kind). Returns the
        number of pages loaded. `sizes`, if a list, receives each loaded page's byte count."""
        raw, n = _keys_bytes(keys)
        if len(buffers) < n:
            raise InvalidArgumentError("%d keys but %d buffers" % (n, len(buffers)))
        dst = (ctypes.c_void_p * max(n, 1))()
        cap = (ctypes.c_size_t * max(n, 1))()
        keep = []
        for i in range(n):
            addr, nbytes, k = host_buffer(buffers[i], True, "buffer %d" % i)
            keep.append(k)
            dst[i] = addr
            cap[i] = nbytes
        out_sizes = (ctypes.c_uint64 * max(n, 1))()
        m = ctypes.c_uint32()
        cc = codec._to_c()
        self._call(lambda h: check(self._lib.oscarkv_load(h, ctypes.byref(cc), raw, n, dst, cap,
                                                          ctypes.byref(m), out_sizes)))
        del keep
        if sizes is not None:
            sizes[:] = [int(out_sizes[i]) for i in range(m.value)]
        return m.value

    def load(self, codec: Codec, keys: Keys,
             kinds: Union[PageKind, Sequence[PageKind], None] = None) -> List[Any]:
        """Loads the longest cached prefix of `keys` into fresh arrays (numpy uint8; without
        numpy a bytearray or a memoryview of one), one per loaded page, exactly its size. `kinds` (one
        kind, or one per key) sizes the buffers exactly; without it each buffer is allocated at
        the larger (BF16) page size and a view of the loaded bytes is returned -- use load_into
        with your own buffers to avoid both."""
        _, n = _keys_bytes(keys)
        if kinds is None:
            caps = [max(codec.int2_page_bytes, codec.bf16_page_bytes)] * n
        elif isinstance(kinds, (int, PageKind)):
            caps = [codec.page_bytes(PageKind(kinds))] * n
        else:
            ks = list(kinds)
            if len(ks) != n:
                raise InvalidArgumentError("%d keys but %d kinds" % (n, len(ks)))
            caps = [codec.page_bytes(PageKind(k)) for k in ks]
        bufs = [new_bytes(c) for c in caps]
        sizes: List[int] = []
        m = self.load_into(codec, keys, bufs, sizes)
        out = []
        for i in range(m):
            b = bufs[i]
            out.append(b if sizes[i] == len(b) else
                       (b[:sizes[i]] if hasattr(b, "ctypes") else memoryview(b)[:sizes[i]]))
        return out

    def delete(self, codec: Codec, keys: Keys) -> int:
        """Deletes cached pages; returns how many were removed (absent keys are fine). A page
        pinned by a lease is removed from the index now and freed when the lease ends."""
        raw, n = _keys_bytes(keys)
        cc = codec._to_c()
        deleted = ctypes.c_uint32()
        self._call(lambda h: check(self._lib.oscarkv_delete(h, ctypes.byref(cc), raw, n, None,
                                                            ctypes.byref(deleted))))
        return deleted.value

    def stats(self) -> Stats:
        """The daemon's pool and lookup counters."""
        s = _native.StatsC()
        self._call(lambda h: check(self._lib.oscarkv_stats_get(h, ctypes.byref(s))))
        return Stats(*(getattr(s, f) for f in _native.STATS_FIELDS))

    # ---- asyncio ----

    def _pool(self) -> ThreadPoolExecutor:
        with self._executor_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=max(1, self.options.threads),
                                                    thread_name_prefix="oscarkv")
            return self._executor

    async def _run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool(), functools.partial(fn, *args, **kw))

    async def lookup_async(self, codec: Codec, keys: Keys) -> int:
        """lookup() without blocking the event loop."""
        return await self._run(self.lookup, codec, keys)

    async def exists_async(self, codec: Codec, keys: Keys) -> List[bool]:
        return await self._run(self.exists, codec, keys)

    async def store_async(self, codec: Codec,
                          pages: Iterable[Tuple[bytes, PageKind, Buffer]]) -> StoreResult:
        """store() without blocking the event loop (page buffers must not change meanwhile)."""
        return await self._run(self.store, codec, list(pages))

    async def load_async(self, codec: Codec, keys: Keys,
                         kinds: Union[PageKind, Sequence[PageKind], None] = None) -> List[Any]:
        return await self._run(self.load, codec, keys, kinds)

    async def load_into_async(self, codec: Codec, keys: Keys, buffers: Sequence[Buffer]) -> int:
        """load_into() without blocking the event loop (buffers must stay alive until done)."""
        return await self._run(self.load_into, codec, keys, buffers)

    async def delete_async(self, codec: Codec, keys: Keys) -> int:
        return await self._run(self.delete, codec, keys)

    async def unregister_codec_async(self, codec: Codec, drop_pages: bool = False) -> int:
        return await self._run(self.unregister_codec, codec, drop_pages)

    async def lookup_pinned_async(self, codec: Codec, keys: Keys, lease_ms: int = 0) -> Lease:
        return await self._run(self.lookup_pinned, codec, keys, lease_ms)


def connect(address: Optional[str] = None, options: Optional[ConnectOptions] = None,
            **kw: Any) -> Client:
    """Connects to an oscarkvd: ``connect("127.0.0.1:50051")``, ``connect(options=...)`` or
    ``connect(address, data_path="grpc", rpc_timeout_ms=2000)``; a tenant's shared namespace:
    ``connect(address, tls_ca=..., tls_cert=..., tls_key=..., shared_namespace="common")``
    (see ConnectOptions). Raises UnavailableError (or DeadlineExceededError) when no daemon
    answers, PermissionDeniedError when the tenant may not use shared_namespace."""
    o = options or ConnectOptions()
    if address is not None:
        kw["address"] = address
    if kw:
        d = dict(o.__dict__)
        for k, v in kw.items():
            if k not in d:
                raise InvalidArgumentError("unknown connect option %r" % k)
            d[k] = v
        o = ConnectOptions(**d)
    return Client(o)
