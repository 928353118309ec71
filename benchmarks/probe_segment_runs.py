"""The norm kernels with each segment of their block cut into runs of 32 vectors (``runs``:
``combine.run_tree_sum``; Triton then gives the warps to the segments, and a segment's group tree
stays inside a warp) against their defaults, at the row lengths of more than one segment: RMSNorm
and LayerNorm forward and backward, bf16. Every variant checked bit for bit against its case's
default first, then three interleaved rounds, do_bench median, L2 flushed; bytes: read x (and dy),
write y (dx).

    python benchmarks/probe_segment_runs.py [OUT_DIR] [rows]   (CUDA)

With ``rows``: the programs that hold several short rows instead (RMSNorm 65536 x 1024, four
rows of 1024 per program): runs of 32 vectors put each row on its own warp.
"""
import os
import sys

import torch

from probe_report import check_and_time, row_op_variants

#: bf16: 32 lanes of one 16-byte vector each: runs of 256 lanes, 16 per segment of 4096
RUNS = 16

#: (label, rows, length, the variants: name -> launch options)
CASES = [
    ("rms", 4096, 16384, {"default": {}, "runs": dict(runs=RUNS), "runs 8 warps": dict(runs=RUNS, num_warps=8),
                          "runs held 8 warps": dict(runs=RUNS, read_twice=False, num_warps=8),
                          "held 8 warps": dict(read_twice=False, num_warps=8),
                          "runs held 16 warps": dict(runs=RUNS, read_twice=False, num_warps=16)}),
    ("rms", 16384, 8192, {"default": {}, "runs": dict(runs=RUNS), "runs 8 warps": dict(runs=RUNS, num_warps=8)}),
    ("rms+residual", 4096, 16384, {"default": {}, "runs": dict(runs=RUNS)}),
    ("ln", 16384, 8192, {"default": {}, "runs": dict(runs=RUNS), "runs 8 warps": dict(runs=RUNS, num_warps=8)}),
    ("ln", 4096, 16384, {"default": {}, "runs": dict(runs=RUNS)}),
    ("rms", 32768, 4096, {"default": {}, "runs": dict(runs=RUNS)}),
    ("rms backward", 16384, 8192, {"default": {}, "runs": dict(runs=RUNS)}),
    ("ln backward", 16384, 8192, {"default": {}, "runs": dict(runs=RUNS)}),
]


#: several rows per program: (label, rows, length, the variants)
ROW_CASES = [
    ("rms", 65536, 1024, {"default": {}, "runs": dict(runs=4), "runs 8 warps": dict(runs=4, num_warps=8),
                          "runs 8 rows": dict(runs=4, rows_per_program=8),
                          "runs 2 rows": dict(runs=4, rows_per_program=2),
                          "8 rows": dict(rows_per_program=8)}),
    ("rms+residual", 65536, 1024, {"default": {}, "runs": dict(runs=4)}),
    ("ln", 65536, 1024, {"default": {}, "runs": dict(runs=4)}),
]


def main(out_dir, which=""):
    torch.manual_seed(0)
    name = "probe-segment-runs-rows.json" if which == "rows" else "probe-segment-runs.json"
    check_and_time(row_op_variants(ROW_CASES if which == "rows" else CASES),
                   os.path.join(out_dir, name) if out_dir else "")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "", sys.argv[2] if len(sys.argv) > 2 else "")
