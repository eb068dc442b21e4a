"""ctypes mirror of include/flashcute/flashcute.h and the lazy loading of libflashcute.so.

Importing this module never fails for a missing library; the first call that needs it raises FlashCuteError.
"""
import ctypes
import os
import pathlib
from ctypes import c_char_p, c_float, c_int, c_int64, c_size_t, c_void_p

SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1

FLOAT16, BFLOAT16, FLOAT64 = 0, 1, 3
WINDOW_UNBOUNDED = -(2**63)  # FLASHCUTE_WINDOW_UNBOUNDED
FORWARD, BACKWARD = 0, 1

_NOT_FOUND = "flashcute library not found: build it with `bash scripts/build.sh` or set FLASHCUTE_LIBRARY"
_BUNDLED = pathlib.Path(__file__).resolve().parent / "_lib" / "libflashcute.so"


class FlashCuteError(RuntimeError):
    """A flashcute call failed (any status but FLASHCUTE_ERROR_INVALID_ARGUMENT, which raises ValueError)."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def _strides(prefix, names=("batch_stride", "row_stride", "head_stride")):
    return [(f"{prefix}_{n}", c_int64) for n in names]


class FwdParams(ctypes.Structure):
    _fields_ = [
        ("q", c_void_p), ("k", c_void_p), ("v", c_void_p), ("out", c_void_p), ("lse", c_void_p),
        *_strides("q"), *_strides("k"), *_strides("v"), *_strides("out"),
        *_strides("lse", ("batch_stride", "head_stride")),
        ("batch", c_int64), ("seqlen_q", c_int64), ("seqlen_k", c_int64), ("nheads", c_int64),
        ("nheads_kv", c_int64), ("head_dim", c_int64), ("head_dim_v", c_int64),
        ("dtype", c_int),
        ("softmax_scale", c_float), ("softcap", c_float), ("causal", c_int),
        ("window_left", c_int64), ("window_right", c_int64),
        ("cu_seqlens_q", c_void_p), ("cu_seqlens_k", c_void_p), ("seqused_k", c_void_p),
        ("seqused_q", c_void_p), ("total_q", c_int64), ("total_k", c_int64), ("varlen_status", c_void_p),
        ("workspace", c_void_p), ("workspace_size", c_size_t),
        ("learnable_sink", c_void_p),
        ("page_table", c_void_p), ("page_table_batch_stride", c_int64), ("page_size", c_int64),
        ("num_pages", c_int64), ("num_splits", c_int64), ("packed_gqa", c_int64),
    ]


class BwdParams(ctypes.Structure):
    _fields_ = [
        ("fwd", FwdParams),
        ("dout", c_void_p), *_strides("dout"),
        ("dlse", c_void_p),
        ("dq", c_void_p), ("dk", c_void_p), ("dv", c_void_p),
        *_strides("dq"), *_strides("dk"), *_strides("dv"),
        ("deterministic", c_int),
        ("workspace", c_void_p), ("workspace_size", c_size_t),
        ("dsink", c_void_p),
    ]


_FWD_P, _BWD_P = ctypes.POINTER(FwdParams), ctypes.POINTER(BwdParams)
_SIZE_P = ctypes.POINTER(c_size_t)
_PROTOTYPES = {
    "flashcute_fwd_params_init": (None, [_FWD_P]),
    "flashcute_bwd_params_init": (None, [_BWD_P]),
    "flashcute_fwd_params_set_contiguous_strides": (None, [_FWD_P]),
    "flashcute_fwd_workspace_size": (c_int, [_FWD_P, _SIZE_P]),
    "flashcute_bwd_workspace_size": (c_int, [_BWD_P, _SIZE_P]),
    "flashcute_fwd": (c_int, [_FWD_P, c_void_p]),
    "flashcute_bwd": (c_int, [_BWD_P, c_void_p]),
    "flashcute_reference_fwd": (c_int, [_FWD_P]),
    "flashcute_reference_bwd": (c_int, [_BWD_P]),
    "flashcute_explain": (c_int, [c_int, _FWD_P, c_int, c_char_p, c_size_t]),
    "flashcute_fwd_occupancy": (c_int, [_FWD_P, c_int, ctypes.POINTER(c_int), ctypes.POINTER(c_int)]),
    "flashcute_arch_profiles": (c_int, [c_int, c_char_p, c_size_t]),
    "flashcute_status_string": (c_char_p, [c_int]),
    "flashcute_last_error": (c_char_p, []),
    "flashcute_version": (c_char_p, []),
    "flashcute_build_info": (c_char_p, []),
}

_lib = None


def library_path():
    """The library that would be loaded: FLASHCUTE_LIBRARY, else the bundled copy; None when neither exists."""
    env = os.environ.get("FLASHCUTE_LIBRARY")
    if env:
        return env if os.path.isfile(env) else None
    return str(_BUNDLED) if _BUNDLED.is_file() else None


def lib():
    global _lib
    if _lib is None:
        path = library_path()
        if path is None:
            env = os.environ.get("FLASHCUTE_LIBRARY")
            raise FlashCuteError(_NOT_FOUND + (f" (FLASHCUTE_LIBRARY={env!r} is not a file)" if env else ""))
        _lib = load(path)
    return _lib


def load(path):
    """The library at path, its entry points typed. lib() holds the one flashcute calls; bench/impls.py swaps in
    others for A/B timing in one process."""
    handle = ctypes.CDLL(path)
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(handle, name)
        fn.restype, fn.argtypes = restype, argtypes
    return handle


def _text(raw):
    return raw.decode("utf-8", "replace") if raw else ""


def check(status):
    """Raise for a failed status: ValueError for invalid arguments, FlashCuteError otherwise."""
    if status == SUCCESS:
        return
    message = f"{_text(lib().flashcute_status_string(status))}: {_text(lib().flashcute_last_error())}"
    if status == ERROR_INVALID_ARGUMENT:
        raise ValueError(message)
    raise FlashCuteError(message, status)


def fwd_params():
    p = FwdParams()
    lib().flashcute_fwd_params_init(ctypes.byref(p))
    return p


def bwd_params():
    p = BwdParams()
    lib().flashcute_bwd_params_init(ctypes.byref(p))
    return p


def _call_text(fn, *args, size=1 << 14):
    buf = ctypes.create_string_buffer(size)
    check(fn(*args, buf, size))
    return _text(buf.value).rstrip("\n")


def explain(direction, params, sm=0):
    return _call_text(lib().flashcute_explain, direction, ctypes.byref(params), sm)


def fwd_occupancy(params, sm=0):
    """(CTAs per SM of the forward config dispatch picks for params, the current device's SM count)."""
    ctas, sms = c_int(0), c_int(0)
    check(lib().flashcute_fwd_occupancy(ctypes.byref(params), sm, ctypes.byref(ctas), ctypes.byref(sms)))
    return ctas.value, sms.value


def arch_profiles(sm=0):
    return _call_text(lib().flashcute_arch_profiles, sm)


def version():
    return _text(lib().flashcute_version())


def build_info():
    return _text(lib().flashcute_build_info())
