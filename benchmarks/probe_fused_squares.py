"""RMSNorm forward with its squares contracted into FMAs (the default for float16 rows, where the
squares are exact: ``treefold._ops.norms._fuses_squares``) against every product rounded on its
own, on the H200: three interleaved rounds (do_bench median, L2 flushed), every pair checked bit
for bit first. (``results/h200-probe-fused-squares.txt`` was taken at commit e83c243, when
bfloat16 rows fused too, with bfloat16 inputs; bfloat16 fuses no longer, so the shapes are
float16 now.)

    python benchmarks/probe_fused_squares.py [OUT_DIR]   (CUDA; writes probe-fused-squares.json there)

Bytes: read x (and the residual), write y (and h), once each.
"""
import os
import sys

import torch

from treefold._ops import norms
from probe_report import time_against_roof


def cases():
    """name -> (callable taking fused_squares, bytes)."""
    out = {}
    for m, n, dtype in ((4096, 16384, torch.float16), (16384, 8192, torch.float16), (32768, 4096, torch.float16),
                        (8192, 4096, torch.float16), (65536, 1024, torch.float16)):
        x = torch.randn(m, n, device="cuda").to(dtype)
        w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
        out[f"rms {m}x{n} {str(dtype)[6:]}"] = (
            lambda fused, x=x, w=w: norms.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", x.dtype, store_stats=False,
                                                        fused_squares=fused)[0], 2 * m * n * 2)
    x = torch.randn(32768, 4096, device="cuda").half()
    r = torch.randn(32768, 4096, device="cuda").half()
    w = (1 + 0.1 * torch.randn(4096, device="cuda")).half()
    out["rms+residual 32768x4096 float16"] = (
        lambda fused: norms.rms_norm_impl(x, w, r, 1e-6, 0.0, "llama", x.dtype, store_stats=False,
                                          fused_squares=fused)[:2], 4 * x.numel() * 2)
    return out


def main(out_dir: str = "") -> None:
    calls, nbytes, mismatches = {}, {}, []
    for name, (fn, size) in cases().items():
        fused, rounded = fn(None), fn(False)
        if isinstance(fused, torch.Tensor):
            fused, rounded = (fused,), (rounded,)
        if not all(torch.equal(a, b) for a, b in zip(fused, rounded)):
            mismatches.append(name)
        calls[f"{name} fused squares"] = lambda fn=fn: fn(None)
        calls[f"{name} rounded squares"] = lambda fn=fn: fn(False)
        nbytes[f"{name} fused squares"] = nbytes[f"{name} rounded squares"] = size
    print(f"bits: {len(calls) // 2 - len(mismatches)} of {len(calls) // 2} cases equal; mismatches: {mismatches}")
    rows = time_against_roof(calls, nbytes, os.path.join(out_dir, "probe-fused-squares.json") if out_dir else "",
                             mismatches=mismatches)
    by_name = {r["name"]: r for r in rows}
    print(f"{'case':36s} {'fused':>7s} {'rounded':>8s}  (% of roof, median of the rounds)")
    for name in [n[:-len(" fused squares")] for n in calls if n.endswith(" fused squares")]:
        fused = sorted(by_name[f"{name} fused squares"]["pct"])[1]
        rounded = sorted(by_name[f"{name} rounded squares"]["pct"])[1]
        print(f"{name:36s} {fused:6.1f}% {rounded:7.1f}%")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
