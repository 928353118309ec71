"""Host time of the prepared eager paths' own Python, on any machine (no GPU): the launches are
stand-ins that take the C launcher's arguments and return, so what is timed is what a repeated
eager call pays besides Triton's C launcher (about 5 us per launch on the H200's host) and the
driver.

    python benchmarks/probe_prepared_host.py

Prints microseconds per call, best of 7 rounds of 20000 calls: a ``PreparedPipeline`` shaped as
argmax over one long row (two launches, two workspace buffers) and as a row sum (one launch, no
buffers), one ``PreparedLaunch``, an eager ``rms_norm`` through ``norm_prepared`` with a
stand-in launch (its key, allocation and checks included), and ``sample``'s own Python before
its launches, with its argument checks and with them skipped for a kind checked before (on the
CPU the checks include reading the logits for rows without a finite value, timed apart: a CUDA
call pays the difference). Compare two trees by running this
with each one's src on PYTHONPATH, alternating; this machine's pace drifts by tens of percent.
"""
import time

import torch

import treefold
from treefold._ops import norms
from treefold._ops.launch import PreparedLaunch, PreparedPipeline

if not hasattr(torch._C, "_cuda_getCurrentRawStream"):  # CPU-only torch builds
    torch._C._cuda_getCurrentRawStream = lambda device: 0


def _launcher(*args):
    return None


def stand_in(slots: int) -> PreparedLaunch:
    """A prepared launch of a kernel with 30 arguments whose first ``slots`` are tensors."""
    return PreparedLaunch((_launcher, False, False), (1, 1, 1), 0, (4, 1, 0), [0] * 30,
                          tuple((i,) for i in range(slots)), 0)


def per_call_us(fn, calls=20000, rounds=7) -> float:
    for _ in range(1000):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main():
    x = torch.randn(1, 151936)
    names = ("x", "out", "part1", "part2")
    argmax_like = PreparedPipeline(((stand_in(4), names, ()), (stand_in(4), names, ())),
                                   {"part1": torch.empty(149), "part2": torch.empty(149, dtype=torch.int64)},
                                   (("out", (1,), torch.int64),))
    row_sum_like = PreparedPipeline(((stand_in(2), ("x", "out"), ()),), {}, (("out", (1,), torch.float32),))
    one = stand_in(4)
    h = torch.randn(1, 4096, dtype=torch.bfloat16)
    w = torch.randn(4096, dtype=torch.bfloat16)
    key = norms._prepared_key(True, h, None, w, None, 1e-6, 0.0, "llama", None, None)
    norms._PREPARED[key] = (stand_in(3), torch.bfloat16)
    cases = [
        ("PreparedPipeline, argmax-like (2 launches, 2 buffers)", lambda: argmax_like(x, {}, {})),
        ("PreparedPipeline, row-sum-like (1 launch)", lambda: row_sum_like(x, {}, {})),
        ("PreparedLaunch, 4 tensor slots", lambda: one(x, x, x, x)),
        ("treefold.rms_norm 1x4096 bf16, stand-in launch", lambda: treefold.rms_norm(h, w)),
        ("torch.empty_like 1x4096 bf16 (for scale)", lambda: torch.empty_like(h)),
    ]
    for name, fn in cases:
        print(f"host us/call  {name:55s} {per_call_us(fn):6.2f}", flush=True)
    # sample's checks: the launches replaced by an empty result, the CUDA-only skip forced
    from treefold.functional import sampling as public
    logits, seeds = torch.randn(64, 64), torch.arange(64)
    public._ops.sample = lambda rows, *args: torch.empty(rows.shape[0], dtype=torch.int64)
    for skip in (False, True):
        public._fast_device = lambda t, skip=skip: skip
        public._VALIDATED.clear()
        for name, fn in ((f"sample top-p 0.9, seed 1 (64 x 64){', checked before' if skip else ''}",
                          lambda: treefold.sample(logits, top_p=0.9, seed=1)),
                         (f"sample top-k 50, per-row seeds{', checked before' if skip else ''}",
                          lambda: treefold.sample(logits, top_k=50, seed=seeds, offset=3))):
            print(f"host us/call  {name:55s} {per_call_us(fn):6.2f}", flush=True)
    finite_rows = per_call_us(lambda: bool((~torch.isfinite(logits).any(dim=-1)).any()))
    print(f"host us/call  {'of which the CPU-only check of finite rows':55s} {finite_rows:6.2f}", flush=True)


if __name__ == "__main__":
    main()
