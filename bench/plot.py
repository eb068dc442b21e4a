"""PNG plots of TFLOP/s vs seqlen from a list of Records. matplotlib is imported only when plotting."""
import os

from .records import OK, is_ours
from .report import MODE_TITLE, impl_order, sections, seqlen_label


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_name(dtype, mode):
    return f"tflops_{dtype}_{mode}.png"


def plot_records(records, out_dir, ceilings=None):
    """One PNG per (dtype, mode): a grid of subplots, rows = head_dim, columns = causal or not, one line per impl.
    Only checked, timed results are drawn. Returns the written paths; raises ImportError without matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    impls = impl_order(records)
    mm = (ceilings or {}).get("matmul_tflops")
    paths = []
    for dtype, mode in sections(records):
        recs = [r for r in records if r.dtype == dtype and r.mode == mode]
        hdims = sorted({r.d for r in recs})
        causals = sorted({r.causal for r in recs})
        fig, axes = plt.subplots(len(hdims), len(causals), squeeze=False, sharex=True,
                                 figsize=(5.5 * len(causals), 3.6 * len(hdims)))
        for row, d in enumerate(hdims):
            for col, causal in enumerate(causals):
                ax = axes[row][col]
                seqlens = sorted({r.s for r in recs if r.d == d and r.causal == causal})
                for n, impl in enumerate(impls):
                    pts = sorted((r.s, r.tflops) for r in recs
                                 if r.impl == impl and r.d == d and r.causal == causal and r.status == OK)
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl,
                                color=f"C{n % 10}", linewidth=2.5 if is_ours(impl) else 1.5)
                if mm:
                    ax.axhline(mm, color="gray", linestyle="--", linewidth=1, label="bf16 matmul")
                ax.set_xscale("log", base=2)
                if seqlens:
                    ax.set_xticks(seqlens)
                    ax.set_xticklabels([seqlen_label(s) for s in seqlens])
                ax.set_ylim(bottom=0)
                ax.grid(True, alpha=0.3)
                ax.set_title(f"head_dim {d}, {'causal' if causal else 'non-causal'}")
                ax.set_xlabel("seqlen (batch × seqlen fixed)")
                ax.set_ylabel("TFLOP/s")
        handles, labels = [], []
        for ax in axes.flat:
            for hnd, lab in zip(*ax.get_legend_handles_labels()):
                if lab not in labels:
                    handles.append(hnd)
                    labels.append(lab)
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), frameon=False)
        fig.suptitle(f"{dtype} {MODE_TITLE.get(mode, mode)}")
        fig.tight_layout(rect=(0, 0.06, 1, 0.96))
        path = os.path.join(out_dir, plot_name(dtype, mode))
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
