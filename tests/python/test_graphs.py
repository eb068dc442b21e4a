"""CUDA graphs and torch.compile on the GPU path: capture + replay of forward and backward (fixed length, varlen
with device-side offsets, and FlashAttention-4's padded varlen form) gives eager's bits; torch.compile (inductor,
and reduce-overhead, which captures graphs itself) gives eager's values. Skipped without CUDA."""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from flashcute import flash_attn_func, flash_attn_varlen_func  # noqa: E402

pytestmark = pytest.mark.usefixtures("flashcute_library")


def fixed_step(deterministic):
    def step(q, k, v, dout, dlse):
        out, lse = flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
        return (out, lse, *torch.autograd.grad((out, lse), (q, k, v), (dout, dlse)))
    return step


def varlen_step(cu_q, cu_k, max_q, max_k, deterministic):
    def step(q, k, v, dout, dlse):
        out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, causal=True, window_size=(300, None),
                                          deterministic=deterministic, max_seqlen_q=max_q, max_seqlen_k=max_k)
        return (out, lse, *torch.autograd.grad((out, lse), (q, k, v), (dout, dlse)))
    return step


def fixed_inputs(head_dim=128):
    def make(gen):
        q, k, v = (torch.randn(2, 1024, h, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for h in (8, 2, 2))
        dout = torch.randn(2, 1024, 8, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        return q, k, v, dout, torch.randn(2, 8, 1024, device="cuda", generator=gen)
    return make


LENGTHS_Q, LENGTHS_K = (300, 1, 0, 723), (500, 37, 12, 1000)


def varlen_inputs(gen):
    tq, tk = sum(LENGTHS_Q) + 16, sum(LENGTHS_K)  # 16 padding rows past the last sequence
    q = torch.randn(tq, 8, 64, device="cuda", dtype=torch.float16, generator=gen)
    k, v = (torch.randn(tk, 4, 64, device="cuda", dtype=torch.float16, generator=gen) for _ in range(2))
    return q, k, v, torch.randn_like(q), torch.randn(8, tq, device="cuda", generator=gen)


def offsets(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device="cuda")


def capture(fn, warmup=None, warmups=1, mode="global"):
    """Runs `warmup` (default: `fn`) on a side stream, as torch.cuda.graph asks, then captures `fn`: (graph, what
    the captured call returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            (warmup or fn)()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=mode):
        results = fn()
    return graph, results


def capture_and_compare(step, make_inputs, mode, exact_grads):
    gen = torch.Generator(device="cuda").manual_seed(0)
    static = [t.clone() for t in make_inputs(gen)]
    for t in static[:3]:
        t.requires_grad_()
    graph, results = capture(lambda: step(*static), warmups=2, mode=mode)
    for trial in range(3):  # new values in the static inputs; each replay must match eager on those values
        fresh = make_inputs(gen)
        with torch.no_grad():
            for s, f in zip(static, fresh):
                s.copy_(f)
        graph.replay()
        eager = step(*(t.detach().clone().requires_grad_(i < 3) for i, t in enumerate(static)))
        torch.cuda.synchronize()
        for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), results, eager):
            # The default backward adds dq (and GQA's dk, dv) with float atomics, in an order that varies between
            # runs, eager or replayed; deterministic mode fixes it.
            if name.startswith("d") and not exact_grads:
                torch.testing.assert_close(got, want, msg=f"replay {trial}: {name}")
            else:
                assert torch.equal(got, want), f"replay {trial}: {name} differs from eager"


# On Hopper the head dims take different backward kernels: with a dQ writer thread in deterministic mode at hd64 and
# hd128 and in both modes at hd192, with atomics from the MMA warps otherwise (src/sm90/bwd_launch.cuh).
@pytest.mark.parametrize("head_dim", [64, 128, 192])
@pytest.mark.parametrize("mode", ["global", "relaxed"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_graph_fixed_length(head_dim, mode, deterministic):
    capture_and_compare(fixed_step(deterministic), fixed_inputs(head_dim), mode, exact_grads=deterministic)


def hd256_inputs(gen):
    q, k, v = (torch.randn(1, 512, h, 256, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (4, 2, 2))
    dout = torch.randn(1, 512, 4, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    return q, k, v, dout, torch.randn(1, 4, 512, device="cuda", generator=gen)


# The portable hd256 tiles (the 99 KB one holds V in registers; deterministic mode orders dQ by turns) under capture,
# through the arch profiles that pick them.
@pytest.mark.parametrize("arch", ["80", "86"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_graph_portable_hd256(arch, deterministic, monkeypatch):
    monkeypatch.setenv("FLASHCUTE_ARCH", arch)
    capture_and_compare(fixed_step(deterministic), hd256_inputs, "global", exact_grads=deterministic)


@pytest.mark.parametrize("mode", ["global", "relaxed"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_graph_varlen_device_offsets(mode, deterministic):
    step = varlen_step(offsets(LENGTHS_Q), offsets(LENGTHS_K), max(LENGTHS_Q), max(LENGTHS_K), deterministic)
    capture_and_compare(step, varlen_inputs, mode, exact_grads=deterministic)


def padded_step(used_q, used_k, deterministic):
    """FlashAttention-4's padded form of flash_attn_varlen_func (no offsets; seqused per sequence): no host read."""
    def step(q, k, v, dout, dlse):
        out, lse = flash_attn_varlen_func(q, k, v, seqused_q=used_q, seqused_k=used_k, causal=True,
                                          deterministic=deterministic)
        return (out, lse, *torch.autograd.grad((out, lse), (q, k, v), (dout, dlse)))
    return step


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_graph_varlen_padded_batch(deterministic):
    used = [torch.tensor(n, dtype=torch.int32, device="cuda") for n in ((1024, 300), (700, 1024))]
    capture_and_compare(padded_step(*used, deterministic), fixed_inputs(), "global", exact_grads=deterministic)


def test_graph_varlen_without_maxima_is_refused_clearly():
    q, k, v, _, _ = varlen_inputs(torch.Generator(device="cuda").manual_seed(1))
    cu_q, cu_k = offsets(LENGTHS_Q), offsets(LENGTHS_K)
    flash_attn_varlen_func(q, k, v, cu_q, cu_k)  # eager: fine
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="max_seqlen_q and max_seqlen_k"):
        with torch.cuda.graph(graph):
            flash_attn_varlen_func(q, k, v, cu_q, cu_k)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_compile_on_the_gpu(mode, deterministic):
    torch._dynamo.reset()
    gen = torch.Generator(device="cuda").manual_seed(2)
    inputs = fixed_inputs()(gen)

    def step(q, k, v, dout, dlse):
        out, lse = flash_attn_func(q, k, v, causal=True, window_size=(256, None), deterministic=deterministic)
        loss = (out.float() * dout.float()).sum() + (lse * dlse).sum()
        return (out, lse, *torch.autograd.grad(loss, (q, k, v)))

    compiled = torch.compile(step, mode=mode, fullgraph=False)
    for _ in range(3):  # reduce-overhead records its graph on a later call
        leaves = [t.clone().requires_grad_(i < 3) for i, t in enumerate(inputs)]
        got = [t.clone() for t in compiled(*leaves)]
    want = step(*(t.clone().requires_grad_(i < 3) for i, t in enumerate(inputs)))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, msg=name)


def test_compile_varlen_padded_batch():
    """The padded varlen form traces whole (fullgraph) under torch.compile; its backward then runs from the
    compiled graph."""
    torch._dynamo.reset()
    q, k, v, dout, dlse = fixed_inputs()(torch.Generator(device="cuda").manual_seed(4))
    used_q = torch.tensor([1024, 300], dtype=torch.int32, device="cuda")
    used_k = torch.tensor([700, 1024], dtype=torch.int32, device="cuda")

    def fwd(q, k, v):
        return flash_attn_varlen_func(q, k, v, seqused_q=used_q, seqused_k=used_k, causal=True, deterministic=True)

    results = []
    for f in (torch.compile(fwd, fullgraph=True), fwd):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse = f(*leaves)
        results.append((out, lse, *torch.autograd.grad((out, lse), leaves, (dout, dlse))))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), *results):
        torch.testing.assert_close(a, b, msg=name)


def test_graph_backward_alone():
    # The forward runs eagerly, on the stream the graph then captures on (autograd runs each backward op on its
    # forward's stream, so a forward on another stream could not be captured by any library); only the backward
    # is captured, then replayed for new cotangents.
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, dout, dlse = fixed_inputs()(gen)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out, lse = flash_attn_func(*leaves, causal=True, deterministic=True)
        torch.autograd.grad((out, lse), leaves, (dout, dlse), retain_graph=True)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        grads = torch.autograd.grad((out, lse), leaves, (dout, dlse), retain_graph=True)
    dout.copy_(torch.randn(dout.shape, device="cuda", dtype=dout.dtype, generator=gen))
    graph.replay()
    torch.cuda.synchronize()
    want = torch.autograd.grad((out, lse), leaves, (dout, dlse), retain_graph=True)
    for name, a, b in zip(("dq", "dk", "dv"), grads, want):
        assert torch.equal(a, b), f"{name} differs from eager"


def test_kvcache_decode_with_append_replays():
    """flash_attn_with_kvcache (paged, appending one token per step, device-side cache_seqlens) captured once and
    replayed for several decode steps gives eager's bits and the same cache contents."""
    from flashcute import flash_attn_with_kvcache
    gen = torch.Generator(device="cuda").manual_seed(3)
    batch, page, pages_per_seq, hkv, d = 3, 16, 8, 2, 64
    k_pages, v_pages = (torch.randn(batch * pages_per_seq, page, hkv, d, device="cuda", dtype=torch.bfloat16,
                                    generator=gen) for _ in range(2))
    table = torch.randperm(batch * pages_per_seq, device="cuda", generator=gen).view(batch, -1).to(torch.int32)
    steps = [(torch.randn(batch, 1, 8, d, device="cuda", dtype=torch.bfloat16, generator=gen),
              torch.randn(batch, 1, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen),
              torch.randn(batch, 1, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)) for _ in range(4)]
    start = torch.tensor([5, 70, 100], dtype=torch.int32, device="cuda")

    def step(q, k, v, kc, vc, lengths):
        out, lse = flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lengths, page_table=table, causal=True)
        lengths += 1
        return out, lse

    eager_k, eager_v, eager_len = k_pages.clone(), v_pages.clone(), start.clone()
    eager = [step(q, k, v, eager_k, eager_v, eager_len) for q, k, v in steps]

    sq, sk, sv = (t.clone() for t in steps[0])
    gk, gv, glen = k_pages.clone(), v_pages.clone(), start.clone()
    # warm-up on copies, so the graph's cache starts where eager's did
    graph, (g_out, g_lse) = capture(lambda: step(sq, sk, sv, gk, gv, glen),
                                    warmup=lambda: step(sq, sk, sv, gk.clone(), gv.clone(), glen.clone()))
    for (q, k, v), (e_out, e_lse) in zip(steps, eager):
        sq.copy_(q), sk.copy_(k), sv.copy_(v)
        graph.replay()
        assert torch.equal(g_out, e_out) and torch.equal(g_lse, e_lse)
    assert torch.equal(gk, eager_k) and torch.equal(gv, eager_v) and torch.equal(glen, eager_len)


# Split-KV decode (the split kernel, then the combine kernel) captured once: a replay on new values gives eager's
# bits, and the split result stays close to the unsplit one, on the Hopper and the portable kernels.
@pytest.mark.parametrize("arch", [None, "120", "80"])
@pytest.mark.parametrize("splits", [7, 16])
def test_kvcache_split_decode_replays(arch, splits, monkeypatch):
    from flashcute import flash_attn_with_kvcache
    if arch:
        monkeypatch.setenv("FLASHCUTE_ARCH", arch)
    gen = torch.Generator(device="cuda").manual_seed(11)
    batch, cache, hkv, d = 2, 3000, 2, 128

    def make():
        q = torch.randn(batch, 1, 8, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        kc, vc = (torch.randn(batch, cache, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                  for _ in range(2))
        return q, kc, vc

    lengths = torch.tensor([cache, 1111], dtype=torch.int32, device="cuda")

    def step(q, kc, vc, num_splits=splits):
        return flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, causal=True, num_splits=num_splits)

    static = make()
    graph, (g_out, g_lse) = capture(lambda: step(*static))
    for trial in range(3):
        for s, f in zip(static, make()):
            s.copy_(f)
        graph.replay()
        e_out, e_lse = step(*static)
        whole_out, whole_lse = step(*static, num_splits=1)
        torch.cuda.synchronize()
        assert torch.equal(g_out, e_out) and torch.equal(g_lse, e_lse), f"replay {trial} differs from eager"
        torch.testing.assert_close(e_out, whole_out, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(e_lse, whole_lse, atol=1e-4, rtol=1e-4)
