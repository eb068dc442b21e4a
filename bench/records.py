"""One measurement = one Record. Pure Python: no torch, no GPU."""
from dataclasses import asdict, dataclass, fields

OK, WRONG, NA = "ok", "WRONG", "n/a"


@dataclass
class Record:
    impl: str          # label: 'sdpa-flash', 'sdpa-efficient', 'sdpa-cudnn', 'flashcute', 'flashcute[sm120]'
    backend: str       # the peers csv's name: 'flash', 'efficient', 'cudnn'; for ours, the impl label
    dtype: str
    mode: str          # 'fwd', 'bwd', 'fwdbwd'
    b: int
    h: int
    s: int
    d: int
    causal: bool
    status: str = NA   # OK, WRONG or NA
    dv: int = None     # V's head dim where it differs from d
    ms: float = None
    tflops: float = None
    correct: bool = None   # None: not checked (unavailable)
    err_out: float = None  # max|out - ref| / max|ref|
    err_grad: float = None  # the largest of the same for dq, dk, dv
    reps: int = None
    note: str = ""

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def shape_key(self):
        return (self.dtype, self.mode, self.d, self.dv, self.causal, self.s, self.b, self.h)


FIELDS = [f.name for f in fields(Record)]


def is_ours(impl):
    return impl.startswith("flashcute")
