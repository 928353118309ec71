"""The norm backward holding a row's 16-bit dy and x through its sums (``hold_16bit``) or not,
against its default, RMSNorm and LayerNorm at 32768 x 4096 and 16384 x 8192 bf16 (there also
with 16 warps), called directly (dx and the weight/bias partials and their column sums);
each variant checked bit for bit against the default first, then three interleaved rounds,
do_bench median, L2 flushed; bytes: read x and dy, write dx.

    python benchmarks/probe_norm_backward_hold.py [OUT_DIR]   (CUDA)
"""
import os
import sys

import torch

from probe_report import check_and_time, row_op_variants


def _variants(n):
    variants = {"default": {}, "hold": dict(hold_16bit=True), "float32 held": dict(hold_16bit=False)}
    if n == 8192:
        variants.update({"16 warps": dict(num_warps=16, hold_16bit=False),
                         "16 warps hold": dict(num_warps=16, hold_16bit=True)})
    return variants


#: (label, rows, length, the variants: name -> launch options of the norm backward)
CASES = [(label, m, n, _variants(n)) for m, n in ((32768, 4096), (16384, 8192))
         for label in ("rms backward", "ln backward")]


def main(out_dir):
    torch.manual_seed(0)
    check_and_time(row_op_variants(CASES), os.path.join(out_dir, "probe-norm-backward-hold.json") if out_dir else "")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
