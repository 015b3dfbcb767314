"""Round trips against a real oscarkvd on 127.0.0.1: store / lookup / exists / load / load_into
(zero copy: the caller's arrays are written in place) / pinned lookups / delete, over shared
memory and over gRPC; asyncio variants; many threads at once."""
import array
import asyncio
import threading

import numpy as np
import pytest

import oscarkv
from oscarkv import PageKind, StatusCode

_seq = iter(range(10**9))


def make_pages(codec, n, seed):
    """n pages (page 0 BF16 sink, the rest INT2) of fresh tokens: (keys, kinds, pages)."""
    p = codec.profile
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 151936, size=p.page_tokens * n, dtype=np.uint32)
    keys = codec.block_keys(tokens)
    kinds = [PageKind.BF16] + [PageKind.INT2] * (n - 1)
    pages = []
    for kind in kinds:
        x = rng.uniform(-2, 2, (p.num_layers, 2, p.page_tokens, p.num_kv_heads, p.head_dim))
        pages.append(codec.build_page(kind, x.astype(np.float32)))
    return keys, kinds, pages


@pytest.fixture(params=["auto", "grpc"])
def client(request, daemon):
    with oscarkv.connect(daemon.address, data_path=request.param) as c:
        assert c.uses_shared_memory == (request.param == "auto")
        yield c


def test_round_trip(client):
    codec = client.register_codec("refmodel")
    assert codec.id == oscarkv.CodecProfile.builtin("refmodel").codec_id
    keys, kinds, pages = make_pages(codec, 4, seed=next(_seq))
    absent = codec.block_keys(np.arange(64, dtype=np.uint32) + 999_000)[0]
    assert client.lookup(codec, keys) == 0
    r = client.store(codec, zip(keys, kinds, pages))
    assert (r.stored, r.deduplicated, r.failed) == (4, 0, 0)
    assert r.page_codes == [StatusCode.OK] * 4
    r = client.store(codec, [(keys[0], kinds[0], pages[0])])
    assert r.deduplicated == 1 and r.page_codes == [StatusCode.ALREADY_EXISTS]
    assert client.lookup(codec, keys + [absent]) == 4
    assert client.exists(codec, [keys[2], absent, keys[0]]) == [True, False, True]

    got = client.load(codec, keys)
    assert len(got) == 4 and all(np.array_equal(g, p) for g, p in zip(got, pages))
    got = client.load(codec, keys[1:], kinds=PageKind.INT2)
    assert [g.nbytes for g in got] == [codec.int2_page_bytes] * 3
    assert all(np.array_equal(g, p) for g, p in zip(got, pages[1:]))

    with client.lookup_pinned(codec, keys, lease_ms=5000) as lease:
        assert lease.matched == 4 and lease.deadline_unix_ms > 0
    assert lease.released

    assert client.delete(codec, keys[:2]) == 2
    assert client.delete(codec, keys[:1]) == 0
    assert client.exists(codec, keys) == [False, False, True, True]
    assert client.lookup(codec, keys) == 0
    assert client.load(codec, keys) == []
    st = client.stats()
    assert st.pool_bytes > 0 and st.lookups > 0


def test_load_into_writes_the_callers_memory(client):
    """Zero copy: the loaded pages land in the arrays the caller passed, at the same address
    (shared memory: one copy from the pool straight into them)."""
    codec = client.register_codec("refmodel")
    keys, kinds, pages = make_pages(codec, 3, seed=next(_seq))
    client.store(codec, zip(keys, kinds, pages))
    slab = np.zeros((3, codec.bf16_page_bytes), np.uint8)  # e.g. an engine's pinned slots
    bufs = [slab[i] for i in range(3)]
    addrs = [b.ctypes.data for b in bufs]
    sizes = []
    assert client.load_into(codec, keys, bufs, sizes) == 3
    assert sizes == [p.nbytes for p in pages]
    assert [b.ctypes.data for b in bufs] == addrs
    for i in range(3):
        assert np.array_equal(slab[i, :sizes[i]], pages[i])  # the slab itself holds the pages
    # other buffer kinds: bytearray, memoryview slices of one bytearray, array.array
    raw = bytearray(codec.bf16_page_bytes * 3)
    mv = memoryview(raw)
    views = [mv[i * codec.bf16_page_bytes:(i + 1) * codec.bf16_page_bytes] for i in range(3)]
    assert client.load_into(codec, keys, views) == 3
    assert raw[:pages[0].nbytes] == pages[0].tobytes()
    a = array.array("B", bytes(codec.int2_page_bytes))
    assert client.load_into(codec, keys[1:2], [a]) == 1 and a.tobytes() == pages[1].tobytes()
    # a buffer too small for its page is an error, never a truncated page
    with pytest.raises(oscarkv.OscarkvError):
        client.load_into(codec, keys[:1], [np.zeros(codec.int2_page_bytes, np.uint8)])
    # pages in through DLPack (a numpy array exporting __dlpack__, wrapped)

    class DlpackOnly:
        def __init__(self, arr):
            self._arr = arr

        def __dlpack__(self, **kw):
            return self._arr.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._arr.__dlpack_device__()

    k2, kinds2, pages2 = make_pages(codec, 2, seed=next(_seq))
    r = client.store(codec, [(k, kd, DlpackOnly(p)) for k, kd, p in zip(k2, kinds2, pages2)])
    assert r.stored == 2
    assert all(np.array_equal(g, p) for g, p in zip(client.load(codec, k2), pages2))


def test_asyncio_variants(daemon):
    async def main():
        with oscarkv.connect(daemon.address, threads=4) as c:
            codec = c.register_codec("refmodel")
            batches = [make_pages(codec, 2, seed=next(_seq)) for _ in range(6)]
            results = await asyncio.gather(*(c.store_async(codec, zip(k, kd, p))
                                             for k, kd, p in batches))
            assert all(r.stored == 2 for r in results)
            matched = await asyncio.gather(*(c.lookup_async(codec, k) for k, _, _ in batches))
            assert matched == [2] * 6
            loaded = await asyncio.gather(*(c.load_async(codec, k) for k, _, _ in batches))
            for (k, _, p), got in zip(batches, loaded):
                assert all(np.array_equal(a, b) for a, b in zip(got, p))
            buf = np.zeros(codec.bf16_page_bytes, np.uint8)
            assert await c.load_into_async(codec, batches[0][0][:1], [buf]) == 1
            assert await c.exists_async(codec, batches[1][0]) == [True, True]
            assert await c.delete_async(codec, batches[1][0]) == 2
    asyncio.run(main())


def test_many_threads_at_once(daemon):
    """8 threads share one client: each stores its own pages and loads them back, and all look
    up the same shared prefix; every byte comes back right."""
    with oscarkv.connect(daemon.address) as c:
        codec = c.register_codec("refmodel")
        shared_keys, shared_kinds, shared_pages = make_pages(codec, 2, seed=next(_seq))
        c.store(codec, zip(shared_keys, shared_kinds, shared_pages))
        per_thread = [make_pages(codec, 3, seed=next(_seq)) for _ in range(8)]
        errors = []
        barrier = threading.Barrier(8)

        def work(i):
            try:
                keys, kinds, pages = per_thread[i]
                barrier.wait(timeout=30)
                for _ in range(5):
                    r = c.store(codec, zip(keys, kinds, pages))
                    assert r.failed == 0 and r.stored + r.deduplicated == 3
                    bufs = [np.zeros(codec.bf16_page_bytes, np.uint8) for _ in range(3)]
                    sizes = []
                    assert c.load_into(codec, keys, bufs, sizes) == 3
                    for b, s, p in zip(bufs, sizes, pages):
                        assert np.array_equal(b[:s], p)
                    assert c.lookup(codec, shared_keys) == 2
                    assert c.exists(codec, keys) == [True] * 3
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append((i, repr(e)))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert errors == []


def test_torch_cpu_tensors(daemon):
    """Pages in and out as torch CPU tensors (where torch is installed; CI's path is numpy)."""
    torch = pytest.importorskip("torch")
    with oscarkv.connect(daemon.address) as c:
        codec = c.register_codec("refmodel")
        keys, kinds, pages = make_pages(codec, 2, seed=next(_seq))
        tensors = [torch.from_numpy(p.copy()) for p in pages]
        assert c.store(codec, zip(keys, kinds, tensors)).stored == 2
        dst = torch.zeros((2, codec.bf16_page_bytes), dtype=torch.uint8)
        ptr = dst.data_ptr()
        sizes = []
        assert c.load_into(codec, keys, [dst[0], dst[1]], sizes) == 2
        assert dst.data_ptr() == ptr
        for i in range(2):
            assert np.array_equal(dst[i, :sizes[i]].numpy(), pages[i])
        x = torch.rand(8, 2, 64, 2, 128, dtype=torch.bfloat16)
        page = codec.build_page(PageKind.BF16, x)
        assert np.array_equal(codec.decode_page(page), x.float().numpy())


def test_keys_agree_with_the_cpp_cli(daemon, tmp_path):
    """Pages stored from Python under keys of token ids are found by the C++ `oscarkv lookup`
    from the same token ids and salt: both sides compute the same block keys."""
    import json
    import os
    import subprocess
    from conftest import REPO
    cli = os.environ.get("OSCARKV_CLI") or str(REPO / "build" / "cli" / "oscarkv")
    if not os.path.isfile(cli):
        pytest.fail("oscarkv CLI not found at %s (set OSCARKV_CLI)" % cli)
    with oscarkv.connect(daemon.address) as c:
        codec = c.register_codec("refmodel")
        tokens = np.random.default_rng(next(_seq)).integers(0, 151936, 64 * 3 + 17)
        keys = codec.block_keys(tokens, "tenant-py")
        _, kinds, pages = make_pages(codec, 3, seed=next(_seq))
        assert c.store(codec, zip(keys, kinds, pages)).stored == 3
    f = tmp_path / "tokens.txt"
    f.write_text(" ".join(str(int(t)) for t in tokens))
    out = subprocess.run([cli, "lookup", "--addr", daemon.address, "--shape", "refmodel",
                          "--salt", "tenant-py", "--tokens-file", str(f), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    j = json.loads(out.stdout)
    assert (j["codec_id"], j["keys"], j["matched"]) == (codec.id.hex(), 3, 3)


def test_unregister_codec(daemon):
    """unregister_codec frees the registration: refused while it holds pages (unless
    drop_pages), NOT_FOUND afterwards and for a second call; registering again starts empty."""
    import dataclasses
    with oscarkv.connect(daemon.address) as c:
        profile = dataclasses.replace(oscarkv.CodecProfile.builtin("refmodel"),
                                      model_id="unregister-test")
        codec = c.register_codec(profile)
        keys, kinds, pages = make_pages(codec, 2, seed=next(_seq))
        assert c.store(codec, zip(keys, kinds, pages)).stored == 2
        with pytest.raises(oscarkv.FailedPreconditionError):
            c.unregister_codec(codec)
        assert c.lookup(codec, keys) == 2  # refused: nothing changed
        assert c.unregister_codec(codec, drop_pages=True) == 2
        with pytest.raises(oscarkv.NotFoundError):
            c.unregister_codec(codec)
        with pytest.raises(oscarkv.NotFoundError):
            c.lookup(codec, keys)
        again = c.register_codec(profile)
        assert again.id == codec.id and c.lookup(again, keys) == 0
        assert asyncio.run(c.unregister_codec_async(again)) == 0
