"""The unfiltered sampling path (greedy argmax and plain temperature sampling: ``race_kernel`` then
``race_combine_kernel``) under other launch plans, beside calls that read the same logits once
and do little else (torch.amax, treefold's argmax), so that the race's distance from a plain read
shows.

    python benchmarks/probe_race_launch.py OUT_DIR        (CUDA)

Variants of the race's plan (``sampling.plan``, swapped for the call and its graph capture):
programs per SM (the default: ``sampling.RACE_PROGRAMS_PER_SM`` and its float32 greedy exception), segment width and warps, prefetch.
151936 logits (the gpu_sampling inputs), 64 rows and 1, float32 and bfloat16. Every variant's
tokens are checked equal to the default's first (greedy and seeded sampling give the same token
under any plan), then each call is timed replayed from a CUDA graph (do_bench median, L2 flushed
by do_bench's zeroing) in three interleaved rounds, and the kernel time of the replay is taken
after that flush and after one that leaves the L2 clean (``treefold.bench.timing.kernel_us``).
Writes OUT_DIR/probe-race-launch.json; prints a table last.
"""
import dataclasses
import json
import os
import sys

import torch

from gpu_sampling import graphed, logits
from probe_report import time_graphed_variants, with_values
from treefold._ops import reduce as reduce_ops
from treefold._ops import sampling as ops
from treefold.bench.timing import clean_flush, kernel_us


#: calls of the stand-ins for ``sampling.plan`` (each variant checks that its own was used)
STAND_IN_CALLS = {"count": 0}


#: ``sampling.plan`` itself, without its cache (whose key does not hold the widths set below)
_PLAN = ops.plan.__wrapped__


def plan_with(width=None, per_sm=8, warps=None, prefetch=None):
    """A stand-in for ``sampling.plan`` giving the race these launch choices (None: plan's own
    width and warps, and prefetch when a program reads more than one segment); the programs per
    row, per SM and prefetch that ``race_plan`` passes are overridden. The plan is ``plan``'s own,
    made with MAX_WIDTH set to ``width`` and its warps replaced by ``warps``."""
    def make(rows, n, device, programs_per_row=None, programs_per_sm=None, prefetch_passed=None):
        STAND_IN_CALLS["count"] += 1
        g = with_values(ops, {"MAX_WIDTH": width or ops.MAX_WIDTH},
                        lambda: _PLAN(rows, n, device, None, per_sm, prefetch))()
        return dataclasses.replace(g, num_warps=warps) if warps else g
    return make


def with_plan(stand_in, call):
    """``call`` with ``sampling.plan`` swapped for ``stand_in``, failing if the stand-in was not
    used (a race planned some other way would time the default under this variant's name)."""
    swapped = with_values(ops, {"plan": stand_in}, call)

    def run():
        before = STAND_IN_CALLS["count"]
        out = swapped()
        if STAND_IN_CALLS["count"] == before:
            raise RuntimeError("the race was not planned by the stand-in")
        return out
    return run


VARIANTS = {
    "default": None,
    "4/SM": plan_with(per_sm=4),
    "12/SM": plan_with(per_sm=12),
    "16/SM": plan_with(per_sm=16),
    "24/SM": plan_with(per_sm=24),
    "32/SM": plan_with(per_sm=32),
    "16/SM no prefetch": plan_with(per_sm=16, prefetch=False),
    "w512 16/SM": plan_with(width=512, per_sm=16),
    "w2048 4w 8/SM": plan_with(width=2048, per_sm=8),
    "w2048 8w 8/SM": plan_with(width=2048, per_sm=8, warps=8),
    "w2048 8w 4/SM": plan_with(width=2048, per_sm=4, warps=8),
    "w4096 8w 4/SM": plan_with(width=4096, per_sm=4, warps=8),
    "w4096 16w 2/SM": plan_with(width=4096, per_sm=2, warps=16),
}


def cases():
    out = {}
    for batch in (64, 1):
        for dtype in (torch.float32, torch.bfloat16):
            x = logits(batch, dtype)
            seeds = torch.arange(batch, device="cuda", dtype=torch.int64) * 7919 + 1
            for mode, t in (("greedy", 0.0), ("sample", 1.0)):
                def call(x=x, t=t, seeds=seeds):
                    return (ops.sample_rows(x, t, None, None, None, seeds, 0),)
                key = (f"{batch} {str(dtype)[6:]} {mode}",)
                out[key] = {name: (call if p is None else with_plan(p, call)) for name, p in VARIANTS.items()}
            # what reading these logits once costs elsewhere (their row maxima checked equal)
            out[(f"{batch} {str(dtype)[6:]} reads",)] = {
                "torch.amax": lambda x=x: (torch.amax(x, dim=1),),
                "treefold argmax": lambda x=x: reduce_ops.extreme_rows(x, True)[:1],
            }
    return out


def main(out_dir):
    table = cases()
    times = time_graphed_variants(table, "", 3)
    kernel, clean = {}, {}
    for key, calls in table.items():
        for name, fn in calls.items():
            replay = graphed(fn)
            kernel[(key, name)] = kernel_us(replay, 30)
            clean[(key, name)] = kernel_us(replay, 30, flush=clean_flush)
    rows = []
    for (key, name), ts in times.items():
        rows.append(dict(case=key[0], variant=name, graph_us=ts, kernel_us=kernel[(key, name)],
                         clean_us=clean[(key, name)]))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "probe-race-launch.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    print("graph: best of 3 rounds (do_bench of the replay, L2 flushed); kernel: after do_bench's "
          "flush; clean: after a flush that leaves the L2 clean; us")
    print(f"{'case':22s} {'variant':20s} {'graph':>7s} {'kernel':>7s} {'clean':>7s}")
    for r in rows:
        k, c = r["kernel_us"], r["clean_us"]
        print(f"{r['case']:22s} {r['variant']:20s} {min(r['graph_us']):7.1f} "
              f"{(k or float('nan')):7.1f} {(c or float('nan')):7.1f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
