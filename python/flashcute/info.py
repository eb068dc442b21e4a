"""python -m flashcute.info: version, build, the GPU found, its arch profile and what dispatch would pick."""
import argparse
import ctypes
import os

from . import _capi

_DTYPES = {"bf16": _capi.BFLOAT16, "fp16": _capi.FLOAT16}


def _gpu():
    """(description, sm) of the current CUDA device via torch, or (reason, None)."""
    try:
        import torch
    except ModuleNotFoundError:
        return "no GPU (torch is not installed)", None
    try:
        if not torch.cuda.is_available():
            return "no GPU", None
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda:{index} {torch.cuda.get_device_name(index)} (sm_{major}{minor})", major * 10 + minor
    except Exception as exc:  # a broken driver is reported, not raised
        return f"no GPU ({exc})", None


def _window(side):
    return _capi.WINDOW_UNBOUNDED if side is None else side


def _params(args):
    p = _capi.fwd_params()
    p.batch, p.seqlen_q, p.seqlen_k = args.batch, args.seqlen_q, args.seqlen_k
    p.nheads, p.nheads_kv = args.nheads, args.nheads_kv
    p.head_dim, p.head_dim_v = args.head_dim, args.head_dim_v or args.head_dim
    _capi.lib().flashcute_fwd_params_set_contiguous_strides(ctypes.byref(p))
    p.dtype = _DTYPES[args.dtype]
    p.softmax_scale = args.head_dim ** -0.5
    p.causal = int(args.causal)
    p.softcap = args.softcap
    p.window_left, p.window_right = _window(args.window_left), _window(args.window_right)
    return p


def _try(fn, *a):
    try:
        return fn(*a)
    except (ValueError, _capi.FlashCuteError) as exc:
        return f"({exc})"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m flashcute.info", description=__doc__)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seqlen-q", type=int, default=128)
    ap.add_argument("--seqlen-k", type=int, default=128)
    ap.add_argument("--nheads", type=int, default=2)
    ap.add_argument("--nheads-kv", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--head-dim-v", type=int, default=0, help="default: --head-dim")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window-left", type=int, default=None, help="default: unbounded")
    ap.add_argument("--window-right", type=int, default=None, help="default: unbounded")
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--arch", type=int, default=0, help="explain for this sm (e.g. 80, 90, 120); default: the GPU")
    args = ap.parse_args(argv)

    print(f"flashcute {_capi.version()}  ({_capi.library_path()})")
    print(f"build: {_capi.build_info()}")
    gpu, device_sm = _gpu()
    print(f"device: {gpu}")
    if os.environ.get("FLASHCUTE_ARCH"):
        print(f"FLASHCUTE_ARCH={os.environ['FLASHCUTE_ARCH']}")
    sm = args.arch
    if not sm and device_sm is None:
        sm = 90
        print("no GPU and no --arch: explaining for sm 90")
    print(f"arch profile: {_try(_capi.arch_profiles, sm or device_sm)}")
    p = _params(args)
    print(f"forward:  {_try(_capi.explain, _capi.FORWARD, p, sm)}")
    print(f"backward: {_try(_capi.explain, _capi.BACKWARD, p, sm)}")


if __name__ == "__main__":
    try:
        main()
    except _capi.FlashCuteError as exc:  # library missing: one line, not a traceback
        raise SystemExit(f"error: {exc}")
