"""The norm forward at decode sizes (one row, 64 rows) under other warps and rows per program,
timed as the bench's CUDA-graph column times them: 20 calls captured in one graph, the device
time per call, no L2 flush, three interleaved rounds; every variant checked bit for bit against
its case's default first. At these sizes a call is one wave of programs whose time is the latency
of one program (its loads, its tree's barriers, its stores), not bytes.

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
    ("rms", 1, 4096, _warps(1, 2, 4, 16)),
    ("rms+residual", 1, 4096, _warps(1, 2, 4, 16)),
    ("ln", 1, 4096, _warps(1, 2, 8)),
    ("rms", 64, 8192, _warps(2, 4, 16)),
    ("rms", 64, 4096, _warps(1, 2, 4, 16)),
]


def main(out_dir):
    torch.manual_seed(0)
    check_and_time(row_op_variants(CASES), os.path.join(out_dir, "probe-decode-norms.json") if out_dir else "",
                   graphed=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
