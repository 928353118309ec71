"""Host time per eager call at decode sizes: 2000 calls with no synchronisation inside, wall time / 2000.

python benchmarks/host_overhead.py  (CUDA). Prints one line per call; what a decode step pays per
call outside a CUDA graph.
"""
import time

import torch
import torch.nn.functional as F

import treefold


def per_call_us(fn, calls=2000):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    dev = "cuda"
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    logits = torch.randn(1, 151936, device=dev)
    cases = [
        ("treefold.softmax 1x4096 bf16", lambda: treefold.softmax(x)),
        ("torch.softmax 1x4096 bf16", lambda: torch.softmax(x, -1)),
        ("treefold.logsumexp 1x4096 bf16", lambda: treefold.logsumexp(x)),
        ("treefold.rms_norm 1x4096 bf16", lambda: treefold.rms_norm(x, w)),
        ("F.rms_norm 1x4096 bf16", lambda: F.rms_norm(x, (4096,), w, 1e-6)),
        ("treefold.rms_norm + residual 1x4096", lambda: treefold.rms_norm(x, w, residual=r)),
        ("treefold.layer_norm 1x4096 bf16", lambda: treefold.layer_norm(x, (4096,), w, b)),
        ("F.layer_norm 1x4096 bf16", lambda: F.layer_norm(x, (4096,), w, b)),
        ("treefold.argmax 1x151936 fp32", lambda: treefold.argmax(logits, dim=-1)),
        ("torch.argmax 1x151936 fp32", lambda: torch.argmax(logits, -1)),
        ("treefold.sum 2^20 fp32", lambda: treefold.sum(logits)),
        ("treefold.sample greedy 1x151936", lambda: treefold.sample(logits, temperature=0.0)),
        ("treefold.sample top_p 0.9 1x151936", lambda: treefold.sample(logits, top_p=0.9, seed=1)),
    ]
    for name, fn in cases:
        try:
            print(f"host us/call  {name:40s} {per_call_us(fn):8.1f}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"host us/call  {name:40s} failed: {e!r:.120}", flush=True)


if __name__ == "__main__":
    main()
