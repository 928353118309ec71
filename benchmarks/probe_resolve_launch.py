"""The filtered sampling path's last pass (``resolve_kernel``, one program per row) under other
launch choices, in one process:

    python benchmarks/probe_resolve_launch.py OUT_DIR           # time every variant
    python benchmarks/probe_resolve_launch.py --warm VARIANT    # compile one variant's kernels

At one row the resolve pass is the largest part of a top-p call (about 15 of 35 us on the H200)
and runs on one SM: a chain of dependent loads and block-wide reductions, whose cost the number
of warps and the width of the pairwise ranking set. Variants: the default (8 warps, chunks of 32
tokens), 4 and 16 warps, chunks of 16 and 64. Every choice gives the same tokens (the order and
the fixed-point masses do not depend on them): checked first.

151936 fp32 logits (the gpu_sampling inputs), peaked rows: one row under top-p 0.9, min-p 0.05,
top-k 50 and top-k 50 + top-p 0.9; 64 rows under top-p 0.9 and min-p 0.05. Each call replayed
from a CUDA graph (do_bench median, L2 flushed) in three interleaved rounds. The resolve kernel
is large (about 22,000 SASS instructions): ``--warm`` compiles a variant into Triton's cache, so
a driver can warm the variants in parallel processes before the timing process starts.
"""
import os
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from probe_report import time_graphed_variants, with_values
from probe_sampling_split import call

#: name -> the launcher's settings
VARIANTS = {
    "default": {},
    "4 warps": {"RESOLVE_WARPS": 4},
    "16 warps": {"RESOLVE_WARPS": 16},
    "chunk 16": {"PAIR_CHUNK": 16},
    "chunk 64": {"PAIR_CHUNK": 64},
}
CASES = ((1, ("top-p 0.9", "min-p 0.05", "top-k 50", "top-k 50 + top-p 0.9")), (64, ("top-p 0.9", "min-p 0.05")))


def table():
    from gpu_sampling import logits
    out = {}
    for batch, configs in CASES:
        x = logits(batch, torch.float32)
        seeds = torch.arange(batch, device="cuda", dtype=torch.int64) * 7919 + 1
        for config in configs:
            fn = call(ops, x, seeds, config, None)
            out[(f"{batch} float32 peaked {config}",)] = {name: with_values(ops, values, fn)
                                                          for name, values in VARIANTS.items()}
    return out


def warm(variant):
    for calls in table().values():
        calls[variant]()
    torch.cuda.synchronize()


def main(out_dir):
    cases = table()
    times = time_graphed_variants(cases, os.path.join(out_dir, "resolve.json"), 3)
    print("best of 3 rounds, us: " + " | ".join(VARIANTS))
    for key, calls in cases.items():
        print(f"{key[0]:32s} " + "  ".join(f"{min(times[(key, name)]):7.1f}" for name in calls))


if __name__ == "__main__":
    if sys.argv[1] == "--warm":
        warm(sys.argv[2])
    else:
        main(sys.argv[1])
