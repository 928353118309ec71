"""Sampling's passes as programmatic dependent launches or ordinary ones, in one process:

    python benchmarks/probe_sampling_pdl.py OUT_DIR

151936 fp32 logits (the gpu_sampling inputs): one row under every filter, greedy and plain
sampling; 64 rows under top-p 0.9 and greedy. Two variants: "ordinary" (DEPENDENT_LAUNCH off)
and "dependent" (on). Each call replayed from a CUDA graph (do_bench median, L2 flushed) in three
interleaved rounds; every variant's tokens must equal the first's. Writes OUT_DIR/pdl.json.
"""
import os
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from probe_report import time_graphed_variants, with_values
from probe_sampling_split import call

#: name -> the launcher's settings
VARIANTS = {"ordinary": {"DEPENDENT_LAUNCH": False}, "dependent": {"DEPENDENT_LAUNCH": True}}


def unfiltered(x, seeds, temperature):
    return lambda: (ops.sample_rows(x, temperature, None, None, None, seeds, 0),)


def main(out_dir):
    from gpu_sampling import logits
    table = {}
    for batch, configs in ((1, ("top-p 0.9", "min-p 0.05", "top-k 50", "top-k 50 + top-p 0.9", "top_k(50)",
                                "greedy", "plain")), (64, ("top-p 0.9", "greedy"))):
        x = logits(batch, torch.float32)
        seeds = torch.arange(batch, device="cuda", dtype=torch.int64) * 7919 + 1
        for config in configs:
            if config in ("greedy", "plain"):
                fn = unfiltered(x, seeds, 0.0 if config == "greedy" else 1.0)
            else:
                fn = call(ops, x, seeds, config, None)
            table[(f"{batch} float32 peaked {config}",)] = {name: with_values(ops, values, fn)
                                                             for name, values in VARIANTS.items()}
    times = time_graphed_variants(table, os.path.join(out_dir, "pdl.json"), 3)
    print("best of 3 rounds, us: " + " | ".join(VARIANTS))
    for key, calls in table.items():
        print(f"{key[0]:40s} " + "  ".join(f"{min(times[(key, name)]):7.1f}" for name in calls))


if __name__ == "__main__":
    main(sys.argv[1])
