"""Row launches under a cap on the registers per thread (``max_registers``, Triton's ``maxnreg``)
against their defaults: more programs per SM, at the price of spills past the cap. Offline
sm_90 (``sass_report.py``), default -> capped, with the programs per SM the registers allow: the
softmax "online" launch at 4096 x 32768 128 registers (4 programs of 4 warps) -> 104 with 48 bytes
of stack (still 4: these measure the spills alone) or 96 with 96 bytes (5); the "cooperative"
launch at 256 x 131072 96 (5) -> 80 with 40 bytes (6) or 64 with 176 (8); RMSNorm 4096 x 16384 read
twice 123 (4) -> 96 with 72 bytes (5) or 80 with 104 (6); the norm backward at 16384 x 8192
(8 warps) RMSNorm 223 and LayerNorm 249 (1 program) -> 128 with 216 and 592 bytes (2), LayerNorm
168 with 320 bytes (still 1).
bf16; every variant checked bit for bit against its case's default, then three interleaved
rounds, do_bench median, L2 flushed.

    python benchmarks/probe_max_registers.py [OUT_DIR]     (CUDA)
"""
import os
import sys

import torch

from treefold._ops import softmax as sm

from probe_report import check_and_time, row_op_variants

_T = sm.Tuning
#: (label, rows, length, the variants: name -> launch options)
CASES = [
    ("softmax", 4096, 32768, {"default": ("auto", _T()), "104 registers": ("auto", _T(max_registers=104)),
                              "96 registers": ("auto", _T(max_registers=96))}),
    ("log_softmax", 4096, 32768, {"default": ("auto", _T()), "104 registers": ("auto", _T(max_registers=104))}),
    ("softmax", 256, 131072, {"default": ("auto", _T()), "80 registers": ("auto", _T(max_registers=80)),
                              "64 registers": ("auto", _T(max_registers=64))}),
    ("rms", 4096, 16384, {"default": {}, "96 registers": dict(max_registers=96),
                          "80 registers": dict(max_registers=80)}),
    ("rms backward", 16384, 8192, {"default": {}, "128 registers": dict(max_registers=128)}),
    ("ln backward", 16384, 8192, {"default": {}, "128 registers": dict(max_registers=128),
                                  "168 registers": dict(max_registers=168)}),
]


def main(out_dir):
    torch.manual_seed(0)
    check_and_time(row_op_variants(CASES), os.path.join(out_dir, "probe-max-registers.json") if out_dir else "")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
