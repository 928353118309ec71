"""The softmax backward and forward at 4096 x 32768 bf16 under every strategy that fits, with warps
and shares swept, on the H200: three interleaved rounds (do_bench median, L2 flushed); every variant
checked bit for bit against the default first.

    python benchmarks/probe_softmax_long.py [OUT_DIR]   (CUDA; writes probe-softmax-long.json there)

Bytes: backward reads y and dy, writes dx; forward reads x, writes y.
"""
import os
import sys

import torch

from treefold._ops import softmax as sm
from probe_report import time_against_roof


def main(out_dir: str = "") -> None:
    torch.manual_seed(0)
    m, n = 4096, 32768
    x = (torch.randn(m, n, device="cuda") * 3).bfloat16()
    y = torch.softmax(x.float(), -1).bfloat16()
    dy = torch.randn(m, n, device="cuda").bfloat16()
    variants = {"block 16w": ("block", sm.Tuning(num_warps=16)), "block 32w": ("block", sm.Tuning(num_warps=32)),
                "block 8w": ("block", sm.Tuning(num_warps=8))}
    for spp in (1, 2, 4):
        for warps in (4, 8, 16):
            variants[f"cooperative {spp} seg/program {warps}w"] = (
                "cooperative", sm.Tuning(segments_per_program=spp, num_warps=warps))
    for warps in (4, 8):
        variants[f"online {warps}w"] = ("online", sm.Tuning(num_warps=warps))
    calls, nbytes, differ = {}, {}, []
    for direction in ("bwd", "fwd"):
        if direction == "bwd":
            default = lambda: sm.softmax_backward(dy, y)
            run = lambda s, t: sm.softmax_backward(dy, y, strategy=s, tuning=t)
            size = 3 * m * n * 2
            strategy = sm._plan_for(sm._SOFTMAX, True, n, m, y).strategy
        else:
            default = lambda: sm.softmax_forward(x)
            run = lambda s, t: sm.softmax_forward(x, strategy=s, tuning=t)
            size = 2 * m * n * 2
            strategy = sm._plan_for(sm._SOFTMAX, False, n, m, x).strategy
        want = default()
        calls[f"{direction} default ({strategy})"] = default
        nbytes[f"{direction} default ({strategy})"] = size
        for label, (s, t) in variants.items():
            if direction == "fwd" and label.startswith("block 8w"):
                continue
            try:
                got = run(s, t)
            except ValueError as e:
                print(f"{direction} {label}: refused ({e})")
                continue
            if not torch.equal(got, want):
                differ.append(f"{direction} {label}")
            calls[f"{direction} {label}"] = lambda s=s, t=t, run=run: run(s, t)
            nbytes[f"{direction} {label}"] = size
    print(f"bits: {len(calls) - 2 - len(differ)} of {len(calls) - 2} variants equal to their default; differ: {differ}")
    rows = time_against_roof(calls, nbytes, os.path.join(out_dir, "probe-softmax-long.json") if out_dir else "",
                             differ=differ)
    print(f"{'variant':40s} % of roof (median of the rounds)")
    for r in rows:
        print(f"{r['name']:40s} {sorted(r['pct'])[1]:5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
