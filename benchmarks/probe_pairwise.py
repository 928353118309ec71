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
    "max 64": {"PAIRWISE_MAX": 64},
    "max 32": {"PAIRWISE_MAX": 32},
    "max 64 chunk 16": {"PAIRWISE_MAX": 64, "PAIR_CHUNK": 16},
    "max 32 chunk 16": {"PAIRWISE_MAX": 32, "PAIR_CHUNK": 16},
}
CASES = (
    (1, False, ("top-p 0.9", "min-p 0.05", "top-k 50", "top-k 50 + top-p 0.9", "top_k(50)")),
    (1, True, ("top-p 0.9",)),
    (64, False, ("top-p 0.9", "min-p 0.05", "top-k 50 + top-p 0.9", "top_k(50)")),
    (64, True, ("top-p 0.9", "min-p 0.05")),
)


def table():
    from gpu_sampling import FLAT, logits
    out = {}
    for batch, flat, configs in CASES:
        x = logits(batch, torch.float32, **({"scale": FLAT} if flat else {}))
        seeds = torch.arange(batch, device="cuda", dtype=torch.int64) * 7919 + 1
        for config in configs:
            fn = call(ops, x, seeds, config, None)
            out[(f"{batch} float32 {'flat' if flat else 'peaked'} {config}",)] = {
                name: with_values(ops, values, fn) for name, values in VARIANTS.items()}
    return out


def warm(variant):
    for calls in table().values():
        calls[variant]()
    torch.cuda.synchronize()


def main(out_dir):
    cases = table()
    times = time_graphed_variants(cases, os.path.join(out_dir, "pairwise.json"), 3)
    print("best of 3 rounds, us: " + " | ".join(VARIANTS))
    for key, calls in cases.items():
        print(f"{key[0]:36s} " + "  ".join(f"{min(times[(key, name)]):7.1f}" for name in calls))


if __name__ == "__main__":
    if sys.argv[1] == "--warm":
        warm(sys.argv[2])
    else:
        main(sys.argv[1])
