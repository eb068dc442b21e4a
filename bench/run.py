"""Benchmark CLI: `python bench/run.py [--quick] [--readme] ...` (see --help). Works from a checkout: the
repository root and python/ go on sys.path, so `bench` and `flashcute` import without installing."""
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (os.path.join(ROOT, "python"), ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from bench import cli, report  # noqa: E402
from bench.plot import have_matplotlib, plot_records  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")


def print_grid(cfg, cases, impl_labels):
    print(f"{len(cases)} shapes × {len(impl_labels)} impls × {len(cfg.modes)} modes "
          f"= {len(cases) * len(impl_labels) * len(cfg.modes)} measurements")
    print("impls:", ", ".join(impl_labels), "| modes:", ", ".join(cfg.modes))
    for c in cases:
        print("  " + c.label())


def _impl_labels(cfg):
    from bench.impls import build
    return [i.label for i in build(cfg.impls, cfg.archs, cfg.libs, cfg.configs)]


def write_outputs(cfg, records, meta, ceilings):
    os.makedirs(cfg.out, exist_ok=True)
    report.write_json(os.path.join(cfg.out, "results.json"), records, meta, ceilings)
    report.write_csv(os.path.join(cfg.out, "results.csv"), records)
    print(f"\nwrote {cfg.out}/results.json and results.csv")
    plots = []
    if cfg.plots:
        if have_matplotlib():
            plots = plot_records(records, cfg.out, ceilings)
            print("plots:", ", ".join(os.path.relpath(p) for p in plots))
        else:
            print("matplotlib is not installed: no plots")
    if cfg.readme:
        os.makedirs(RESULTS, exist_ok=True)
        names = []
        for p in plots:
            shutil.copy(p, os.path.join(RESULTS, os.path.basename(p)))
            names.append(os.path.basename(p))
        path = os.path.join(RESULTS, "PERFORMANCE.md")
        with open(path, "w") as f:
            f.write(report.performance_markdown(records, meta, ceilings, names))
        print(f"wrote {os.path.relpath(path)}")


def main(argv=None):
    cfg = cli.parse_args(argv)
    cases = cli.build_cases(cfg)
    if cfg.dry_run:
        print_grid(cfg, cases, _impl_labels(cfg))
        return 0
    if cfg.from_json:
        meta, ceilings, records = report.read_json(cfg.from_json)
        print(report.text_report(records, ceilings))
        write_outputs(cfg, records, meta, ceilings)
        return 0
    import torch
    if not torch.cuda.is_available():
        print("no CUDA GPU found; `--dry-run` shows the grid without one", file=sys.stderr)
        return 2
    from bench import ceilings as ceil
    from bench import envinfo
    from bench.impls import build
    from bench.measure import run_case
    from bench.progress import progress

    meta = envinfo.collect(argv)
    print(f"{meta['gpu']} ({meta.get('capability')}), torch {meta['torch']}, CUDA {meta['cuda']}, "
          f"cuDNN {meta['cudnn']}, flashcute {meta['flashcute']}, commit {meta['commit']}")
    ceilings = {}
    if cfg.ceilings:
        ceilings = ceil.measure()
        print(report.ceilings_text(ceilings))
    impls = build(cfg.impls, cfg.archs, cfg.libs, cfg.configs)
    bar = progress(len(cases) * len(impls) * len(cfg.modes), desc="bench")
    records = []
    try:
        for case in cases:
            records += run_case(case, impls, cfg.modes, cfg, bar)
    except KeyboardInterrupt:
        bar.write("interrupted: writing what was measured")
    finally:
        bar.close()
    print()
    print(report.text_report(records, ceilings))
    notes = sorted({(r.impl, r.note) for r in records if r.note})
    if notes:
        print("\nnotes:")
        for impl, note in notes:
            print(f"  {impl}: {note}")
    write_outputs(cfg, records, meta, ceilings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
