"""RMSNorm rows of 16384 and softmax rows of 4096 to 131072 under several launch choices and the default, each timed three
times in interleaved rounds (do_bench median, L2 flushed), to separate the choices from the
run-to-run spread: python benchmarks/probe_shared_rows.py (CUDA)."""
import torch

import treefold
from treefold._ops import norms
from treefold._ops import softmax as sm
from treefold.bench.roofs import measure_copy_roof
from treefold.bench.timing import CudaTimer, interleaved_us


def main():
    torch.manual_seed(0)
    x = torch.randn(4096, 16384, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(16384, device="cuda")).bfloat16()
    xs = (torch.randn(8192, 4096, device="cuda") * 3).bfloat16()
    rms = {
        "rms 4096x16384 whole row, 16 warps": dict(rows_per_program=1, num_warps=16),
        "rms 4096x16384 whole row, 8 warps": dict(rows_per_program=1, num_warps=8),
        "rms 4096x16384 shares of 4096, 4 warps": dict(segments_per_program=1),
        "rms 4096x16384 shares of 4096, 2 warps": dict(segments_per_program=1, num_warps=2),
        "rms 4096x16384 shares of 8192, 8 warps": dict(segments_per_program=2),
        "rms 4096x16384 shares of 8192, 4 warps": dict(segments_per_program=2, num_warps=4),
    }
    calls = {name: (lambda kw=kw: norms.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", torch.bfloat16,
                                                         store_stats=False, **kw)) for name, kw in rms.items()}
    calls["rms 4096x16384 treefold.rms_norm (default)"] = lambda: (treefold.rms_norm(x, w),)
    for name, t in {"softmax 8192x4096 block 4 warps, 1 row": sm.Tuning(num_warps=4, rows_per_program=1),
                    "softmax 8192x4096 block 8 warps, 2 rows": sm.Tuning(num_warps=8, rows_per_program=2),
                    "softmax 8192x4096 block 4 warps, 2 rows": sm.Tuning(num_warps=4, rows_per_program=2)}.items():
        calls[name] = lambda t=t: sm.softmax_forward(xs, strategy="block", tuning=t)
    long_rows = {(4096, 32768): (torch.randn(4096, 32768, device="cuda") * 3).bfloat16(),
                 (256, 131072): (torch.randn(256, 131072, device="cuda") * 3).bfloat16()}
    for (rows, n), xl in long_rows.items():
        for label, strategy, t in (("online", "online", sm.Tuning()),
                                   ("cooperative 8192 per program, 4 warps", "cooperative",
                                    sm.Tuning(segments_per_program=2, num_warps=4)),
                                   ("cooperative 4096 per program, 4 warps", "cooperative",
                                    sm.Tuning(segments_per_program=1, num_warps=4)),
                                   ("block 16 warps", "block", sm.Tuning(num_warps=16))):
            if strategy == "block" and n > 32768:
                continue
            calls[f"softmax {rows}x{n} {label}"] = (lambda xl=xl, strategy=strategy, t=t:
                                                    sm.softmax_forward(xl, strategy=strategy, tuning=t))
    want = calls["rms 4096x16384 whole row, 16 warps"]()[0]
    for name, fn in calls.items():
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        if name.startswith("rms"):
            assert torch.equal(out, want), name
    times = interleaved_us(calls, CudaTimer(warmup_ms=10, rep_ms=60))
    roof = measure_copy_roof(torch.device("cuda"), CudaTimer()).gbs
    print(f"roof {roof:.0f} GB/s; bits of every rms launch equal")
    for name, ts in times.items():
        numel = x.numel() if name.startswith("rms") else xs.numel()
        for (rows, n), xl in long_rows.items():
            if f" {rows}x{n} " in name:
                numel = xl.numel()
        nbytes = 2 * numel * 2
        print(f"{name:44s} " + "  ".join(f"{t:7.1f} us {100 * nbytes / t / 1e3 / roof:5.1f}%" for t in ts))


if __name__ == "__main__":
    main()
