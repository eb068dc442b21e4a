"""The implementations under test, each with one interface: label, backend, context(), forward(q, k, v, causal).
q, k, v and the returned out are (B, S, H, D). torch and flashcute are imported inside."""
import contextlib
import os

SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}
ARCH_ENV = "FLASHCUTE_ARCH"
GRID_ENV = "FLASHCUTE_FWD_GRID"
ORDER_ENV = "FLASHCUTE_FWD_ORDER"
CONFIG_ENV = "FLASHCUTE_CONFIG"


class Sdpa:
    """torch.nn.functional.scaled_dot_product_attention pinned to one backend; it takes (B, H, S, D), so the
    (B, S, H, D) tensors go in and come out as transposed views (no copies)."""

    def __init__(self, backend):
        self.backend = backend
        self.label = f"sdpa-{backend}"

    def context(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[self.backend]))

    def forward(self, q, k, v, causal):
        import torch.nn.functional as F
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=causal)
        return out.transpose(1, 2)


class Flashcute:
    """flashcute.flash_attn_func; with an arch, FLASHCUTE_ARCH is set while it runs (the library reads it per
    call) and the label says which, e.g. 'flashcute[sm120]'. grid: FLASHCUTE_FWD_GRID while it runs ('tiles': the
    Hopper forward with one CTA per tile, for an A/B against its persistent grid). order: FLASHCUTE_FWD_ORDER while
    it runs ('heads': the forward's tiles head by head, for an A/B against the sectioned order). config:
    FLASHCUTE_CONFIG while it runs (a kernel config's name: it serves its own direction, dtype and head dims only),
    labelled by its tile."""

    def __init__(self, arch=None, deterministic=False, lib=None, grid=None, config=None, order=None):
        self.arch = arch
        self.deterministic = deterministic
        self.lib = lib  # (label, path): another build of the library, for A/B timing (--lib)
        self.env = {ARCH_ENV: None if arch is None else str(arch), GRID_ENV: grid, CONFIG_ENV: config,
                    ORDER_ENV: order}
        shown = arch if arch is not None else os.environ.get(ARCH_ENV)
        name = ("flashcute-det" if deterministic else f"flashcute-{grid}" if grid else
                f"flashcute-{order}" if order else "flashcute")
        if lib is not None:
            name += f"@{lib[0]}"
        if config is not None:
            name += ":" + config.rsplit("_", 1)[-1]
        self.label = f"{name}[sm{shown}]" if shown else name
        self.backend = self.label
        self._fn = None
        self._handle = None

    @contextlib.contextmanager
    def context(self):
        from flashcute import _capi
        saved_lib = _capi._lib
        if self.lib is not None:
            if self._handle is None:
                self._handle = _capi.load(self.lib[1])
            _capi._lib = self._handle
        old = {key: os.environ.get(key) for key in self.env}
        for key, value in self.env.items():
            if value is not None:
                os.environ[key] = value
        try:
            yield
        finally:
            _capi._lib = saved_lib
            for key, value in old.items():
                if self.env[key] is None:
                    continue
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def forward(self, q, k, v, causal):
        if self._fn is None:
            import flashcute
            self._fn = flashcute.flash_attn_func
        out, _lse = self._fn(q, k, v, causal=causal, deterministic=self.deterministic)
        return out


class Fa4:
    """FlashAttention-4 (flash_attn.cute, CuTe DSL; ../shared/peers/fa4/README.md says how to bring it to the
    device). Each shape class compiles on its first call, which the warm-up absorbs."""

    label = backend = "fa4"

    @staticmethod
    def available():
        try:
            from flash_attn.cute.interface import flash_attn_func  # noqa: F401
            return True
        except Exception:  # not installed, or built for another Python or GPU
            return False

    def context(self):
        return contextlib.nullcontext()

    def forward(self, q, k, v, causal):
        from flash_attn.cute.interface import flash_attn_func
        out, _lse = flash_attn_func(q, k, v, causal=causal)
        return out


def build(impl_names, archs=(None,), libs=(), configs=()):
    """Impl objects for the names in cli.IMPLS order given; 'flashcute' once per arch, per other library in libs
    ((label, path) pairs) and per forced kernel config in configs; fa4 only where it imports."""
    out = []
    for name in impl_names:
        if name in ("flashcute", "flashcute-det", "flashcute-tiles", "flashcute-heads"):
            grid = "tiles" if name == "flashcute-tiles" else None
            order = "heads" if name == "flashcute-heads" else None
            for lib in (None, *libs):
                for config in (None, *configs):
                    out += [Flashcute(a, deterministic=name == "flashcute-det", lib=lib, grid=grid, config=config,
                                      order=order) for a in archs]
        elif name == "fa4":
            if Fa4.available():
                out.append(Fa4())
            else:
                print("fa4: flash_attn.cute does not import here; skipped")
        else:
            out.append(Sdpa(name))
    return out
