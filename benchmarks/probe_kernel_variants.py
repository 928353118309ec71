"""Launch choices of the norm forward timed by their kernels' durations (the profiler's, CUPTI,
after an L2 flush: ``treefold.bench.timing.kernel_us``, 50 calls), at the four shapes where a peer's kernel ran
faster than treefold's (``results/h200-probe-kernel-times.txt``): RMSNorm 16384 x 8192 (compile
126.0 us against 128.2), 4096 x 16384 (QuACK 67.5 against 68.0), float32 8192 x 4096 (compile 64.4
against 64.9), LayerNorm 65536 x 1024 (compile 66.0 against 66.9). Every variant checked bit for
bit against its case's default first; three interleaved rounds.

    python benchmarks/probe_kernel_variants.py [OUT_DIR] [decode|exchange|held|warp|rows|blocks|bwarps|bdefault|lnb]

``held``: with the exchanges, launch choices that the trees' barriers had ruled out: rows held by
more warps, rows read twice by more, LayerNorm rows shared by more warps.

``blocks``: the norm backward with row blocks other than the order's (``rows_per_block``; dw's
bits then differ from the default's, dx's must not).

``exchange``: the rows' trees with their levels between warps met in one exchange (the default
where the loads are aligned, ``_ops.launch.tree_exchanges``) against every level its own
(``tree_exchange=False``), at the bench's norm shapes, forward and backward.
"""
import json
import os
import statistics
import sys

import torch

from probe_report import check_bits, row_op_variants
from treefold.bench.timing import kernel_us

CASES = [
    ("rms", 16384, 8192, {"default": {}, "runs 4": dict(runs=4), "runs 64": dict(runs=64),
                          "store plain": dict(store_hint=""), "twice 8w": dict(read_twice=True, num_warps=8)}),
    ("rms fp32", 8192, 4096, {"default": {}, "runs 16": dict(runs=16), "store plain": dict(store_hint="")}),
    ("rms", 4096, 16384, {"default": {}, "runs 4": dict(runs=4), "runs 64": dict(runs=64),
                          "store first": dict(store_hint="evict_first")}),
    ("ln", 65536, 1024, {"default": {}, "runs 1": dict(runs=1), "runs 32": dict(runs=32),
                         "store first": dict(store_hint="evict_first"), "read first": dict(read_policy="evict_first")}),
]


#: ``decode``: the bench's kernel time put torch.compile's 64 x 8192 at 2.1 us after the flush
#: against treefold's 2.7 (``results/h200-norms-kernel-times.md``): one row per program, 4 warps
DECODE_CASES = [("rms", 64, 8192, {"default": {}, "8w": dict(num_warps=8), "16w": dict(num_warps=16),
                                   "twice 16w": dict(read_twice=True, num_warps=16),
                                   "split 2": dict(segments_per_program=2)}),
                ("rms", 64, 4096, {"default": {}, "8w": dict(num_warps=8), "twice 8w": dict(read_twice=True,
                                                                                      num_warps=8)})]


_ONE_BY_ONE = {"default": {}, "level by level": dict(tree_exchange=False)}
EXCHANGE_CASES = [("rms", 16384, 8192, _ONE_BY_ONE), ("rms fp32", 8192, 4096, _ONE_BY_ONE),
                  ("rms", 32768, 4096, _ONE_BY_ONE), ("rms", 8192, 4096, _ONE_BY_ONE),
                  ("rms", 4096, 16384, _ONE_BY_ONE), ("rms+residual", 32768, 4096, _ONE_BY_ONE),
                  ("ln", 8192, 4096, _ONE_BY_ONE), ("ln", 16384, 8192, _ONE_BY_ONE),
                  ("rms", 64, 8192, _ONE_BY_ONE), ("rms", 1, 4096, _ONE_BY_ONE),
                  ("rms backward", 32768, 4096, _ONE_BY_ONE), ("rms backward", 16384, 8192, _ONE_BY_ONE),
                  ("ln backward", 16384, 8192, _ONE_BY_ONE),
                  ("ln backward", 8192, 4096, {**_ONE_BY_ONE, "exchange": dict(tree_exchange=True)})]


HELD_CASES = [
    ("rms fp32", 8192, 4096, {"default": {}, "held 16w": dict(read_twice=False, num_warps=16),
                              "held 8w": dict(read_twice=False, num_warps=8), "twice 8w": dict(num_warps=8),
                              "twice 32w": dict(num_warps=32)}),
    ("rms", 4096, 16384, {"default": {}, "held 16w": dict(num_warps=16), "twice 16w": dict(read_twice=True,
                                                                                            num_warps=16),
                          "twice 32w": dict(read_twice=True, num_warps=32)}),
    ("rms", 16384, 8192, {"default": {}, "twice 32w": dict(num_warps=32), "held 16w": dict(read_twice=False,
                                                                                            num_warps=16),
                          "runs 4": dict(runs=4)}),
    ("ln", 65536, 1024, {"default": {}, "4 rows 8w": dict(rows_per_program=4, num_warps=8),
                         "2 rows 4w": dict(rows_per_program=2, num_warps=4),
                         "4 rows 4w": dict(rows_per_program=4, num_warps=4),
                         "8 rows 16w": dict(rows_per_program=8, num_warps=16)}),
    ("rms", 65536, 1024, {"default": {}, "8 rows 16w": dict(rows_per_program=8, num_warps=16),
                          "2 rows 4w": dict(rows_per_program=2, num_warps=4)}),
    ("rms", 64, 8192, {"default": {}, "8w": dict(num_warps=8), "16w": dict(num_warps=16),
                       "twice 16w": dict(read_twice=True, num_warps=16)}),
]


#: ``warp``: rows of 1024 each held by one warp of a one-row program, as Inductor's LayerNorm
#: kernel holds them (65536 programs of 32 threads: no barrier, no shared memory; each warp loads
#: the weight and bias itself), against the default of the time, eight rows of eight warps (the
#: default now: two rows of two warps, ``_ops.norms._FORWARD_TILE``)
_ONE_WARP = {"default": {}, "1 row 1w": dict(rows_per_program=1, num_warps=1),
             "2 rows 2w": dict(rows_per_program=2, num_warps=2)}
WARP_CASES = [("ln", 65536, 1024, _ONE_WARP), ("rms", 65536, 1024, _ONE_WARP)]


#: ``rows``: two rows per program where the default takes one (float32 rows of 4096, where
#: torch.compile's kernel stays 0.6% ahead, and the 8-16 KiB bf16 rows): two rows' loads, trees
#: and IEEE square roots and divisions in flight in one program, held or read twice
_TWO_ROWS = {"2 rows held 16w": dict(rows_per_program=2, read_twice=False, num_warps=16),
             "2 rows twice 16w": dict(rows_per_program=2, read_twice=True, num_warps=16),
             "2 rows twice 32w": dict(rows_per_program=2, read_twice=True, num_warps=32)}
ROWS_CASES = [
    ("rms fp32", 8192, 4096, {"default": {}, **_TWO_ROWS,
                              "2 rows held 32w": dict(rows_per_program=2, read_twice=False, num_warps=32)}),
    ("rms", 8192, 4096, {"default": {}, **_TWO_ROWS,
                         "2 rows twice 8w": dict(rows_per_program=2, read_twice=True, num_warps=8)}),
    ("rms", 16384, 8192, {"default": {}, "2 rows twice 16w": _TWO_ROWS["2 rows twice 16w"],
                          "2 rows twice 32w": _TWO_ROWS["2 rows twice 32w"]}),
    ("ln", 8192, 4096, {"default": {}, "2 rows 16w": dict(rows_per_program=2, num_warps=16),
                        "2 rows 8w": dict(rows_per_program=2, num_warps=8)}),
]


#: ``blocks``: row blocks of the norm backward (the partial rows of dw and db). With 256 blocks
#: (rows of 8192 and more: one program per SM of the H200) the blocks ran in two waves, the second
#: 124 programs wide; ceil(M / 132) rows per block run in one. Run with two trees' src to compare
#: the rules (and a constant loop bound against a runtime one at the same blocks).
BLOCKS_CASES = [
    ("rms backward", 32768, 4096, {"default": {}, "125 rows (263)": dict(rows_per_block=125)}),
    ("rms backward", 16384, 8192, {"default": {}, "125 rows (132)": dict(rows_per_block=125),
                                   "64 rows (256)": dict(rows_per_block=64)}),
    ("ln backward", 16384, 8192, {"default": {}, "125 rows (132)": dict(rows_per_block=125),
                                  "64 rows (256)": dict(rows_per_block=64)}),
    ("ln backward", 8192, 4096, {"default": {}}),
    ("rms backward", 4096, 16384, {"default": {}, "32 rows (128)": dict(rows_per_block=32),
                                   "16 rows (256)": dict(rows_per_block=16)}),
]


#: ``bwarps``: the norm backward at 16 warps and with a fourth pipeline stage, now that rows of
#: 8192 run in one wave of 132 blocks (the 16-warp launches compile without spills: offline sm_90
#: RMSNorm 16384 x 8192 111 registers, LayerNorm 128, RMSNorm 32768 x 4096 64)
_BACKWARD_WARPS = {"default": {}, "16w": dict(num_warps=16), "4 stages": dict(num_stages=4),
                   "16w 4 stages": dict(num_warps=16, num_stages=4), "16w 2 stages": dict(num_warps=16, num_stages=2)}
BACKWARD_WARPS_CASES = [("rms backward", 32768, 4096, _BACKWARD_WARPS), ("rms backward", 16384, 8192, _BACKWARD_WARPS),
                        ("ln backward", 16384, 8192, _BACKWARD_WARPS),
                        ("ln backward", 8192, 4096, {"default": {}, "16w": dict(num_warps=16)})]


#: ``lnb``: LayerNorm's backward at rows of 8192 with its launch choices again (paired sums and
#: 16-bit rows had lost when those rows ran in two waves of 256 blocks)
LN_BACKWARD_CASES = [
    ("ln backward", 16384, 8192, {"default": {}, "paired": dict(paired_sums=True),
                                  "paired exchange": dict(paired_sums=True, tree_exchange=True),
                                  "hold 16-bit": dict(hold_16bit=True),
                                  "paired hold 16-bit": dict(paired_sums=True, hold_16bit=True),
                                  "level by level": dict(tree_exchange=False)}),
    ("rms backward", 16384, 8192, {"default": {}, "hold 16-bit": dict(hold_16bit=True)})]


#: ``bdefault``: the norm backward's default launches alone (dx, dw and db: the backward kernel and
#: the column sums), to compare trees
BACKWARD_DEFAULT_CASES = [(label, m, n, {"default": {}}) for label, m, n in (
    ("rms backward", 32768, 4096), ("rms backward", 16384, 8192), ("ln backward", 16384, 8192),
    ("ln backward", 8192, 4096), ("rms backward", 4096, 16384))]


def main(out_dir: str, which: str = "") -> None:
    torch.manual_seed(0)
    cases = {"decode": DECODE_CASES, "exchange": EXCHANGE_CASES, "held": HELD_CASES,
             "warp": WARP_CASES, "rows": ROWS_CASES, "blocks": BLOCKS_CASES,
             "bwarps": BACKWARD_WARPS_CASES, "bdefault": BACKWARD_DEFAULT_CASES,
             "lnb": LN_BACKWARD_CASES}.get(which, CASES)
    variants = row_op_variants(cases)
    unequal = check_bits(variants)
    if which == "blocks":  # other blocks give dw other bits by design; dx must not change
        first = {}
        for name, (fn, _, case) in variants.items():
            dx = fn()[0].clone()
            first.setdefault(case, dx)
            if not torch.equal(dx.view(torch.int16), first[case].view(torch.int16)):
                print(f"dx NOT EQUAL: {name}")
                unequal.append(f"dx {name}")
    times = {name: [] for name in variants}
    for _ in range(3):
        for name, (fn, _, _) in variants.items():
            times[name].append(kernel_us(fn, calls=50))
    width = max(len(n) for n in times)
    for name, ts in times.items():
        print(f"{name:{width}s}  " + "  ".join(f"{t:7.2f}" for t in ts) + f"  median {statistics.median(ts):7.2f} us")
    if out_dir:
        with open(os.path.join(out_dir, f"probe-kernel-variants{'-' + which if which else ''}.json"), "w") as f:
            json.dump(dict(kernel_us=times, unequal=unequal), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "", sys.argv[2] if len(sys.argv) > 2 else "")
