"""Sampling under min-p alone by one race over the kept tokens (``sample_min_p_rows``: the
segment maxima, then the race, then its combine) against the pipeline (``sample_rows``: six
launches with the pre-list), timed in the same process:

    python benchmarks/probe_min_p_race.py OUT_DIR

For each case (rows, dtype, peaked or flat logits of gpu_sampling.py) and min-p (0.05, 0.3, and
one per row spread over [0, 0.5]): the two calls' tokens compared at 8 offsets (8 draws per row),
then each call replayed from a CUDA graph (do_bench median, L2 flushed) in three interleaved
rounds, and the profiler's kernel time of the replay (``kernel_us``). Writes
OUT_DIR/min-p-race.json and prints a table last. ROWS="1,64" sets the batch sizes;
PROGRAMS="15,22" adds the race at those programs per row (a launch choice of both its passes),
checked and timed beside the default plan.
"""
import os
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from gpu_sampling import FLAT, PEAKED, logits
from probe_report import graph_and_kernel_report, time_graphed_variants

ROWS = tuple(int(r) for r in os.environ.get("ROWS", "1,64").split(","))
PROGRAMS = tuple(int(p) for p in os.environ.get("PROGRAMS", "").split(",") if p)


def main(out_dir: str) -> None:
    cases, mismatches = {}, {}
    for rows in ROWS:
        seeds = torch.arange(rows, device="cuda") * 7919 + 3
        spread = torch.linspace(0.0, 0.5, rows, device="cuda")
        for dtype in (torch.float32, torch.bfloat16):
            for kind, scale in (("peaked", PEAKED), ("flat", FLAT)):
                if kind == "flat" and dtype != torch.float32:
                    continue
                x = logits(rows, dtype, scale)
                for name, mp in (("min-p 0.05", 0.05), ("min-p 0.3", 0.3), ("min-p per row", spread)):
                    key = (rows, str(dtype).replace("torch.", ""), kind, name)
                    bad = 0
                    plans = (None,) + (PROGRAMS if rows > 1 else ())
                    for offset in range(8):
                        want = ops.sample_rows(x, 1.0, None, None, mp, seeds, offset)
                        for ppr in plans:
                            got = ops.sample_min_p_rows(x, 1.0, mp, seeds, offset, programs_per_row=ppr)
                            bad += int((got != want).sum())
                    mismatches[" ".join(map(str, key))] = bad
                    cases[key] = {
                        "pipeline": lambda x=x, mp=mp, s=seeds: (ops.sample_rows(x, 1.0, None, None, mp, s, 3),),
                        "race": lambda x=x, mp=mp, s=seeds: (ops.sample_min_p_rows(x, 1.0, mp, s, 3),),
                    }
                    for ppr in plans[1:]:
                        cases[key][f"race {ppr}/row"] = lambda x=x, mp=mp, s=seeds, ppr=ppr: (
                            ops.sample_min_p_rows(x, 1.0, mp, s, 3, programs_per_row=ppr),)
    graph = time_graphed_variants(cases, os.path.join(out_dir, "min-p-race-graph.json"))
    graph_and_kernel_report(cases, graph, os.path.join(out_dir, "min-p-race.json"), mismatches)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out")
