"""Every provider's GPU time per call from the profiler (CUPTI kernel durations), after an L2
flush as do_bench makes it, at the norm shapes where the bench puts treefold within 1% of a peer.

do_bench times the window between two CUDA events around the call. At LayerNorm and RMSNorm
65536 x 1024 that window was 1.5 us longer for treefold's public call than for its launch, while
the profiler gave the kernel the same duration from both (``results/h200-probe-public-norms.txt``):
so at these shapes the window measures more than the kernels. Here the kernels alone: the sum of
the durations of every kernel a call launches (``treefold.bench.timing.kernel_us``, the flush's
kernels excluded), per call, over 50 calls, for treefold and the peers built exactly as the bench
builds them; three rounds. (``results/h200-probe-kernel-times.txt`` was taken with this probe's
own timer before the bench had one: the same sum, the flush's fill excluded by name, and a count
of kernels per call beside it.)

    python benchmarks/probe_kernel_times.py [OUT_DIR]   (CUDA; peers from .peers/activate.sh)
"""
import json
import os
import statistics
import sys

import torch

import treefold
from treefold.bench.cases import CASES_BY_NAME, Shape
from treefold.bench.providers import make_providers
from treefold.bench.runner import load_providers, make_inputs, clone_inputs
from treefold.bench.timing import kernel_us

CASES = [("rms_norm", 16384, 8192, "bf16"), ("rms_norm", 65536, 1024, "bf16"), ("rms_norm", 4096, 16384, "bf16"),
         ("rms_norm", 8192, 4096, "fp32"), ("rms_norm", 8192, 4096, "bf16"), ("rms_norm", 32768, 4096, "bf16"),
         ("rms_norm+residual", 32768, 4096, "bf16"),
         ("layer_norm", 65536, 1024, "bf16"), ("layer_norm", 8192, 4096, "bf16"), ("layer_norm", 16384, 8192, "bf16")]
CALLS = 50


def main(out_dir: str) -> None:
    device = torch.device("cuda")
    providers = load_providers(make_providers(["torch", "compile", "liger", "quack"], treefold), print)
    rows = []
    for name, m, n, dtype in CASES:
        case, shape = CASES_BY_NAME[name], Shape(m, n, dtype)
        base = make_inputs(case, shape, device, 0)
        calls = {}
        for p in providers:
            try:
                impl = p.build(case, clone_inputs(case, base), shape)
                if impl is None:
                    continue
                impl.fn()
                impl.fn()
                torch.cuda.synchronize()
                calls[p.name] = impl.fn
            except Exception as e:  # a peer that refuses the shape
                print(f"{name} {m}x{n} {dtype} {p.name}: {type(e).__name__}: {str(e)[:80]}")
        times = {k: [] for k in calls}
        for _ in range(3):
            for k, fn in calls.items():
                times[k].append(kernel_us(fn, CALLS))
        label = f"{name} {m}x{n} {dtype}"
        for k, ts in times.items():
            rows.append(dict(case=label, provider=k, us=ts))
            print(f"{label:32s} {k:9s} " + "  ".join(f"{t:7.2f}" for t in ts)
                  + f"  median {statistics.median(ts):7.2f} us")
        del base, calls
        torch.cuda.empty_cache()
    if out_dir:
        with open(os.path.join(out_dir, "probe-kernel-times.json"), "w") as f:
            json.dump(dict(calls=CALLS, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
