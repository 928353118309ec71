"""The filtered sampling path's last pass (``resolve_kernel``, one program per row) under other
launch choices, in one process:

    python benchmarks/probe_resolve_launch.py OUT_DIR           # time every variant
    python benchmarks/probe_resolve_launch.py --warm VARIANT    # compile one variant's kernels

At one row the resolve pass is the largest part of a top-p call (about 15 of 35 us on the H200)
and runs on one SM: a chain of dependent loads and block-wide reductions, whose cost the number
of warps and the width of the pairwise ranking set. Variants: the default (RESOLVE_WARPS = 16,
chunks of 32 tokens), 8 warps, chunks of 16 and 64 (4 warps spilled: 57 us at one row). At 16
warps a thread may hold 128 registers, and offline (sm_90, 64 rows of 151936 fp32 under top-p)
the kernel spills 96 bytes a thread to its stack; at 8 warps it may hold 255. Every choice gives
the same tokens (the order and the fixed-point masses do not depend on them): checked first.

151936 fp32 logits (the gpu_sampling inputs), peaked rows: one row under top-p 0.9, min-p 0.05,
top-k 50 and top-k 50 + top-p 0.9; 64 rows under top-p 0.9 and min-p 0.05. Each call replayed
from a CUDA graph (do_bench median, L2 flushed) in three interleaved rounds. The resolve kernel
is large (about 22,000 SASS instructions): ``--warm`` compiles a variant into Triton's cache, so
a driver can warm the variants in parallel processes before the timing process starts.
"""
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from probe_report import sampling_variants, variant_probe

#: name -> the launcher's settings
VARIANTS = {
    "default": {},
    "8 warps": {"RESOLVE_WARPS": 8},
    "chunk 16": {"PAIR_CHUNK": 16},
    "chunk 64": {"PAIR_CHUNK": 64},
}
CASES = (
    (1, torch.float32, False, ("top-p 0.9", "min-p 0.05", "top-k 50", "top-k 50 + top-p 0.9")),
    (64, torch.float32, False, ("top-p 0.9", "min-p 0.05")),
)


def table():
    return sampling_variants(ops, VARIANTS, CASES)


if __name__ == "__main__":
    variant_probe(sys.argv, VARIANTS, table, "resolve.json")
