"""RMSNorm rows read twice by many warps, the first read kept in L2 (``read_policy="evict_last"``,
the second read evict-first), against the rows held on chip: the shapes where torch.compile's
Inductor kernel beat treefold (``results/h200-norms-all-peers-1.md``: 16384 x 8192 bf16 98.4% of
the roof against 94.8, 8192 x 4096 float32 92.5 against 89.0). Inductor's kernel there loops over
the row in blocks of 2048 (4096 for float32) with 16 warps, reads it twice, the first read
evict-last (``results/probe-inductor-norms/``). Every variant checked bit for bit against its
case's default first, then three interleaved rounds, do_bench median, L2 flushed.

    python benchmarks/probe_read_twice_warps.py [OUT_DIR] [rows | residual | layernorm | ln1024]   (CUDA)

With ``rows``: launches of fewer rows, which hold them by default: decode batches replayed from
CUDA graphs (the bench's decode column) and batches near ``_READ_TWICE_MIN_ROWS``, flushed.
With ``residual``: RMSNorm with a residual read twice (h read back from its store) at 4-16 warps;
with ``layernorm``: LayerNorm read again for its centred squares and its output; with ``ln1024``:
LayerNorm 65536 x 1024 read twice with several rows per program.
"""
import os
import sys

import torch

from probe_report import check_and_time, row_op_variants


def _variants(extra=None):
    v = {"default": {}}
    for warps in (8, 16):
        v[f"held {warps}w"] = dict(num_warps=warps)
        v[f"twice {warps}w"] = dict(read_twice=True, num_warps=warps)
        v[f"twice {warps}w keep"] = dict(read_twice=True, num_warps=warps, read_policy="evict_last")
    v["twice 32w keep"] = dict(read_twice=True, num_warps=32, read_policy="evict_last")
    v.update(extra or {})
    return v


CASES = [
    ("rms", 16384, 8192, _variants()),
    ("rms fp32", 8192, 4096, _variants()),
    ("rms", 8192, 4096, _variants()),
    ("rms", 4096, 16384, _variants()),
    ("rms", 32768, 4096, _variants()),
    ("ln", 65536, 1024, {"default": {}, "2 rows": dict(rows_per_program=2), "4 rows": dict(rows_per_program=4),
                         "16 rows": dict(rows_per_program=16), "8 rows 4w": dict(rows_per_program=8, num_warps=4),
                         "8 rows 16w": dict(rows_per_program=8, num_warps=16)}),
]


#: ``rows``: fewer rows, where the default holds them (``_READ_TWICE_MIN_ROWS``): decode batches
#: replayed from CUDA graphs (``graphed``), and batches near the threshold flushed
DECODE_CASES = [(label, m, n, {"default": {}, "twice": dict(read_twice=True)})
                for label, m, n in (("rms", 64, 8192), ("rms", 1, 4096), ("rms", 64, 4096), ("rms fp32", 64, 4096))]
THRESHOLD_CASES = [(label, m, n, {"default": {}, "twice": dict(read_twice=True), "held": dict(read_twice=False)})
                   for label, m, n in (("rms", 512, 8192), ("rms", 1024, 8192), ("rms", 2048, 4096))]


#: ``residual``: with a residual, the row read again is h, read back from its store (kept in L2 by
#: default, ``h_store_hint``) instead of held through the reduction
RESIDUAL_CASES = [("rms+residual", m, n, {"default": {}, "twice 8w": dict(read_twice=True, num_warps=8),
                                          "twice 16w": dict(read_twice=True, num_warps=16),
                                          "twice 4w": dict(read_twice=True, num_warps=4),
                                          "twice 8w h plain": dict(read_twice=True, num_warps=8, h_store_hint=""),
                                          "twice 16w h plain": dict(read_twice=True, num_warps=16, h_store_hint=""),
                                          "twice 8w y plain": dict(read_twice=True, num_warps=8, store_hint="")})
                  for m, n in ((32768, 4096), (16384, 8192), (8192, 4096))]


#: ``layernorm``: LayerNorm read again for its centred squares and for its output
LAYER_NORM_CASES = [("ln", m, n, {"default": {}, "twice 4w": dict(read_twice=True, num_warps=4),
                                  "twice 8w": dict(read_twice=True, num_warps=8),
                                  "twice 16w": dict(read_twice=True, num_warps=16),
                                  "twice 8w first plain": dict(read_twice=True, num_warps=8, read_policy=""),
                                  "twice 16w first plain": dict(read_twice=True, num_warps=16, read_policy="")})
                    for m, n in ((16384, 8192), (8192, 4096), (32768, 4096))] + [
    ("ln", 65536, 1024, {"default": {}, "twice": dict(read_twice=True), "twice 2 rows": dict(read_twice=True,
                                                                                            rows_per_program=2),
                         "twice 4 rows 4w": dict(read_twice=True, rows_per_program=4, num_warps=4)})]

#: ``ln1024``: LayerNorm 65536 x 1024 alone (where torch.compile led by 0.5-1 us), held with 8-32
#: elements per thread (RMSNorm's rows of 1024 run best at 16: ``_RMS_ROWS_1024_ELEMENTS_PER_THREAD``),
#: and read twice with several rows per program, against its default (eight rows of 8 warps, held,
#: 32 elements per thread)
LAYER_NORM_1024_CASES = [("ln", 65536, 1024, {"default": {}} | {
    f"held {rows} rows {warps}w": dict(rows_per_program=rows, num_warps=warps)
    for rows, warps in ((4, 8), (2, 4), (4, 4), (2, 8), (16, 16))} | {
    f"twice {rows} rows {warps}w": dict(read_twice=True, rows_per_program=rows, num_warps=warps)
    for rows, warps in ((2, 2), (4, 4))})]


def main(out_dir, which=""):
    torch.manual_seed(0)
    path = (lambda name: os.path.join(out_dir, name)) if out_dir else (lambda name: "")
    if which in ("residual", "layernorm", "ln1024"):
        cases = {"residual": RESIDUAL_CASES, "layernorm": LAYER_NORM_CASES, "ln1024": LAYER_NORM_1024_CASES}[which]
        check_and_time(row_op_variants(cases), path(f"probe-read-twice-{which}.json"))
        return
    if which == "rows":
        check_and_time(row_op_variants(DECODE_CASES), path("probe-read-twice-decode.json"), graphed=True)
        check_and_time(row_op_variants(THRESHOLD_CASES), path("probe-read-twice-threshold.json"))
        return
    check_and_time(row_op_variants(CASES), path("probe-read-twice-warps.json"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "", sys.argv[2] if len(sys.argv) > 2 else "")
