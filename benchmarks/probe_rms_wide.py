"""Where RMSNorm's forward loses against a minimal kernel at 4096 x 16384 bf16 (82-83% of the roof
against 89-90% for the minimal kernel and QuACK): the minimal kernel with one treefold piece added
at a time, on the H200, three interleaved rounds (do_bench median, L2 flushed).

    python benchmarks/probe_rms_wide.py [OUT_DIR]   (CUDA; writes probe-rms-wide.json there)

Variants (one row per program; ``llama`` casting; weight read with the row):
    minimal       tl.sum of x * x, rsqrt                                  (compiler order, approximate)
    + tree        the sum as treefold's grouped halving tree (the order)   (approximate rsqrt)
    + ieee        tl.sum, then div_rn / sqrt_rn as treefold rounds them
    + tree + ieee both: treefold's arithmetic in the minimal kernel's shape; then with the weight
                  read after the reduction ("weight late") and with the row read a second time
                  after it (from L1 / L2) instead of held in registers through it, 4 or 8 warps
    treefold      ``rms_norm_impl`` (the same arithmetic, the library's kernel and launch), its
                  default and with ``read_twice`` and the warps given
Bytes: read x, write y (2 x M x N x 2).
"""
import os
import sys

import torch
import triton
import triton.language as tl

from treefold import order
from treefold._ops import norms
from treefold.kernels.combine import tree_sum
from probe_report import time_against_roof


@triton.jit
def variant_kernel(x_ptr, w_ptr, y_ptr, n, n_float, eps, SEGMENTS: tl.constexpr, LOG2_SEGMENTS: tl.constexpr,
                   LANES: tl.constexpr, LOG2_LANES: tl.constexpr, GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr,
                   TREE: tl.constexpr, IEEE: tl.constexpr, WEIGHT_LATE: tl.constexpr = False,
                   RELOAD: tl.constexpr = False):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, SEGMENTS)[:, None] * LANES + tl.arange(0, LANES)[None, :]
    mask = col < n
    x = tl.load(x_ptr + row * n + col, mask=mask, other=0.0).to(tl.float32)
    if not WEIGHT_LATE:
        w = tl.load(w_ptr + col, mask=mask, other=0.0).to(tl.float32)
    if TREE:
        seg = tree_sum(x * x, SEGMENTS, LANES, LOG2_LANES, GROUP, LOG2_GROUP)
        total = tl.sum(tree_sum(tl.reshape(seg, [1, SEGMENTS]), 1, SEGMENTS, LOG2_SEGMENTS, 1, 0), axis=0)
    else:
        total = tl.sum(tl.sum(x * x, axis=1), axis=0)
    if IEEE:
        rstd = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(total, n_float) + eps))
    else:
        rstd = tl.rsqrt(total / n_float + eps)
    if RELOAD:  # read the row again (from L1 / L2) rather than hold it through the reduction
        x = tl.load(x_ptr + row * n + col, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    if WEIGHT_LATE:
        w = tl.load(w_ptr + col, mask=mask, other=0.0).to(tl.float32)
    y = (x * rstd).to(y_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(y_ptr + row * n + col, y.to(y_ptr.dtype.element_ty), mask=mask)


def variant(x, w, tree, ieee, warps, weight_late=False, reload=False):
    m, n = x.shape
    y = torch.empty_like(x)
    lanes, segments = order.lanes(n), order.next_pow2(order.num_segments(n))
    group = order.group(n, x.dtype)
    variant_kernel[(m,)](x, w, y, n, float(n), 1e-6, SEGMENTS=segments, LOG2_SEGMENTS=order.log2(segments),
                         LANES=lanes, LOG2_LANES=order.log2(lanes), GROUP=group, LOG2_GROUP=order.log2(group),
                         TREE=tree, IEEE=ieee, WEIGHT_LATE=weight_late, RELOAD=reload, num_warps=warps,
                         enable_fp_fusion=True)
    return y


def main(out_dir: str = "") -> None:
    torch.manual_seed(0)
    calls, nbytes = {}, {}
    for m, n in ((4096, 16384), (16384, 8192), (32768, 4096), (8192, 4096)):
        x = torch.randn(m, n, device="cuda").bfloat16()
        w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16()
        name = f"rms {m}x{n}"
        warps = 8
        for tree, ieee, label in ((False, False, "minimal"), (True, True, "+ tree + ieee")):
            calls[f"{name} {label} {warps}w"] = lambda x=x, w=w, t=tree, i=ieee, wp=warps: variant(x, w, t, i, wp)
        for late, reload, label in ((True, False, "weight late"), (True, True, "weight late, row read twice"),
                                    (False, True, "row read twice")):
            for wp in (4, 8):
                calls[f"{name} + tree + ieee, {label} {wp}w"] = (
                    lambda x=x, w=w, wp=wp, late=late, reload=reload: variant(x, w, True, True, wp, late, reload))
        calls[f"{name} treefold"] = lambda x=x, w=w: norms.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", x.dtype,
                                                                         store_stats=False)[0]
        for twice in (True, False):
            for wp in (4, 8):
                calls[f"{name} treefold, read_twice={twice} {wp}w"] = (
                    lambda x=x, w=w, t=twice, wp=wp: norms.rms_norm_impl(
                        x, w, None, 1e-6, 0.0, "llama", x.dtype, store_stats=False, read_twice=t, num_warps=wp)[0])
        for key in [k for k in calls if k.startswith(name + " ")]:
            nbytes[key] = 2 * m * n * 2
        want = calls[f"{name} treefold"]()
        same = [k for k in calls if (k.startswith(name + " + tree") or k.startswith(name + " treefold,"))
                and not torch.equal(calls[k](), want)]
        print(f"{name}: variants with treefold's arithmetic that differ from it bit for bit: {same}")
    rows = time_against_roof(calls, nbytes, os.path.join(out_dir, "probe-rms-wide.json") if out_dir else "")
    print(f"{'variant':34s} % of roof (median of the rounds)")
    for r in rows:
        print(f"{r['name']:34s} {sorted(r['pct'])[1]:5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
