"""The one explicit list of kernel instantiations. Everything else (the config table dispatch reads, the
generated .cu files, the CI subset) is derived from it by generate.py.

Compile-time axes: family (sm80 portable / sm90 Hopper), direction, dtype, head dim and the tile. Everything else
(causal, window, softcap, GQA, varlen, strides, seqlens) is a runtime argument.

Each entry: (family, direction, head_dim, block_m, block_n, warps, ctas_per_sm, priority, why); head_dim is a
pair (head_dim, head_dim_v) for a kernel whose V and O have a head dim of their own (dispatch prefers it where it
covers both with less padding).
ctas_per_sm is the occupancy the tile is meant for: dispatch only picks it where smem * ctas_per_sm fits the
profile's shared memory per SM. Among fitting configs the highest priority wins. ROW_RANGES below narrows some
configs to the query rows per head (seqlen_q, packed rows included) they were measured to win at.
"""

DTYPES = ("fp16", "bf16")

# Forward, portable mma.sync path. Two tile sets: one for the big-smem parts (sm_80/87: 163 KB, sm_90/100/110:
# 227 KB) and one for the 99 KB parts (sm_86/89/120/121), where DESIGN.md section 4 asks for two CTAs per SM
# when the tile allows it.
FWD_SM80 = [
    # hd64: 128x128 (FA2's tile; ptxas spills 104 B on sm_90a, 248 B in its decode instantiation; 255 registers, so
    # two CTAs per SM on every profile) ran 1.03-1.08x FA2 under FLASHCUTE_ARCH=80 and =86 against 0.89-1.04x for
    # the spill-free 128x64 it replaced; 128x128 w8, 128x64 w8 and 64x128 w4 ran 0.53-0.91x (bench/RESULTS.md,
    # twenty-second session, run 1).
    ("sm80", "fwd", 64, 128, 128, 4, 2, 2, "48 KB, two CTAs on every profile; spills"),
    # hd96: 128x32 (spill-free on sm_80, sm_90a and sm_120) replaced 128x64, which spilled 12 B on sm_80. Its speed
    # is not measured; on the H200, hd96 runs the Hopper family.
    ("sm80", "fwd", 96, 128, 32, 4, 2, 1, "36 KB, two CTAs on every profile"),
    # hd128: 128x64 (168 B of ptxas spills on sm_90a, 148-184 B on every target) beats the spill-free 128x32 by
    # 9-18% where two of its CTAs fit an SM (163/227 KB parts), and loses 6-14% where one does (99 KB parts);
    # under FLASHCUTE_ARCH=80 it runs 1.06-1.10x FA2 (bench/RESULTS.md, ninth session, run 3). 128x32 is
    # spill-free on every target.
    ("sm80", "fwd", 128, 128, 64, 4, 2, 2, "64 KB, two CTAs on 163/227 KB parts; spills"),
    ("sm80", "fwd", 128, 128, 32, 4, 2, 1, "48 KB: two CTAs on every profile"),
    ("sm80", "fwd", 192, 128, 64, 8, 1, 2, "96 KB, 8 warps"),
    ("sm80", "fwd", 192, 64, 64, 4, 1, 1, "72 KB for 99 KB parts"),
    ("sm80", "fwd", 256, 128, 64, 8, 1, 2, "128 KB, 8 warps: 163/227 KB parts only"),
    ("sm80", "fwd", 256, 64, 64, 4, 1, 1, "96 KB: fits 99 KB parts"),
    # hd128 with at most 64 query rows per head (decode, its query heads packed; ROW_RANGES, where the 128-row tiles
    # above serve the rest, so the Hopper tiles' higher priorities still win on sm_90): at 128 rows the
    # mma.sync work of a K/V tile takes about as long as its load at the H200's per-SM bandwidth, so the 128-row
    # tiles read a decode cache at 23-46% of the copy ceiling. Under the occupancy-faithful emulation (bench/RESULTS.md,
    # twentieth session, run 5; batch 64, 32k-128k keys) 64x128 (FA2's split-KV tile) read at 79-88% on the 163 KB
    # profile, two CTAs per SM, and 60-64% on the 99 KB one, one CTA; 64x64 at 74-78% on both, two CTAs.
    ("sm80", "fwd", 128, 64, 128, 4, 2, 2, "80 KB, up to 64 query rows: two CTAs on 163/227 KB parts"),
    ("sm80", "fwd", 128, 64, 64, 4, 2, 1, "48 KB, up to 64 query rows: two CTAs on 99 KB parts"),
]

# Backward, portable mma.sync path (FA2's design: one CTA per key tile, dQ added into a float32 workspace).
# Shared memory: Q with its rows' lse_log2 and D, dO (block_m x D), K, V (block_n x D), P, dS (block_m x block_n),
# plus a second Q stage when that keeps the tile inside the profile class it was sized for (99 / 163 / 227 KB), and
# beside it a second dO stage where that fits the class too (1.02-1.06x the tiles with one dO stage: bench/RESULTS.md,
# 2026-12-07 sixteenth session). Tiles in BWD_V_IN_REGS hold V in registers, P and dS taking its shared memory.
# Mirrors bwd_double_buffer_q(), bwd_double_buffer_do() and SharedStorage in src/sm80/bwd_traits.cuh, which
# static_asserts the result.
_SMEM_CLASSES = (101376, 166912, 232448)


def _bwd_smem_class(nbytes):
    return next((i for i, c in enumerate(_SMEM_CLASSES) if nbytes <= c), len(_SMEM_CLASSES))


def bwd_smem_bytes(head_dim, block_m, block_n, warps, v_in_regs=False):
    q_stage = 2 * block_m * head_dim + 8 * block_m  # Q plus its rows' lse_log2 and D (float32)
    v, pds = block_n * head_dim, 2 * block_m * block_n
    single = q_stage + 2 * (block_m * head_dim + block_n * head_dim + (max(v, pds) if v_in_regs else v + pds))
    double = _bwd_smem_class(single + q_stage) == _bwd_smem_class(single)
    do_stage = 2 * block_m * head_dim  # a second dO stage beside the second Q stage, where it too fits the class
    double_do = double and _bwd_smem_class(single + q_stage + do_stage) == _bwd_smem_class(single)
    return single + (q_stage if double else 0) + (do_stage if double_do else 0)


# Two tile sets: 163/227 KB parts (priority 2) and 99 KB parts (priority 1). block_n sets how often Q/dO are re-read
# and how many dQ additions each query row receives, so it stays as large as the part allows. The fastest measured
# tile ships even where ptxas spills a few bytes (spill stores on sm_90a in brackets): timed under the
# occupancy-faithful FLASHCUTE_ARCH=80 / 86 on the H200 (bench/RESULTS.md, ninth session, run 3), the big-smem
# tiles beat the spill-free ones they replace by 4-13% (hd64 128x128 vs 64x128), 21-40% (hd128 64x128 vs 64x64),
# 17-24% (hd192 64x64 vs 32x64) and 19-25% (hd256 64x64 vs 32x64); on 99 KB parts hd128 32x128 beats 64x64 by 2-9%.
# hd256 on 99 KB parts: 64x32 on 8 warps with V in registers (BWD_V_IN_REGS; 104.5 KB with V in shared memory) runs
# 1.11-1.19x the 32x32 w4 tile it replaced (bench/RESULTS.md, 2026-12-06); at hd128 the same change
# (64x64 w8, V in registers) measured 0.96-1.02x 32x128 and was not kept.
BWD_SM80 = [
    ("sm80", "bwd", 64, 128, 128, 8, 1, 2, "162 KB, Q and dO double-buffered"),
    ("sm80", "bwd", 64, 64, 128, 8, 1, 1, "97 KB, Q and dO double-buffered: 99 KB parts"),
    ("sm80", "bwd", 96, 64, 128, 8, 1, 2, "129 KB, Q and dO double-buffered"),
    ("sm80", "bwd", 96, 64, 64, 8, 1, 1, "89 KB, Q and dO double-buffered: 99 KB parts"),
    ("sm80", "bwd", 128, 64, 128, 8, 1, 2, "161 KB, Q and dO double-buffered"),
    ("sm80", "bwd", 128, 32, 128, 8, 1, 1, "96.25 KB, single Q stage: 99 KB parts"),
    ("sm80", "bwd", 192, 64, 64, 8, 1, 2, "161 KB, Q and dO double-buffered"),
    ("sm80", "bwd", 192, 32, 64, 8, 1, 1, "92.5 KB, Q double-buffered: 99 KB parts"),
    ("sm80", "bwd", 256, 64, 64, 8, 1, 2, "144.5 KB, single Q stage (52 B)"),
    ("sm80", "bwd", 256, 64, 32, 8, 1, 1, "96.5 KB, V in registers, single Q stage: 99 KB parts (16 B)"),
]

# Portable backward tiles whose V stays in registers for the whole key tile (the B operand of dP = dO V^T, FA2's
# Is_V_in_regs), P and dS taking V's shared memory: (head_dim, block_m, block_n, warps). Their config names end in
# "vr", so the same tile with V in shared memory keeps its own name.
BWD_V_IN_REGS = {(256, 64, 32, 8)}

# Forward, Hopper wgmma path (sm_90a: needs wgmma, which no other profile declares), warp-specialised: one consumer
# warpgroup per 64 query rows plus a producer warpgroup (warps counts the consumers; TMA for fixed-length batches
# and most paged caches, cp.async for varlen), two K/V stages, and an O buffer where it fits (kOwnO: all but hd192,
# hd256 and the n176 candidate). Key tiles whose width is no multiple of 32 (hd128 n176, hd192 n112, hd256 n80)
# measured 2-30% slower until 2026-12-06 (bench/RESULTS.md, eighth and twenty-seventh sessions): CuTe had built their
# S = Q K^T from 64 x 16 wgmmas (src/sm90/wgmma.cuh). As full-width wgmmas, hd192 n112 and hd256 n80 (FA3's and
# FA4's tiles) ran 0.95-1.15x n96 / n64 from 2k query rows (1.00-1.15x in the run beside FA4), 0.92-1.04x at 1k: they
# serve from 2k (ROW_RANGES); hd128 n176 stays a candidate (0.80-1.08x n128, spilling 84 B). On an H100
# (bench/RESULTS.md, 2026-12-06 seventh session).
FWD_SM90 = [
    ("sm90", "fwd", 64, 128, 128, 8, 1, 3, "97 KB"),
    # hd64 with 192 query rows: three consumer warpgroups taking turns (160 registers each), FA3's and FA4's hd64
    # tile; from 4k query rows (ROW_RANGES) it ran 0.99-1.16x the 128-row tile, at 1k 0.87-0.99x (bench/RESULTS.md,
    # twelfth session, run 2).
    ("sm90", "fwd", 64, 192, 128, 12, 1, 4, "113 KB, from 4k query rows"),
    ("sm90", "fwd", 96, 128, 128, 8, 1, 3, "145 KB"),
    ("sm90", "fwd", 128, 128, 128, 8, 1, 3, "193 KB"),
    ("sm90", "fwd", 192, 128, 96, 8, 1, 3, "193 KB"),
    ("sm90", "fwd", 192, 128, 112, 8, 1, 4, "217 KB, from 2k query rows"),
    # DeepSeek's (192, 128): V and O at their own head dim (a 128-wide P.V and O), 128 keys per tile as FA4 takes:
    # 1.05-1.29x the padded hd192 kernel; 112 keys (room for an O buffer) ran 0.56-0.87x these (bench/RESULTS.md,
    # eighteenth session, runs 2-3).
    ("sm90", "fwd", (192, 128), 128, 128, 8, 1, 3, "209 KB"),
    ("sm90", "fwd", 256, 128, 64, 8, 1, 3, "193 KB"),
    ("sm90", "fwd", 256, 128, 80, 8, 1, 4, "225 KB, from 2k query rows"),
    # At most 64 query rows per head (decode, its query heads packed): one consumer warpgroup halves the MMA work per
    # K/V tile, which at 128 rows takes about as long as the tile's load at the H200's per-SM bandwidth; decode ran
    # 1.08-1.19x the 128-row tile (bench/RESULTS.md, twelfth session, run 2).
    ("sm90", "fwd", 128, 64, 128, 4, 1, 4, "161 KB, up to 64 query rows"),
]

# Backward, Hopper wgmma path: 64 query rows per step (128 at hd64), Q/dO in a ring of stages, two warpgroups. With
# block_n 128 each warpgroup owns 64 of the keys and keeps dK, dV for them in registers (head_dim / 2 floats each per
# thread); with block_n 64 both warpgroups take the same 64 keys and split the head dim (see src/sm90/bwd_traits.cuh).
# hd96 runs the portable kernel: 64x128 here spilled 8 B on sm_90a once the epilogue moved into common/bwd_epilogue.cuh,
# and the spill-free 64x64 ran at 175-214 TFLOP/s on the H200 against the portable 64x128's 220-282 (bench/RESULTS.md,
# sixth session, run D). The sizes below are the tile's own; the kernel with a dQ writer thread (src/sm90/bwd_kernel.cuh,
# bwd_ws_kernel: deterministic mode at hd64 and hd128, both modes at hd192 and (192, 128)) adds a float32 dQ buffer of
# up to 48 KB and a third warpgroup (hd64 then takes two Q/dO stages), still one CTA per SM.
BWD_SM90 = [
    # hd64 takes 128 query rows per step (FA4's hd64 tile): 1.01-1.17x the 64-row tile it replaced, default and
    # deterministic (bench/RESULTS.md, twenty-fourth session, run 8; twenty-fifth, runs 1-3).
    ("sm90", "bwd", 64, 128, 128, 8, 1, 4, "195 KB"),
    ("sm90", "bwd", 128, 64, 128, 8, 1, 3, "194 KB (8 B)"),
    # hd192: FA3's and FA4's tile, 96 keys, 48 per warpgroup, S not transposed and dK^T / dV^T with the head dim as
    # the wgmma rows, one dO stage and one P / dS stage, so that the dQ writer's buffer fits beside it
    # (BwdTraits::kSwapKV): 1.12-1.25x the 64-key tile it replaced, deterministic 1.23-1.40x (bench/RESULTS.md,
    # 2026-12-06 seventh session; before full-width wgmmas, 0.81-0.91x).
    ("sm90", "bwd", 192, 64, 96, 8, 1, 3, "169 KB"),
    # DeepSeek's (192, 128): V, dO and dV 128 wide, on hd192's 96-key tile: 1.10-1.30x the 64-key tile it replaced,
    # deterministic 1.14-1.41x (bench/RESULTS.md, 2026-12-07 eleventh session, on an H100; its cp.async kernels spill
    # 112-188 B). The 64-key tile, ("sm90", "bwd", (192, 128), 64, 64, 8, 1, 3, "154 KB"), had run 1.06-1.12x the
    # padded hd192 kernel (eighteenth session, run 3).
    ("sm90", "bwd", (192, 128), 64, 96, 8, 1, 3, "149 KB"),
    ("sm90", "bwd", 256, 64, 64, 8, 1, 3, "226 KB"),
]

# Tuning candidates (priority 0: never dispatched unless FLASHCUTE_CONFIG names them): FA3's non-causal tiles, with
# the 24 / 240 register split (src/sm90/fwd_traits.cuh), for an A/B against the shipped 128-key tiles: hd64 n192
# (+5% at 16k, -7% at 1k, bench/RESULTS.md eighth session) and hd128 n176 (above).
FWD_SM90_CANDIDATES = [
    ("sm90", "fwd", 64, 128, 192, 8, 1, 0, "candidate: 129 KB"),
    ("sm90", "fwd", 128, 128, 176, 8, 1, 0, "candidate: 209 KB"),
]

# Query rows per head (min, max; None: unbounded) outside which a config does not compete in dispatch (a forced
# FLASHCUTE_CONFIG still runs it). Keyed by (family, direction, head_dim, block_m, block_n, warps); every other
# config serves any rows, so each head dim keeps a config for every row count (tests/cpp/test_dispatch.cpp).
ROW_RANGES = {
    ("sm90", "fwd", 64, 192, 128, 12): (4096, None),
    ("sm90", "fwd", 192, 128, 112, 8): (2048, None),
    ("sm90", "fwd", 256, 128, 80, 8): (2048, None),
    ("sm90", "fwd", 128, 64, 128, 4): (None, 64),
    ("sm80", "fwd", 128, 128, 64, 4): (65, None),
    ("sm80", "fwd", 128, 128, 32, 4): (65, None),
    ("sm80", "fwd", 128, 64, 128, 4): (None, 64),
    ("sm80", "fwd", 128, 64, 64, 4): (None, 64),
}

KERNELS = FWD_SM80 + BWD_SM80 + FWD_SM90 + FWD_SM90_CANDIDATES + BWD_SM90

# The CI subset: every family and direction compiles for every arch target, at a cost a 2-core machine can pay
# (both dtypes' code paths, both tile sets, tuning candidates left out).
CI_CASES = (("fp16", 64), ("bf16", 128))
# Code paths no CI case reaches: the portable backward with V in registers (BWD_V_IN_REGS, hd256 alone).
CI_EXTRA = ("sm80_bwd_fp16_hd256_m64n32w8vr",)
