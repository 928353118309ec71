"""The softmax backward (dy, y -> dx, bf16) under treefold's launch choices, now that its held
launches keep y and dy in 16 bits, against Liger's kernel called directly (one program per row,
its own block size and warps), in three interleaved rounds after a bit check of every treefold
variant against the default; do_bench median, L2 flushed; bytes: read y and dy, write dx.

    python benchmarks/probe_softmax_backward.py [OUT_DIR]   (CUDA; with Liger: source .peers/activate.sh)
"""
import os
import sys

import torch

from treefold._ops import softmax as sm

from probe_report import time_against_roof

#: (rows, length, the treefold variants: name -> (strategy, Tuning))
CASES = [
    (4096, 32768, {"default": ("auto", sm.Tuning()),
                   "block 32 warps": ("block", sm.Tuning(num_warps=32)),
                   "block 16 warps, float32 held": ("block", sm.Tuning(hold_16bit=False)),
                   "cooperative": ("cooperative", sm.Tuning()),
                   "cooperative, 2 programs of 8 warps": ("cooperative", sm.Tuning(segments_per_program=4,
                                                                                     num_warps=8)),
                   "online": ("online", sm.Tuning())}),
    (8192, 4096, {"default": ("auto", sm.Tuning()),
                  "block 4 warps": ("block", sm.Tuning(num_warps=4)),
                  "block 16 warps": ("block", sm.Tuning(num_warps=16)),
                  "block 8 warps, float32 held": ("block", sm.Tuning(hold_16bit=False))}),
]


def main(out_dir):
    torch.manual_seed(0)
    try:
        from liger_kernel.ops.softmax import _softmax_backward as liger_backward
        from liger_kernel.ops.utils import calculate_settings
    except ImportError:
        liger_backward = None
    calls, nbytes, unequal = {}, {}, []
    for m, n, variants in CASES:
        x = (3 * torch.randn(m, n, device="cuda")).bfloat16()
        y = torch.softmax(x.float(), -1).bfloat16()
        dy = torch.randn(m, n, device="cuda").bfloat16()
        first = None
        for name, (strategy, tuning) in variants.items():
            fn = lambda s=strategy, t=tuning, y=y, dy=dy: sm.softmax_backward(dy, y, strategy=s, tuning=t)
            out = fn()
            if first is None:
                first = out.clone()
            elif not torch.equal(out.view(torch.int16), first.view(torch.int16)):
                unequal.append(f"{m}x{n} {name}")
            calls[f"{m}x{n} treefold {name}"] = fn
            nbytes[f"{m}x{n} treefold {name}"] = 3 * y.numel() * 2
        if liger_backward is not None:
            block, warps = calculate_settings(n)
            calls[f"{m}x{n} liger ({warps} warps)"] = (
                lambda y=y, dy=dy, block=block, warps=warps: liger_backward(dy, y, block, warps, False))
            nbytes[f"{m}x{n} liger ({warps} warps)"] = 3 * y.numel() * 2
    print("bits equal to the default in every case" if not unequal else f"NOT EQUAL: {unequal}")
    time_against_roof(calls, nbytes, os.path.join(out_dir, "probe-softmax-backward.json") if out_dir else "",
                      unequal=unequal)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
