"""The Hopper forward's persistent grid (src/common/tile_scheduler.cuh): a few CTAs walking every tile through the
tile counter give the bits of one CTA per tile, and pass the float64 reference, for every head dim and feature.

FLASHCUTE_FWD_GRID forces the grid (src/sm90/fwd_launch.cuh): "tiles" one CTA per tile, a number n that many CTAs.
The portable family ignores it, so under another arch profile both runs are the same kernel. Skipped without CUDA.
"""
import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flashcute  # noqa: E402
from test_gpu_grid import (FEATURES, HEAD_DIMS, check_forward, forced_env, make_inputs,  # noqa: E402
                           poison_allocator, stable_seed)


def forced_grid(grid):
    return forced_env("FLASHCUTE_FWD_GRID", grid)


def both_grids(fn, ctas):
    """fn() under one CTA per tile and under `ctas` persistent CTAs; asserts equal bits, returns the second."""
    results = []
    for grid in ("tiles", ctas):
        with forced_grid(grid):
            poison_allocator(1 << 24)
            results.append(fn())
            torch.cuda.synchronize()
    for a, b in zip(*results):
        assert torch.equal(a, b), f"the persistent grid of {ctas} CTAs changed the bits"
    return results[1]


# Fewer CTAs than tiles by far (each walks many, the tile ring and the K/V rings wrap), and one CTA alone.
@pytest.mark.parametrize("ctas", (1, 3))
@pytest.mark.parametrize("sq,sk", [(17, 113), (1013, 1013), (300, 2000)])
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("hd", HEAD_DIMS)
def test_persistent_matches_tiles(hd, feature, sq, sk, ctas):
    dtype = torch.bfloat16 if hd % 128 else torch.float16
    _, _, causal, window, softcap = FEATURES[feature]
    q, k, v = make_inputs(dtype, hd, feature, sq, sk, stable_seed(dtype, hd, feature, sq, sk, "persistent"), 3)
    scale = 1.0 / math.sqrt(hd)
    out, lse = both_grids(lambda: flashcute.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal,
                                                            window_size=window, softcap=softcap), ctas)
    check_forward(q, k, v, out, lse, scale, causal, window, softcap)


@pytest.mark.parametrize("hd", (64, 128, 256))
def test_persistent_varlen_sink(hd):
    # Varlen (the cp.async producer, every producer thread walking), sequences of 0-700 rows, sinks, GQA.
    lens_q, lens_k = [5, 0, 700, 129, 64], [300, 17, 700, 1, 256]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    torch.manual_seed(hd)
    q = torch.randn(sum(lens_q), 8, hd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lens_k), 2, hd, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(lens_k), 2, hd, device="cuda", dtype=torch.bfloat16)
    sink = torch.randn(8, device="cuda")
    out, lse = both_grids(lambda: flashcute.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, causal=True, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
        learnable_sink=sink), 2)
    # Each sequence against one fixed-length call of it.
    for b in range(len(lens_q)):
        if lens_q[b] == 0:
            continue
        qs, ks, vs = (t[c[b]:c[b + 1]][None] for t, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        with forced_grid("tiles"):
            o1, l1 = flashcute.flash_attn_func(qs, ks, vs, causal=True, learnable_sink=sink)
        torch.testing.assert_close(out[cu_q[b]:cu_q[b + 1]], o1[0], atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse[:, cu_q[b]:cu_q[b + 1]], l1[0], atol=1e-3, rtol=1e-3)


def test_persistent_default_grid_many_tiles():
    # More tiles than SMs: the default choice is the persistent grid; it gives the bits of one CTA per tile.
    q = torch.randn(4, 2048, 16, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4, 2048, 4, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(4, 2048, 4, 128, device="cuda", dtype=torch.bfloat16)
    runs = []
    for grid in ("tiles", ""):
        with forced_grid(grid):
            runs.append(flashcute.flash_attn_func(q, k, v, causal=True))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("grid", ("tiles", "persistent"))
@pytest.mark.parametrize("order", ("heads", "1", "3", "7", "1000"))
@pytest.mark.parametrize("hd", (64, 128))
def test_tile_order_keeps_bits(hd, order, grid):
    # The tile order's sections (FLASHCUTE_FWD_ORDER: heads one after the other, sections of n rows, the first taking
    # the remainder, one section for all) change which CTA computes a tile, never its bits. Causal (where the
    # default takes sections), 3 sequences x 5 query heads on one K/V head, a partial last query tile. (The portable
    # family keeps the launch order.)
    torch.manual_seed(hd)
    q = torch.randn(3, 1013, 5, hd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(3, 1013, 1, hd, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(3, 1013, 1, hd, device="cuda", dtype=torch.bfloat16)
    runs = []
    for forced in ("", order):
        with forced_grid(grid), forced_env("FLASHCUTE_FWD_ORDER", forced):
            poison_allocator(1 << 24)
            runs.append(flashcute.flash_attn_func(q, k, v, causal=True))
            torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    check_forward(q, k, v, *runs[1], 1.0 / math.sqrt(hd), True, (None, None), 0.0)
