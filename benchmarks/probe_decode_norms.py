"""The norm forward at decode sizes (one row, 64 rows) under other warps, timed as the bench's
CUDA-graph column times them: 20 calls captured in one graph, the device time per call, no L2
flush, three interleaved rounds; every variant checked bit for bit against its case's default
first. At these sizes a call is one wave of programs whose time is the latency of one program
(its loads, its tree's barriers, its stores), not bytes. Then the shapes where the bench has
RMSNorm level with a peer (16384 x 8192, and 32768 x 4096 with a residual) under other warps and
rows per program, timed as the bench's main column (L2 flushed). Every case names its warps
explicitly beside "default": ``results/h200-probe-decode-norms.txt`` was taken while the default
was 8 warps in every RMSNorm case here (4 for LayerNorm), before the 4 warps it measured faster
became the default for rows of 8192 and rows of 4096 with a residual.

    python benchmarks/probe_decode_norms.py [OUT_DIR]     (CUDA)
"""
import os
import sys

import torch

from probe_report import check_and_time, row_op_variants


def _warps(*counts):
    return {"default": {}, **{f"{w} warps": dict(num_warps=w) for w in counts}}


#: (label, rows, length, the variants: name -> launch options)
CASES = [
    ("rms", 1, 4096, _warps(1, 2, 4, 8, 16)),
    ("rms+residual", 1, 4096, _warps(1, 2, 4, 8, 16)),
    ("ln", 1, 4096, _warps(1, 2, 4, 8)),
    ("rms", 64, 8192, _warps(2, 4, 8, 16)),
    ("rms", 64, 4096, _warps(1, 2, 4, 8, 16)),
]


#: (label, rows, length, the variants), timed with L2 flushed
LEVEL_CASES = [
    ("rms+residual", 32768, 4096, {"default": {}, "4 warps": dict(num_warps=4), "8 warps": dict(num_warps=8),
                                   "16 warps": dict(num_warps=16),
                                   "2 rows, 8 warps": dict(rows_per_program=2, num_warps=8),
                                   "2 rows, 16 warps": dict(rows_per_program=2, num_warps=16)}),
    ("rms", 16384, 8192, {"default": {}, "4 warps": dict(num_warps=4), "8 warps": dict(num_warps=8),
                          "16 warps": dict(num_warps=16)}),
]


def main(out_dir):
    torch.manual_seed(0)
    check_and_time(row_op_variants(CASES), os.path.join(out_dir, "probe-decode-norms.json") if out_dir else "",
                   graphed=True)
    check_and_time(row_op_variants(LEVEL_CASES),
                   os.path.join(out_dir, "probe-level-norms.json") if out_dir else "")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
