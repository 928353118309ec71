"""Probe: what the treefold order costs on the GPU (tree sums and a row-in-registers softmax).

Run on a CUDA machine: python benchmarks/probe_order.py. Prints a short table; JSON to $OUT.
"""
import json
import os
import sys

import numpy as np
import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from treefold import order  # noqa: E402
from treefold._ops.reduce import tree_sum_rows  # noqa: E402
from treefold.kernels.combine import tree_sum, tree_max_sum  # noqa: E402

rows_out = []


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e-3


def roof():
    n = 1 << 28
    a = torch.empty(n, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    t = bench(lambda: b.copy_(a))
    return 2 * a.numel() * 4 / t / 1e9


@triton.jit
def softmax_rows_kernel(x_ptr, y_ptr, rows, n, stride, S: tl.constexpr, C: tl.constexpr, LOG2_C: tl.constexpr,
                        LOG2_S: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, TREE: tl.constexpr):
    pid = tl.program_id(0)
    for r in range(ROWS_PER_PROGRAM):
        row = pid * ROWS_PER_PROGRAM + r
        if row < rows:
            offs = tl.arange(0, S)[:, None] * C + tl.arange(0, C)[None, :]
            mask = offs < n
            x = tl.load(x_ptr + row.to(tl.int64) * stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
            if TREE:
                m_seg = tl.max(x, axis=1)
                m_safe = tl.where(m_seg == float("-inf"), 0.0, m_seg)
                e = tl.exp(x - m_safe[:, None])
                s_seg = tree_sum(e, S, C, LOG2_C)
                m2, z2 = tree_max_sum(tl.reshape(m_seg, [1, S]), tl.reshape(s_seg, [1, S]), 1, S, LOG2_S)
                m = tl.sum(m2, axis=0)
                z = tl.sum(z2, axis=0)
            else:
                m = tl.max(tl.max(x, axis=1), axis=0)
                e = tl.exp(x - m)
                z = tl.sum(tl.sum(e, axis=1), axis=0)
            y = tl.exp(x - m) / z
            tl.store(y_ptr + row.to(tl.int64) * stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def softmax_probe(x, tree, num_warps, rpp):
    rows, n = x.shape
    C = order.lanes(n)
    S = order.next_pow2(order.num_segments(n))
    y = torch.empty_like(x)
    grid = (triton.cdiv(rows, rpp),)
    softmax_rows_kernel[grid](x, y, rows, n, x.stride(0), S, C, order.log2(C), order.log2(S), rpp, tree,
                              num_warps=num_warps)
    return y


def main():
    torch.manual_seed(0)
    R = roof()
    print(f"roof {R:.0f} GB/s", flush=True)
    # bits vs CPU reference
    for n in [31, 4097, 151936, (1 << 24) + 1]:
        xc = torch.rand(n) * 2 - 1
        want = order.reference_sum(xc.numpy())
        got = tree_sum_rows(xc.view(1, n).cuda()).cpu().numpy()[0]
        print(f"bits n={n}: {'SAME' if got.tobytes() == np.float32(want).tobytes() else 'DIFF'} {got} {want}")
    for n in [1 << 26, 1 << 28]:
        x = torch.rand(n, device="cuda")
        t = bench(lambda: tree_sum_rows(x.view(1, n)))
        tt = bench(lambda: torch.sum(x))
        vals = {tree_sum_rows(x.view(1, n)).item() for _ in range(20)}
        rows_out.append(("sum fp32", f"2^{n.bit_length()-1}", "treefold", t, n * 4 / t / 1e9))
        rows_out.append(("sum fp32", f"2^{n.bit_length()-1}", "torch", tt, n * 4 / tt / 1e9))
        print(f"distinct in 20 runs n={n}: {len(vals)}")
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    t = bench(lambda: tree_sum_rows(x))
    tt = bench(lambda: x.sum(-1))
    rows_out.append(("rowsum bf16", "8192x4096", "treefold", t, x.numel() * 2 / t / 1e9))
    rows_out.append(("rowsum bf16", "8192x4096", "torch", tt, x.numel() * 2 / tt / 1e9))
    for shape in [(8192, 4096), (32768, 8192), (4096, 32768)]:
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        ref = torch.softmax(x.float(), -1)
        nbytes = 2 * x.numel() * 2
        tt = bench(lambda: torch.softmax(x, -1))
        rows_out.append(("softmax bf16", f"{shape[0]}x{shape[1]}", "torch", tt, nbytes / tt / 1e9))
        for tree in (True, False):
            for nw in (1, 2, 4, 8, 16):
                for rpp in (1, 2, 4):
                    if shape[1] >= 32768 and nw < 4:
                        continue
                    try:
                        y = softmax_probe(x, tree, nw, rpp)
                        err = (y.float() - ref).abs().max().item()
                        t = bench(lambda: softmax_probe(x, tree, nw, rpp))
                        rows_out.append(("softmax bf16", f"{shape[0]}x{shape[1]}",
                                         f"{'tree' if tree else 'free'} w{nw} r{rpp} err{err:.1e}", t, nbytes / t / 1e9))
                    except Exception as e:  # noqa: BLE001
                        print("fail", shape, tree, nw, rpp, repr(e)[:200])
    print(f"{'op':14} {'shape':12} {'variant':28} {'us':>9} {'GB/s':>7} {'%roof':>6}")
    for op, shape, var, t, gbs in rows_out:
        print(f"{op:14} {shape:12} {var:28} {t*1e6:9.1f} {gbs:7.0f} {100*gbs/R:6.1f}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe_order.json"), "w") as f:
            json.dump({"roof": R, "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
