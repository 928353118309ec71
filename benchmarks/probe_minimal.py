"""Softmax and LayerNorm forward: treefold's default launch against minimal Triton kernels of the
same launch shape (one row per program; ``tl.max`` / ``tl.sum`` in the compiler's order, ``tl.exp``,
``rsqrt``; not bit-exact; for rows of 32768 also a minimal "online" kernel that reads the row twice)
and Liger, to tell what treefold's kernels add from what the launch shape costs. bf16, three interleaved rounds, do_bench median, L2 flushed; bytes: read x, write y.

    python benchmarks/probe_minimal.py [OUT_DIR]   (CUDA; with the peers: source .peers/activate.sh)
"""
import os
import sys

import torch
import triton
import triton.language as tl

from treefold._ops import norms
from treefold._ops import softmax as sm

from probe_report import time_against_roof


@triton.jit
def minimal_softmax_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < n
    x = tl.load(x_ptr + row * n + col, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    y = e * (1.0 / tl.sum(e, axis=0))
    tl.store(y_ptr + row * n + col, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def minimal_online_softmax_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, BLOCKS: tl.constexpr,
                                  EVICT_FIRST: tl.constexpr):
    """Two reads of the row (the second from L2): a running (max, sum) over blocks, then the
    outputs; the compiler's reduction order, not bit-exact."""
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for j in range(BLOCKS):
        start = j * BLOCK
        mask = start + col < n
        x = tl.load(x_ptr + row * n + start + col, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    inv = 1.0 / s
    for j in range(BLOCKS):
        start = j * BLOCK
        mask = start + col < n
        x = tl.load(x_ptr + row * n + start + col, mask=mask, other=float("-inf")).to(tl.float32)
        y = (tl.exp(x - m) * inv).to(y_ptr.dtype.element_ty)
        if EVICT_FIRST:
            tl.store(y_ptr + row * n + start + col, y, mask=mask, eviction_policy="evict_first")
        else:
            tl.store(y_ptr + row * n + start + col, y, mask=mask)


@triton.jit
def minimal_layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < n
    x = tl.load(x_ptr + row * n + col, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n
    d = tl.where(mask, x - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(d * d, axis=0) / n + eps)
    w = tl.load(w_ptr + col, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + col, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n + col, (d * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)


def minimal_softmax(x, warps):
    y = torch.empty_like(x)
    minimal_softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=warps)
    return y


def minimal_online_softmax(x, block, warps, evict_first):
    y = torch.empty_like(x)
    minimal_online_softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=block, BLOCKS=triton.cdiv(x.shape[1], block),
                                                 EVICT_FIRST=evict_first, num_warps=warps)
    return y


def minimal_layer_norm(x, w, b, warps):
    y = torch.empty_like(x)
    minimal_layer_norm_kernel[(x.shape[0],)](x, w, b, y, x.shape[1], 1e-5, BLOCK=triton.next_power_of_2(x.shape[1]),
                                             num_warps=warps)
    return y


def main(out_dir):
    torch.manual_seed(0)
    calls, nbytes = {}, {}
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    except ImportError:
        LigerSoftmaxFunction = LigerLayerNormFunction = None
    for m, n in ((8192, 4096), (32768, 8192), (4096, 32768)):
        x = (torch.randn(m, n, device="cuda") * 3).bfloat16()
        shape = f"{m}x{n}"
        p = sm._plan_for(sm._SOFTMAX, False, n, m, x)
        calls[f"softmax {shape} treefold default ({p.strategy}, {p.rows_per_program} rows, {p.num_warps} warps)"] = (
            lambda x=x: sm.softmax_forward(x))
        if n <= 8192:
            for rows, warps in ((1, 4), (1, 8), (2, 8), (2, 4)):
                calls[f"softmax {shape} treefold block {rows} rows, {warps} warps"] = (
                    lambda x=x, t=sm.Tuning(rows_per_program=rows, num_warps=warps): sm.softmax_forward(
                        x, strategy="block", tuning=t))
        for warps in ((4, 8, 16) if n <= 8192 else (16, 32)):
            calls[f"softmax {shape} minimal kernel {warps} warps"] = lambda x=x, w=warps: minimal_softmax(x, w)
        if n > 8192:
            # the online layout without the treefold order: does the order or the two reads hold it back?
            for block, warps, evict in ((8192, 4, True), (8192, 4, False), (4096, 4, True), (8192, 8, True)):
                calls[f"softmax {shape} minimal online {block}/{warps} warps{', evict-first' if evict else ''}"] = (
                    lambda x=x, b=block, w=warps, e=evict: minimal_online_softmax(x, b, w, e))
        if LigerSoftmaxFunction is not None:
            calls[f"softmax {shape} liger"] = lambda x=x: LigerSoftmaxFunction.apply(x)
        for key in calls:
            if f"softmax {shape} " in key:
                nbytes[key] = 2 * x.numel() * 2
    for m, n in ((8192, 4096), (16384, 8192)):
        x = torch.randn(m, n, device="cuda").bfloat16()
        w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16()
        b = (0.1 * torch.randn(n, device="cuda")).bfloat16()
        shape = f"{m}x{n}"
        rows, warps = norms.forward_config(n, False)
        calls[f"ln {shape} treefold default ({rows} rows, {warps} warps)"] = (
            lambda x=x, w=w, b=b: norms.layer_norm_impl(x, w, b, 1e-5, store_stats=False))
        for r, wp in ((1, 4), (1, 8), (2, 8), (2, 16)):
            if (r, wp) != (rows, warps):
                calls[f"ln {shape} treefold {r} rows, {wp} warps"] = (
                    lambda x=x, w=w, b=b, kw=dict(rows_per_program=r, num_warps=wp): norms.layer_norm_impl(
                        x, w, b, 1e-5, store_stats=False, **kw))
        for wp in (4, 8, 16):
            calls[f"ln {shape} minimal kernel {wp} warps"] = (
                lambda x=x, w=w, b=b, wp=wp: minimal_layer_norm(x, w, b, wp))
        if LigerLayerNormFunction is not None:
            calls[f"ln {shape} liger"] = lambda x=x, w=w, b=b: LigerLayerNormFunction.apply(x, w, b, 1e-5)
        for key in calls:
            if f"ln {shape} " in key:
                nbytes[key] = 2 * x.numel() * 2
    time_against_roof(calls, nbytes, os.path.join(out_dir, "probe-minimal.json") if out_dir else "")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
