"""CPU tests of the benchmark suite (bench/): FLOP counting, grid parsing, writers, plots.
They need no GPU; the few that need torch skip without it."""
import csv
import io
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import cli, report  # noqa: E402
from bench.flops import attn_flops, attn_pairs, tflops, visible_pairs  # noqa: E402
from bench.plot import plot_name, plot_records  # noqa: E402
from bench.records import NA, OK, WRONG, Record  # noqa: E402


def brute_pairs(sq, sk, causal, left=None, right=None):
    """Visible pairs straight from DESIGN.md §1, one pair at a time."""
    if causal:
        right = 0
    n = 0
    for i in range(sq):
        for j in range(sk):
            ok = True
            if left is not None:
                ok &= j >= i + (sk - sq) - left
            if right is not None:
                ok &= j <= i + (sk - sq) + right
            n += ok
    return n


# ---------------------------------------------------------------- FLOP counting

def test_noncausal_flops_fa_formula():
    assert attn_flops(2, 16, 1024, 1024, 128) == 4 * 2 * 16 * 1024 * 1024 * 128
    assert attn_flops(1, 3, 100, 300, 64) == 4 * 3 * 100 * 300 * 64


def test_dv_differs_from_d():
    assert attn_flops(2, 4, 64, 96, 128, dv=64) == 2 * 2 * 4 * 64 * 96 * (128 + 64)


def test_causal_square_is_halved():
    assert attn_flops(4, 8, 2048, 2048, 64, causal=True) == attn_flops(4, 8, 2048, 2048, 64) / 2
    # the exact count is the triangle including the diagonal
    assert visible_pairs(7, 7, causal=True) == 7 * 8 // 2 == brute_pairs(7, 7, True)


@pytest.mark.parametrize("sq,sk", [(5, 9), (9, 5), (1, 17), (17, 1), (3, 40), (40, 3), (12, 13)])
def test_causal_rectangular_counts_visible_pairs(sq, sk):
    assert visible_pairs(sq, sk, causal=True) == brute_pairs(sq, sk, True)
    assert attn_pairs(sq, sk, causal=True) == brute_pairs(sq, sk, True)
    assert attn_flops(2, 3, sq, sk, 64, causal=True) == 2 * 2 * 3 * brute_pairs(sq, sk, True) * 128


@pytest.mark.parametrize("sq,sk,causal,left,right", [
    (16, 16, False, 3, 2), (16, 16, True, 4, None), (10, 25, False, 0, 0), (25, 10, True, 2, None),
    (12, 30, False, None, 5), (30, 12, False, 6, None), (8, 8, False, None, 0), (12, 30, False, -1, 5),
    (30, 12, False, 6, -3), (20, 20, True, -4, None), (9, 9, False, 2, -5)])
def test_window_counts_visible_pairs(sq, sk, causal, left, right):
    expect = brute_pairs(sq, sk, causal, left, right)
    assert visible_pairs(sq, sk, causal, (left, right)) == expect
    assert attn_pairs(sq, sk, causal, (left, right)) == expect


def test_exact_flag_counts_square_causal_exactly():
    assert attn_pairs(8, 8, causal=True, exact=True) == brute_pairs(8, 8, True)


def test_backward_is_two_and_a_half_forward():
    fwd = attn_flops(2, 16, 4096, 4096, 128, causal=True)
    assert attn_flops(2, 16, 4096, 4096, 128, causal=True, mode="bwd") == 2.5 * fwd
    assert attn_flops(2, 16, 4096, 4096, 128, causal=True, mode="fwdbwd") == 3.5 * fwd


def test_tflops_matches_peer_csv_row():
    # shared/measurements/h200-peers.csv: b=1, h=32, d=64, s=16384, non-causal flash fwd 7.141024 ms -> 307.94
    assert tflops(attn_flops(1, 32, 16384, 16384, 64), 7.141024112701416) == pytest.approx(307.942, rel=1e-4)
    assert tflops(1e12, None) is None and tflops(1e12, 0) is None


# ---------------------------------------------------------------- CLI and grid

def test_default_grid():
    cfg = cli.parse_args([])
    cases = cli.build_cases(cfg)
    assert cfg.dtypes == ["bf16", "fp16"] and cfg.hdims == [64, 128, 256]
    assert cfg.seqlens == [512, 1024, 2048, 4096, 8192, 16384] and cfg.causals == [False, True]
    assert cfg.modes == ["fwd", "bwd", "fwdbwd"] and cfg.impls == ["flash", "efficient", "cudnn", "flashcute"]
    assert len(cases) == 2 * 3 * 2 * 6
    for c in cases:
        assert c.b == 16384 // c.s and c.h == 2048 // c.d
    assert cfg.archs == [None] and not cfg.quick and not cfg.readme


def test_quick_grid_and_overrides():
    cfg = cli.parse_args(["--quick"])
    assert cfg.dtypes == ["bf16"] and cfg.hdims == [64, 128] and cfg.seqlens == [1024, 4096, 16384]
    assert len(cli.build_cases(cfg)) == 12
    cfg = cli.parse_args(["--quick", "--hdim", "256", "--seqlen", "2k,512", "--causal", "1", "--dtype", "fp16"])
    cases = cli.build_cases(cfg)
    assert [(c.dtype, c.d, c.causal, c.s, c.b, c.h) for c in cases] == [
        ("fp16", 256, True, 2048, 8, 8), ("fp16", 256, True, 512, 32, 8)]


def test_flags():
    cfg = cli.parse_args(["--mode", "fwd,bwd", "--impl", "sdpa-cudnn,flashcute", "--arch", "120,sm80,native",
                          "--causal", "false,true", "--tokens", "8192", "--width", "1024", "--out", "/tmp/x",
                          "--readme", "--no-plots"])
    assert cfg.modes == ["fwd", "bwd"] and cfg.impls == ["cudnn", "flashcute"]
    assert cfg.archs == ["120", "80", None] and cfg.causals == [False, True]
    assert cfg.out == "/tmp/x" and cfg.readme and not cfg.plots
    c = cli.build_cases(cfg)[0]
    assert (c.b, c.h) == (8192 // c.s, 1024 // c.d)


def test_lib_flag_adds_a_flashcute_impl_per_build():
    from bench.impls import build
    cfg = cli.parse_args(["--impl", "flashcute", "--lib", "a=/x/liba.so", "--lib", "b=/y/libb.so"])
    assert cfg.libs == [("a", "/x/liba.so"), ("b", "/y/libb.so")]
    assert [i.label for i in build(cfg.impls, cfg.archs, cfg.libs)] == ["flashcute", "flashcute@a", "flashcute@b"]
    assert cli.parse_args([]).libs == []


def test_config_flag_times_forced_kernel_configs(monkeypatch):
    from bench.impls import build
    monkeypatch.delenv("FLASHCUTE_CONFIG", raising=False)
    cfg = cli.parse_args(["--impl", "flashcute", "--config", "sm90_bwd_bf16_hd64_m128n128w8"])
    impls = build(cfg.impls, cfg.archs, cfg.libs, cfg.configs)
    assert [i.label for i in impls] == ["flashcute", "flashcute:m128n128w8"]
    with impls[1].context():
        assert os.environ["FLASHCUTE_CONFIG"] == "sm90_bwd_bf16_hd64_m128n128w8"
    with impls[0].context():
        assert "FLASHCUTE_CONFIG" not in os.environ
    assert "FLASHCUTE_CONFIG" not in os.environ and cli.parse_args([]).configs == []


@pytest.mark.parametrize("text,value", [("512", 512), ("1k", 1024), ("16K", 16384), ("4096", 4096)])
def test_parse_seqlen(text, value):
    assert cli.parse_seqlen(text) == value


@pytest.mark.parametrize("bad", [["--mode", "fwdx"], ["--impl", "triton"], ["--dtype", "fp8"],
                                 ["--causal", "maybe"], ["--arch", "hopper"], ["--lib", "nolabel"]])
def test_bad_flags_exit(bad):
    with pytest.raises(SystemExit):
        cli.parse_args(bad)


def test_impl_labels_follow_arch(monkeypatch):
    from bench.impls import build
    monkeypatch.delenv("FLASHCUTE_ARCH", raising=False)
    labels = [i.label for i in build(["flash", "efficient", "cudnn", "flashcute"], [None, "120"])]
    assert labels == ["sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flashcute", "flashcute[sm120]"]
    monkeypatch.setenv("FLASHCUTE_ARCH", "90")
    assert build(["flashcute"], [None])[0].label == "flashcute[sm90]"


def test_deterministic_impl_is_opt_in(monkeypatch):
    from bench.impls import build
    monkeypatch.delenv("FLASHCUTE_ARCH", raising=False)
    assert "flashcute-det" not in cli.parse_args([]).impls
    cfg = cli.parse_args(["--impl", "flash,flashcute,flashcute-det"])
    impls = build(cfg.impls, [None])
    assert [i.label for i in impls] == ["sdpa-flash", "flashcute", "flashcute-det"]
    assert [getattr(i, "deterministic", None) for i in impls] == [None, False, True]


def test_arch_context_sets_and_restores_env(monkeypatch):
    from bench.impls import Flashcute
    monkeypatch.setenv("FLASHCUTE_ARCH", "90")
    with Flashcute("120").context():
        assert os.environ["FLASHCUTE_ARCH"] == "120"
    assert os.environ["FLASHCUTE_ARCH"] == "90"
    monkeypatch.delenv("FLASHCUTE_ARCH")
    with Flashcute("80").context():
        assert os.environ["FLASHCUTE_ARCH"] == "80"
    assert "FLASHCUTE_ARCH" not in os.environ


def test_dry_run_needs_no_torch():
    code = ("import sys; sys.modules['torch'] = None\n"  # importing torch now raises ImportError
            "sys.argv = ['bench/run.py', '--quick', '--dry-run']\n"
            f"sys.path.insert(0, {os.path.join(ROOT, 'bench')!r})\n"
            f"import runpy; runpy.run_path({os.path.join(ROOT, 'bench', 'run.py')!r}, run_name='__main__')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "12 shapes × 4 impls × 3 modes = 144 measurements" in res.stdout


def test_bench_modules_do_not_import_torch():
    mods = ["flops", "cli", "records", "report", "plot", "progress", "timing", "check", "impls", "measure",
            "ceilings", "envinfo"]
    code = (f"import sys; sys.path.insert(0, {ROOT!r})\n"
            + "".join(f"import bench.{m}\n" for m in mods)
            + "assert 'torch' not in sys.modules, 'torch imported'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------- writers and plots

def synthetic_records():
    recs = []
    peers = {"sdpa-flash": ("flash", 300.0), "sdpa-efficient": ("efficient", 130.0), "sdpa-cudnn": ("cudnn", 450.0),
             "flashcute": ("flashcute", 360.0)}
    for mode, factor in (("fwd", 1.0), ("bwd", 0.8)):
        for causal in (False, True):
            for d in (64, 128):
                for s in (1024, 4096, 16384):
                    for impl, (backend, tf) in peers.items():
                        r = Record(impl=impl, backend=backend, dtype="bf16", mode=mode, b=16384 // s, h=2048 // d,
                                   s=s, d=d, causal=causal, status=OK, ms=1.0, tflops=tf * factor, correct=True,
                                   err_out=1e-3, err_grad=None if mode == "fwd" else 4e-3, reps=50)
                        if impl == "sdpa-cudnn" and d == 128 and s == 1024:
                            r.status, r.ms, r.tflops, r.correct, r.note = NA, None, None, None, "No kernel"
                        if impl == "flashcute" and causal and s == 16384:
                            r.status, r.ms, r.tflops, r.correct, r.err_out = WRONG, None, None, False, 0.5
                        recs.append(r)
    return recs


CEIL = {"matmul_n": 8192, "matmul_tflops": 730.0, "copy_bytes": 2**30, "copy_gbps": 4300.0}
META = {"date": "2026-11-30 10:00 UTC", "gpu": "NVIDIA H200", "torch": "2.11.0", "commit": "abc1234",
        "command": "python bench/run.py --quick"}


def test_hdim_v_gives_cases_flops_and_rows_of_their_own():
    cfg = cli.parse_args(["--hdim", "192,128", "--hdim-v", "128", "--seqlen", "1k", "--causal", "0", "--dtype", "bf16"])
    first, second = cli.build_cases(cfg)
    assert (first.d, first.dv, first.v_dim()) == (192, 128, 128) and "d=192/128" in first.label()
    assert second.dv is None and second.v_dim() == 128  # the same head dim: no V of its own
    from bench import flops as F
    assert F.attn_flops(1, 1, 8, 8, 192, 128) == F.attn_flops(1, 1, 8, 8, 160)
    recs = [Record(impl="flashcute", backend="flashcute", dtype="bf16", mode="fwd", b=16, h=10, s=1024, d=192, dv=dv,
                   causal=False, status=OK, ms=1.0, tflops=100.0, correct=True) for dv in (128, None)]
    headers, rows = report.table(recs, "bf16", "fwd")
    assert [dict(zip(headers, r))["hdim"] for r in rows] == ["192/128", "192"]


def test_table_cells_ratios_and_share():
    recs = synthetic_records()
    headers, rows = report.table(recs, "bf16", "fwd", CEIL["matmul_tflops"])
    assert headers[:5] == report.SHAPE_HEADERS
    assert headers[5:9] == ["sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flashcute"]
    assert headers[9:] == ["fc/flash", "fc/efficient", "fc/cudnn", "fc %mm"]
    assert len(rows) == 2 * 2 * 3
    first = dict(zip(headers, rows[0]))
    assert first["seqlen"] == "1k" and first["causal"] == "no" and first["hdim"] == "64"
    assert first["flashcute"] == "360.0" and first["fc/flash"] == "1.20"
    assert first["fc/cudnn"] == "0.80" and first["fc %mm"] == "49%"
    cells = [dict(zip(headers, r)) for r in rows]
    na = [c for c in cells if c["hdim"] == "128" and c["seqlen"] == "1k"]
    assert all(c["sdpa-cudnn"] == NA and c["fc/cudnn"] == "–" for c in na)
    wrong = [c for c in cells if c["causal"] == "yes" and c["seqlen"] == "16k"]
    assert all(c["flashcute"] == WRONG and c["fc %mm"] == "–" for c in wrong)


def test_text_report():
    text = report.text_report(synthetic_records(), CEIL)
    assert "730 TFLOP/s" in text and "4.30 TB/s" in text
    assert "== bf16 forward ==" in text and "== bf16 backward ==" in text
    assert WRONG in text and NA in text


def test_json_roundtrip(tmp_path):
    recs = synthetic_records()
    path = tmp_path / "r.json"
    report.write_json(path, recs, META, CEIL)
    meta, ceil, back = report.read_json(path)
    assert meta == META and ceil == CEIL and back == recs
    assert json.loads(path.read_text())["records"][0]["impl"] == "sdpa-flash"


def test_csv_columns_like_peers(tmp_path):
    recs = synthetic_records()
    path = tmp_path / "r.csv"
    report.write_csv(path, recs)
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(recs)
    for col in ("b", "backend", "causal", "d", "h", "s", "impl", "dtype", "mode", "correct", "tflops", "ms"):
        assert col in rows[0]
    wrong = [r for r in rows if r["status"] == WRONG]
    assert wrong and all(r["correct"] == "False" and r["tflops"] == "" for r in wrong)
    assert rows[0]["backend"] == "flash" and rows[0]["causal"] == "False"


def test_performance_markdown():
    md = report.performance_markdown(synthetic_records(), META, CEIL, [plot_name("bf16", "fwd")])
    assert md.startswith("## Performance")
    for fact in ("2026-11-30", "NVIDIA H200", "2.11.0", "abc1234", "730 TFLOP/s", "4.30 TB/s"):
        assert fact in md
    assert "![tflops_bf16_fwd](tflops_bf16_fwd.png)" in md
    assert "### bf16, forward" in md and "### bf16, backward" in md
    assert "| hdim | causal | seqlen |" in md


def test_plots(tmp_path):
    pytest.importorskip("matplotlib")
    paths = plot_records(synthetic_records(), str(tmp_path), CEIL)
    assert [os.path.basename(p) for p in paths] == [plot_name("bf16", "fwd"), plot_name("bf16", "bwd")]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_write_outputs_with_readme(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from bench import run
    monkeypatch.setattr(run, "RESULTS", str(tmp_path / "results"))
    cfg = cli.parse_args(["--quick", "--out", str(tmp_path / "out"), "--readme"])
    run.write_outputs(cfg, synthetic_records(), META, CEIL)
    for name in ("results.json", "results.csv", plot_name("bf16", "fwd")):
        assert (tmp_path / "out" / name).exists()
    md = (tmp_path / "results" / "PERFORMANCE.md").read_text()
    assert "tflops_bf16_bwd.png" in md and (tmp_path / "results" / plot_name("bf16", "bwd")).exists()


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stream_type", [io.StringIO, _Tty])
def test_text_progress_bar(stream_type):
    from bench.progress import _TextBar
    buf = stream_type()
    bar = _TextBar(4, "bench", stream=buf)
    bar.set_postfix_str("sdpa-flash fwd")
    bar.update(2)
    bar.close()
    assert "2/4" in buf.getvalue() and "sdpa-flash fwd" in buf.getvalue()
    assert ("\r" in buf.getvalue()) == (stream_type is _Tty)


# ---------------------------------------------------------------- the parts that need torch (on the CPU)

def test_reference_matches_sdpa_math():
    torch = pytest.importorskip("torch")
    from bench.check import reference, rel_err
    torch.manual_seed(0)
    for sq, sk, causal in ((33, 33, True), (17, 45, True), (40, 24, False)):
        q = torch.randn(2, sq, 3, 16, dtype=torch.float64)
        k, v = torch.randn(2, sk, 3, 16, dtype=torch.float64), torch.randn(2, sk, 3, 16, dtype=torch.float64)
        dout = torch.randn(2, sq, 3, 16, dtype=torch.float64)
        # small max_elems forces blocks of heads and rows
        out, grads = reference(q, k, v, causal=causal, dout=dout, max_elems=200)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        qt, kt, vt = (t.transpose(1, 2) for t in leaves)
        mask = None
        if causal:  # bottom-right aligned, as DESIGN.md §1
            mask = torch.ones(sq, sk, dtype=torch.bool).tril(diagonal=sk - sq)
        s = (qt @ kt.transpose(-1, -2)) / 4.0
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        o = (torch.softmax(s, -1).nan_to_num(0.0) @ vt).transpose(1, 2)
        expect = torch.autograd.grad(o, leaves, dout)
        assert rel_err(out, o.detach()) < 1e-6
        for g, e in zip(grads, expect):
            assert rel_err(g, e) < 1e-6


def test_rel_err_flags_nan():
    torch = pytest.importorskip("torch")
    from bench.check import rel_err
    ref = torch.ones(4)
    assert rel_err(torch.tensor([1.0, 1.0, 1.0, float("nan")]), ref) == float("inf")
    assert rel_err(torch.tensor([1.0, 1.0, 1.0, 1.5]), ref) == pytest.approx(0.5)


def test_run_case_on_cpu(monkeypatch):
    """The measuring loop end to end on the CPU: timing by wall clock, SDPA's CPU flash kernel as a peer (the
    efficient backend has no CPU kernel: n/a), and a deliberately wrong impl (WRONG, not timed)."""
    torch = pytest.importorskip("torch")
    import contextlib
    import time

    from bench import measure, timing
    from bench.impls import Sdpa

    def cpu_inputs(case, n_sets, seed=0):
        g = torch.Generator().manual_seed(seed)
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[case.dtype]
        return [tuple(torch.randn(case.b, case.s, case.h, case.d, generator=g).to(dt) for _ in range(4))
                for _ in range(n_sets)]

    def wall_time(fn, n_sets=1, **_):
        t0 = time.perf_counter()
        for i in range(3):
            fn(i % n_sets)
        return timing.Timing(median_ms=(time.perf_counter() - t0) / 3 * 1e3, min_ms=0.0, reps=3)

    class Wrong:
        label = backend = "flashcute"

        def context(self):
            return contextlib.nullcontext()

        def forward(self, q, k, v, causal):
            return v * 1.0

    monkeypatch.setattr(measure, "make_inputs", cpu_inputs)
    monkeypatch.setattr(measure, "cuda_time", wall_time)
    monkeypatch.setattr(measure, "l2_bytes", lambda: 2**20)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    cfg = cli.parse_args(["--dtype", "bf16", "--hdim", "32", "--seqlen", "128", "--causal", "1"])
    case = cli.Case("bf16", 32, True, 128, 2, 2)
    recs = measure.run_case(case, [Sdpa("flash"), Sdpa("efficient"), Wrong()], cfg.modes, cfg)
    got = {(r.impl, r.mode): r for r in recs}
    assert len(recs) == 9
    for mode in cfg.modes:
        flash = got[("sdpa-flash", mode)]
        assert flash.status == OK and flash.correct and flash.tflops > 0 and flash.err_out < 2e-2
        assert got[("sdpa-efficient", mode)].status == NA and got[("sdpa-efficient", mode)].correct is None
        wrong = got[("flashcute", mode)]
        assert wrong.status == WRONG and wrong.correct is False and wrong.tflops is None
        assert wrong.note.startswith("out error")
    assert got[("sdpa-flash", "bwd")].err_grad < 5e-2
    assert got[("sdpa-flash", "fwd")].reps == 3 * cfg.rounds  # one timing per round


def test_run_case_rotates_impls_between_rounds(monkeypatch):
    """Every impl is checked first, then each round times them all, starting one further along each time, and a
    record keeps the median of its rounds."""
    import contextlib

    from bench import measure, timing
    from bench.records import OK as ok

    entered, times = [], iter([5.0, 1.0, 3.0, 2.0, 9.0, 4.0, 7.0, 8.0, 6.0])

    class Fake:
        def __init__(self, label):
            self.label = self.backend = label

        @contextlib.contextmanager
        def context(self):
            entered.append(self.label)
            yield

    monkeypatch.setattr(measure, "make_inputs", lambda case, n_sets, seed=0: [(None,) * 4] * n_sets)
    monkeypatch.setattr(measure, "reference", lambda *a, **k: (None, None))
    monkeypatch.setattr(measure, "l2_bytes", lambda: 2**20)
    monkeypatch.setattr(measure, "check_impl", lambda *a: (ok, None, 0.0, None, ""))
    monkeypatch.setattr(measure, "_timed_fn", lambda *a: None)
    monkeypatch.setattr(measure, "cuda_time", lambda *a, **k: timing.Timing(median_ms=next(times), min_ms=0.0, reps=10))
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    cfg = cli.parse_args(["--mode", "fwd", "--rounds", "3"])
    recs = measure.run_case(cli.Case("bf16", 64, False, 128, 1, 1), [Fake("a"), Fake("b"), Fake("c")], ["fwd"], cfg)
    assert entered == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # rounds a b c, then b c a, then c a b: a 5, 4, 8; b 1, 2, 6; c 3, 9, 7
    assert [(r.impl, r.ms, r.reps) for r in recs] == [("a", 5.0, 30), ("b", 2.0, 30), ("c", 7.0, 30)]
