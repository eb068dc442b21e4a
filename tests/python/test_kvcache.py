"""flash_attn_with_kvcache: contiguous and paged caches, appending new keys (with rotary embedding), decode-shaped
queries, GQA, causal against the cache length, varlen queries, sinks, and named errors. On CPU tensors (the float64
reference through the same composition) and, where a GPU is present, on it against the same call on the CPU."""
import math

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402


def _rand(*shape, seed=0, dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)


def _per_sequence(q, k_cache, v_cache, lengths, **kw):
    """Each sequence alone through flash_attn_func over its first lengths[b] cache rows."""
    outs, lses = [], []
    for b, n in enumerate(lengths):
        o, l_ = flashcute.flash_attn_func(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], **kw)
        outs.append(o)
        lses.append(l_)
    return torch.cat(outs), torch.cat(lses)


def _paged(cache, page_size, seed=0):
    """The same cache as shuffled pages: (pages, page_table) with page_table[b, i] holding row block i of b."""
    batch, rows = cache.shape[:2]
    per = rows // page_size
    perm = torch.randperm(batch * per, generator=torch.Generator().manual_seed(seed))
    pages = torch.empty(batch * per + 3, page_size, *cache.shape[2:], dtype=cache.dtype)  # spare pages too
    blocks = cache.reshape(batch * per, page_size, *cache.shape[2:])
    pages[perm] = blocks
    return pages, perm.reshape(batch, per).to(torch.int32)


@pytest.mark.parametrize("causal", [False, True])
def test_contiguous_cache_matches_each_sequence(causal):
    q, kc, vc = _rand(3, 2, 4, 16), _rand(3, 40, 2, 16, seed=1), _rand(3, 40, 2, 16, seed=2)
    lengths = [40, 7, 1]
    out, lse = flashcute.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
                                                 causal=causal)
    ref_out, ref_lse = _per_sequence(q, kc, vc, lengths, causal=causal)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    assert lse.shape == (3, 4, 2) and lse.is_contiguous()


def test_one_row_decode_unpacks_as_a_view():
    """Packed decode with one query row per head: paged_fwd's out already lies in the unpacked head order, and its
    fake op gives the same strides (opcheck), so unpacking costs no copy."""
    from flashcute import ops
    q, kc, vc = _rand(2, 1, 8, 16), _rand(2, 40, 2, 16, seed=1), _rand(2, 40, 2, 16, seed=2)
    lengths = torch.tensor([40, 9], dtype=torch.int32)
    out, lse = flashcute.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, causal=True)
    ref_out, ref_lse = _per_sequence(q, kc, vc, [40, 9], causal=True)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    assert out.is_contiguous() and lse.is_contiguous()
    packed = q.reshape(2, 1, 2, 4, 16).transpose(2, 3).reshape(2, 4, 2, 16)  # rows j: query head hk * 4 + j
    table = torch.arange(2, dtype=torch.int32)[:, None]
    args = (packed, kc, vc, table, lengths, 0.25, True, ops.WINDOW_UNBOUNDED, ops.WINDOW_UNBOUNDED, 0.0, None, 0, 4)
    pout, _ = ops.paged_fwd(*args)
    assert pout.stride() == (8 * 16, 16, 4 * 16, 1)
    torch.library.opcheck(ops.paged_fwd, args)


@pytest.mark.parametrize("page_size", [1, 5, 16])
def test_paged_cache_is_bit_identical_to_contiguous(page_size):
    q, kc, vc = _rand(2, 3, 4, 8), _rand(2, 80, 2, 8, seed=1), _rand(2, 80, 2, 8, seed=2)
    lengths = torch.tensor([80, 33], dtype=torch.int32)
    kp, table = _paged(kc, page_size, seed=3)
    vp, _ = _paged(vc, page_size, seed=3)
    for causal in (False, True):
        out, lse = flashcute.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, causal=causal)
        pout, plse = flashcute.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lengths, page_table=table,
                                                       causal=causal)
        assert torch.equal(out, pout) and torch.equal(lse, plse)


def test_append_writes_the_cache_and_attends_to_it():
    kc, vc = _rand(2, 20, 1, 8, seed=1), _rand(2, 20, 1, 8, seed=2)
    q, k, v = _rand(2, 3, 2, 8), _rand(2, 3, 1, 8, seed=4), _rand(2, 3, 1, 8, seed=5)
    lengths = torch.tensor([5, 12], dtype=torch.int32)
    before_k = kc.clone()
    out, lse = flashcute.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lengths, causal=True)
    for b, n in enumerate((5, 12)):
        torch.testing.assert_close(kc[b, n:n + 3], k[b], rtol=0, atol=0)
        torch.testing.assert_close(vc[b, n:n + 3], v[b], rtol=0, atol=0)
        torch.testing.assert_close(kc[b, :n], before_k[b, :n], rtol=0, atol=0)
        assert torch.equal(kc[b, n + 3:], before_k[b, n + 3:])
    ref_out, ref_lse = _per_sequence(q, kc, vc, [8, 15], causal=True)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_append_into_pages_matches_contiguous():
    kc, vc = _rand(2, 24, 2, 8, seed=1), _rand(2, 24, 2, 8, seed=2)
    kp, table = _paged(kc, 4, seed=7)
    vp, _ = _paged(vc, 4, seed=7)
    q, k, v = _rand(2, 2, 4, 8), _rand(2, 2, 2, 8, seed=4), _rand(2, 2, 2, 8, seed=5)
    lengths = torch.tensor([3, 21], dtype=torch.int32)
    out, lse = flashcute.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lengths, causal=True)
    pout, plse = flashcute.flash_attn_with_kvcache(q, kp, vp, k, v, cache_seqlens=lengths, page_table=table,
                                                   causal=True)
    assert torch.equal(out, pout) and torch.equal(lse, plse)
    rows = kp[table.long()].reshape(2, 24, 2, 8)
    assert torch.equal(rows, kc)


def _rotary_tables(positions, rotary_dim):
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos(), angles.sin()


def _rotate_manual(x, cos, sin, pos, interleaved):
    out = x.clone()
    half = cos.shape[1]
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            c, sn = cos[pos[b][s]], sin[pos[b][s]]
            for i in range(half):
                a, bb = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
                x1, x2 = x[b, s, :, a], x[b, s, :, bb]
                out[b, s, :, a] = x1 * c[i] - x2 * sn[i]
                out[b, s, :, bb] = x1 * sn[i] + x2 * c[i]
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_rotary_rotates_q_and_the_new_keys(interleaved, causal):
    kc, vc = _rand(2, 16, 1, 8, seed=1), _rand(2, 16, 1, 8, seed=2)
    q, k, v = _rand(2, 2, 2, 8), _rand(2, 2, 1, 8, seed=4), _rand(2, 2, 1, 8, seed=5)
    cos, sin = _rotary_tables(32, 6)  # rotary_dim 6 of head_dim 8: the last two channels pass through
    lengths = [4, 9]
    kc2, vc2 = kc.clone(), vc.clone()
    out, _ = flashcute.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
                                               causal=causal, rotary_cos=cos, rotary_sin=sin,
                                               rotary_interleaved=interleaved)
    k_pos = [[n + j for j in range(2)] for n in lengths]
    q_pos = k_pos if causal else [[n, n] for n in lengths]
    k_rot = _rotate_manual(k, cos, sin, k_pos, interleaved)
    q_rot = _rotate_manual(q, cos, sin, q_pos, interleaved)
    for b, n in enumerate(lengths):
        kc2[b, n:n + 2], vc2[b, n:n + 2] = k_rot[b], v[b]
    torch.testing.assert_close(kc, kc2, rtol=1e-12, atol=1e-12)
    ref_out, _ = _per_sequence(q_rot, kc2, vc2, [n + 2 for n in lengths], causal=causal)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)


def test_varlen_queries_and_sink():
    kc, vc = _rand(2, 12, 2, 8, seed=1), _rand(2, 12, 2, 8, seed=2)
    q = _rand(5, 4, 8)
    cu = torch.tensor([0, 1, 5], dtype=torch.int32)
    sink = _rand(4, seed=9)
    lengths = torch.tensor([12, 6], dtype=torch.int32)
    out, lse = flashcute.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, cu_seqlens_q=cu, causal=True,
                                                 learnable_sink=sink)
    for b, (lo, hi) in enumerate(((0, 1), (1, 5))):
        n = int(lengths[b])
        o, l_ = flashcute.flash_attn_func(q[None, lo:hi], kc[b:b + 1, :n], vc[b:b + 1, :n], causal=True,
                                          learnable_sink=sink)
        torch.testing.assert_close(out[lo:hi], o[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[:, lo:hi], l_[0], rtol=1e-12, atol=1e-12)


def test_whole_cache_by_default_and_num_splits_accepted():
    q, kc, vc = _rand(1, 1, 2, 8), _rand(1, 9, 2, 8, seed=1), _rand(1, 9, 2, 8, seed=2)
    out, _ = flashcute.flash_attn_with_kvcache(q, kc, vc, num_splits=4)
    ref, _ = flashcute.flash_attn_func(q, kc, vc)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("with_sink", [False, True])
def test_decode_split_and_packed_gqa(num_splits, with_sink):
    """Decode-shaped calls (one query row; or several without a causal mask) pack the query heads of a K/V head
    (python/flashcute/decode.py) and pass num_splits to the library (the CPU reference computes the same attention
    unsplit; the GPU cases below split): they match each sequence alone, empty sequences included (out 0, lse -inf,
    or lse = the sink)."""
    kc, vc = _rand(3, 40, 2, 8, seed=1), _rand(3, 40, 2, 8, seed=2)
    sink = _rand(8, seed=9) if with_sink else None
    lengths = [40, 0, 13]
    for sq, causal in ((1, True), (3, False)):
        q = _rand(3, sq, 8, 8, seed=sq)
        out, lse = flashcute.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
                                                     causal=causal, num_splits=num_splits, learnable_sink=sink)
        ref_out, ref_lse = _per_sequence(q, kc, vc, lengths, causal=causal, learnable_sink=sink)
        torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_split_and_pack_choices():
    """decode.py's choices: a given num_splits kept within the C API's limits (256, and 65535 CTAs along the batch),
    0 left for the op to choose; the choice fills one wave (SMs x CTAs per SM) with chunks of >= 512 keys for one
    query tile per head, and never splits a prefill; GQA packing with every mask (the kernels see the packed rows'
    query rows) but not with a sink, and only for few query rows."""
    from flashcute import decode
    assert decode.limit_splits(3, 2) == 3
    assert decode.limit_splits(1000, 2) == 256
    assert decode.limit_splits(200, 1000) == 65
    assert decode.limit_splits(0, 7) == 0
    assert decode.choose_splits(1, 8, 4, 1 << 17, 132) == 16  # one CTA per SM (the Hopper decode tile)
    assert decode.choose_splits(1, 8, 4, 1 << 17, 264) == 33  # two (the portable 64-row tiles)
    assert decode.choose_splits(64, 8, 4, 1 << 17, 264) == 1  # the tiles fill the GPU themselves
    assert decode.choose_splits(1, 8, 4, 2048, 264) == 4  # chunks of at least 512 keys
    assert decode.choose_splits(1, 8, 4, 1000, 264) == 1  # short caches are not split
    # More than one query tile per head (a prefill against the cache) is never split; the rule answers before it
    # asks for the wave (the library's occupancy query).
    assert decode.choose_splits(1, 32, 1024, 1 << 17, lambda: 1 / 0) == 1
    assert decode.choose_splits(1, 8, 4, 1 << 17, lambda: 264) == 33
    assert decode.packs(None, 4, 1) and decode.packs(None, 4, 64)
    assert not decode.packs(torch.zeros(8), 4, 1)  # one sink logit per query head
    assert not decode.packs(None, 1, 1)
    assert not decode.packs(None, 4, 128) and not decode.packs(None, 4, 8192)  # prefill: the tiles are full anyway


def test_decode_split_in_bf16_keeps_the_error_rule():
    """The partial outputs pass through bf16 before the float32 combine: still within 2x of plain PyTorch."""
    from attn_ref import check, forward
    kc, vc = _rand(2, 300, 2, 64, seed=1, dtype=torch.bfloat16), _rand(2, 300, 2, 64, seed=2, dtype=torch.bfloat16)
    q = _rand(2, 1, 8, 64, dtype=torch.bfloat16)
    out, lse = flashcute.flash_attn_with_kvcache(q, kc, vc, causal=True, num_splits=5)
    ref_o, ref_l = forward(*(t.double() for t in (q, kc, vc)), 0.125, True, (None, None), 0.0, torch.float64)
    base_o, base_l = forward(q, kc, vc, 0.125, True, (None, None), 0.0, torch.bfloat16)
    check(out, ref_o, base_o, 1e-5, "out")
    check(lse, ref_l, base_l, 1e-5, "lse")


@pytest.mark.parametrize("kwargs,match", [
    (dict(cache_seqlens=torch.tensor([3], dtype=torch.int64)), "cache_seqlens must be"),
    (dict(cache_seqlens=torch.tensor([20], dtype=torch.int32)), "more than the cache holds"),
    (dict(num_splits=-1), "num_splits"),
    (dict(page_table=torch.zeros(1, 2, dtype=torch.int64)), "page_table"),
    (dict(k=_rand(1, 1, 2, 8)), "k and v"),
    (dict(k=_rand(1, 1, 2, 8), v=_rand(1, 1, 2, 8)), "needs cache_seqlens"),
])
def test_errors_name_the_argument(kwargs, match):
    q, kc, vc = _rand(1, 1, 2, 8), _rand(1, 9, 2, 8, seed=1), _rand(1, 9, 2, 8, seed=2)
    with pytest.raises(ValueError, match=match):
        flashcute.flash_attn_with_kvcache(q, kc, vc, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 16, 7])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("num_splits", [0, 3, 40])
def test_gpu_decode_matches_cpu(page_size, dtype, num_splits):
    """Decode (one and four query rows, GQA 32/8, hd128; split-KV into 3 or 40 chunks, some of them empty) on the
    GPU: the same call on the CPU in float64 is the reference, under the 2x rule against plain PyTorch in the dtype
    (attn_ref), per sequence."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from attn_ref import check, forward
    dt = getattr(torch, dtype)
    lengths = [300, 1, 77]
    for sq in (1, 4):
        q = _rand(3, sq, 32, 128, seed=sq, dtype=dt, device="cuda")
        kc, vc = (_rand(3, 304, 8, 128, seed=s, dtype=dt, device="cuda") for s in (1, 2))
        kw = dict(cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device="cuda"), causal=True,
                  num_splits=num_splits)
        if page_size is None:
            out, lse = flashcute.flash_attn_with_kvcache(q, kc, vc, **kw)
        else:
            rows = math.ceil(304 / page_size) * page_size
            pad = (lambda t: torch.cat([t, t.new_zeros(3, rows - 304, *t.shape[2:])], 1))
            kp, table = _paged(pad(kc).cpu(), page_size, seed=1)
            vp, _ = _paged(pad(vc).cpu(), page_size, seed=1)
            out, lse = flashcute.flash_attn_with_kvcache(q, kp.cuda(), vp.cuda(), page_table=table.cuda(), **kw)
        for b, n in enumerate(lengths):
            args = (q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], q.shape[-1] ** -0.5, True, (None, None), 0.0)
            ref_o, ref_l = forward(*(t.double() for t in args[:3]), *args[3:], torch.float64)
            base_o, base_l = forward(*args, dt)
            check(out[b:b + 1], ref_o, base_o, 1e-5, "out")
            check(lse[b:b + 1], ref_l, base_l, 1e-5, "lse")


@pytest.mark.gpu
@pytest.mark.parametrize("arch", [None, 80, 120], ids=["native", "sm80", "sm120"])
@pytest.mark.parametrize("dims", [(128, 128), (192, 128)], ids=["128", "192v128"])
@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_gpu_pages_read_in_place_match_contiguous_bits(page_size, dims, arch):
    """The kernels read the pages in place (the C API's page_table): decode (split automatically on a 4k cache)
    and a causal prefill over the same cache give the contiguous cache's bits; also where V's head dim differs, and
    on the portable kernels (arch profiles), whose pages of whole key tiles (the contiguous cache, 256, and 64 on the
    64-key tiles) take one table read per tile and the others go row by row."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from test_gpu_grid import forced_arch
    d, dv = dims
    lengths = torch.tensor([4096, 1000, 0], dtype=torch.int32, device="cuda")
    kc, vc = (_rand(3, 4096, 8, dim, seed=s, dtype=torch.bfloat16, device="cuda") for s, dim in ((1, d), (2, dv)))
    kp, table = _paged(kc.cpu(), page_size, seed=4)
    vp, _ = _paged(vc.cpu(), page_size, seed=4)
    kp, vp, table = kp.cuda(), vp.cuda(), table.cuda()
    for sq, causal in ((1, True), (3, False), (64, True)):
        q = _rand(3, sq, 32, d, seed=sq, dtype=torch.bfloat16, device="cuda")
        with forced_arch(arch):
            want = flashcute.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, causal=causal)
            got = flashcute.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lengths, page_table=table,
                                                    causal=causal)
        for a, b in zip(got, want):
            assert torch.equal(a, b), (sq, causal)


@pytest.mark.gpu
def test_gpu_random_caches_keep_the_error_rule():
    """Random kvcache calls on the GPU (page sizes 1 to 256 or contiguous, GQA, 1 to 33 query rows, causal or a
    window, softcap, sinks, 0 to 17 splits, empty sequences, V's head dim apart): per sequence within 2x of plain
    PyTorch's error in the dtype against float64 (attn_ref), lse included."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import random
    from attn_ref import check, forward
    from test_gpu_grid import forced_arch
    rng = random.Random(7)
    for case in range(40):
        dt = rng.choice([torch.float16, torch.bfloat16])
        batch, hkv, group = rng.randint(1, 4), rng.randint(1, 3), rng.choice([1, 2, 4])
        dims, sq = rng.choice([64, 96, 128, 256, (192, 128)]), rng.choice([1, 1, 2, 7, 33])
        d, dv = dims if isinstance(dims, tuple) else (dims, dims)
        page = rng.choice([None, 1, 3, 16, 64, 256])
        capacity = rng.randint(1, 1000)
        if page:
            capacity = -(-capacity // page) * page
        lengths = [rng.choice([0, capacity, rng.randint(0, capacity)]) for _ in range(batch)]
        causal = rng.random() < 0.6
        window = (rng.randint(0, 300), 0) if rng.random() < 0.2 else (None, None)
        softcap = rng.choice([0.0, 0.0, 15.0])
        sink = torch.randn(hkv * group, device="cuda") if rng.random() < 0.3 else None
        splits = rng.choice([0, 1, 2, 5, 17])
        arch = rng.choice([None, None, 80, 86, 89, 120])  # the portable kernels under each profile too
        q = _rand(batch, sq, hkv * group, d, seed=case, dtype=dt, device="cuda")
        kc, vc = (_rand(batch, capacity, hkv, dim, seed=100 * case + s, dtype=dt, device="cuda")
                  for s, dim in ((1, d), (2, dv)))
        kw = dict(cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device="cuda"), causal=causal,
                  window_size=window, softcap=softcap, learnable_sink=sink, num_splits=splits)
        with forced_arch(arch):
            if page is None:
                out, lse = flashcute.flash_attn_with_kvcache(q, kc, vc, **kw)
            else:
                kp, table = _paged(kc.cpu(), page, seed=case)
                vp, _ = _paged(vc.cpu(), page, seed=case)
                out, lse = flashcute.flash_attn_with_kvcache(q, kp.cuda(), vp.cuda(), page_table=table.cuda(), **kw)
        what = f"case {case}: {dt} b{batch} hkv{hkv} g{group} d{d}/{dv} sq{sq} page {page} cap {capacity} {lengths} " \
               f"causal {causal} window {window} softcap {softcap} sink {sink is not None} splits {splits} arch {arch}"
        for b, n in enumerate(lengths):
            args = (q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], d ** -0.5, causal, window, softcap)
            s64 = None if sink is None else sink.double()
            ref_o, ref_l = forward(*(t.double() for t in args[:3]), *args[3:], torch.float64, s64)
            base_o, base_l = forward(*args, dt, sink)
            check(out[b:b + 1], ref_o, base_o, 1e-5, f"out, {what}", ulps=1)
            check(lse[b:b + 1], ref_l, base_l, 1e-5, f"lse, {what}", ulps=1)


def test_torch_compile_fullgraph():
    """Appending into pages and the split decode path trace whole under torch.compile (no host reads while
    compiling) and give eager's results and cache contents."""
    g = torch.Generator().manual_seed(0)
    pages = [torch.randn(8, 16, 2, 16, dtype=torch.float64, generator=g) for _ in range(2)]
    table = torch.randperm(8, generator=g).view(2, 4).to(torch.int32)
    q = torch.randn(2, 1, 8, 16, dtype=torch.float64, generator=g)
    k, v = (torch.randn(2, 1, 2, 16, dtype=torch.float64, generator=g) for _ in range(2))
    lengths = torch.tensor([40, 7], dtype=torch.int32)

    def step(q, kp, vp, k, v, lengths):
        return flashcute.flash_attn_with_kvcache(q, kp, vp, k, v, cache_seqlens=lengths, page_table=table,
                                                 causal=True, num_splits=3)

    eager_k, eager_v = (t.clone() for t in pages)
    eager = step(q, eager_k, eager_v, k, v, lengths)
    comp_k, comp_v = (t.clone() for t in pages)
    compiled = torch.compile(step, fullgraph=True)(q, comp_k, comp_v, k, v, lengths)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert torch.equal(eager_k, comp_k) and torch.equal(eager_v, comp_v)
