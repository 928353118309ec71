"""The norm backward's column sums alone, under other launch choices: columns per program
(BLOCK_N) and warps, on the partials the backward kernel leaves (RMSNorm 32768 x 4096: 256 x 4096;
rows of 8192: 132 x 8192; LayerNorm's two sets), each call after a pass that rewrites the
partials (they sit in L2, dirty, as the backward kernel leaves them). Kernel time (CUPTI),
three interleaved rounds; every variant's sums checked equal to the default's.

    python benchmarks/probe_column_sum.py [OUT_DIR]   (CUDA)
"""
import json
import os
import statistics
import sys

import torch

from treefold import order
from treefold._ops import norms
from treefold.bench.timing import kernel_us

SHAPES = [(256, 4096, 1), (132, 8192, 1), (132, 8192, 2)]
CHOICES = [(32, 4), (16, 4), (8, 4), (16, 2), (8, 2), (4, 1), (8, 1), (64, 8), (32, 8)]


def call(parts, out, parts2, out2, block_n, warps):
    p, n = parts.shape
    padded = order.next_pow2(p)
    grid = (order.cdiv(n, block_n), 2 if parts2 is not None else 1)
    return lambda: norms._column_sum_kernel(
        grid, parts, out, parts2 if parts2 is not None else parts, out2 if out2 is not None else out, p, n,
        PARTS=padded, LOG2_PARTS=order.log2(padded), BLOCK_N=block_n, num_warps=warps,
        enable_fp_fusion=False)


def main(out_dir: str) -> None:
    torch.manual_seed(0)
    variants, checks = {}, []
    for p, n, sets in SHAPES:
        parts = torch.randn(p, n, device="cuda")
        parts2 = torch.randn(p, n, device="cuda") if sets == 2 else None
        outs = [torch.empty(n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        first = None
        for block_n, warps in CHOICES:
            fn = call(parts, outs[0], parts2, outs[1] if sets == 2 else None, block_n, warps)
            fn()
            got = [o.clone() for o in outs[:sets]]
            if first is None:
                first = got
            checks.append(all(torch.equal(a, b) for a, b in zip(got, first)))
            touch = (lambda parts=parts, parts2=parts2: (parts.mul_(1.0), parts2.mul_(1.0) if parts2 is not None
                                                         else None))
            variants[f"{p}x{n} x{sets} BLOCK_N {block_n} {warps}w"] = (fn, touch)
    print("sums equal to the first choice's:", all(checks))
    times = {k: [] for k in variants}
    for _ in range(3):
        for name, (fn, touch) in variants.items():
            times[name].append(kernel_us(fn, calls=50, flush=touch))
    for name, ts in times.items():
        print(f"{name:32s} " + " ".join(f"{t:6.2f}" for t in ts) + f"  median {statistics.median(ts):6.2f} us")
    if out_dir:
        with open(os.path.join(out_dir, "probe-column-sum.json"), "w") as f:
            json.dump(dict(kernel_us=times, equal=all(checks)), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
