"""oscarkv.torch: the ops' CUDA paths against the kernels' CPU references (gpu marker), the fake
implementations under torch.compile, CUDA-graph capture, and PagedKVCache's page plan.

Needs PyTorch and liboscarkv_cuda_c.so (a CUDA build: kernels/cuda/capi); skipped without them.
"""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: oscarkv.torch needs it")

from oscarkv import LibraryNotFoundError  # noqa: E402

try:
    from oscarkv.torch import _capi  # noqa: E402
    _capi.load()
except LibraryNotFoundError as e:  # a build without CUDA has no kernels library
    pytest.skip("liboscarkv_cuda_c.so not found (needs a CUDA build): %s" % e,
                allow_module_level=True)

from oscarkv.torch import BF16, INT2, KVCodec, PagedKVCache  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
D = 128


def plan_kinds(n, T=64, S=64, R=256):
    """PlanSequencePages (kernels/src/page_set.cc) of n tokens, as a list of kinds."""
    out, pos = [], 0
    sink_end = min(n, -(-S // T) * T)
    while pos < sink_end:
        out.append(BF16)
        pos += T
    limit = n - R if n > R else 0
    while pos + T <= limit:
        out.append(INT2)
        pos += T
    while pos < n:
        out.append(BF16)
        pos += T
    return out


def test_page_plan_matches_cpp_plan_cpu():
    codec = KVCodec.builtin("naive", 1, 1)
    cache = PagedKVCache(codec, 1, 2, 2048, device="cpu", max_step_tokens=1024)
    cache.reset(2)
    g = torch.Generator().manual_seed(3)
    steps = [[300, 5], [1, 1], [64, 700], [1, 1]] + [[1, 1]] * 70
    n = [0, 0]
    for st in steps:
        cache.begin_step(st)
        rows = torch.randn(sum(st), 1, D, generator=g)
        cache.write(0, rows, rows)
        n = [a + b for a, b in zip(n, st)]
        for b in range(2):
            kinds = [k for k, _, _ in cache.sequence_pages(b)]
            # pages holding this step's rows may still be BF16 until the next step flushes them
            want = plan_kinds(n[b])
            assert len(kinds) == len(want)
            for i, (k, w) in enumerate(zip(kinds, want)):
                assert k == w or (w == INT2 and (i + 1) * 64 > n[b] - st[b]), (b, i, kinds, want)
            assert sum(c for _, _, c in cache.sequence_pages(b)) == n[b]


def _random_cache(device, codec, lengths, seed=1, hq=8, extra=64):
    g = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(codec, hq, len(lengths), max(lengths) + extra, device=device,
                         max_step_tokens=sum(lengths) + 64)
    cache.reset(len(lengths))
    cache.begin_step(lengths)
    L, H = codec.num_layers, codec.num_kv_heads
    rows = [(torch.randn(sum(lengths), H, D, generator=g) * 2).to(device) for _ in range(2 * L)]
    for l in range(L):
        cache.write(l, rows[2 * l], rows[2 * l + 1])
    cache.begin_step([1] * len(lengths))  # flushes the prompt's history pages
    for l in range(L):
        r = torch.randn(len(lengths), H, D, generator=g).to(device)
        cache.write(l, r, -r)
    return cache


def _to_cpu(cache):
    """A CPU view of a CUDA cache's page table (same pool bytes) for the references."""
    pool = cache.pool.cpu()
    shift = pool.data_ptr() - cache.pool.data_ptr()
    return pool, (cache.page_ptrs.cpu() + shift)


def test_fake_impls_trace_under_torch_compile_cpu():
    codec = KVCodec.builtin("hadamard", 2, 2)
    cache = PagedKVCache(codec, 8, 2, 512, device="cpu", max_step_tokens=600)
    cache.reset(2)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(2, 8, D)
        out, lse = torch.ops.oscarkv.paged_decode(
            q, cache.pool, cache.page_ptrs, cache.page_kinds, cache.page_token_counts,
            cache.seq_page_indptr[:3], cache.seq_page_ids, cache.rotations, 1, 0, 2, 128, 64, 0.0)
        assert out.shape == (2, 8, D) and lse.shape == (2, 8)
    f = torch.compile(lambda q: cache.decode(0, q), backend="eager", fullgraph=False)
    cache.begin_step([3, 2])
    r = torch.randn(5, 2, D)
    for l in range(2):
        cache.write(l, r, r)
    cache.begin_step([1, 1])
    for l in range(2):
        cache.write(l, r[:2], r[:2])
    q = torch.randn(2, 8, D)
    torch.testing.assert_close(f(q), cache.decode(0, q))


@gpu
@pytest.mark.parametrize("codec_name,group", [("hadamard", 128), ("naive", 64)])
def test_quantize_write_and_decode_equal_references(codec_name, group):
    codec = KVCodec.builtin(codec_name, 3, 2, group_size=group)
    lengths = [700, 129, 64]
    cuda = _random_cache("cuda", codec, lengths)
    cpu = _random_cache("cpu", codec, lengths)
    torch.cuda.synchronize()
    # Same plan on both sides; page bytes: BF16 rows within rounding of the rotation order,
    # INT2 codes equal on almost every element (fp16 R on the GPU, fp32 on the CPU).
    assert cuda.sequence_pages(0) == cpu.sequence_pages(0)
    g = torch.Generator().manual_seed(9)
    q = torch.randn(len(lengths), 8, D, generator=g)
    pool, ptrs = _to_cpu(cuda)
    for layer in range(3):
        got = cuda.decode(layer, q.cuda()).cpu()
        # The reference over the GPU-written pages isolates the attention kernel.
        ref, _ = torch.ops.oscarkv.paged_decode(
            q, pool, ptrs, cuda.page_kinds.cpu(), cuda.page_token_counts.cpu(),
            cuda.seq_page_indptr[:4].cpu(), cuda.seq_page_ids.cpu(), cuda.rotations.cpu(), layer,
            0, 3, group, 64, 0.0)
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < 2e-3, (layer, err)
        # The whole CPU path (reference writes + reference decode) within INT2 noise.
        full = cpu.decode(layer, q)
        assert ((got - full).norm() / full.norm()).item() < 5e-2


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
@pytest.mark.parametrize("unrotate", [True, False])
def test_decode_of_a_rotated_query_equals_decode_of_the_query(device, unrotate):
    """decode(q @ R_K per KV head, rotated_query=True) == decode(q): the rotation convention
    the kernels expect (row vector times R, the softmax scale applied after), on the CPU
    reference and the GPU launch (rot_k = NULL). A rotated query decoded as unrotated differs."""
    codec = KVCodec.builtin("hadamard", 2, 2)
    lengths = [700, 129]
    cache = _random_cache(device, codec, lengths, seed=4)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(len(lengths), 8, D, generator=g).to(device)
    for layer in range(2):
        r = cache.query_rotation(layer)  # [kv_heads, d, d]
        qr = torch.einsum("bhgi,hic->bhgc", q.view(len(lengths), 2, 4, D).double(),
                          r.double()).reshape_as(q).float().contiguous()
        want = cache.decode(layer, q, unrotate=unrotate)
        got = cache.decode(layer, qr, unrotate=unrotate, rotated_query=True)
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-5, (layer, err)
        wrong = cache.decode(layer, qr, unrotate=unrotate)  # rotated twice
        assert ((wrong - want).norm() / want.norm()).item() > 1e-2


@gpu
def test_unrotated_write_is_bit_exact():
    codec = KVCodec.builtin("naive", 2, 2)
    g = torch.Generator().manual_seed(5)
    rows = torch.randn(2, 64, 2, D, generator=g).bfloat16()
    out = {}
    for dev in ("cpu", "cuda"):
        c = PagedKVCache(codec, 8, 1, 256, device=dev, bf16_slots=2, int2_slots=2)
        slot_i2 = c.n_bf16
        dp = torch.full((64,), slot_i2, dtype=torch.int32, device=dev)
        ds = torch.arange(64, dtype=torch.int32, device=dev)
        k, v = rows.to(dev), (-rows).to(dev)
        torch.ops.oscarkv.quantize_write(c.pool, c.page_ptrs, c.page_kinds, dp, ds, k, v, None,
                                         None, None, None, 2, 0, 128, 64, 0, True)
        torch.cuda.synchronize()
        out[dev] = c.pool[c.n_bf16 * c.pb:].cpu()
    assert torch.equal(out["cpu"], out["cuda"])


@gpu
def test_extend_equals_reference():
    codec = KVCodec.builtin("hadamard", 2, 2)
    lengths = [400, 70]
    cuda = _random_cache("cuda", codec, lengths, seed=4)
    g = torch.Generator().manual_seed(11)
    new = [37, 130]
    cuda.begin_step(new)
    n = sum(new)
    k = torch.randn(n, 2, D, generator=g)
    v = torch.randn(n, 2, D, generator=g)
    q = torch.randn(n, 8, D, generator=g)
    for layer in range(2):
        cuda.write(layer, k.cuda(), v.cuda())
    got = cuda.extend(1, q.cuda(), k.cuda(), v.cuda()).cpu()
    torch.cuda.synchronize()
    pool, ptrs = _to_cpu(cuda)
    rk = torch.einsum("thd,hde->the", k, codec.matrices[1, 0]).bfloat16().contiguous()
    rv = torch.einsum("thd,hde->the", v, codec.matrices[1, 1]).bfloat16().contiguous()
    ref, _ = torch.ops.oscarkv.paged_extend(
        q, rk, rv, cuda.q_indptr[:3].cpu(), pool, ptrs, cuda.page_kinds.cpu(),
        cuda.prefix_token_counts.cpu(), cuda.prefix_indptr[:3].cpu(), cuda.prefix_ids.cpu(),
        cuda.rotations.cpu(), 1, 0, max(new), 2, 128, 64, 0.0)
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < 5e-3, err


@gpu
def test_decode_replays_in_a_cuda_graph_over_new_lengths():
    codec = KVCodec.builtin("hadamard", 2, 2)
    cache = _random_cache("cuda", codec, [500, 200], seed=6, extra=128)
    q = torch.randn(2, 8, D, device="cuda")
    k = torch.randn(2, 2, D, device="cuda")
    static_out = cache.decode(0, q)  # warm-up
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph, stream=s):
            cache.write(0, k, k)
            static_out = cache.decode(0, q)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(70):  # past a flush: the page table and plan change under the graph
        cache.begin_step([1, 1])
        k.normal_()
        q.normal_()
        graph.replay()
        eager = cache.decode(0, q)
        torch.testing.assert_close(static_out, eager, rtol=1e-4, atol=1e-5)
    h = cache._decoder.handle

    rows = cache._decoder.max_seqs

    def direct(x):
        qp = torch.zeros(rows, 8, D, device="cuda")
        qp[:2] = x
        return torch.ops.oscarkv.paged_decode(
            qp, cache.pool, cache.page_ptrs, cache.page_kinds, cache.page_token_counts,
            cache.seq_page_indptr[:3], cache.seq_page_ids, cache.rotations, 0, h, 2, 128, 64,
            0.0)[0][:2] * 2
    compiled = torch.compile(direct, fullgraph=True)
    torch.testing.assert_close(compiled(q), cache.decode(0, q) * 2, rtol=1e-4, atol=1e-5)


def test_layer_major_pool_equals_page_major_cpu():
    """PagedKVCache(layer_major=True) -- one pool region per layer -- writes, flushes, attends
    and exports exactly as the whole-page pool does; its loaded pages export unchanged."""
    codec = KVCodec.builtin("hadamard", 3, 2)
    got = {}
    for lm in (False, True):
        cache = PagedKVCache(codec, 4, 2, 1024, device="cpu", max_step_tokens=640, layer_major=lm)
        cache.reset(2)
        g = torch.Generator().manual_seed(5)
        outs = []
        # 500 tokens: whole pages written as INT2 directly; then 64 more: BF16 pages flushed
        for st in [[500, 70], [1, 1], [64, 3], [1, 1], [1, 1]]:
            cache.begin_step(st)
            n = sum(st)
            for layer in range(3):
                k, v = torch.randn(n, 2, D, generator=g), torch.randn(n, 2, D, generator=g)
                q = torch.randn(n, 4, D, generator=g)
                cache.write(layer, k, v)
                outs.append(cache.decode(layer, q) if st == [1, 1] else cache.extend(layer, q, k, v))
        pages = [(kind, cache.export_page(s), count) for b in range(2)
                 for kind, s, count in cache.sequence_pages(b)]
        got[lm] = (outs, pages, cache)
    for a, b in zip(got[False][0], got[True][0]):
        assert torch.equal(a, b)
    assert [p[1] for p in got[False][1]] == [p[1] for p in got[True][1]]
    assert any(k == INT2 for k, _, _ in got[True][1])  # the flushes ran
    # pages in: a layer-major cache loads the exported pages and gives them back unchanged
    cache = got[True][2]
    seq0 = got[True][1][:len(cache.pages[0])]
    cache.reset(1)
    cache.load_pages(0, [(k, data) for k, data, _ in seq0], sum(c for _, _, c in seq0))
    assert [cache.export_page(s) for _, s, _ in cache.sequence_pages(0)] == [d for _, d, _ in seq0]
