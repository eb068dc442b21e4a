"""Command-line flags and the benchmark grid. Pure Python: no torch, no GPU."""
import argparse
import os
from dataclasses import dataclass, field

DTYPES = ("bf16", "fp16")
MODES = ("fwd", "bwd", "fwdbwd")
PEERS = ("flash", "efficient", "cudnn")
DEFAULT_IMPLS = PEERS + ("flashcute",)
# flashcute-det: flashcute with deterministic=True (bit-identical backward), timed beside the default on request;
# flashcute-tiles: FLASHCUTE_FWD_GRID=tiles (one CTA per tile in the Hopper forward), likewise;
# flashcute-heads: FLASHCUTE_FWD_ORDER=heads (the forward's tiles head by head, not in sections), likewise.
# fa4: FlashAttention-4, skipped where it does not import.
IMPLS = DEFAULT_IMPLS + ("flashcute-det", "flashcute-tiles", "flashcute-heads", "fa4")

FULL_GRID = {"dtype": ["bf16", "fp16"], "hdim": [64, 128, 256], "seqlen": [512, 1024, 2048, 4096, 8192, 16384],
             "causal": [False, True]}
QUICK_GRID = {"dtype": ["bf16"], "hdim": [64, 128], "seqlen": [1024, 4096, 16384], "causal": [False, True]}

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


@dataclass(frozen=True)
class Case:
    """One attention shape: q, k are (b, s, h, d), v (b, s, h, dv or d); Sq == Sk == s, H == Hkv."""
    dtype: str
    d: int
    causal: bool
    s: int
    b: int
    h: int
    dv: int = None  # V's and O's head dim where it differs from d

    def v_dim(self):
        return self.dv or self.d

    def label(self):
        dims = f"{self.d}/{self.dv}" if self.dv else f"{self.d}"
        return f"{self.dtype} d={dims} {'causal' if self.causal else 'full'} s={self.s} b={self.b} h={self.h}"


@dataclass
class Config:
    dtypes: list
    hdims: list
    seqlens: list
    causals: list
    modes: list
    impls: list
    archs: list = field(default_factory=lambda: [None])
    libs: list = field(default_factory=list)
    configs: list = field(default_factory=list)
    hdim_v: int = None
    tokens: int = 16384
    width: int = 2048
    quick: bool = False
    out: str = DEFAULT_OUT
    readme: bool = False
    plots: bool = True
    ceilings: bool = True
    dry_run: bool = False
    from_json: str = ""
    target_s: float = 0.3
    rounds: int = 3
    warmup: int = 5
    min_reps: int = 10
    max_reps: int = 200
    tol_out: float = 2e-2
    tol_grad: float = 5e-2


def _csv(text):
    return [t.strip() for t in str(text).split(",") if t.strip()]


def _int(text, what):
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"not a {what}: {text!r}") from None


def parse_seqlen(text):
    """'512' -> 512, '4k' -> 4096, '16K' -> 16384."""
    t = text.strip().lower()
    if t.endswith("k"):
        return _int(t[:-1], "seqlen") * 1024
    return _int(t, "seqlen")


def parse_bool(text):
    t = text.strip().lower()
    if t in ("1", "true", "yes", "y", "causal", "on"):
        return True
    if t in ("0", "false", "no", "n", "full", "noncausal", "non-causal", "off"):
        return False
    raise ValueError(f"not a causal value: {text!r}")


def parse_arch(text):
    """'120' or 'sm120' -> '120'; 'native', 'default', 'none' or '' -> None (FLASHCUTE_ARCH left unset)."""
    t = text.strip().lower()
    if t in ("", "native", "default", "none"):
        return None
    if t.startswith("sm_"):
        t = t[3:]
    elif t.startswith("sm"):
        t = t[2:]
    if not t.isdigit():
        raise ValueError(f"not an arch: {text!r}")
    return t


def parse_lib(text):
    """'LABEL=PATH' -> (label, path)."""
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise ValueError(f"--lib takes LABEL=PATH, got {text!r}")
    return label, path


def _impl_name(text):
    t = text.strip().lower()
    if t.startswith("sdpa-") or t.startswith("sdpa_"):
        t = t[5:]
    if t == "eff":
        t = "efficient"
    if t not in IMPLS:
        raise ValueError(f"unknown impl {text!r}; choose from {', '.join(IMPLS)}")
    return t


def build_parser():
    p = argparse.ArgumentParser(
        prog="bench/run.py",
        description="Time flashcute against PyTorch SDPA (flash, efficient, cuDNN) on the GPU it finds.")
    g = p.add_argument_group("grid (comma lists; defaults: the full grid, or the quick one with --quick)")
    g.add_argument("--dtype", help="bf16,fp16")
    g.add_argument("--hdim", help="head dims, e.g. 64,128,256")
    g.add_argument("--hdim-v", type=int, help="V's head dim for every case, where it differs (e.g. --hdim 192 "
                                              "--hdim-v 128: DeepSeek's shape)")
    g.add_argument("--seqlen", help="e.g. 512,1k,2k,4k,8k,16k")
    g.add_argument("--causal", help="0,1 (also true/false, causal/full)")
    g.add_argument("--mode", default=",".join(MODES), help="fwd,bwd,fwdbwd (default all)")
    g.add_argument("--impl", default=",".join(DEFAULT_IMPLS),
                   help="flash,efficient,cudnn,flashcute (default), flashcute-det (deterministic backward), "
                        "flashcute-tiles (the Hopper forward with one CTA per tile, not its persistent grid), "
                        "flashcute-heads (the forward's tiles head by head, not in sections) "
                        "and fa4 (FlashAttention-4, where it imports)")
    g.add_argument("--arch", help="FLASHCUTE_ARCH values, each timed as its own impl, e.g. 120,80 or native,120")
    g.add_argument("--lib", action="append", default=[], metavar="LABEL=PATH",
                   help="another build of libflashcute.so, timed as flashcute@LABEL beside the one loaded "
                        "(A/B in one process; scripts/ab_tree.sh builds them); repeatable")
    g.add_argument("--config", help="kernel config names (comma list), each timed as flashcute:<tile> with "
                                    "FLASHCUTE_CONFIG set, beside dispatch's choice; a config serves its own "
                                    "direction, dtype and head dims only")
    g.add_argument("--tokens", type=int, default=16384, help="batch = tokens // seqlen (default 16384)")
    g.add_argument("--width", type=int, default=2048, help="nheads = width // head_dim (default 2048)")
    g.add_argument("--quick", action="store_true", help="bf16, hdim 64/128, seqlen 1k/4k/16k, causal and not")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=DEFAULT_OUT, help="folder for results.json/.csv and plots (default bench/out)")
    o.add_argument("--readme", action="store_true", help="also write bench/results/PERFORMANCE.md with the plots")
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    o.add_argument("--no-ceilings", action="store_true", help="skip the matmul and copy ceilings")
    o.add_argument("--dry-run", action="store_true", help="print the grid and exit (no GPU needed)")
    o.add_argument("--from-json", default="", metavar="PATH",
                   help="re-render the table, plots and --readme page from a saved results.json (no GPU needed)")
    t = p.add_argument_group("timing and checking")
    t.add_argument("--target-s", type=float,
                   help="seconds of timed reps per measurement, split over its rounds (default 0.3, quick 0.2)")
    t.add_argument("--rounds", type=int, default=3,
                   help="timing rounds per shape, the impls in a rotated order each round; a measurement is the "
                        "median of its rounds (default 3)")
    t.add_argument("--warmup", type=int, default=5, help="warm-up calls per measurement")
    t.add_argument("--min-reps", type=int, default=10)
    t.add_argument("--max-reps", type=int, default=200)
    t.add_argument("--tol-out", type=float, default=2e-2, help="max|out-ref| / max|ref| allowed")
    t.add_argument("--tol-grad", type=float, default=5e-2, help="same for dq, dk, dv")
    return p


def parse_args(argv=None):
    """Flags -> Config. Grid flags left out take the full grid, or the quick grid with --quick."""
    parser = build_parser()
    a = parser.parse_args(argv)
    grid = QUICK_GRID if a.quick else FULL_GRID
    try:
        dtypes = _csv(a.dtype) if a.dtype else list(grid["dtype"])
        for dt in dtypes:
            if dt not in DTYPES:
                raise ValueError(f"unknown dtype {dt!r}; choose from {', '.join(DTYPES)}")
        hdims = [_int(x, "head_dim") for x in _csv(a.hdim)] if a.hdim else list(grid["hdim"])
        seqlens = [parse_seqlen(x) for x in _csv(a.seqlen)] if a.seqlen else list(grid["seqlen"])
        causals = _unique([parse_bool(x) for x in _csv(a.causal)]) if a.causal else list(grid["causal"])
        modes = _csv(a.mode)
        for m in modes:
            if m not in MODES:
                raise ValueError(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
        impls = _unique([_impl_name(x) for x in _csv(a.impl)])
        archs = _unique([parse_arch(x) for x in _csv(a.arch)]) if a.arch else [None]
        libs = [parse_lib(x) for x in a.lib]
        configs = _unique(_csv(a.config)) if a.config else []
    except ValueError as e:
        parser.error(str(e))
    return Config(dtypes=dtypes, hdims=hdims, hdim_v=a.hdim_v, seqlens=seqlens, causals=causals, modes=modes,
                  impls=impls, archs=archs, libs=libs, configs=configs, tokens=a.tokens, width=a.width,
                  quick=a.quick, out=a.out, readme=a.readme,
                  plots=not a.no_plots, ceilings=not a.no_ceilings, dry_run=a.dry_run, from_json=a.from_json,
                  target_s=a.target_s if a.target_s is not None else (0.2 if a.quick else 0.3),
                  rounds=max(1, a.rounds), warmup=a.warmup, min_reps=a.min_reps, max_reps=a.max_reps,
                  tol_out=a.tol_out, tol_grad=a.tol_grad)


def _unique(items):
    seen = []
    for x in items:
        if x not in seen:
            seen.append(x)
    return seen


def build_cases(cfg):
    """The grid as Cases, ordered dtype, head_dim, causal, seqlen (so plots and tables read in order)."""
    cases = []
    for dtype in cfg.dtypes:
        for d in cfg.hdims:
            for causal in cfg.causals:
                for s in cfg.seqlens:
                    cases.append(Case(dtype=dtype, d=d, causal=causal, s=s,
                                      b=max(1, cfg.tokens // s), h=max(1, cfg.width // d),
                                      dv=cfg.hdim_v if cfg.hdim_v and cfg.hdim_v != d else None))
    return cases
