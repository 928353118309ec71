"""Sampling row passes that load each segment before working on the previous one ("prefetch"),
against not, at the default programs per row and at half of them, for 151936 logits (the
gpu_sampling inputs) at batch 1 and 64, fp32 and bf16. With SURE_LIST=1 in the environment,
instead: where the sure-kept tokens of top-p and min-p race (``SURE_LIST_MAX``: 0, all raced in
the compaction pass; 2^20, all listed for the resolve pass), with and without prefetch for
peaked logits, 64 rows, fp32, peaked and flat logits.

Every variant's tokens (top_k: values and indices) are first checked equal to the default's, then
each is timed replayed from a CUDA graph (do_bench median, L2 flushed) in three interleaved
rounds. python benchmarks/probe_sampling_prefetch.py [OUT_DIR] (CUDA; writes
probe-sampling-prefetch.json there).
"""
import os
import sys

import torch

from gpu_sampling import FLAT, VOCAB, logits
from treefold._ops import sampling as ops
from probe_report import time_graphed_variants

ROUNDS = 3
CONFIGS = {
    "greedy": dict(temperature=0.0),
    "sample": dict(temperature=1.0),
    "top-k 50": dict(temperature=1.0, top_k=50),
    "top-p 0.9": dict(temperature=1.0, top_p=0.9),
    "min-p 0.05": dict(temperature=1.0, min_p=0.05),
    "top_k(50)": None,
}


def caller(x, seeds, config, **launch):
    c = CONFIGS[config]
    if c is None:
        return lambda: ops.top_k_rows(x, 50, **launch)
    return lambda: (ops.sample_rows(x, c["temperature"], c.get("top_k"), c.get("top_p"), c.get("min_p"),
                                    seeds, 0, **launch),)


def listing(sure_list_max, fn):
    """fn with ``SURE_LIST_MAX`` set to this for its launch (and its graph capture)."""
    def run():
        saved, ops.SURE_LIST_MAX = ops.SURE_LIST_MAX, sure_list_max
        try:
            return fn()
        finally:
            ops.SURE_LIST_MAX = saved
    return run


def main(out_dir):
    cases = {}
    if os.environ.get("SURE_LIST"):
        # sure-kept tokens raced where they lie (0), listed for the resolve pass up to 8192 per
        # row (the default), or all listed; top-p and min-p at 64 rows, fp32
        x = logits(64, torch.float32)
        seeds = torch.arange(64, device="cuda", dtype=torch.int64) * 7919 + 1
        for config in ("top-p 0.9", "min-p 0.05"):
            cases[("float32", 64, config)] = {
                f"SURE_LIST_MAX {m}, prefetch {pf}": listing(m, caller(x, seeds, config, prefetch=pf))
                for m in (0, 8192, 1 << 20) for pf in (False, True)}
        # rows that keep most of their tokens: flat logits, top-p 0.9 and top-p 1 as a per-row tensor
        flat = logits(64, torch.float32, scale=FLAT)
        every = torch.ones(64, device="cuda")
        for label, p in (("top-p 0.9 flat", 0.9), ("top-p 1 (tensor) flat", every)):
            cases[("float32", 64, label)] = {
                f"SURE_LIST_MAX {m}": listing(m, lambda p=p: (ops.sample_rows(flat, 1.0, None, p, None, seeds, 0),))
                for m in (0, 8192, 1 << 20)}
    for dtype in (torch.float32, torch.bfloat16) if not cases else ():
        for batch in (1, 64):
            x = logits(batch, dtype)
            seeds = torch.arange(batch, device="cuda", dtype=torch.int64) * 7919 + 1
            for config in CONFIGS:
                race = CONFIGS[config] is not None and list(CONFIGS[config]) == ["temperature"]
                g = (ops.race_plan(batch, VOCAB, dtype, x.device, CONFIGS[config]["temperature"] == 0.0) if race
                     else ops.plan(batch, VOCAB, x.device))
                half = max(1, g.programs_per_row // 2)
                cases[(str(dtype)[6:], batch, config)] = {
                    f"no prefetch, {g.programs_per_row}/row": caller(x, seeds, config, prefetch=False),
                    f"prefetch, {g.programs_per_row}/row": caller(x, seeds, config, prefetch=True),
                    f"prefetch, {half}/row": caller(x, seeds, config, prefetch=True, programs_per_row=half),
                }
    time_graphed_variants(cases, os.path.join(out_dir, "probe-sampling-prefetch.json") if out_dir else "",
                          ROUNDS)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
