"""Two ceilings measured in the same run: a large bf16 matmul (TFLOP/s) and a device-to-device copy (GB/s,
bytes read + written). torch is imported inside."""
from .timing import cuda_time


def matmul_tflops(n=8192, target_s=0.3):
    import torch
    a = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    b = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    t = cuda_time(lambda i: torch.matmul(a[i], b[i], out=c), n_sets=2, target_s=target_s)
    return 2.0 * n ** 3 / (t.median_ms * 1e-3) / 1e12


def copy_gbps(nbytes=2**30, target_s=0.3):
    import torch
    src = torch.empty(nbytes, device="cuda", dtype=torch.uint8).random_(0, 255)
    dst = torch.empty_like(src)
    t = cuda_time(lambda i: dst.copy_(src), n_sets=1, target_s=target_s)
    return 2.0 * nbytes / (t.median_ms * 1e-3) / 1e9


def measure(n=8192, copy_bytes=2**30):
    import torch
    out = {"matmul_n": n, "matmul_tflops": matmul_tflops(n), "copy_bytes": copy_bytes,
           "copy_gbps": copy_gbps(copy_bytes)}
    torch.cuda.empty_cache()
    return out
