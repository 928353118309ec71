"""Launches that hold 16-bit inputs as loaded through their reductions (``hold_16bit``: widened to
float32 again where each use needs them) against their defaults (float32 copies held through the
reductions, or rows of 16384 read a second time), and other warps: the norm forward, and the
softmax forward and backward ("block" and "cooperative"). bf16, every variant first checked bit
for bit against the default of its case, then three interleaved rounds, do_bench median, L2
flushed; bytes: read x (and the residual, or y and dy), write y (and h, or dx).

    python benchmarks/probe_hold_16bit.py [OUT_DIR]   (CUDA)
"""
import os
import sys

import torch

from treefold._ops import softmax as sm

from probe_report import check_and_time, row_op_variants

#: (label, rows, length, the variants: name -> launch options)
CASES = [
    ("rms", 4096, 16384, {"default": {}, "hold 8 warps": dict(hold_16bit=True),
                          "hold 16 warps": dict(hold_16bit=True, num_warps=16),
                          "read twice 8 warps": dict(num_warps=8)}),
    ("rms", 16384, 8192, {"default": {}, "hold": dict(hold_16bit=True),
                          "hold 16 warps": dict(hold_16bit=True, num_warps=16)}),
    ("rms", 32768, 4096, {"default": {}, "hold": dict(hold_16bit=True)}),
    ("rms", 8192, 4096, {"default": {}, "hold": dict(hold_16bit=True)}),
    ("rms", 65536, 1024, {"default": {}, "hold": dict(hold_16bit=True),
                          "hold 8 warps": dict(hold_16bit=True, num_warps=8)}),
    ("rms+residual", 32768, 4096, {"default": {}, "hold": dict(hold_16bit=True)}),
    ("rms+residual", 4096, 16384, {"default": {}, "hold": dict(hold_16bit=True)}),
    ("ln", 16384, 8192, {"default": {}, "hold": dict(hold_16bit=True)}),
    ("ln", 8192, 4096, {"default": {}, "hold": dict(hold_16bit=True)}),
]
_HOLD = sm.Tuning(hold_16bit=True)
#: (label, rows, length, the variants: name -> (strategy, Tuning)); the softmax output is bf16
SOFTMAX_CASES = [
    ("softmax", 8192, 4096, {"default": ("auto", sm.Tuning()), "hold": ("auto", _HOLD)}),
    ("softmax", 32768, 8192, {"default": ("auto", sm.Tuning()), "hold": ("auto", _HOLD)}),
    ("softmax", 4096, 32768, {"default": ("auto", sm.Tuning()), "hold": ("auto", _HOLD),
                              "hold, 4 segments of 8 warps": ("cooperative", sm.Tuning(
                                  segments_per_program=4, num_warps=8, hold_16bit=True)),
                              "block 32 warps": ("block", sm.Tuning(num_warps=32)),
                              "block 32 warps hold": ("block", sm.Tuning(num_warps=32, hold_16bit=True))}),
    ("softmax", 256, 131072, {"default": ("auto", sm.Tuning()), "hold": ("auto", _HOLD),
                              "8 warps": ("cooperative", sm.Tuning(num_warps=8)),
                              "8 warps hold": ("cooperative", sm.Tuning(num_warps=8, hold_16bit=True)),
                              "4 segments of 8 warps hold": ("cooperative", sm.Tuning(
                                  segments_per_program=4, num_warps=8, hold_16bit=True))}),
    ("softmax backward", 8192, 4096, {"default": ("auto", sm.Tuning()), "hold": ("auto", _HOLD),
                                      "hold 4 warps": ("auto", sm.Tuning(num_warps=4, hold_16bit=True))}),
    ("softmax backward", 4096, 32768, {"default": ("auto", sm.Tuning()), "hold": ("auto", _HOLD),
                                       "32 warps": ("block", sm.Tuning(num_warps=32)),
                                       "hold 32 warps": ("block", sm.Tuning(num_warps=32, hold_16bit=True)),
                                       "cooperative": ("cooperative", sm.Tuning()),
                                       "cooperative hold": ("cooperative", _HOLD)}),
]


def main(out_dir):
    torch.manual_seed(0)
    check_and_time(row_op_variants(CASES + SOFTMAX_CASES),
                   os.path.join(out_dir, "probe-hold-16bit.json") if out_dir else "")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
