"""What each launch of the filtered sampling path adds to the whole call: the call replayed from a
CUDA graph with only its first L launches, for every L (the later launches not made at all).

    PYTHONPATH=src:benchmarks python benchmarks/probe_sampling_chain.py [OUT.json [CASE]]

(CASE: the index of one case of ``cases()`` alone, so that a driver can run each case in its own
process.) DESCENT=1: the descent from the pre-list instead (``sample_descent_rows(listed=True)``,
top-p 0.9 at 64 float32 rows, peaked and flat), at its default rounds and at one.

The difference between the prefixes of L and L - 1 launches is what launch L costs the call's
end-to-end time, its wait for the launch before it included: with programmatic dependent
launches the profiler's per-launch times overlap, these do not. A prefix's outputs are not the
call's (its tokens are not compared). 151936 logits (the gpu_sampling inputs), fp32 and bf16,
64 rows and one; do_bench median of each graph replay, L2 flushed, three interleaved rounds.
"""
import json
import os
import sys

import torch

from gpu_sampling import FLAT, graphed, logits

from treefold._ops import sampling as ops
from treefold.bench.timing import CudaTimer, interleaved_us

CALLS = {  # name -> (top_k, top_p, min_p); None: top_k_rows(x, 50)
    "top-p 0.9": (None, 0.9, None),
    "min-p 0.05": (None, None, 0.05),
    "top-k 50": (50, None, None),
    "top_k(50)": None,
}
SHAPES = ((64, torch.float32, tuple(CALLS)), (64, torch.bfloat16, ("top-p 0.9",)),
          (1, torch.float32, ("top-p 0.9", "min-p 0.05")))
#: DESCENT=1: name -> launch choices of sample_descent_rows(x, 1.0, 0.9, listed=True)
DESCENT = {"listed": {}, "listed, launches": dict(loop=False), "listed, one round": dict(rounds=1, loop=False)}
if os.environ.get("DESCENT") == "1":
    CALLS = DESCENT
    SHAPES = ((64, torch.float32, tuple(DESCENT)), (-64, torch.float32, tuple(DESCENT)))  # (-rows: flat)


class _Prefix(ops._Run):
    """A run that makes only its first ``limit`` launches and counts the launches it was asked for."""
    limit = 1 << 30

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked = []

    def __call__(self, launcher, grid, *args, **kwargs):
        self.asked.append(getattr(launcher.kernel, "__name__", None) or launcher.kernel.fn.__name__)
        if len(self.asked) <= _Prefix.limit:
            super().__call__(launcher, grid, *args, **kwargs)


def call(x, seeds, name):
    config = CALLS[name]
    if CALLS is DESCENT:
        return lambda: (ops.sample_descent_rows(x, 1.0, 0.9, None, seeds, 0, listed=True, **config),)
    if config is None:
        return lambda: ops.top_k_rows(x, 50)
    return lambda: (ops.sample_rows(x, 1.0, *config, seeds, 0),)


def cases():
    return [(rows, dtype, name) for rows, dtype, names in SHAPES for name in names]


def launches_of(fn):
    """The names of the launches one call of ``fn`` makes (all of them made)."""
    _Prefix.limit = 1 << 30
    probe = _Prefix()
    original = ops._Run
    ops._Run = lambda *a, **k: probe
    try:
        fn()
    finally:
        ops._Run = original
    return probe.asked


def main(out_path="", case=None):
    ops._Run = _Prefix  # every call below builds its launches through this run
    replays, launch_names = {}, {}
    # a graph reads the tensors it was captured with: the logits and seeds made outside the
    # capture must outlive every replay (replays of freed ones, in runs of several cases in one
    # process, faulted with an illegal address, here once and in probe_single_pass.py)
    keep = []
    for i, (rows, dtype, name) in enumerate(cases()):
        if case is not None and i != int(case):
            continue
        x = logits(abs(rows), dtype, **({"scale": FLAT} if rows < 0 else {}))
        seeds = torch.arange(abs(rows), device="cuda", dtype=torch.int64) * 7919 + 1
        keep += [x, seeds]
        key = f"{abs(rows)} {str(dtype)[6:]}{' flat' if rows < 0 else ''} {name}"
        fn = call(x, seeds, name)
        launch_names[key] = launches_of(fn)
        for limit in range(1, len(launch_names[key]) + 1):
            _Prefix.limit = limit
            replays[(key, limit)] = graphed(fn)
            replays[(key, limit)]()
            torch.cuda.synchronize()  # a prefix that faults is named by the last line printed
            print(f"{key}: the first {limit} launches replayed", flush=True)
        _Prefix.limit = 1 << 30
    torch.cuda.synchronize()
    times = interleaved_us(replays, CudaTimer(warmup_ms=10, rep_ms=40), 3)
    print(f"device {torch.cuda.get_device_name()}; graph replay of the first L launches, L2 flushed, "
          "best of 3 rounds, us (+ what launch L adds)")
    result = {}
    for key, names in launch_names.items():
        best = [min(times[(key, limit)]) for limit in range(1, len(names) + 1)]
        steps = [best[0]] + [b - a for a, b in zip(best, best[1:])]
        result[key] = {"launches": names, "prefix_us": best,
                       "rounds": [times[(key, limit)] for limit in range(1, len(names) + 1)]}
        print(f"{key}: whole {best[-1]:.1f} us = " + ", ".join(f"{n} +{s:.1f}" for n, s in zip(names, steps)))
    if out_path:
        if case is not None:
            out_path = out_path.replace(".json", f"-{case}.json")
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
