"""Tables (text and markdown), JSON and CSV from a list of Records. Pure Python: no torch, no GPU."""
import csv
import json
import os

from .records import OK, Record, is_ours

# The peers csv's columns (shared/measurements/h200-peers.csv) first, then ours.
CSV_COLUMNS = ["b", "backend", "causal", "d", "h", "s", "impl", "dtype", "mode", "ms", "tflops", "correct",
               "status", "err_out", "err_grad", "reps", "note"]
LEGEND = ("TFLOP/s (FlashAttention's FLOP count); WRONG = failed the check against float32, not timed; "
          "n/a = refused or failed; fc/x = flashcute ÷ peer x; %mm = share of the matmul ceiling")
MODE_TITLE = {"fwd": "forward", "bwd": "backward", "fwdbwd": "forward + backward"}
SHAPE_HEADERS = ["hdim", "causal", "seqlen", "batch", "heads"]


def impl_order(records):
    """Impl labels in first-seen order, peers before ours."""
    seen = []
    for r in records:
        if r.impl not in seen:
            seen.append(r.impl)
    return [i for i in seen if not is_ours(i)] + [i for i in seen if is_ours(i)]


def sections(records):
    """(dtype, mode) pairs in first-seen order; one table each."""
    seen = []
    for r in records:
        if (r.dtype, r.mode) not in seen:
            seen.append((r.dtype, r.mode))
    return seen


def cell(rec):
    if rec is None:
        return "–"
    if rec.status == OK and rec.tflops is not None:
        return f"{rec.tflops:.1f}"
    return rec.status


def _ratio(a, b):
    if a is None or b is None or a.status != OK or b.status != OK or not b.tflops:
        return "–"
    return f"{a.tflops / b.tflops:.2f}"


def seqlen_label(s):
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def short(label):
    """Column-header form of an impl label: 'sdpa-cudnn' -> 'cudnn', 'flashcute[sm120]' -> 'fc[sm120]'."""
    return label.replace("sdpa-", "").replace("flashcute", "fc")


def table(records, dtype, mode, matmul_tflops=None):
    """Headers and rows of one (dtype, mode) table: TFLOP/s per impl, ours/peer ratios, ours % of matmul."""
    impls = impl_order(records)
    ours = [i for i in impls if is_ours(i)]
    peers = [i for i in impls if not is_ours(i)]
    headers = SHAPE_HEADERS + impls + [f"{short(o)}/{short(p)}" for o in ours for p in peers]
    if matmul_tflops:
        headers += [f"{short(o)} %mm" for o in ours]
    by_shape = {}
    for r in records:
        if r.dtype == dtype and r.mode == mode:
            by_shape.setdefault((r.d, r.dv, r.causal, r.s, r.b, r.h), {})[r.impl] = r
    rows = []
    for (d, dv, causal, s, b, h), got in by_shape.items():
        row = [f"{d}/{dv}" if dv else str(d), "yes" if causal else "no", seqlen_label(s), str(b), str(h)]
        row += [cell(got.get(i)) for i in impls]
        row += [_ratio(got.get(o), got.get(p)) for o in ours for p in peers]
        if matmul_tflops:
            for o in ours:
                r = got.get(o)
                row.append(f"{100 * r.tflops / matmul_tflops:.0f}%" if r and r.status == OK else "–")
        rows.append(row)
    return headers, rows


def format_text(headers, rows):
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def format_markdown(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def ceilings_text(ceilings):
    if not ceilings:
        return "ceilings: not measured"
    parts = []
    if ceilings.get("matmul_tflops"):
        parts.append(f"bf16 {ceilings.get('matmul_n', 8192)}³ matmul {ceilings['matmul_tflops']:.0f} TFLOP/s")
    if ceilings.get("copy_gbps"):
        parts.append(f"device copy {ceilings['copy_gbps'] / 1000:.2f} TB/s (read + write)")
    return "ceilings: " + ("; ".join(parts) if parts else "not measured")


def text_report(records, ceilings=None):
    mm = (ceilings or {}).get("matmul_tflops")
    out = [ceilings_text(ceilings), LEGEND]
    for dtype, mode in sections(records):
        out += ["", f"== {dtype} {MODE_TITLE.get(mode, mode)} ==", format_text(*table(records, dtype, mode, mm))]
    return "\n".join(out)


def write_json(path, records, meta=None, ceilings=None):
    with open(path, "w") as f:
        json.dump({"meta": meta or {}, "ceilings": ceilings or {}, "records": [r.to_dict() for r in records]},
                  f, indent=1)


def read_json(path):
    with open(path) as f:
        data = json.load(f)
    return data.get("meta", {}), data.get("ceilings", {}), [Record.from_dict(r) for r in data["records"]]


def write_csv(path, records):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in records:
            d = r.to_dict()
            w.writerow({k: ("" if d[k] is None else d[k]) for k in CSV_COLUMNS})


def performance_markdown(records, meta=None, ceilings=None, plots=()):
    """The README's Performance section. `plots` are paths relative to the markdown file."""
    meta = meta or {}
    mm = (ceilings or {}).get("matmul_tflops")
    out = ["## Performance", ""]
    facts = [("date", meta.get("date")), ("GPU", meta.get("gpu")), ("torch", meta.get("torch")),
             ("CUDA", meta.get("cuda")), ("cuDNN", meta.get("cudnn")), ("flashcute commit", meta.get("commit")),
             ("command", f"`{meta['command']}`" if meta.get("command") else None)]
    out += [f"- {k}: {v}" for k, v in facts if v]
    out += [f"- {ceilings_text(ceilings)}", "",
            "TFLOP/s as FlashAttention counts them (4·B·H·Sq·Sk·D forward, halved for causal; backward 2.5×), "
            "the median over timing rounds (the impls' order rotated each round) of the median of timed reps on "
            "rotated inputs. Every result was first checked against a float32 "
            "reference; WRONG means it failed that check and was not timed, n/a that the backend refused the "
            "shape. `fc/x` is flashcute's TFLOP/s over peer x's, `%mm` its share of the matmul ceiling.", ""]
    for p in plots:
        name = os.path.splitext(os.path.basename(p))[0]
        out.append(f"![{name}]({p})")
    if plots:
        out.append("")
    for dtype, mode in sections(records):
        out += [f"### {dtype}, {MODE_TITLE.get(mode, mode)}", "", format_markdown(*table(records, dtype, mode, mm)),
                ""]
    return "\n".join(out)
