"""Softmax at the decode shapes (1 and 64 rows of 151936 bf16) under each strategy that can take
them, timed three ways, and what do_bench's L2 flush costs every provider:

    python benchmarks/probe_decode_flush.py [OUT_DIR]     # warm the variants in parallel, then time
    python benchmarks/probe_decode_flush.py --warm I K    # compile the I-th of K shares of variants

- "graph": 20 calls in one CUDA graph, L2 warm (``treefold.bench.timing.cuda_graph_us``): what
  the strategy rule was chosen on.
- "dirty": the flush ``triton.testing.do_bench`` (and so the bench) uses, zeros written over
  256 MB, so the timed call finds the L2 full of dirty lines: every line it brings in first
  writes one back, and a call that reads 19 MB pays for up to the L2's worth of write-backs
  besides. Unlike do_bench, each call is synchronised before the next flush.
- "clean": the same zeroing, then a read of another 256 MB buffer before the timed call, so the
  L2 holds clean lines of neither input: the call pays for its own bytes alone.

Each timing is the median of REPS calls; the variants are timed in interleaved rounds, and every
variant's output is checked equal bit for bit to the default's first (all strategies follow the
one order). torch.softmax is timed the same ways for comparison.
"""
import json
import os
import statistics
import subprocess
import sys

import torch
import triton

from treefold._ops import softmax as ops
from treefold.bench.timing import clean_flush, cuda_graph_us

N = 151936
ROWS = (1, 64)
#: label -> (strategy, tuning)
VARIANTS = {
    "auto": ("auto", ops.Tuning()),
    "split": ("split", ops.Tuning()),
    "split 8 warps": ("split", ops.Tuning(num_warps=8)),
    "split 2 segments": ("split", ops.Tuning(segments_per_program=2)),
    "split ordinary launch": ("split", ops.Tuning(dependent_launch=False)),
    "cooperative": ("cooperative", ops.Tuning()),
    "cooperative 8 warps": ("cooperative", ops.Tuning(num_warps=8)),
    "cooperative 2 segments": ("cooperative", ops.Tuning(segments_per_program=2)),
    "online": ("online", ops.Tuning()),
}
REPS = 200
ROUNDS = 5


def _inputs(rows):
    g = torch.Generator(device="cuda").manual_seed(rows)
    return (torch.randn(rows, N, device="cuda", generator=g) * 2).bfloat16()


def _call(x, strategy, tuning):
    return lambda: ops.softmax_forward(x, strategy=strategy, tuning=tuning)


def warm(i, k):
    for rows in ROWS:
        x = _inputs(rows)
        for label in list(VARIANTS)[i::k]:
            try:
                _call(x, *VARIANTS[label])()
            except ValueError:  # a strategy the shape does not take (main says which)
                pass
    torch.cuda.synchronize()


class FlushTimer:
    """Median of ``reps`` event-timed calls, each after zeroing a 256 MB buffer and, with
    ``clean``, reading another 256 MB buffer (so the L2 holds clean lines of neither input:
    ``timing.clean_flush``)."""

    def __init__(self, clean):
        self.clean = clean
        self.zeros = None if clean else torch.empty(1 << 26, dtype=torch.int32, device="cuda")

    def __call__(self, fn):
        fn()
        times = []
        for _ in range(REPS):
            if self.clean:
                clean_flush()
            else:
                self.zeros.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)


def main(out_dir):
    k = 8
    procs = [subprocess.Popen([sys.executable, __file__, "--warm", str(i), str(k)]) for i in range(k)]
    for p in procs:
        p.wait()
    timers = {"graph": cuda_graph_us, "dirty": FlushTimer(False), "clean": FlushTimer(True)}
    results = []
    for rows in ROWS:
        x = _inputs(rows)
        want = ops.softmax_forward(x)
        calls = {"torch": lambda x=x: torch.softmax(x, -1)}
        for label, (strategy, tuning) in VARIANTS.items():
            fn = _call(x, strategy, tuning)
            try:
                same = torch.equal(fn().view(torch.int16), want.view(torch.int16))
            except ValueError as e:  # a strategy the shape does not take
                print(f"{rows}x{N} {label}: {e}")
                continue
            if not same:
                print(f"{rows}x{N} {label}: BITS DIFFER from the default")
            calls[label] = fn
        times = {(label, timer): [] for label in calls for timer in timers}
        for _ in range(ROUNDS):
            for label, fn in calls.items():
                for timer_name, timer in timers.items():
                    times[(label, timer_name)].append(timer(fn))
        for label in calls:
            row = {"rows": rows, "variant": label}
            for timer_name in timers:
                row[timer_name] = times[(label, timer_name)]
            results.append(row)
    print(f"softmax {N} bf16 forward, us: median over {ROUNDS} interleaved rounds (each round's value a "
          f"median of {REPS} calls; graph: 20 calls per graph), min-max in brackets")
    print(f"{'rows':>4} {'variant':24} {'graph':>18} {'dirty flush':>18} {'clean flush':>18}")
    for r in results:
        cells = [f"{statistics.median(r[t]):6.2f} [{min(r[t]):5.1f}-{max(r[t]):5.1f}]" for t in timers]
        print(f"{r['rows']:>4} {r['variant']:24} " + " ".join(f"{c:>18}" for c in cells))
    if out_dir:
        with open(os.path.join(out_dir, "probe-decode-flush.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--warm":
        warm(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else None)
