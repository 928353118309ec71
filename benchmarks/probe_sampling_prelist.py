"""The filtered sampling path with and without the histogram's pre-list (the compaction of a
row whose kept prefix ends within PRELIST_BINS bins of its maximum reads the pre-listed tokens
instead of the row), in one process:

    python benchmarks/probe_sampling_prelist.py OUT_DIR

The cases of ``probe_sampling_split`` (151936 logits; 64 rows fp32 and bf16 and one row fp32,
peaked; 64 flat rows fp32), each replayed from a CUDA graph (do_bench median, L2 flushed) in
three interleaved rounds under the default rule (the pre-list in filtered calls on grids of more
than 4 programs per SM), with no pre-list, and with the pre-list on every grid (one row too);
every variant's tokens
must equal the default's. Then each launch's time (torch profiler) in the
top-p 0.9 call at 64 rows fp32, with and without the pre-list. Writes OUT_DIR/prelist.json.
"""
import json
import os
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops

from probe_report import time_graphed_variants, with_values
from probe_sampling import kernel_times
from probe_sampling_split import call, cases

#: name -> the launcher's pre-list settings
VARIANTS = {"default": {}, "no pre-list": dict(PRELIST_BINS=0, PRELIST_MIN_PROGRAMS_PER_SM=0),
            "pre-list always": dict(PRELIST_MIN_PROGRAMS_PER_SM=0)}


def main(out_dir):
    table = {}
    for key, x, seeds, config in cases():
        table[key] = {name: with_values(ops, values, call(ops, x, seeds, config, None))
                      for name, values in VARIANTS.items()}
    times = time_graphed_variants(table, "", 3)
    from gpu_sampling import logits
    seeds = torch.arange(64, device="cuda", dtype=torch.int64) * 7919 + 1
    x = logits(64, torch.float32)
    launches = {}
    for name in ("default", "no pre-list"):
        launches[name] = kernel_times(with_values(ops, VARIANTS[name], call(ops, x, seeds, "top-p 0.9", None)))
        print(f"kernels, top-p 0.9, 64 rows fp32, {name} (us per launch): "
              + ", ".join(f"{k} {v}" for k, v in launches[name].items()))
    print("best of 3 rounds, us: " + " | ".join(VARIANTS))
    for key in table:
        print(f"{key[0]:40s} " + "  ".join(f"{min(times[(key, name)]):7.1f}" for name in VARIANTS))
    with open(os.path.join(out_dir, "prelist.json"), "w") as f:
        json.dump({"times": {f"{k[0]} | {v}": t for (k, v), t in times.items()}, "launches": launches}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
