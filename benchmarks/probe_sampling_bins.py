"""The sampling pipeline's bins (``NUM_BINS`` bins of 1 / ``BINS_PER_NAT`` nat below the row maximum)
swept: fewer bins make the histogram pass cheaper (Triton's histogram costs a few instructions per
bin bit per token) and leave more tokens in the boundary bins for the compaction and resolve
passes. 151936 logits (the gpu_sampling inputs), fp32, batch 64 and 1, peaked and flat rows.

The histogram's pre-list covers the same 10 nats in every variant (PRELIST_BINS = 10 x
BINS_PER_NAT, at most NUM_BINS - 1: 7.75 nats for 32 bins of a quarter nat). Every variant's
tokens (top_k: values and indices) are first checked equal to the default's, then each is timed
replayed from a CUDA graph (do_bench median, L2 flushed) in three interleaved rounds.
python benchmarks/probe_sampling_bins.py [OUT_DIR] (CUDA; writes probe-sampling-bins.json there).
"""
import os
import sys

import torch

from gpu_sampling import FLAT, logits
from treefold._ops import sampling as ops
from probe_report import time_graphed_variants

ROUNDS = 3
BINS = ((64, 4.0), (128, 4.0), (64, 2.0), (32, 2.0), (32, 4.0), (16, 1.0))
CONFIGS = {
    "top-p 0.9": dict(top_p=0.9),
    "min-p 0.05": dict(min_p=0.05),
    "top-k 50": dict(top_k=50),
    "top-k 50 + top-p 0.9": dict(top_k=50, top_p=0.9),
    "top_k(50)": None,
}


def with_bins(num_bins, bins_per_nat, fn):
    """fn with the module's bins, and the pre-list's bins over the same 10 nats, set to these for
    its launch (and its graph capture)."""
    def run():
        saved = ops.NUM_BINS, ops.BINS_PER_NAT, ops.PRELIST_BINS
        ops.NUM_BINS, ops.BINS_PER_NAT = num_bins, bins_per_nat
        ops.PRELIST_BINS = min(num_bins - 1, round(10 * bins_per_nat))
        try:
            return fn()
        finally:
            ops.NUM_BINS, ops.BINS_PER_NAT, ops.PRELIST_BINS = saved
    return run


def caller(x, seeds, config):
    c = CONFIGS[config]
    if c is None:
        return lambda: ops.top_k_rows(x, 50)
    return lambda: (ops.sample_rows(x, 1.0, c.get("top_k"), c.get("top_p"), c.get("min_p"), seeds, 0),)


def main(out_dir):
    cases = {}
    for batch, flat in ((64, False), (1, False), (64, True)):
        x = logits(batch, torch.float32, **({"scale": FLAT} if flat else {}))
        seeds = torch.arange(batch, device="cuda", dtype=torch.int64) * 7919 + 1
        for config in CONFIGS if not flat else ("top-p 0.9", "min-p 0.05"):
            cases[(batch, "flat" if flat else "peaked", config)] = {
                f"{nb} bins of 1/{bpn:g} nat": with_bins(nb, bpn, caller(x, seeds, config)) for nb, bpn in BINS}
    time_graphed_variants(cases, os.path.join(out_dir, "probe-sampling-bins.json") if out_dir else "", ROUNDS)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
