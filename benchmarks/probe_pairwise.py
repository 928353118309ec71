"""The resolve pass's pairwise ranking (``resolve_kernel``'s ``_resolve_short``) at other sizes, in
one process:

    python benchmarks/probe_pairwise.py OUT_DIR           # time every variant
    python benchmarks/probe_pairwise.py --warm VARIANT    # compile one variant's kernels

Stamps of the SM clock inside the resolve program (one row of 151936 fp32, H200) put about 6 us of
a 14 us resolve in the pairwise ranking and the race after it, whatever the list's length (min-p:
an empty list, 6.2 us): its cost is the [PAIRWISE_MAX, PAIR_CHUNK] comparison tiles and their
reductions, PAIRWISE_MAX / PAIR_CHUNK of them. Smaller tiles cost less; lists longer than
PAIRWISE_MAX are first cut down by the sub-bins (``_refine``), and what is still longer takes the
bracket search. Variants: PAIRWISE_MAX 128 (the default), 64, 32, with chunks of 32 or 16. Every
choice gives the same tokens (checked first).

151936 logits (the gpu_sampling inputs): one row fp32, peaked (top-p 0.9, min-p 0.05, top-k 50,
top-k 50 + top-p 0.9, top_k(50)) and flat (top-p 0.9); 64 rows fp32, peaked (top-p 0.9, min-p
0.05, top-k 50 + top-p 0.9, top_k(50)) and flat (top-p 0.9, min-p 0.05). Each call replayed from a
CUDA graph (do_bench median, L2 flushed) in three interleaved rounds.
"""
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from probe_report import sampling_variants, variant_probe

#: name -> the launcher's settings
VARIANTS = {
    "default": {},
    "max 64": {"PAIRWISE_MAX": 64},
    "max 32": {"PAIRWISE_MAX": 32},
    "max 64 chunk 16": {"PAIRWISE_MAX": 64, "PAIR_CHUNK": 16},
    "max 32 chunk 16": {"PAIRWISE_MAX": 32, "PAIR_CHUNK": 16},
}
CASES = (
    (1, torch.float32, False, ("top-p 0.9", "min-p 0.05", "top-k 50", "top-k 50 + top-p 0.9", "top_k(50)")),
    (1, torch.float32, True, ("top-p 0.9",)),
    (64, torch.float32, False, ("top-p 0.9", "min-p 0.05", "top-k 50 + top-p 0.9", "top_k(50)")),
    (64, torch.float32, True, ("top-p 0.9", "min-p 0.05")),
)


def table():
    return sampling_variants(ops, VARIANTS, CASES)


if __name__ == "__main__":
    variant_probe(sys.argv, VARIANTS, table, "pairwise.json")
