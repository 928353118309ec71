"""Where the sure-kept race of 64-row filtered calls runs: in race programs of the compaction
launch (the default on grids of more than COMPACT_RACE_PROGRAMS_PER_SM programs per SM) against
inside the compaction's own programs (RACE_SURE), in one process:

    python benchmarks/probe_compact_race.py OUT_DIR           # check and time both
    python benchmarks/probe_compact_race.py --warm VARIANT    # compile one variant's kernels

At 64 rows of 151936 the compaction launch holds 3840 programs (1920 compaction programs, then
1920 race programs); offline (sm_90, the H200's plan of 5 segments per program, the pre-list on)
the kernel takes 144 registers with the race programs' path compiled into it and 145 with the race
in its loops, so 3 programs of 4 warps per SM either way: about 10 waves of programs on 132 SMs
against 5. In peaked rows almost every one of
those programs only reads its row's plan and leaves (the few that hold the pre-list's segments
do the work), so if the compaction's time (+7.8 to +10.3 us of the call on an H100,
results/h100-sampling-chain.txt) is the turnover of programs rather than that work, the race in
the compaction's loops is the faster launch; in flat rows, which race in place, it costs the
compaction's programs the noise in their loops. Both variants must give the same tokens
(checked first).

151936 logits (the gpu_sampling inputs): 64 rows fp32 peaked (top-p 0.9, min-p 0.05) and flat
(top-p 0.9, min-p 0.05), 64 rows bf16 peaked (top-p 0.9). Each call replayed from a CUDA graph
(do_bench median, L2 flushed) in three interleaved rounds.
"""
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from probe_report import sampling_variants, variant_probe

#: name -> the launcher's settings
VARIANTS = {"race programs": {}, "race in compaction": {"COMPACT_RACE_PROGRAMS_PER_SM": 1 << 20}}
CASES = (
    (64, torch.float32, False, ("top-p 0.9", "min-p 0.05")),
    (64, torch.float32, True, ("top-p 0.9", "min-p 0.05")),
    (64, torch.bfloat16, False, ("top-p 0.9",)),
)


def table():
    return sampling_variants(ops, VARIANTS, CASES)


if __name__ == "__main__":
    variant_probe(sys.argv, VARIANTS, table, "compact_race.json")
