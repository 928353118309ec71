"""The sampling pipeline's bins (``NUM_BINS`` bins of 1 / ``BINS_PER_NAT`` nat below the row maximum)
swept: fewer bins make the histogram pass cheaper (Triton's histogram costs a few instructions per
bin bit per token) and leave more tokens in the boundary bins for the compaction and resolve
passes. 151936 logits (the gpu_sampling inputs), fp32, batch 64 and 1, peaked and flat rows.

Every variant's tokens (top_k: values and indices) are first checked equal to the default's, then
each is timed replayed from a CUDA graph (do_bench median, L2 flushed) in three interleaved rounds.
python benchmarks/probe_sampling_bins.py [OUT_DIR] (CUDA; writes probe-sampling-bins.json there).
"""
import json
import os
import sys

import torch

from treefold.bench.timing import CudaTimer, interleaved_us
from gpu_sampling import FLAT, graphed, logits
from treefold._ops import sampling as ops

ROUNDS = 3
BINS = ((128, 4.0), (64, 2.0), (64, 4.0), (32, 1.0), (32, 2.0), (16, 1.0))
CONFIGS = {
    "top-p 0.9": dict(top_p=0.9),
    "min-p 0.05": dict(min_p=0.05),
    "top-k 50": dict(top_k=50),
    "top-k 50 + top-p 0.9": dict(top_k=50, top_p=0.9),
    "top_k(50)": None,
}


def with_bins(num_bins, bins_per_nat, fn):
    """fn with the module's bins set to these for its launch (and its graph capture)."""
    def run():
        saved = ops.NUM_BINS, ops.BINS_PER_NAT
        ops.NUM_BINS, ops.BINS_PER_NAT = num_bins, bins_per_nat
        try:
            return fn()
        finally:
            ops.NUM_BINS, ops.BINS_PER_NAT = saved
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
    checks, replays = {}, {}
    for key, calls in cases.items():
        want = None
        for name, fn in calls.items():
            got = [t.clone() for t in fn()]
            want = want or got
            checks[f"{key} {name}"] = all(torch.equal(a, b) for a, b in zip(got, want))
            replays[(key, name)] = graphed(fn)
    times = interleaved_us(replays, CudaTimer(warmup_ms=10, rep_ms=40), ROUNDS)
    bad = [k for k, v in checks.items() if not v]
    print(f"device {torch.cuda.get_device_name()}; {len(checks)} variants, tokens not equal to the first: {bad or 'none'}")
    print("graph replay, L2 flushed, us (three rounds)")
    for key, calls in cases.items():
        print(" ".join(map(str, key)))
        for name in calls:
            ts = times[(key, name)]
            print(f"  {name:22s} " + "  ".join(f"{t:7.1f}" for t in ts) + f"   median {sorted(ts)[1]:7.1f}")
    if out_dir:
        with open(os.path.join(out_dir, "probe-sampling-bins.json"), "w") as f:
            json.dump({"checks": checks, "times_us": {f"{k[0]} | {k[1]}": v for k, v in times.items()}}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
