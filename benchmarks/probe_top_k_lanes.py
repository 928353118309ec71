"""top_k(50) by group maxima (``top_k_lanes_rows``: two launches, one read of the row) against
``top_k_rows`` (the pipeline of six), and the launch choices of the two-launch form, in one
process:

    python benchmarks/probe_top_k_lanes.py OUT_DIR
    ROWS=2,8,32 ONLY=rows,lanes python benchmarks/probe_top_k_lanes.py OUT_DIR   # a subset
    SAMPLE=1 ONLY=rows,lanes python benchmarks/probe_top_k_lanes.py OUT_DIR   # sampling under top-k 50
    SAMPLE=1 TOP_P=0.9 ONLY=rows,lanes python benchmarks/probe_top_k_lanes.py OUT_DIR   # and top-p 0.9

Variants: the finishing program at 4, 8 and 16 warps; the finish as a programmatic dependent
launch or not; its bound over each program's 8 or 16 best candidates; the tokens that reach the
k-th group sorted alone up to 64 or 128 of them; groups of 4, 8 and 16 lanes; candidates per
row cut at 2048 (30 programs of five segments per row at both 1 and 64 rows), 4096 and 8192
(more, shorter programs at one row). Every variant must give the same values and indices as the first
(``top_k_rows``, itself checked against a stable sort by the GPU tier). 151936 logits, the
gpu_sampling inputs (peaked; one flat case), one row and 64. Times: each call replayed from a
CUDA graph (do_bench median, L2 flushed) in three interleaved rounds, then the profiler's kernel
time of each (``kernel_us``: the union of the call's kernels after the same flush), and
torch.topk for scale.
"""
import json
import os
import sys

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops
from treefold.bench.timing import kernel_us

from gpu_sampling import FLAT, graphed, logits
from probe_report import time_graphed_variants, with_values

K = 50
VARIANTS = {  # name -> the ops module's settings (None: top_k_rows)
    "rows": None,
    "lanes": {},
    "nodep": {"TOP_K_LANES_DEPENDENT_LAUNCH": False},
    "w4": {"TOP_K_LANES_FINISH_WARPS": 4},
    "w16": {"TOP_K_LANES_FINISH_WARPS": 16},
    "head8": {"TOP_K_LANES_HEAD": 8},
    "kept64": {"TOP_K_LANES_KEPT": 64},
    "g4": {"TOP_K_LANES_GROUP": 4},
    "g16": {"TOP_K_LANES_GROUP": 16},
    "c4096": {"TOP_K_LANES_CANDIDATES": 4096},
    "c8192": {"TOP_K_LANES_CANDIDATES": 8192},
}
#: (rows, dtype, kind): kind "peaked" and "flat" are gpu_sampling's inputs, "ties" the peaked
#: ones rounded to whole numbers (thousands of equal logits: the tokens that reach the k-th
#: group outnumber TOP_K_LANES_KEPT and the finish sorts all it gathered)
#: SAMPLE=1: time sampling under top-k 50 instead (``sample_rows`` against ``sample_top_k_lanes_rows``)
SAMPLE = os.environ.get("SAMPLE") == "1"
#: TOP_P=p (with SAMPLE=1): top-p p inside the top k as well
TOP_P = float(os.environ["TOP_P"]) if os.environ.get("TOP_P") else None
CASES = ((1, torch.float32, "peaked"), (1, torch.bfloat16, "peaked"), (64, torch.float32, "peaked"),
         (64, torch.bfloat16, "peaked"), (64, torch.float32, "flat"), (64, torch.float32, "ties"))


def table() -> dict:
    out = {}
    cases = CASES
    if os.environ.get("ROWS"):  # ROWS=2,4,...: those row counts, peaked, both dtypes
        cases = [(int(r), dtype, "peaked") for r in os.environ["ROWS"].split(",")
                 for dtype in (torch.float32, torch.bfloat16)]
    names = os.environ.get("ONLY", "").split(",") if os.environ.get("ONLY") else list(VARIANTS) + ["torch.topk"]
    for batch, dtype, kind in cases:
        x = logits(batch, dtype, **({"scale": FLAT} if kind == "flat" else {}))
        if kind == "ties":
            x = x.round()
        key = (f"{batch} {str(dtype)[6:]} {kind}",)
        calls = {}
        seeds = torch.arange(batch, device="cuda", dtype=torch.int64) * 7919 + 1
        for name, values in VARIANTS.items():
            if name not in names:
                continue
            if SAMPLE:  # sampling under top-k 50 at temperature 1: the pipeline or the race of the lanes' top k
                if values is None:
                    calls[name] = (lambda x=x, s=seeds: (ops.sample_rows(x, 1.0, K, TOP_P, None, s, 3),))
                else:
                    calls[name] = with_values(ops, values, lambda x=x, s=seeds: (
                        ops.sample_top_k_lanes_rows(x, 1.0, K, TOP_P, None, s, 3),))
            elif values is None:
                calls[name] = (lambda x=x: ops.top_k_rows(x, K))
            else:
                calls[name] = with_values(ops, values, lambda x=x: ops.top_k_lanes_rows(x, K))
        if SAMPLE:
            out[key] = calls
            continue
        if "treefold.top_k" in names:  # the public call: the rule's choice, prepared after its first call
            calls["treefold.top_k"] = lambda x=x: treefold.top_k(x, K)
        if "torch.topk" in names:
            calls["torch.topk"] = lambda x=x: torch.topk(x, K)
        out[key] = calls
    return out


def main(out_dir: str) -> None:
    cases = table()
    # (torch.topk orders ties its own way: its check against top_k_rows may fail on bf16)
    times = time_graphed_variants(cases, os.path.join(out_dir, "top-k-lanes-graph.json"), 3)
    kernel = {}
    for key, calls in cases.items():
        for name, fn in calls.items():
            kernel[f"{key[0]} | {name}"] = kernel_us(graphed(fn))
    print("best of 3 graph rounds / kernel us:  " + " | ".join(next(iter(cases.values()))))
    for key, calls in cases.items():
        print(f"{key[0]:16s} " + "  ".join(
            f"{min(times[(key, n)]):5.1f}/{kernel[f'{key[0]} | {n}'] or float('nan'):5.1f}" for n in calls))
    with open(os.path.join(out_dir, "top-k-lanes-kernel.json"), "w") as f:
        json.dump(kernel, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
