"""flashcute benchmark suite: `python bench/run.py --help`.

Modules that need no GPU (and import no torch at import time): flops, cli, records, report, plot, progress.
Modules that drive the GPU (torch imported inside functions): timing, check, impls, ceilings, measure, envinfo.
"""
