"""The L2 eviction policies of the filtered path's two reads of the logits: the segment maxima's
read from HBM (``FILTER_FIRST_READ_POLICY``) and the histogram pass's read of the same bytes
(``FILTER_SECOND_READ_POLICY``), in one process:

    python benchmarks/probe_read_policy.py OUT_DIR           # check and time every variant
    python benchmarks/probe_read_policy.py --warm VARIANT    # compile one variant's kernels

At 64 rows of 151936 fp32 the logits are 39 MB against an L2 of 50 MB (H100) or 60 MB (H200),
which do_bench's flush leaves full of dirty lines. If part of the first read is evicted before
the second (the histogram pass added 20 us to a 64-row fp32 call on an H100 and 16 us to a bf16
one of half the bytes, results/h100-probe-single-pass.txt), keeping the first read's lines
(evict_last) and letting the second read's go first should take the difference off; where the
logits already stay in L2 the policies should change nothing. Every variant must give the same
tokens (checked first).

151936 logits (the gpu_sampling inputs): 64 rows fp32 peaked (top-p 0.9, min-p 0.05, top-k 50)
and flat (top-p 0.9), 64 rows bf16 peaked (top-p 0.9), 16 rows fp32 peaked (top-p 0.9), one row
fp32 peaked (top-p 0.9, min-p 0.05: the pipeline, which ``sample`` takes at one row for min-p).
Each call replayed from a CUDA graph (do_bench median, L2 flushed) in three interleaved rounds.
"""
import os
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from probe_report import sampling_variants, variant_probe

#: name -> the launcher's settings
VARIANTS = {
    "plain": {"FILTER_FIRST_READ_POLICY": "", "FILTER_SECOND_READ_POLICY": ""},
    "keep first": {"FILTER_FIRST_READ_POLICY": "evict_last", "FILTER_SECOND_READ_POLICY": ""},
    "keep first, drop second": {"FILTER_FIRST_READ_POLICY": "evict_last", "FILTER_SECOND_READ_POLICY": "evict_first"},
    "drop second": {"FILTER_FIRST_READ_POLICY": "", "FILTER_SECOND_READ_POLICY": "evict_first"},
}
CASES = (
    (64, torch.float32, False, ("top-p 0.9", "min-p 0.05", "top-k 50")),
    (64, torch.float32, True, ("top-p 0.9",)),
    (64, torch.bfloat16, False, ("top-p 0.9",)),
    (16, torch.float32, False, ("top-p 0.9",)),
    (1, torch.float32, False, ("top-p 0.9", "min-p 0.05")),
)
#: ONLY_ROWS=1,16 keeps the cases of those batch sizes
if os.environ.get("ONLY_ROWS"):
    CASES = tuple(c for c in CASES if str(c[0]) in os.environ["ONLY_ROWS"].split(","))


def table():
    return sampling_variants(ops, VARIANTS, CASES)


if __name__ == "__main__":
    variant_probe(sys.argv, VARIANTS, table, "read_policy.json")
