"""What the GPU runs in one ``torch.autograd.grad`` of the norms, as the bench times it: every
kernel of the call (name, start relative to the call's first, duration) after do_bench's L2
flush, and the do_bench time of the call beside its kernels' union. The gap between the two is
what the window holds besides the kernels (launch latency, host, any kernel not ours).

    python benchmarks/probe_backward_timeline.py [OUT_DIR]   (CUDA)
"""
import json
import os
import statistics
import sys

import torch
import triton
from torch.profiler import ProfilerActivity, profile

import treefold
from treefold.bench.timing import kernel_us

CASES = [("rms_norm", 32768, 4096), ("rms_norm", 16384, 8192), ("layer_norm", 16384, 8192)]


def grad_call(op: str, m: int, n: int):
    x = torch.randn(m, n, device="cuda").bfloat16().requires_grad_()
    w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16().requires_grad_()
    if op == "rms_norm":
        y, wrt = treefold.rms_norm(x, w), (x, w)
    else:
        b = (0.1 * torch.randn(n, device="cuda")).bfloat16().requires_grad_()
        y, wrt = treefold.layer_norm(x, n, w, b), (x, w, b)
    dy = torch.randn(m, n, device="cuda").bfloat16()
    return lambda: torch.autograd.grad(y, wrt, dy, retain_graph=True)


def timeline(fn, calls: int = 5) -> list:
    driver = triton.runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            driver.clear_cache(cache)
            fn()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and e.device_time > 0),
                    key=lambda e: e.time_range.start)
    # split by the flush's kernel (the one that writes the 256 MB cache buffer)
    flush_name = events[0].name
    calls_seen, current = [], None
    for e in events:
        if e.name == flush_name:
            current = []
            calls_seen.append(current)
        elif current is not None:
            current.append(e)
    return [[(e.name.split("(")[0][:60], e.time_range.start, e.device_time) for e in c] for c in calls_seen]


def main(out_dir: str) -> None:
    torch.manual_seed(0)
    results = {}
    for op, m, n in CASES:
        fn = grad_call(op, m, n)
        bench = 1000 * statistics.median(triton.testing.do_bench(fn, return_mode="all"))
        kernels = kernel_us(fn, calls=20)
        calls = timeline(fn)
        label = f"{op}.bwd {m}x{n}"
        print(f"{label}: do_bench {bench:.1f} us, kernels' union {kernels:.1f} us")
        for c in calls[-2:]:
            t0 = c[0][1] if c else 0
            print("   " + "; ".join(f"{name} at {start - t0:.1f} for {dur:.1f}" for name, start, dur in c))
        results[label] = dict(do_bench_us=bench, kernel_us=kernels, calls=calls)
    if out_dir:
        with open(os.path.join(out_dir, "probe-backward-timeline.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
