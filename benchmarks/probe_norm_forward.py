"""Where the RMSNorm forward loses to the peers: treefold's launch choices against a minimal
Triton kernel (one row per program, ``tl.sum`` in the compiler's order, ``rsqrt``; no treefold
order, not bit-exact) at the same shapes, and against Liger when installed. bf16, three
interleaved rounds, do_bench median, L2 flushed; bytes: read x, write y (the weight once).

    python benchmarks/probe_norm_forward.py [OUT_DIR]   (CUDA; with the peers: source .peers/activate.sh)

If the minimal kernel is near the peers and treefold is not, the gap lies in what treefold's
kernel adds (the order's tree, IEEE division and square root, the casting); if the minimal kernel
is as slow, in the launch shape.
"""
import os
import sys

import torch
import triton
import triton.language as tl

from treefold._ops import norms

from probe_report import time_against_roof


@triton.jit
def minimal_rms_kernel(x_ptr, w_ptr, y_ptr, n, eps, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    """y = (x * rstd).to(x dtype) * w, rstd = rsqrt(mean(x^2) + eps); one row per program."""
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < n
    x = tl.load(x_ptr + row * n + col, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    w = tl.load(w_ptr + col, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
    y = (x * rstd).to(y_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(y_ptr + row * n + col, y.to(y_ptr.dtype.element_ty), mask=mask)


def minimal(x, w, warps, evict=""):
    m, n = x.shape
    y = torch.empty_like(x)
    minimal_rms_kernel[(m,)](x, w, y, n, 1e-6, BLOCK=triton.next_power_of_2(n), EVICT=evict, num_warps=warps)
    return y


def main(out_dir):
    torch.manual_seed(0)
    calls, nbytes = {}, {}
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        LigerRMSNormFunction = None
    for m, n in ((32768, 4096), (16384, 8192), (65536, 1024), (4096, 16384)):
        x = torch.randn(m, n, device="cuda").bfloat16()
        w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16()
        shape = f"{m}x{n}"
        rows, warps = norms.forward_config(n, True)
        calls[f"rms {shape} treefold default ({rows} rows, {warps} warps)"] = (
            lambda x=x, w=w: norms.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", torch.bfloat16, store_stats=False))
        calls[f"rms {shape} treefold default, evict_first"] = (
            lambda x=x, w=w: norms.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", torch.bfloat16, store_stats=False,
                                                 read_policy="evict_first"))
        for r, wp in ((1, 4), (1, 8), (1, 16), (2, 8)):
            if (r, wp) != (rows, warps) and r * n <= 16384:
                calls[f"rms {shape} treefold {r} rows, {wp} warps"] = (
                    lambda x=x, w=w, kw=dict(rows_per_program=r, num_warps=wp): norms.rms_norm_impl(
                        x, w, None, 1e-6, 0.0, "llama", torch.bfloat16, store_stats=False, **kw))
        for wp in (4, 8, 16):
            calls[f"rms {shape} minimal kernel {wp} warps"] = lambda x=x, w=w, wp=wp: minimal(x, w, wp)
        calls[f"rms {shape} minimal kernel 8 warps, evict_first"] = lambda x=x, w=w: minimal(x, w, 8, "evict_first")
        if LigerRMSNormFunction is not None and n <= 65536:
            calls[f"rms {shape} liger"] = lambda x=x, w=w: LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)
        for key in calls:
            if shape in key:
                nbytes[key] = 2 * x.numel() * 2
    # LayerNorm, the residual add (read x and r, write y and h) and float32, default and evict_first
    for label, m, n, dtype in (("ln", 8192, 4096, torch.bfloat16), ("ln", 16384, 8192, torch.bfloat16),
                               ("rms+residual", 32768, 4096, torch.bfloat16), ("rms fp32", 8192, 4096, torch.float32)):
        x = torch.randn(m, n, device="cuda").to(dtype)
        r = torch.randn(m, n, device="cuda").to(dtype)
        w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
        b = (0.1 * torch.randn(n, device="cuda")).to(dtype)
        for policy in ("", "evict_first"):
            key = f"{label} {m}x{n} treefold default{', evict_first' if policy else ''}"
            if label == "ln":
                calls[key] = lambda x=x, w=w, b=b, p=policy: norms.layer_norm_impl(
                    x, w, b, 1e-5, store_stats=False, read_policy=p)
            elif label == "rms+residual":
                calls[key] = lambda x=x, w=w, r=r, p=policy: norms.rms_norm_impl(
                    x, w, r, 1e-6, 0.0, "llama", x.dtype, store_stats=False, read_policy=p)
            else:
                calls[key] = lambda x=x, w=w, p=policy: norms.rms_norm_impl(
                    x, w, None, 1e-6, 0.0, "llama", x.dtype, store_stats=False, read_policy=p)
            nbytes[key] = (4 if label == "rms+residual" else 2) * x.numel() * x.element_size()
    time_against_roof(calls, nbytes, os.path.join(out_dir, "probe-norm-forward.json") if out_dir else "")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
