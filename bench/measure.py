"""Measure one Case: build inputs, compute the float32 reference once, then for each impl check it and time
each mode. A failed check is recorded as WRONG and not timed; a refused shape or any error as n/a."""
import statistics
import warnings

from . import flops as F
from .check import reference, rel_err
from .records import NA, OK, WRONG, Record
from .timing import cuda_time, input_sets_for, l2_bytes

BWD_MODES = ("bwd", "fwdbwd")


def _short(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def make_inputs(case, n_sets, seed=0):
    import torch
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[case.dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    qk = (case.b, case.s, case.h, case.d)
    vo = (case.b, case.s, case.h, case.v_dim())
    return [tuple(torch.randn(shape, device="cuda", dtype=dtype, generator=g) for shape in (qk, qk, vo, vo))
            for _ in range(n_sets)]


def check_impl(impl, case, inputs, ref_out, ref_grads, cfg):
    """(fwd status, bwd status, err_out, err_grad, note); bwd status is None when no grads were asked."""
    import torch
    q, k, v, dout = inputs
    err_out = err_grad = None
    need_bwd = ref_grads is not None
    leaves = [t.detach().requires_grad_(need_bwd) for t in (q, k, v)]
    try:
        out = impl.forward(*leaves, case.causal)
        err_out = rel_err(out, ref_out)
    except Exception as e:  # noqa: BLE001 - any refusal of the backend is "n/a" for this shape
        return NA, NA if need_bwd else None, None, None, _short(e)
    fwd = OK if err_out <= cfg.tol_out else WRONG
    note = "" if fwd == OK else f"out error {err_out:.3g} > {cfg.tol_out:g}"
    if not need_bwd:
        return fwd, None, err_out, None, note
    try:
        grads = torch.autograd.grad(out, leaves, dout)
        err_grad = max(rel_err(g, r) for g, r in zip(grads, ref_grads))
    except Exception as e:  # noqa: BLE001
        return fwd, NA, err_out, None, "; ".join(filter(None, [note, "backward: " + _short(e)]))
    bwd = OK if err_grad <= cfg.tol_grad else WRONG
    if bwd == WRONG:
        note = "; ".join(filter(None, [note, f"grad error {err_grad:.3g} > {cfg.tol_grad:g}"]))
    return fwd, bwd, err_out, err_grad, note


def _timed_fn(impl, mode, sets, causal):
    """fn(i): one call of `mode` on input set i. bwd keeps one forward graph per set and reruns its backward."""
    import torch
    if mode == "fwd":
        def fwd(i):
            with torch.no_grad():
                impl.forward(*sets[i][:3], causal)
        return fwd
    leaves = [[t.detach().requires_grad_(True) for t in s[:3]] for s in sets]
    if mode == "bwd":
        outs = [impl.forward(*lv, causal) for lv in leaves]
        return lambda i: torch.autograd.grad(outs[i], leaves[i], sets[i][3], retain_graph=True)
    return lambda i: torch.autograd.grad(impl.forward(*leaves[i], causal), leaves[i], sets[i][3])


def run_case(case, impls, modes, cfg, bar=None):
    """Records for every (impl, mode) of this case, in that order. Every impl is checked first; then cfg.rounds
    rounds time each checked (impl, mode), the impls in an order rotated by one each round, and a record keeps the
    median of its rounds' medians: with one round, whichever impl went first could gain or lose several percent on
    an H100 (bench/RESULTS.md, 2026-12-07 twelfth session)."""
    import torch
    set_bytes = 2 * case.b * case.s * case.h * (case.d + case.v_dim()) * 2
    sets = make_inputs(case, input_sets_for(set_bytes, l2_bytes(), lo=3))
    need_bwd = any(m in BWD_MODES for m in modes)
    ref_out, ref_grads = reference(*sets[0][:3], causal=case.causal, dout=sets[0][3] if need_bwd else None)
    per_impl = []
    for impl in impls:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with impl.context():
                fwd_st, bwd_st, err_out, err_grad, note = check_impl(impl, case, sets[0], ref_out, ref_grads, cfg)
        recs = []
        for mode in modes:
            status = fwd_st if mode == "fwd" or fwd_st != OK else bwd_st
            recs.append(Record(impl=impl.label, backend=impl.backend, dtype=case.dtype, mode=mode, b=case.b,
                               h=case.h, s=case.s, d=case.d, dv=case.dv, causal=case.causal, status=status,
                               correct=None if status == NA else status == OK, err_out=err_out,
                               err_grad=err_grad if mode != "fwd" else None, note=note))
        per_impl.append((impl, recs))
    times = {}
    for r in range(cfg.rounds):
        for i in range(len(per_impl)):
            impl, recs = per_impl[(i + r) % len(per_impl)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with impl.context():
                    for rec in recs:
                        if bar is not None:
                            bar.set_postfix_str(f"{impl.label} {rec.mode} {case.label()}")
                        if rec.status == OK:
                            _time_into(rec, impl, sets, case, cfg, times.setdefault(id(rec), []))
                        if bar is not None and r == cfg.rounds - 1:
                            bar.update(1)
            torch.cuda.empty_cache()
    del sets, ref_out, ref_grads
    torch.cuda.empty_cache()
    return [rec for _, recs in per_impl for rec in recs]


def _time_into(rec, impl, sets, case, cfg, medians):
    """Times one round of rec's (impl, mode); rec keeps the median over the rounds so far."""
    try:
        t = cuda_time(_timed_fn(impl, rec.mode, sets, case.causal), n_sets=len(sets), warmup=cfg.warmup,
                      target_s=cfg.target_s / cfg.rounds, min_reps=cfg.min_reps, max_reps=cfg.max_reps)
    except Exception as e:  # noqa: BLE001 - e.g. out of memory: recorded, the run goes on
        rec.status, rec.note = NA, "timing: " + _short(e)
        return
    medians.append(t.median_ms)
    rec.ms, rec.reps = statistics.median(medians), (rec.reps or 0) + t.reps
    rec.tflops = F.tflops(F.attn_flops(case.b, case.h, case.s, case.s, case.d, case.v_dim(), causal=case.causal,
                                       mode=rec.mode), rec.ms)
