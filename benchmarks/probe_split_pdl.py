"""Softmax "split" (decode batches of a vocabulary) with and without the programmatic dependent
launch of its FINISH phase: bits equal, kernel time in a CUDA graph (20 calls per graph, `treefold.bench.timing.cuda_graph_us`), and
do_bench time of the eager call. python benchmarks/probe_split_pdl.py (CUDA)."""

import torch
import triton

from treefold._ops import softmax as ops
from treefold.bench.timing import cuda_graph_us as graph_us


def main():
    torch.manual_seed(0)
    for rows in (1, 64):
        x = torch.randn(rows, 151936, device="cuda", dtype=torch.bfloat16) * 2
        dy = torch.randn_like(x)
        variants = {
            "split, dependent FINISH": ops.Tuning(dependent_launch=True),
            "split, ordinary FINISH": ops.Tuning(dependent_launch=False),
        }
        want = ops.softmax_forward(x, strategy="split")
        y = want
        want_dx = ops.softmax_backward(dy, y, strategy="split")
        for name, t in variants.items():
            fwd = lambda t=t: ops.softmax_forward(x, strategy="split", tuning=t)  # noqa: E731
            bwd = lambda t=t: ops.softmax_backward(dy, y, strategy="split", tuning=t)  # noqa: E731
            same = torch.equal(fwd(), want) and torch.equal(bwd(), want_dx)
            eager = triton.testing.do_bench(fwd, warmup=25, rep=100, return_mode="median") * 1e3
            print(f"softmax {rows}x151936 bf16 {name:24s} same bits {same}  graph fwd {graph_us(fwd):6.1f} us  "
                  f"bwd {graph_us(bwd):6.1f} us  eager do_bench fwd {eager:6.1f} us")


if __name__ == "__main__":
    main()
