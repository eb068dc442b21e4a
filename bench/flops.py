"""FLOP counts for attention, as FlashAttention reports them. Pure Python: no torch, no GPU.

Forward: 2 matmuls per visible (query, key) pair, 2·(D + Dv) FLOPs per pair (= 4·D when Dv == D).
Backward is counted as 2.5× the forward (5 matmuls instead of 2), forward+backward as 3.5×.
Visibility follows DESIGN.md §1 (bottom-right aligned): key j is visible to query i iff
j >= i + (Sk - Sq) - left and j <= i + (Sk - Sq) + right; None = unbounded (negative sides are offsets); causal
means right = 0.
"""
from functools import lru_cache

MODE_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


def _bound(x):
    return None if x is None else int(x)


def _window(causal, window):
    left, right = (None, None) if window is None else (_bound(window[0]), _bound(window[1]))
    if causal:
        right = 0
    return left, right


@lru_cache(maxsize=4096)
def _count_pairs(sq, sk, left, right):
    off = sk - sq
    total = 0
    for i in range(sq):
        lo = 0 if left is None else max(0, i + off - left)
        hi = sk - 1 if right is None else min(sk - 1, i + off + right)
        if hi >= lo:
            total += hi - lo + 1
    return total


def visible_pairs(sq, sk, causal=False, window=(None, None)):
    """Exact number of (query, key) pairs that the mask leaves visible (one batch, one head)."""
    left, right = _window(causal, window)
    if left is None and right is None:
        return sq * sk
    return _count_pairs(int(sq), int(sk), left, right)


def attn_pairs(sq, sk, causal=False, window=(None, None), exact=False):
    """Pairs to count FLOPs over. FlashAttention's convention for plain causal with Sq == Sk is Sq·Sk / 2
    (what the peers in DESIGN.md §6 were measured with); every other masked case counts pairs exactly."""
    left, right = _window(causal, window)
    if not exact and causal and left is None and sq == sk:
        return sq * sk / 2
    return visible_pairs(sq, sk, causal, window)


def attn_flops(b, h, sq, sk, d, dv=None, causal=False, window=(None, None), mode="fwd", exact=False):
    """FLOPs of one attention call in `mode` ('fwd', 'bwd' or 'fwdbwd')."""
    dv = d if dv is None else dv
    fwd = 2.0 * b * h * attn_pairs(sq, sk, causal, window, exact) * (d + dv)
    return fwd * MODE_FACTOR[mode]


def tflops(flops, ms):
    """TFLOP/s from a FLOP count and milliseconds; None when the time is missing or not positive."""
    if ms is None or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12
