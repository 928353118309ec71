"""How the L2 flush between timed calls weighs on a 2^26 float32 sum, and decode-sized argmax
kernel times without the host.

python benchmarks/probe_flush.py (CUDA). triton.testing.do_bench flushes L2 by zeroing a 256 MiB
buffer before each call: that leaves up to 60 MiB of dirty lines for the timed kernel's reads to
write back. Here the same sums are timed after (a) that zeroing flush and (b) a flush that only
reads 256 MiB (L2 left clean), with events around the kernel alone, median of 200. The argmax
rows are timed inside a CUDA graph of 20 calls (kernel time, no host launch cost).
"""
import statistics

import torch

import treefold as tf
from treefold.bench.timing import cuda_graph_us as graph_us
from treefold._ops.reduce import ExtremeTuning, extreme_rows


def timed(fn, flush, reps=200):
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for _ in range(5):
        fn()
    for i in range(reps):
        flush()
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end)) * 1e3


def main():
    buf = torch.empty(64 << 20, dtype=torch.int32, device="cuda")  # 256 MiB
    sink = torch.empty(1, dtype=torch.int64, device="cuda")
    dirty = lambda: buf.zero_()  # noqa: E731
    clean = lambda: torch.sum(buf, dim=0, dtype=torch.int64, out=sink[0])  # noqa: E731
    x = torch.rand(1 << 26, device="cuda")
    nbytes = x.numel() * 4
    for name, fn in [("treefold.sum", lambda: tf.sum(x)), ("torch.sum", lambda: torch.sum(x))]:
        for flush_name, flush in [("zeroing flush (do_bench)", dirty), ("read-only flush", clean)]:
            us = timed(fn, flush)
            print(f"sum fp32 2^26  {name:14s} after {flush_name:26s} {us:7.1f} us  {nbytes / us / 1e3:6.0f} GB/s")
    for rows in (1, 64):
        logits = torch.randn(rows, 151936, device="cuda")
        cases = [("treefold.argmax", lambda: tf.argmax(logits, dim=-1)),
                 ("torch.argmax", lambda: torch.argmax(logits, -1))]
        cases += [(f"extreme_rows tiles={t}", lambda t=t: extreme_rows(logits, True, tuning=ExtremeTuning(tiles=t)))
                  for t in (1, 2, 4, 8, 16)]
        for name, fn in cases:
            print(f"argmax {rows}x151936 fp32  {name:24s} in a CUDA graph {graph_us(fn):6.1f} us/call")


if __name__ == "__main__":
    main()
