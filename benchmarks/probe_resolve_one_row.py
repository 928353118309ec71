"""Launch choices of the sampling passes after the plan, at one row above all, in one process:

    python benchmarks/probe_resolve_one_row.py OUT_DIR           # time every variant
    python benchmarks/probe_resolve_one_row.py --warm VARIANT    # compile one variant's kernels

At one row of 151936 the resolve pass, one program, is the longest pass of a filtered call, and
SM clock stamps inside it (``probe_resolve_stamps.py``) put 1.6-1.8 us in the race of the
sure-kept tokens the plan listed for it (608 under top-p 0.9). Where the compaction races in
place itself (``race_in_compaction``: one row), the variants:

- "sure in place": SURE_LIST_MAX_IN_COMPACTION = 0: every row races its sure-kept tokens in
  the compaction, spread over the row's programs, and the resolve merges their winners only;
- "resolve 8 warps" (RESOLVE_WARPS = 8; 16 won at a pairwise limit of 128, the tiles are half
  that now);
- "one chunk": PAIR_CHUNK = 64 (one [64, 64] tile instead of two [64, 32]);
- "sure in place, 8 warps".

Every choice gives the same tokens (checked first). 151936 logits (the gpu_sampling inputs): one
row fp32 peaked (top-p 0.9, min-p 0.05, top-k 50, top-k 50 + top-p 0.9), bf16 peaked top-p 0.9,
fp32 flat top-p 0.9; 64 rows fp32 peaked top-p 0.9 and min-p 0.05 (where only the warps and the
chunk apply). Each call replayed from a CUDA graph (do_bench median, L2 flushed) in three
interleaved rounds.
"""
import os
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from probe_report import time_graphed_variants, with_values
from probe_sampling_split import call

#: name -> the launcher's settings
VARIANTS = {
    "default": {},
    "sure in place": {"SURE_LIST_MAX_IN_COMPACTION": 0},
    "resolve 8 warps": {"RESOLVE_WARPS": 8},
    "one chunk": {"PAIR_CHUNK": 64},
    "sure in place, 8 warps": {"SURE_LIST_MAX_IN_COMPACTION": 0, "RESOLVE_WARPS": 8},
}
CASES = (
    (1, torch.float32, False, ("top-p 0.9", "min-p 0.05", "top-k 50", "top-k 50 + top-p 0.9")),
    (1, torch.bfloat16, False, ("top-p 0.9",)),
    (1, torch.float32, True, ("top-p 0.9",)),
    (64, torch.float32, False, ("top-p 0.9", "min-p 0.05")),
)


def table():
    from gpu_sampling import FLAT, logits
    out = {}
    for batch, dtype, flat, configs in CASES:
        x = logits(batch, dtype, **({"scale": FLAT} if flat else {}))
        seeds = torch.arange(batch, device="cuda", dtype=torch.int64) * 7919 + 1
        for config in configs:
            fn = call(ops, x, seeds, config, None)
            out[(f"{batch} {str(dtype)[6:]} {'flat' if flat else 'peaked'} {config}",)] = {
                name: with_values(ops, values, fn) for name, values in VARIANTS.items()}
    return out


def warm(variant):
    for calls in table().values():
        calls[variant]()
    torch.cuda.synchronize()


def main(out_dir):
    cases = table()
    times = time_graphed_variants(cases, os.path.join(out_dir, "one-row.json"), 3)
    print("best of 3 rounds, us: " + " | ".join(VARIANTS))
    for key, calls in cases.items():
        print(f"{key[0]:36s} " + "  ".join(f"{min(times[(key, name)]):7.1f}" for name in calls))


if __name__ == "__main__":
    if sys.argv[1] == "--warm":
        warm(sys.argv[2])
    else:
        main(sys.argv[1])
