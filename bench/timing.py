"""CUDA-event timing: warm-up, then the median of many reps, each rep on the next of several input sets
(so a small problem cannot run from L2 left warm by the previous rep). torch is imported inside."""
import math
import statistics
from dataclasses import dataclass


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    reps: int


def input_sets_for(set_bytes, l2_bytes, lo=2, hi=8):
    """How many input sets to rotate among so that together they are at least 4× the L2."""
    if set_bytes <= 0:
        return lo
    return max(lo, min(hi, math.ceil(4 * l2_bytes / set_bytes)))


def l2_bytes(device=None):
    import torch
    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    return getattr(props, "L2_cache_size", 50 * 2**20) or 50 * 2**20


def cuda_time(fn, n_sets=1, warmup=5, target_s=0.3, min_reps=10, max_reps=200):
    """fn(i) runs one call on input set i % n_sets. Returns the median of per-rep CUDA-event times."""
    import torch
    for i in range(max(1, warmup)):
        fn(i % n_sets)
    # Estimate the time per call from a short burst, to pick how many reps fit in target_s.
    probe = max(1, min(3, n_sets))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(probe):
        fn(i % n_sets)
    end.record()
    end.synchronize()
    est_ms = max(start.elapsed_time(end) / probe, 1e-3)
    reps = int(max(min_reps, min(max_reps, target_s * 1e3 / est_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for r in range(reps):
        starts[r].record()
        fn(r % n_sets)
        ends[r].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return Timing(median_ms=statistics.median(times), min_ms=min(times), reps=reps)
