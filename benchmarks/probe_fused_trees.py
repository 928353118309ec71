"""Fused tree levels (``combine.tree_sum``'s WARP_BITS: one compiled sum over the tree levels that
lie on warps) against every level on its own, at the bench's norm and softmax shapes, bf16 unless
said, on the H200: three interleaved rounds (do_bench median, L2 flushed), every pair checked bit
for bit first.

    python benchmarks/probe_fused_trees.py [OUT_DIR]   (CUDA; writes probe-fused-trees.json there)

The level-by-level launches are the same launches with WARP_BITS and SEG_WARP_BITS set to 0 (a
wrapper around ``Launcher.__call__``), so the two differ in the tree's exchanges alone.
Bytes: forward read + write once (norms with a residual: read x and the residual, write y and h);
backward read x (or y) and dy, write dx.
"""
import os
import sys

import torch

from treefold._ops import launch, norms
from treefold._ops import softmax as sm
from probe_report import time_against_roof

_LEVEL_BY_LEVEL = [False]
_launcher_call = launch.Launcher.__call__


def _call(self, grid, *args, **kwargs):
    if _LEVEL_BY_LEVEL[0]:
        kwargs = {k: (0 if k in ("WARP_BITS", "SEG_WARP_BITS") else v) for k, v in kwargs.items()}
    return _launcher_call(self, grid, *args, **kwargs)


launch.Launcher.__call__ = _call


def level_by_level(fn):
    def run():
        _LEVEL_BY_LEVEL[0] = True
        try:
            return fn()
        finally:
            _LEVEL_BY_LEVEL[0] = False
    return run


def cases():
    """name -> (callable, bytes)."""
    out = {}
    bf16 = torch.bfloat16
    for m, n, dtype in ((4096, 16384, bf16), (16384, 8192, bf16), (32768, 4096, bf16), (8192, 4096, bf16),
                        (65536, 1024, bf16), (8192, 4096, torch.float32)):
        x = torch.randn(m, n, device="cuda").to(dtype)
        w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
        size = x.element_size()
        out[f"rms {m}x{n} {str(dtype)[6:]}"] = (
            lambda x=x, w=w: norms.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", x.dtype, store_stats=False)[0],
            2 * m * n * size)
    x = torch.randn(32768, 4096, device="cuda").bfloat16()
    r = torch.randn(32768, 4096, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(4096, device="cuda")).bfloat16()
    out["rms+residual 32768x4096"] = (
        lambda: norms.rms_norm_impl(x, w, r, 1e-6, 0.0, "llama", x.dtype, store_stats=False)[:2], 4 * x.numel() * 2)
    for m, n in ((8192, 4096), (16384, 8192)):
        x = torch.randn(m, n, device="cuda").bfloat16()
        w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16()
        b = (0.1 * torch.randn(n, device="cuda")).bfloat16()
        out[f"ln {m}x{n}"] = (lambda x=x, w=w, b=b: norms.layer_norm_impl(x, w, b, 1e-5)[0], 2 * m * n * 2)
    for m, n in ((32768, 4096), (16384, 8192)):
        x = torch.randn(m, n, device="cuda").bfloat16()
        w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16()
        b = (0.1 * torch.randn(n, device="cuda")).bfloat16()
        dy = torch.randn(m, n, device="cuda").bfloat16()
        _, _, rstd = norms.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", x.dtype)
        _, mean, rstd_ln = norms.layer_norm_impl(x, w, b, 1e-5)
        out[f"rms.bwd {m}x{n}"] = (
            lambda dy=dy, x=x, w=w, r=rstd: norms.rms_norm_backward_impl(
                dy, None, x, w, r, 0.0, "llama", x.dtype, None, True), 3 * m * n * 2)
        out[f"ln.bwd {m}x{n}"] = (
            lambda dy=dy, x=x, w=w, mu=mean, r=rstd_ln: norms.layer_norm_backward_impl(
                dy, x, w, mu, r, True, x.dtype), 3 * m * n * 2)
    for m, n in ((8192, 4096), (32768, 8192), (4096, 32768), (256, 131072)):
        x = (torch.randn(m, n, device="cuda") * 3).bfloat16()
        out[f"softmax {m}x{n}"] = (lambda x=x: sm.softmax_forward(x), 2 * m * n * 2)
    x = (torch.randn(8192, 4096, device="cuda") * 3).float()
    out["softmax 8192x4096 float32"] = (lambda: sm.softmax_forward(x), 2 * x.numel() * 4)
    for m, n in ((8192, 4096), (4096, 32768)):
        y = torch.softmax(torch.randn(m, n, device="cuda") * 3, -1).bfloat16()
        dy = torch.randn(m, n, device="cuda").bfloat16()
        out[f"softmax.bwd {m}x{n}"] = (lambda y=y, dy=dy: sm.softmax_backward(dy, y), 3 * m * n * 2)
    return out


def flatten(result):
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for r in result if r is not None for t in flatten(r)]


def main(out_dir: str = "") -> None:
    calls, nbytes, mismatches = {}, {}, []
    for name, (fn, size) in cases().items():
        fused, single = flatten(fn()), flatten(level_by_level(fn)())
        if not all(torch.equal(a, b) for a, b in zip(fused, single)):
            mismatches.append(name)
        calls[f"{name} fused"] = fn
        calls[f"{name} level by level"] = level_by_level(fn)
        nbytes[f"{name} fused"] = nbytes[f"{name} level by level"] = size
    verdicts = {kernel.kernel.fn.__name__: sum(v for v in kernel._fused_verdicts.values())
                for kernel in (norms._forward_kernel, norms._backward_kernel, sm._KERNEL)}
    print(f"bits: {len(calls) // 2 - len(mismatches)} of {len(calls) // 2} cases equal; mismatches: {mismatches}")
    print(f"launches whose fused layout was verified, per kernel: {verdicts}")
    rows = time_against_roof(calls, nbytes, os.path.join(out_dir, "probe-fused-trees.json") if out_dir else "",
                             mismatches=mismatches, verified=verdicts)
    by_name = {r["name"]: r for r in rows}
    print(f"{'case':34s} {'fused':>8s} {'levels':>8s}  (% of roof, median of rounds)")
    for name in [n[:-len(" fused")] for n in calls if n.endswith(" fused")]:
        f = sorted(by_name[f"{name} fused"]["pct"])[1]
        s = sorted(by_name[f"{name} level by level"]["pct"])[1]
        print(f"{name:34s} {f:7.1f}% {s:7.1f}%")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
