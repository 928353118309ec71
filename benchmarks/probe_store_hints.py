"""The output stores with the L2 evict-first policy (``store_hint``) against the default policy,
for the row kernels that stream: the softmax forward ("online" reads each row twice, the second
time from L2 if the row is still there; "cooperative" and "block" read once) and backward, and
the norm forward (RMSNorm rows of 16384 are read twice). bf16, every variant first checked bit
for bit against its case's default, then three interleaved rounds, do_bench median, L2 flushed;
bytes: read x (and the residual, or y and dy), write y (and h, or dx).

    python benchmarks/probe_store_hints.py [OUT_DIR]        (CUDA)
    python benchmarks/probe_store_hints.py --ncu NAME       one variant, four times, for ncu

Under Nsight Compute, the DRAM bytes of a variant say whether its second read came from L2:

    ncu --clock-control none --kernel-name regex:'softmax_kernel|norm_forward_kernel' \
        --launch-skip 3 --launch-count 1 --metrics dram__bytes_read.sum,dram__bytes_write.sum \
        python benchmarks/probe_store_hints.py --ncu "softmax 4096x32768 no store hint"
"""
import os
import sys

import torch

from treefold._ops import softmax as sm

from probe_report import check_and_time, repeat_one, row_op_variants

_EF = "evict_first"
#: (label, rows, length, the variants: name -> launch options). RMSNorm rows of 16384 are read
#: twice and store with evict-first by default; the others store with no hint by default.
NORM_CASES = [
    ("rms", 4096, 16384, {"default": {}, "no store hint": dict(store_hint="")}),
    ("rms", 16384, 8192, {"default": {}, "stores evict_first": dict(store_hint=_EF)}),
    ("rms", 32768, 4096, {"default": {}, "stores evict_first": dict(store_hint=_EF)}),
    ("rms+residual", 32768, 4096, {"default": {}, "stores evict_first": dict(store_hint=_EF)}),
    ("ln", 16384, 8192, {"default": {}, "stores evict_first": dict(store_hint=_EF)}),
]
_T = sm.Tuning
#: (label, rows, length, the variants: name -> (strategy, Tuning)). The forward "online" launch
#: (the default at 4096 x 32768) stores with evict-first by default; the others with no hint.
SOFTMAX_CASES = [
    ("softmax", 4096, 32768, {"default": ("auto", _T()),
                              "no store hint": ("auto", _T(store_hint="")),
                              "no read hints": ("auto", _T(hints=False)),
                              "8 warps": ("online", _T(num_warps=8)),
                              "blocks of 16384, 8 warps": ("online", _T(seg_block=4, num_warps=8)),
                              "blocks of 16384, 16 warps": ("online", _T(seg_block=4, num_warps=16)),
                              "one block, 16 warps": ("online", _T(seg_block=8, num_warps=16)),
                              "one block, 32 warps": ("online", _T(seg_block=8, num_warps=32))}),
    ("log_softmax", 4096, 32768, {"default": ("auto", _T()), "no store hint": ("auto", _T(store_hint=""))}),
    ("softmax", 256, 131072, {"default": ("auto", _T()),
                              "stores evict_first": ("auto", _T(store_hint=_EF)),
                              "online": ("online", _T())}),
    ("softmax", 32768, 8192, {"default": ("auto", _T()), "stores evict_first": ("auto", _T(store_hint=_EF))}),
    ("softmax", 8192, 4096, {"default": ("auto", _T()), "stores evict_first": ("auto", _T(store_hint=_EF))}),
    ("softmax backward", 4096, 32768, {"default": ("auto", _T()),
                                       "stores evict_first": ("auto", _T(store_hint=_EF))}),
    ("softmax backward", 8192, 4096, {"default": ("auto", _T()),
                                      "stores evict_first": ("auto", _T(store_hint=_EF))}),
]


def main(out_dir):
    torch.manual_seed(0)
    check_and_time(row_op_variants(NORM_CASES + SOFTMAX_CASES),
                   os.path.join(out_dir, "probe-store-hints.json") if out_dir else "")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--ncu":
        torch.manual_seed(0)
        repeat_one(row_op_variants(NORM_CASES + SOFTMAX_CASES, sys.argv[2]))
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "")
