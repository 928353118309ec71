"""Reductions on the GPU: correctness, determinism and speed of treefold's sums, argmax, row sums.

Run on a CUDA machine from the repository root:

    python benchmarks/gpu_reductions.py          # OUT=dir also writes dir/reductions.json

For every shape of issue 5 (fp32 sums of 2^26 and 2^28, bf16 sum of 2^28, accurate=True at
2^28, argmax of 2^28, row sums of 8192 x 4096 bf16) it first checks the default launch against
the CPU reference (bits), runs it 20 times (one distinct value expected), and checks that every
launch variant gives the same bits; then it times them all with triton.testing.do_bench (median,
L2 flushed) next to torch eager, CUB through cupy.sum / cupy.argmax (when cupy is installed) and
torch.compile (row sums), against the roof measured in the same run (a 2 GiB device-to-device
copy, bytes read + written). A failing variant is reported and skipped. The short table is
printed last; the full record goes to $OUT/reductions.json.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from fractions import Fraction

os.environ.setdefault("CUPY_ACCELERATORS", "cub")  # CUB for cupy's full reductions

import torch  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import treefold as tf  # noqa: E402
from treefold import order  # noqa: E402
from treefold._ops import reduce as ops  # noqa: E402
from treefold._ops.reduce import ExtremeTuning, SumTuning, extreme_rows, tree_sum_rows  # noqa: E402
from treefold.reference import reductions as ref  # noqa: E402

try:
    import cupy
except Exception as exc:  # noqa: BLE001 - an optional peer
    cupy = None
    CUPY_NOTE = f"cupy not available ({type(exc).__name__}: {exc}); CUB peer skipped"
else:
    CUPY_NOTE = f"cupy {cupy.__version__}, accelerators {os.environ.get('CUPY_ACCELERATORS')}"

#: Where the tensors live (the script is meant for "cuda"; the CPU only serves smoke tests of it).
DEVICE = "cuda"
#: The issue's sizes: fp32 sums, the 2^28 cases (bf16 sum, accurate, argmax), the row sums, and
#: the float32 elements copied for the roof.
SUM_SIZES = (1 << 26, 1 << 28)
BIG = 1 << 28
ROW_SHAPE = (8192, 4096)
ROOF_ELEMENTS = 1 << 28
ROWS: list[dict] = []
CHECKS: list[dict] = []
START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def bench(fn) -> float:
    """Median seconds per call, L2 flushed before each (do_bench's default)."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def bits(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    if t.dtype.is_floating_point:
        t = t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t.numpy().tobytes()


def check(name: str, ok: bool, detail: str = "") -> bool:
    CHECKS.append({"check": name, "ok": bool(ok), "detail": detail})
    log(f"{'PASS' if ok else 'FAIL'} {name} {detail}")
    return ok


def roof() -> float:
    a = torch.empty(ROOF_ELEMENTS, dtype=torch.float32, device=DEVICE)
    b = torch.empty_like(a)
    t = bench(lambda: b.copy_(a))
    del a, b
    return 2 * ROOF_ELEMENTS * 4 / t / 1e9


def record(op: str, shape: str, strategy: str, fn, nbytes: int, baseline: bool = False) -> dict | None:
    """Time one variant (failures are recorded and skipped); ``baseline``: torch eager."""
    try:
        t = bench(fn)
    except Exception as exc:  # noqa: BLE001 - report and continue
        ROWS.append({"op": op, "shape": shape, "strategy": strategy, "error": f"{type(exc).__name__}: {exc}"})
        log(f"FAILED timing {op} {shape} {strategy}: {exc}")
        return None
    row = {"op": op, "shape": shape, "strategy": strategy, "us": t * 1e6, "gbs": nbytes / t / 1e9,
           "baseline": baseline, "note": ""}
    ROWS.append(row)
    log(f"{op} {shape} {strategy}: {t * 1e6:.1f} us, {row['gbs']:.0f} GB/s")
    return row


def variants_same_bits(op: str, shape: str, want: bytes, variants: dict) -> dict:
    """Run each variant once; keep those giving the default's bits (others are reported)."""
    kept = {}
    for name, fn in variants.items():
        try:
            got = bits(fn())
        except Exception as exc:  # noqa: BLE001
            check(f"{op} {shape} {name} runs", False, f"{type(exc).__name__}: {exc}")
            traceback.print_exc()
            continue
        if check(f"{op} {shape} {name} same bits as the default", got == want):
            kept[name] = fn
    return kept


def timed_variants(op: str, shape: str, runs: dict, nbytes: int) -> None:
    """Time every variant. The first timing after the checks (host-bound loops with copies to
    the CPU) ran up to 2x slow on short kernels while the GPU clocks came back up, so one
    untimed do_bench of the first variant comes first."""
    if runs:
        bench(next(iter(runs.values())))
    for name, fn in runs.items():
        record(op, shape, name, fn, nbytes)


def deterministic(op: str, shape: str, fn) -> None:
    values = {bits(fn()) for _ in range(20)}
    check(f"{op} {shape} 20 runs", len(values) == 1, f"{len(values)} distinct value(s)")


def plan_text(levels) -> list[str]:
    return [f"n={lv.n} grid={lv.grid} warps={lv.num_warps} finish={lv.finish} nodes={lv.node_segments}x{lv.node_stride}"
            for lv in levels]


# ---- the shapes -----------------------------------------------------------------------------

def sum_case(n: int, dtype: torch.dtype, gen: torch.Generator, variants: dict) -> None:
    op, shape = f"sum {str(dtype).replace('torch.', '')}", f"2^{n.bit_length() - 1}"
    x = torch.rand(n, device=DEVICE, generator=gen, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
    x2 = x.view(1, n)
    nbytes = n * x.element_size() + 4
    default = lambda: tf.sum(x, dtype=torch.float32)  # noqa: E731
    want = bits(default())
    check(f"{op} {shape} default == CPU reference", want == bits(torch.tensor(ref.reference_sum_chunked(x))))
    deterministic(op, shape, default)
    runs = {"default (treefold.sum)": default}
    runs.update({name: (lambda t=t: tree_sum_rows(x2, tuning=t)[0]) for name, t in variants.items()})
    timed_variants(op, shape, variants_same_bits(op, shape, want, runs), nbytes)
    record(op, shape, "torch.sum", lambda: torch.sum(x), nbytes, baseline=True)
    if cupy is not None and dtype == torch.float32:
        xc = cupy.asarray(x)
        record(op, shape, "cupy.sum (CUB)", lambda: cupy.sum(xc), nbytes)
    ROWS.append({"op": op, "shape": shape, "plan": plan_text(ops.plan_sum(n, 1, dtype, 4, SumTuning(), False, True))})


def accurate_case(n: int, gen: torch.Generator, variants: dict) -> None:
    op, shape = "sum accurate fp32", f"2^{n.bit_length() - 1}"
    x = torch.rand(n, device=DEVICE, generator=gen)
    x2 = x.view(1, n)
    nbytes = n * 4 + 4
    scaled = x * float(1 << 24)
    if bool((scaled == scaled.floor()).all()):
        # torch.rand gives multiples of 2^-24: the exact sum is an int64 sum, on the GPU
        exact = Fraction(int(scaled.to(torch.int64).sum().item()), 1 << 24)
    else:
        exact = ref.exact_sum(x.cpu())
    nearest = ref.round_to_float32(exact)
    default = lambda: tf.sum(x, accurate=True)  # noqa: E731
    want = bits(default())
    check(f"{op} {shape} == float32 nearest the exact sum", want == bits(torch.tensor(nearest)),
          f"exact {float(exact)!r}, nearest {float(nearest)!r}, plain float32 sum {float(tf.sum(x))!r}")
    deterministic(op, shape, default)
    runs = {f"default (treefold.sum, exact_groups={ops.ACCURATE_EXACT_GROUPS})": default}
    runs.update({name: (lambda kw=kw: tree_sum_rows(x2, accurate=True, **kw)[0]) for name, kw in variants.items()})
    timed_variants(op, shape, variants_same_bits(op, shape, want, runs), nbytes)
    record(op, shape, "torch.sum (float64)", lambda: torch.sum(x, dtype=torch.float64), nbytes, baseline=True)


def argmax_case(n: int, gen: torch.Generator, variants: dict) -> None:
    op, shape = "argmax fp32", f"2^{n.bit_length() - 1}"
    x = torch.randn(n, device=DEVICE, generator=gen)
    x[n // 3] = x.max() + 1  # a known maximum
    x[n - 7] = x[n // 3]     # and a tie after it
    nbytes = n * 4 + 8
    default = lambda: tf.argmax(x)  # noqa: E731
    idx = int(default())
    check(f"{op} {shape} == torch.argmax (first of the tie)", idx == int(torch.argmax(x)) == n // 3, f"{idx}")
    deterministic(op, shape, default)
    runs = {"default (treefold.argmax)": default}
    runs.update({name: (lambda t=t: extreme_rows(x.view(1, n), True, tuning=t)[1][0]) for name, t in variants.items()})
    timed_variants(op, shape, variants_same_bits(op, shape, bits(default()), runs), nbytes)
    record(op, shape, "torch.argmax", lambda: torch.argmax(x), nbytes, baseline=True)
    if cupy is not None:
        xc = cupy.asarray(x)
        record(op, shape, "cupy.argmax (CUB)", lambda: cupy.argmax(xc), nbytes)
    ROWS.append({"op": op, "shape": shape, "plan": [str(lv) for lv in ops.plan_extreme(n, 1, ExtremeTuning())]})


def rows_case(rows: int, n: int, gen: torch.Generator, variants: dict) -> None:
    op, shape = "rowsum bf16", f"{rows}x{n}"
    x = torch.randn(rows, n, device=DEVICE, generator=gen).to(torch.bfloat16)
    nbytes = rows * n * 2 + rows * 2
    default = lambda: tf.sum(x, dim=-1)  # noqa: E731
    want = bits(default())
    cpu = torch.from_numpy(order.reference_sum(x.cpu())).to(torch.bfloat16)
    check(f"{op} {shape} default == CPU reference", want == bits(cpu))
    deterministic(op, shape, default)
    runs = {"default (treefold.sum)": default}
    runs.update({name: (lambda t=t: tree_sum_rows(x, tuning=t, out_dtype=torch.bfloat16))
                 for name, t in variants.items()})
    timed_variants(op, shape, variants_same_bits(op, shape, want, runs), nbytes)
    record(op, shape, "torch x.sum(-1)", lambda: x.sum(dim=-1), nbytes, baseline=True)
    try:
        compiled = torch.compile(lambda t: t.sum(dim=-1))
        compiled(x)
        record(op, shape, "torch.compile x.sum(-1)", lambda: compiled(x), nbytes)
    except Exception as exc:  # noqa: BLE001
        log(f"torch.compile skipped: {exc}")
    ROWS.append({"op": op, "shape": shape, "plan": plan_text(ops.plan_sum(n, rows, torch.bfloat16, 4, SumTuning()))})


# Defaults (the heuristics in treefold._ops.reduce): whole-tensor sums compute tree nodes at the
# first level (about NODE_PROGRAMS programs, one warp per 4096-lane segment), finished by a
# dependent launch; rows: one warp per 4096-lane segment, one segment per program.
SUM_VARIANTS = {
    "segments (no nodes)": SumTuning(node_stride=0),
    "no dependent launch": SumTuning(dependent_launch=False),
    "P256": SumTuning(node_stride=256), "P1024": SumTuning(node_stride=1024),
}
BF16_VARIANTS = {
    "segments (no nodes)": SumTuning(node_stride=0),
    "P256 w4": SumTuning(node_stride=256, num_warps=4),
}
ACCURATE_VARIANTS = {
    "exact groups": {"exact_groups": True},
    "segments (no nodes)": {"tuning": SumTuning(node_stride=0)},
    "P128 w4": {"tuning": SumTuning(node_stride=128, num_warps=4)},
    "P128 w1": {"tuning": SumTuning(node_stride=128, num_warps=1)},
}
ARGMAX_VARIANTS = {
    "lanes1024 w2 (before)": ExtremeTuning(lanes=1024, num_warps=2, tiles=32),
    "w8": ExtremeTuning(num_warps=8),
}
ROW_VARIANTS = {
    "w4": SumTuning(num_warps=4),
    "rpp2 w2": SumTuning(rows_per_program=2, num_warps=2),
    "no evict_first": SumTuning(evict_first=False),
}
EXTREME_ROW_VARIANTS = {
    "lanes1024 tiles32 w2 (before)": ExtremeTuning(lanes=1024, tiles=32, num_warps=2),
    "tiles2": ExtremeTuning(tiles=2), "tiles8": ExtremeTuning(tiles=8), "w8": ExtremeTuning(num_warps=8),
}


def extreme_rows_case(rows: int, n: int, dtype: torch.dtype, want_index: bool, gen: torch.Generator,
                      variants: dict) -> None:
    """Row max (or argmax) against torch: values or indices equal, then every variant timed."""
    op = f"{'argmax' if want_index else 'amax'} rows {str(dtype).replace('torch.', '')}"
    shape = f"{rows}x{n}"
    x = torch.randn(rows, n, device=DEVICE, generator=gen).to(dtype)
    nbytes = rows * n * x.element_size() + rows * (8 if want_index else x.element_size())
    pick = 1 if want_index else 0
    default = (lambda: tf.argmax(x, dim=-1)) if want_index else (lambda: tf.amax(x, dim=-1))  # noqa: E731
    want = bits(default())
    theirs = torch.argmax(x, -1) if want_index else torch.amax(x, -1)
    check(f"{op} {shape} == torch", want == bits(theirs))
    deterministic(op, shape, default)
    runs = {"default": default}
    runs.update({name: (lambda t=t: extreme_rows(x, True, tuning=t)[pick]) for name, t in variants.items()})
    timed_variants(op, shape, variants_same_bits(op, shape, want, runs), nbytes)
    record(op, shape, "torch", (lambda: torch.argmax(x, -1)) if want_index else (lambda: torch.amax(x, -1)),
           nbytes, baseline=True)
    ROWS.append({"op": op, "shape": shape, "plan": [str(lv) for lv in ops.plan_extreme(n, rows, ExtremeTuning())]})


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_reductions: needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    gen = torch.Generator(device=DEVICE).manual_seed(20261130)
    dev = torch.cuda.get_device_name()
    log(f"{dev}; torch {torch.__version__}, triton {triton.__version__}; {CUPY_NOTE}")
    roof_gbs = roof()
    log(f"roof (2 GiB copy, read + write): {roof_gbs:.0f} GB/s")
    cases = [(f"sum fp32 {n}", lambda n=n: sum_case(n, torch.float32, gen, SUM_VARIANTS)) for n in SUM_SIZES]
    cases += [
        ("sum bf16", lambda: sum_case(BIG, torch.bfloat16, gen, BF16_VARIANTS)),
        ("accurate", lambda: accurate_case(BIG, gen, ACCURATE_VARIANTS)),
        ("argmax", lambda: argmax_case(BIG, gen, ARGMAX_VARIANTS)),
        ("row sums", lambda: rows_case(*ROW_SHAPE, gen, ROW_VARIANTS)),
        ("amax rows", lambda: extreme_rows_case(*ROW_SHAPE, torch.bfloat16, False, gen, EXTREME_ROW_VARIANTS)),
        ("argmax rows 64", lambda: extreme_rows_case(64, 151936, torch.float32, True, gen, EXTREME_ROW_VARIANTS)),
        ("argmax rows 1", lambda: extreme_rows_case(1, 151936, torch.float32, True, gen, EXTREME_ROW_VARIANTS)),
    ]
    for name, run in cases:
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - a failing case must not stop the others
            check(f"{name} case", False, f"{type(exc).__name__}: {exc}")
            traceback.print_exc()
        torch.cuda.empty_cache()

    timed = [r for r in ROWS if "us" in r]
    torch_us = {(r["op"], r["shape"]): r["us"] for r in timed if r["baseline"]}
    default_fp32 = {r["shape"]: r["us"] for r in timed
                    if r["op"] == "sum float32" and r["strategy"].startswith("default")}
    for r in timed:
        r["pct_roof"] = 100 * r["gbs"] / roof_gbs
        base = torch_us.get((r["op"], r["shape"]))
        r["vs_torch"] = base / r["us"] if base else None
        if r["op"] == "sum accurate fp32" and r["shape"] in default_fp32 and not r["baseline"]:
            r["note"] = f"{r['us'] / default_fp32[r['shape']]:.3f}x the default fp32 sum"
    failed = [c for c in CHECKS if not c["ok"]]
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "reductions.json")
        with open(path, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "triton": triton.__version__, "peers": CUPY_NOTE,
                       "roof_gbs": roof_gbs, "checks": CHECKS, "rows": ROWS,
                       "accurate_exact_groups": ops.ACCURATE_EXACT_GROUPS}, f, indent=1)
        log(f"wrote {path}")

    print(f"\nroof {roof_gbs:.0f} GB/s ({dev}); checks: {len(CHECKS) - len(failed)} passed, {len(failed)} failed")
    for c in failed:
        print(f"  FAILED {c['check']} {c['detail']}")
    print(f"{'op':18} {'shape':10} {'strategy':46} {'us':>8} {'GB/s':>6} {'%roof':>6} {'vs torch':>8}  note")
    for r in ROWS:
        if "error" in r:
            print(f"{r['op']:18} {r['shape']:10} {r['strategy'][:46]:46} error: {r['error'][:60]}")
        elif "us" in r:
            vs = f"{r['vs_torch']:.2f}x" if r["vs_torch"] else "-"
            print(f"{r['op']:18} {r['shape']:10} {r['strategy'][:46]:46} {r['us']:8.1f} {r['gbs']:6.0f} "
                  f"{r['pct_roof']:6.1f} {vs:>8}  {r.get('note', '')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
