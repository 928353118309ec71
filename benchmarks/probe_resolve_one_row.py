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
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from probe_report import sampling_variants, variant_probe

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
    return sampling_variants(ops, VARIANTS, CASES)


if __name__ == "__main__":
    variant_probe(sys.argv, VARIANTS, table, "one-row.json")
