"""Row sums with each program's rows cut into runs of 32 vectors (``SumTuning.runs``: Triton then
gives each row its own warps, and a row's tree stays inside them) against one run, at the bench's
row-sum shape and the row norms, with other rows per program and warps; every variant checked
bit for bit against the first of its case, then three interleaved rounds, do_bench median, L2
flushed; bytes: read x once (the results are a few KB).

    python benchmarks/probe_reduce_runs.py [OUT_DIR]   (CUDA)
"""
import os
import sys

import torch

from treefold._ops import reduce
from treefold._ops.reduce import SumTuning

from probe_report import time_against_roof


def main(out_dir):
    torch.manual_seed(0)
    calls, moved, first, unequal = {}, {}, {}, []
    for dtype, m, n in ((torch.bfloat16, 8192, 4096), (torch.float32, 8192, 4096), (torch.bfloat16, 32768, 1024),
                        (torch.bfloat16, 4096, 16384)):
        x = torch.randn(m, n, device="cuda").to(dtype)
        case = f"{str(dtype)[6:]} {m}x{n}"
        variants = {"one run (the earlier default)": SumTuning(runs=1), "runs": SumTuning()}
        for rpp in (4, 8, 16):
            variants[f"runs, {rpp} rows"] = SumTuning(rows_per_program=rpp)
        variants["runs, 8 rows, 8 warps"] = SumTuning(rows_per_program=8, num_warps=8)
        for name, tuning in variants.items():
            for square in (False, True):
                label = f"{'row norms' if square else 'row sums'} {case} {name}"
                fn = (lambda x=x, t=tuning, s=square: reduce.tree_sum_rows(x, s, final="sqrt" if s else "none",
                                                                           tuning=t))
                out = fn().clone()
                key = (case, square)
                if key not in first:
                    first[key] = out
                elif not torch.equal(out.view(torch.int32), first[key].view(torch.int32)):
                    unequal.append(label)
                calls[label], moved[label] = fn, x.numel() * x.element_size()
    print("bits equal to the first variant in every case" if not unequal else f"NOT EQUAL: {unequal}")
    time_against_roof(calls, moved, os.path.join(out_dir, "probe-reduce-runs.json") if out_dir else "",
                      unequal=unequal)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
