"""The listed descent's first two passes (segment maxima and the histogram pass, which share a
plan) under other programs per row, against the default plan (FILTER_PROGRAMS_PER_SM per SM: 30
per row at 64 rows on 132 SMs), timed in the same process:

    python benchmarks/probe_listed_plan.py OUT_DIR

The default plan was chosen on the pipeline, whose later passes (the compaction of flat rows)
take the same plan; in the listed descent the rounds take a plan of their own
(DESCENT_LISTED_PROGRAMS_PER_ROW), so the first two passes' plan is a choice of its own there.
For each case (64 rows of gpu_sampling's inputs: float32 and bfloat16 peaked, float32 flat) under
top-p 0.9: the tokens of every plan compared with the default's at 8 offsets, then each call
replayed from a CUDA graph (do_bench median, L2 flushed) in three interleaved rounds, and the
profiler's kernel time of the replay (``kernel_us``). PROGRAMS="15,20,22" sets the plans tried
(each rounded by ``plan`` to whole segments per program). Writes OUT_DIR/listed-plan.json and
prints a table last.
"""
import os
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from gpu_sampling import FLAT, PEAKED, VOCAB, logits
from probe_report import graph_and_kernel_report, time_graphed_variants

ROWS = 64
PROGRAMS = tuple(int(p) for p in os.environ.get("PROGRAMS", "15,22").split(",") if p)
FILTERS = {"top-p 0.9": (0.9, None)}


def main(out_dir: str) -> None:
    cases, mismatches = {}, {}
    seeds = torch.arange(ROWS, device="cuda") * 7919 + 3
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    default = ops.plan(ROWS, VOCAB, torch.device("cuda")).programs_per_row
    plans = [p for p in dict.fromkeys(ops.plan(ROWS, VOCAB, torch.device("cuda"), p).programs_per_row
                                      for p in PROGRAMS) if p != default]
    print(f"{sms} SMs; default plan {default} programs per row; others {plans}")
    for dtype, kind, scale in ((torch.float32, "peaked", PEAKED), (torch.bfloat16, "peaked", PEAKED),
                               (torch.float32, "flat", FLAT)):
        x = logits(ROWS, dtype, scale)
        for name, (p, mp) in FILTERS.items():
            key = (str(dtype).replace("torch.", ""), kind, name)
            bad = 0
            for offset in range(8):
                want = ops.sample_descent_rows(x, 1.0, p, mp, seeds, offset, listed=True)
                for ppr in plans:
                    got = ops.sample_descent_rows(x, 1.0, p, mp, seeds, offset, listed=True, programs_per_row=ppr)
                    bad += int((got != want).sum())
            mismatches[" ".join(key)] = bad
            cases[key] = {f"{default}/row (default)": lambda x=x, p=p, mp=mp: (
                ops.sample_descent_rows(x, 1.0, p, mp, seeds, 3, listed=True),)}
            for ppr in plans:
                cases[key][f"{ppr}/row"] = lambda x=x, p=p, mp=mp, ppr=ppr: (
                    ops.sample_descent_rows(x, 1.0, p, mp, seeds, 3, listed=True, programs_per_row=ppr),)
    graph = time_graphed_variants(cases, os.path.join(out_dir, "listed-plan-graph.json"))
    graph_and_kernel_report(cases, graph, os.path.join(out_dir, "listed-plan.json"), mismatches)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out")
