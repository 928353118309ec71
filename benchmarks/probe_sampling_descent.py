"""Sampling under top-p and min-p by descent (``sample_descent_rows``: a race over the row, rounds
that keep its winner or race the tokens before it, a finishing program per row) against the
pipeline (``sample_rows``: five launches, six with the pre-list), timed in the same process:

    python benchmarks/probe_sampling_descent.py OUT_DIR

Case by case: a check (for every filter, 32 offsets, i.e. 32 different draws per row, the
descent's tokens at 1, 2 and 3 rounds as launches, at one program per row and with the rounds
in one launch against the pipeline's;
mismatches are counted), then each call replayed from a CUDA graph (do_bench median, L2 flushed)
in three interleaved rounds, and the profiler's kernel time of each (``kernel_us``), at each of
TIMED_OFFSETS (different draws), reported as means over them. 151936 logits, gpu_sampling's
inputs (peaked; flat), one row and 64, float32 and bfloat16. Writes OUT_DIR/sampling-descent.json.
QUICK=1: 8 offsets in the check, two timed, and only the pipeline and the default descent (in
the check too). ONLY_CASES="0,1" (indices into CASES) and ONLY_FILTERS="top-p 0.9,min-p 0.05"
narrow the run; LISTED=1, FINISH=1, LOOP=1, FORMS=1 or RACE_IN_LOOP=1 check and time other launch choices instead (see
VARIANTS); ROWS="2,8,32" replaces the cases with those batch sizes (float32 and bfloat16 peaked,
float32 flat), TIMED="0,3,4" the timed offsets. Before
anything is timed, the calls are compiled into Triton's cache by one process per plan (rows,
dtype) and filter, several at once (a process with WARM=1 makes each of its calls once and
exits): on a fresh machine, one process compiling a case's kernels took more than five minutes.
PARALLEL=0 compiles in the timed process instead.
"""
import json
import os
import subprocess
import sys
import time

import torch

import treefold  # noqa: F401  (the tree on PYTHONPATH)
from treefold._ops import sampling as ops
from treefold.bench.timing import kernel_us

from gpu_sampling import FLAT, graphed, logits
from probe_report import time_graphed_variants

FILTERS = {  # name -> (temperature, top_p, min_p)
    "top-p 0.9": (1.0, 0.9, None),
    "top-p 0.5": (1.0, 0.5, None),
    "min-p 0.05": (1.0, None, 0.05),
    "top-p 0.9 + min-p 0.05": (1.0, 0.9, 0.05),
    "t 0.7 top-p 0.95": (0.7, 0.95, None),
    "top-p 0.1": (1.0, 0.1, None),
    "top-p per row": (1.0, "rows", None),  # rows' p spread over [0.05, 1] (one row: 0.05)
}
QUICK = os.environ.get("QUICK") == "1"
#: Offsets timed, each its own graph: different draws per row, so that the times average over
#: rows that end early and rows that need the finishing passes (descent_steps.py: under top-p 0.9
#: about one 64-row call in three holds such a row).
TIMED_OFFSETS = (3, 4) if QUICK else (3, 4, 5, 6)
if os.environ.get("TIMED"):
    TIMED_OFFSETS = tuple(int(o) for o in os.environ["TIMED"].split(","))
CASES = ((64, torch.float32, "peaked"), (1, torch.float32, "peaked"), (64, torch.float32, "flat"),
         (64, torch.bfloat16, "peaked"), (1, torch.bfloat16, "peaked"), (1, torch.float32, "flat"),
         (64, torch.float32, "medium"))
if os.environ.get("ROWS"):  # where the two meet: these batch sizes, fp32 and bf16 peaked, fp32 flat
    CASES = tuple((int(rows), dtype, kind) for rows in os.environ["ROWS"].split(",")
                  for dtype, kind in ((torch.float32, "peaked"), (torch.bfloat16, "peaked"), (torch.float32, "flat")))
ALL_CASES = CASES
if os.environ.get("ONLY_CASES"):
    CASES = tuple(CASES[int(i)] for i in os.environ["ONLY_CASES"].split(","))
if os.environ.get("ONLY_FILTERS"):
    FILTERS = {name: FILTERS[name] for name in os.environ["ONLY_FILTERS"].split(",")}
WARM = os.environ.get("WARM") == "1"
#: The descent's launch choices the check compares with the pipeline.
CHECKED = ({},) if QUICK else (dict(rounds=1, loop=False), dict(rounds=2, loop=False), dict(rounds=3, loop=False),
                                dict(programs_per_row=1), dict(loop=True))
#: Launch choices checked and timed against the pipeline instead of the default descent, by the
#: environment: LISTED=1 the descent from the pre-list (``listed=True``), its rounds on
#: DESCENT_LISTED_PROGRAMS_PER_ROW programs per row and on the histogram's grid; FINISH=1 the
#: descent as ``sample`` takes it (over the row up to 16 rows, from the pre-list from 17) with its
#: finishing program's segments of 1024 (the rounds'), 2048 and 4096 tokens; LOOP=1 the same with
#: its rounds after round 0 as launches and in one launch (``loop=True``); FORMS=1 the descent
#: over the row in launches and in the loop, and the loop from the pre-list; RACE_IN_LOOP=1 the
#: loop from the pre-list with round 0 in a launch of its own and in the loop's launch, and there
#: with each program's first segment of the list held (registers capped at 168 and 128).
MODES = {
    "LISTED": {"listed": dict(listed=True), "listed grid": dict(listed=True, descent_programs_per_row=0)},
    "FINISH": {"finish 1024": dict(finish_width=0, loop=False), "finish 2048": dict(finish_width=2048, loop=False),
               "finish 4096": dict(finish_width=4096, loop=False)},
    "LOOP": {"launches": dict(loop=False), "loop": dict(loop=True)},
    "FORMS": {"row": dict(listed=False, loop=False), "row loop": dict(listed=False, loop=True),
              "listed loop": dict(listed=True, loop=True)},
    "RACE_IN_LOOP": {"listed loop": dict(listed=True, loop=True, race_in_loop=False),
                     "race in loop": dict(listed=True, loop=True, race_in_loop=True),
                     "held 168": dict(listed=True, loop=True, race_in_loop=True, hold_share=True),
                     "held 128": dict(listed=True, loop=True, race_in_loop=True, hold_share=True, max_registers=128)},
}
VARIANTS = next((variants for mode, variants in MODES.items() if os.environ.get(mode) == "1"), None)
if VARIANTS:
    CHECKED = tuple(VARIANTS.values())
#: Offsets checked.
CHECK_OFFSETS = range(2, 10) if QUICK else range(32)
#: What a WARM process calls with: one offset (the kernels do not specialise on it, so one
#: compiled kernel serves every offset).
WARM_OFFSETS = TIMED_OFFSETS[:1]


#: Standard deviations of the logits other than gpu_sampling's peaked 4: "medium" rows have pre-lists
#: of about 20000 tokens, "flat" rows too many for theirs.
SCALES = {"medium": 3.0, "flat": FLAT}


def inputs(batch: int, dtype: torch.dtype, kind: str) -> tuple:
    """(logits, per-row seeds) of a case."""
    x = logits(batch, dtype, **({"scale": SCALES[kind]} if kind in SCALES else {}))
    return x, torch.arange(batch, device="cuda", dtype=torch.int64) * 7919 + 1


def top_p_of(p, batch: int):
    """A filter's top-p: the scalar, or for "rows" a tensor spread over [0.05, 1] (a single row
    takes 0.05, the hardest)."""
    return torch.linspace(0.05, 1.0, batch, device="cuda") if p == "rows" else p


def check(batch: int, dtype: torch.dtype, kind: str) -> dict:
    """{case and filter: rows whose descent token differs from the pipeline's, over the offsets
    and the launch choices CHECKED}."""
    x, seeds = inputs(batch, dtype, kind)
    bad = {}
    for name, (t, p, mp) in FILTERS.items():
        p = top_p_of(p, batch)
        wrong = 0
        for offset in WARM_OFFSETS if WARM else CHECK_OFFSETS:
            want = ops.sample_rows(x, t, None, p, mp, seeds, offset)
            for kw in CHECKED:
                got = ops.sample_descent_rows(x, t, p, mp, seeds, offset, **kw)
                wrong += int((got != want).sum())
        bad[f"{batch} {str(dtype)[6:]} {kind} {name}"] = wrong
    return bad


def table(batch: int, dtype: torch.dtype, kind: str) -> dict:
    """{(case and filter, offset): {variant: call}} of one case (flat rows: three filters)."""
    x, seeds = inputs(batch, dtype, kind)
    out = {}
    variants = {"pipeline": None, "descent": {}}
    if VARIANTS:
        variants = {"pipeline": None, **VARIANTS}
    elif not QUICK:
        variants.update({"descent r1": dict(rounds=1, loop=False), "descent r3": dict(rounds=3, loop=False)})
    for name, (t, p, mp) in FILTERS.items():
        if kind == "flat" and name not in ("top-p 0.9", "min-p 0.05", "top-p per row"):
            continue
        p = top_p_of(p, batch)
        for offset in TIMED_OFFSETS:
            out[(f"{batch} {str(dtype)[6:]} {kind} {name}", offset)] = {
                variant: call(x, seeds, t, p, mp, offset, kw) for variant, kw in variants.items()}
    return out


def call(x, seeds, t, p, mp, offset, kw):
    """The pipeline's call (kw None), or the descent's with launch choices kw."""
    if kw is None:
        return lambda: (ops.sample_rows(x, t, None, p, mp, seeds, offset),)
    return lambda: (ops.sample_descent_rows(x, t, p, mp, seeds, offset, **kw),)


def line(key: str, row: dict) -> str:
    return f"{key:42s} " + "  ".join(
        f"{name} {r['graph_us']:6.1f}/{r['kernel_us']:6.1f} (<= {r['graph_max_us']:6.1f})"
        for name, r in row.items() if name != "mismatches") + f"  mismatches {row['mismatches']}"


def compile_in_parallel(out_dir: str) -> None:
    """Every call of the run made once by WARM=1 processes, one per plan (rows and dtype: peaked
    and flat rows share their kernels) and filter, as many at once as the host has cores; each
    process's output in out_dir/compile-<case>-<n>.txt."""
    started = time.time()
    plans = {}
    for case in CASES:
        plans.setdefault(case[:2], ALL_CASES.index(case))
    jobs = [(index, name) for index in plans.values() for name in FILTERS]
    procs = []
    for n, (index, name) in enumerate(jobs):
        while sum(proc.poll() is None for proc, _ in procs) >= (os.cpu_count() or 2):
            time.sleep(0.2)
        env = dict(os.environ, WARM="1", ONLY_CASES=str(index), ONLY_FILTERS=name)
        with open(os.path.join(out_dir, f"compile-{index}-{n}.txt"), "w") as log:
            procs.append((subprocess.Popen([sys.executable, os.path.abspath(__file__), os.path.join(out_dir, "compile")],
                                           env=env, stdout=log, stderr=subprocess.STDOUT), (index, name)))
    failed = [job for proc, job in procs if proc.wait() != 0]
    print(f"compiled {len(jobs)} (plan, filter) pairs in {time.time() - started:.0f} s"
          + (f"; failed (see compile-*.txt): {failed}" if failed else ""), flush=True)


def main(out_dir: str) -> None:
    """Case by case (the most telling first), so that a call cut short keeps what it measured:
    check, time, print a line per filter and rewrite the JSON."""
    os.makedirs(out_dir, exist_ok=True)
    if not WARM and os.environ.get("PARALLEL", "1") != "0":
        compile_in_parallel(out_dir)
    results, raw = {}, {}
    for case in CASES:
        bad = check(*case)
        if WARM:
            torch.cuda.synchronize()
            print(f"compiled {case}", flush=True)
            continue
        cases = table(*case)
        times = time_graphed_variants(cases, "", 3)
        kernel = {(key, name): kernel_us(graphed(fn)) or float("nan")
                  for key, calls in cases.items() for name, fn in calls.items()}
        raw.update({f"{key[0]} | {key[1]} | {name}": {"graph_us": times[(key, name)], "kernel_us": kernel[(key, name)]}
                    for key, calls in cases.items() for name in calls})
        for name_key in dict.fromkeys(key[0] for key in cases):
            keys = [key for key in cases if key[0] == name_key]
            row = {}
            for name in cases[keys[0]]:
                best = [min(times[(key, name)]) for key in keys]
                row[name] = {"graph_us": sum(best) / len(best), "graph_max_us": max(best),
                             "kernel_us": sum(kernel[(key, name)] for key in keys) / len(keys)}
            row["mismatches"] = bad[name_key]
            results[name_key] = row
            print(line(name_key, row), flush=True)
        with open(os.path.join(out_dir, "sampling-descent.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "offsets": TIMED_OFFSETS, "results": results,
                       "per_offset": raw}, f, indent=1)
    if WARM:
        return
    print(f"\ngraph us / kernel us: means over offsets {TIMED_OFFSETS} (different draws; each the best of 3 "
          "rounds), (<= the slowest offset's graph us); mismatches: rows whose descent token differs from "
          "the pipeline's (check offsets x the launch choices checked)")
    for key, row in results.items():
        print(line(key, row))


if __name__ == "__main__":
    main(sys.argv[1])
