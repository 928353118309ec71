"""Sampling lists still longer than the pairwise limit after the sub-bin refinement: sorted
(``resolve_kernel``'s SORT_MID, up to SORT_MAX tokens) against the bracket search, in one
process:

    python benchmarks/probe_sort_mid.py OUT_DIR           # time every variant
    python benchmarks/probe_sort_mid.py --warm VARIANT    # compile one variant's kernels

Flat rows refine to hundreds of tokens (181-575 for one row of 151936 of standard deviation 2
under top-p 0.9, interpreted on the CPU) and take the bracket search, whose passes over the list
are a chain of block-wide reductions in the one resolve program; a sort of at most 1024 composite
keys and a prefix sum give the same ranks and masses. Peaked rows refine to at most a few dozen
tokens and never reach either (their times should not move, though the resolve grows: offline
sm_90, 14,664 -> 16,464 instructions, the same 128 registers). Every choice gives the same
tokens (checked first). 151936 logits (the gpu_sampling inputs): one row and 64 rows, fp32 flat
(top-p 0.9, min-p 0.05) and peaked (top-p 0.9, min-p 0.05), bf16 peaked top-p 0.9; each call
replayed from a CUDA graph (do_bench median, L2 flushed) in three interleaved rounds.
"""
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from probe_report import sampling_variants, variant_probe

#: name -> the launcher's settings
VARIANTS = {
    "search": {"SORT_MID_LISTS": False},
    "sort": {"SORT_MID_LISTS": True},
}
CASES = (
    (1, torch.float32, True, ("top-p 0.9", "min-p 0.05")),
    (1, torch.float32, False, ("top-p 0.9", "min-p 0.05")),
    (1, torch.bfloat16, False, ("top-p 0.9",)),
    (64, torch.float32, True, ("top-p 0.9", "min-p 0.05")),
    (64, torch.float32, False, ("top-p 0.9", "min-p 0.05")),
    (64, torch.bfloat16, False, ("top-p 0.9",)),
)


def table():
    return sampling_variants(ops, VARIANTS, CASES)


if __name__ == "__main__":
    variant_probe(sys.argv, VARIANTS, table, "sort-mid.json")
