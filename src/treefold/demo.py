"""``treefold demo``: the numerics experiments behind treefold, measured on this machine.

1. Summing 2^26 uniform [0, 1) float32 values: a serial float32 loop stops at 2^24 while the
   treefold order lands within a few ulps of the exact sum (both against a float64 sum).
2. Summing 0.1 ten thousand times with a bfloat16 accumulator (stuck), a float32 one, and Kahan's
   and Neumaier's compensated sums with bfloat16 storage.
3. Row variances of 1,024 x 4,096 float32 values at offset 10,000 (std 1): E[x^2] - E[x]^2 goes
   negative (its square root NaN) on many rows; Welford and two-pass do not.
4. A naive softmax of [1000, 999, 998] overflows to NaN; subtracting the maximum does not.
5. A fully masked row (all -inf): the naive result is NaN, treefold's convention gives zeros.
6. Determinism (needs a GPU): a one-pass sum with atomic adds gives different bits from run to
   run; treefold's tree gives the same bits every time.

Every number in the report is measured when the demo runs. On a machine with a CUDA GPU each
experiment also runs there (torch on CUDA and treefold's compiled kernels) and the report shows
both. ``--json PATH`` writes every number; non-finite values are written as the strings
"NaN", "Infinity" and "-Infinity" so the file is strict JSON. ``--quick`` uses smaller sizes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

from . import __version__, numerics, order
from ._ops.reduce import tree_sum_rows

SEED = 20261130


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one demo run."""

    serial_n: int           # values in the float32 serial-sum experiment
    tenth_count: int        # how many times 0.1 is added
    var_rows: int           # rows of the variance experiment
    var_cols: int           # values per row
    var_offset: float       # mean of every row (std 1)
    determinism_runs: int   # repetitions of the GPU sums


FULL = Sizes(serial_n=1 << 26, tenth_count=10_000, var_rows=1024, var_cols=4096,
             var_offset=10_000.0, determinism_runs=20)
# The serial sum must pass 2^24 to stall, which takes more than 2^25 values of mean 0.5.
QUICK = Sizes(serial_n=5 << 23, tenth_count=10_000, var_rows=64, var_cols=4096,
              var_offset=10_000.0, determinism_runs=20)

_BF16 = next(f for f in numerics.formats() if f.name == "bfloat16")
_FP32 = next(f for f in numerics.formats() if f.name == "float32")


# --------------------------------------------------------------------------------------------
# Progress on stderr
# --------------------------------------------------------------------------------------------

class _Progress:
    """One stderr line per step: its label when it starts, its time when it ends."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr

    @contextmanager
    def step(self, label: str):
        start = time.perf_counter()
        self.stream.write(f"treefold demo: {label} ...")
        self.stream.flush()
        try:
            yield
        except BaseException:
            self.stream.write(" failed\n")
            raise
        self.stream.write(f" {time.perf_counter() - start:.1f} s\n")
        self.stream.flush()


# --------------------------------------------------------------------------------------------
# Sums in the treefold order: the NumPy reference on the CPU, the Triton kernel on CUDA
# --------------------------------------------------------------------------------------------

def _order_row_sums(x: torch.Tensor, *, square: bool = False, kernel: bool) -> torch.Tensor:
    """float32 sums of the rows of a 2-D tensor in the treefold order (x*x with ``square``)."""
    if kernel:
        return tree_sum_rows(x.contiguous(), square=square)
    values = x.float() * x.float() if square else x
    return torch.from_numpy(np.ascontiguousarray(order.reference_sum(values)))


# --------------------------------------------------------------------------------------------
# 1. The float32 serial sum that stops at 2^24
# --------------------------------------------------------------------------------------------

def _sum_entry(value: float, fp64: float, correctly_rounded: float) -> dict:
    spacing = float(np.spacing(np.float32(correctly_rounded)))
    return {"value": value, "rel_err": (value - fp64) / fp64,
            "ulps_from_correctly_rounded": (value - correctly_rounded) / spacing}


def serial_sum_cpu(values: np.ndarray) -> dict:
    """Experiment 1 on the host: serial float32 fold, treefold order, torch.sum, float64 sum."""
    fp64 = float(np.add.reduce(values, dtype=np.float64))
    correctly_rounded = float(np.float32(fp64))
    serial = numerics.sequential_sum(values, torch.float32)
    return {
        "n": int(values.size), "fp64": fp64, "correctly_rounded_fp32": correctly_rounded,
        "serial_spacing": float(np.spacing(np.float32(serial))),
        "cpu": {
            "serial_fp32": _sum_entry(serial, fp64, correctly_rounded),
            "treefold_order": _sum_entry(float(order.reference_sum(values)), fp64, correctly_rounded),
            "torch_sum": _sum_entry(float(torch.from_numpy(values).sum()), fp64, correctly_rounded),
        },
    }


def serial_sum_device(values: torch.Tensor, result: dict, *, kernel: bool = True) -> dict:
    """Experiment 1 on a device: the treefold kernel and torch.sum (a serial loop has no GPU form)."""
    fp64, correctly_rounded = result["fp64"], result["correctly_rounded_fp32"]
    tree = _order_row_sums(values.view(1, -1), kernel=kernel)
    tree_value = float(tree[0])
    cpu_tree = result["cpu"]["treefold_order"]["value"]
    entry = _sum_entry(tree_value, fp64, correctly_rounded)
    entry["same_bits_as_cpu_reference"] = (
        np.float32(tree_value).tobytes() == np.float32(cpu_tree).tobytes())
    return {"treefold_order": entry,
            "torch_sum": _sum_entry(float(values.sum()), fp64, correctly_rounded)}


# --------------------------------------------------------------------------------------------
# 2. Adding 0.1 ten thousand times
# --------------------------------------------------------------------------------------------

def tenth_sum_cpu(count: int) -> dict:
    """Experiment 2 on the host: 0.1 (as bfloat16) added ``count`` times, several accumulators."""
    values = torch.full((count,), 0.1, dtype=torch.bfloat16)
    stored = float(values[0])
    exact = math.fsum(values.to(torch.float64).tolist())
    sequential_bf16 = numerics.sequential_sum(values, torch.bfloat16)
    return {
        "count": count, "stored_value": stored, "exact_sum_of_stored": exact,
        "nearest_bf16_to_exact": _BF16.round(exact),
        "bf16_spacing_at_sequential": _spacing(_BF16, sequential_bf16),
        "cpu": {
            "sequential_bf16": sequential_bf16,
            "sequential_fp32": numerics.sequential_sum(values, torch.float32),
            "kahan_bf16": numerics.kahan_sum(values, torch.bfloat16),
            "neumaier_bf16": numerics.neumaier_sum(values, torch.bfloat16),
            "treefold_order_fp32": float(order.reference_sum(values)),
            "torch_sum_bf16": float(values.sum()),
            "fp32_values_sequential_fp32": numerics.sequential_sum(
                torch.full((count,), 0.1, dtype=torch.float32), torch.float32),
        },
    }


def _spacing(fmt: numerics.FloatFormat, value: float) -> float:
    """Distance from |value| to the next larger number of ``fmt``."""
    if value == 0:
        return fmt.min_subnormal
    exponent = max(math.frexp(abs(value))[1] - 1, fmt.min_exponent)
    return math.ldexp(1.0, exponent - fmt.mantissa_bits)


def tenth_sum_device(count: int, device, *, kernel: bool = True) -> dict:
    """Experiment 2 on a device: torch.sum of the bfloat16 values and the treefold kernel."""
    values = torch.full((count,), 0.1, dtype=torch.bfloat16, device=device)
    return {"treefold_order_fp32": float(_order_row_sums(values.view(1, -1), kernel=kernel)[0]),
            "torch_sum_bf16": float(values.sum())}


# --------------------------------------------------------------------------------------------
# 3. Variance: E[x^2] - E[x]^2 against Welford and two-pass
# --------------------------------------------------------------------------------------------

VARIANCE_METHODS = {
    "naive_treefold": "E[x^2] - E[x]^2, sums in the treefold order",
    "naive_torch": "E[x^2] - E[x]^2, torch.mean",
    "welford_sequential": "Welford, one value at a time",
    "welford_chan_tree": "Welford/Chan merges, pairwise tree",
    "two_pass_treefold": "two-pass: mean, then mean of (x - mean)^2",
    "torch_var": "torch.var(correction=0)",
}


def _chan_merge(count_a, mean_a, m2_a, count_b, mean_b, m2_b):
    """Merge two (count, mean, M2) states (Chan, Golub and LeVeque); count 0 is the identity."""
    count = count_a + count_b
    weight_b = count_b / count.clamp_min(1.0)
    delta = mean_b - mean_a
    return count, mean_a + delta * weight_b, m2_a + m2_b + delta * delta * count_a * weight_b


def _welford_chan_tree(x: torch.Tensor) -> torch.Tensor:
    """Population variance of each row: one (1, x, 0) state per element, merged by a halving
    tree (state j takes state j + width/2, ...), the way a GPU block combines its lanes."""
    rows, n = x.shape
    width = order.next_pow2(n)
    # Zero count, mean and M2 is the merge's identity.
    state = [torch.nn.functional.pad(t, (0, width - n))
             for t in (torch.ones_like(x), x, torch.zeros_like(x))]
    while width > 1:
        width //= 2
        state = _chan_merge(*(t[:, :width] for t in state), *(t[:, width:] for t in state))
    count, _, m2 = state
    return m2[:, 0] / count[:, 0]


def _welford_sequential(x: torch.Tensor) -> torch.Tensor:
    """Population variance of each row by Welford's update, one column at a time, in float32."""
    mean = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    m2 = torch.zeros_like(mean)
    for j in range(x.shape[1]):
        value = x[:, j]
        delta = value - mean
        mean = mean + delta / float(j + 1)
        m2 = m2 + delta * (value - mean)
    return m2 / float(x.shape[1])


def variances(x: torch.Tensor, *, kernel: bool) -> dict[str, torch.Tensor]:
    """Every method's float32 population variance of the rows of ``x`` (float32, 2-D)."""
    n = float(x.shape[1])
    mean = _order_row_sums(x, kernel=kernel) / n
    naive = _order_row_sums(x, square=True, kernel=kernel) / n - mean * mean
    centred = x - mean[:, None]
    return {
        "naive_treefold": naive,
        "naive_torch": (x * x).mean(dim=1) - x.mean(dim=1) ** 2,
        "welford_sequential": _welford_sequential(x),
        "welford_chan_tree": _welford_chan_tree(x),
        "two_pass_treefold": _order_row_sums(centred, square=True, kernel=kernel) / n,
        "torch_var": torch.var(x, dim=1, correction=0),
    }


def variance_data(sizes: Sizes) -> np.ndarray:
    rng = np.random.default_rng(SEED + 3)
    noise = rng.standard_normal((sizes.var_rows, sizes.var_cols), dtype=np.float32)
    return noise + np.float32(sizes.var_offset)


def variance_metrics(estimates: dict[str, torch.Tensor], exact: np.ndarray) -> dict:
    """Negative rows, NaN standard deviations and relative errors against the float64 variance."""
    out = {}
    for name, var in estimates.items():
        v = var.detach().cpu().numpy().astype(np.float64)
        with np.errstate(invalid="ignore"):
            std = np.sqrt(v)
        rel = np.abs(v - exact) / exact
        rel = np.where(np.isnan(rel), np.inf, rel)
        out[name] = {"negative_rows": int((v < 0).sum()), "nan_std_rows": int(np.isnan(std).sum()),
                     "median_rel_err": float(np.median(rel)), "max_rel_err": float(rel.max())}
    return out


# --------------------------------------------------------------------------------------------
# 4 and 5. Softmax: overflow and the fully masked row
# --------------------------------------------------------------------------------------------

SCORES = [1000.0, 999.0, 998.0]
MASKED_ROW = [-math.inf] * 4
PARTLY_MASKED_ROW = [0.0, -math.inf, 1.0, -math.inf]


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def stable_softmax(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def masked_softmax(x: torch.Tensor) -> torch.Tensor:
    """Stable softmax with treefold's convention: a row that is entirely -inf is all zeros.

    The maximum of such a row is -inf, and x - max would be -inf - (-inf) = NaN; using 0 in its
    place makes every exponential exp(-inf) = 0, and a zero denominator yields zeros."""
    m = x.amax(dim=-1, keepdim=True)
    e = torch.exp(x - torch.where(m == -math.inf, torch.zeros_like(m), m))
    s = e.sum(dim=-1, keepdim=True)
    return torch.where(s > 0, e / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(e))


def softmax_results(device) -> dict:
    """Experiments 4 and 5 on one device (float32)."""
    scores = torch.tensor(SCORES, dtype=torch.float32, device=device)
    shifted = scores - scores.max()
    reference = stable_softmax(torch.tensor(SCORES, dtype=torch.float64))
    stable = stable_softmax(scores)
    masked = torch.tensor(MASKED_ROW, dtype=torch.float32, device=device)
    partly = torch.tensor(PARTLY_MASKED_ROW, dtype=torch.float32, device=device)
    return {
        "naive": naive_softmax(scores).tolist(),
        "naive_of_shifted": naive_softmax(shifted).tolist(),
        "stable": stable.tolist(),
        "torch_softmax": torch.softmax(scores, dim=-1).tolist(),
        "stable_vs_fp64": numerics.compare(stable.cpu(), reference, dtype=torch.float32).as_dict(),
        "masked_naive": stable_softmax(masked).tolist(),
        "masked_torch_softmax": torch.softmax(masked, dim=-1).tolist(),
        "masked_convention": masked_softmax(masked).tolist(),
        "partly_masked_convention": masked_softmax(partly).tolist(),
    }


# --------------------------------------------------------------------------------------------
# 6. Determinism: atomic adds against the tree
# --------------------------------------------------------------------------------------------

_ATOMIC_BLOCK = 4096


@triton.jit
def _atomic_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """One-pass sum: each program sums BLOCK values and atomically adds them to ``out_ptr[0]``.

    The programs' additions reach ``out_ptr`` in whatever order they finish, so the rounding
    of the total changes from run to run. Reads n float32 values, one atomic add per program.

    Args:
        x_ptr: float32 values, contiguous.
        out_ptr: one float32, zeroed before the launch.
        n: number of values.
        BLOCK: values per program.
    """
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    block_total = tl.sum(tl.load(x_ptr + offsets, mask=offsets < n, other=0.0), axis=0)
    tl.atomic_add(out_ptr, block_total)


def atomic_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of a contiguous 1-D float32 tensor by one kernel with atomic adds (not deterministic)."""
    out = torch.zeros(1, dtype=torch.float32, device=x.device)
    _atomic_sum_kernel[(triton.cdiv(x.numel(), _ATOMIC_BLOCK),)](x, out, x.numel(), BLOCK=_ATOMIC_BLOCK)
    return out


def _distinct(values: list[float]) -> dict:
    counts = Counter(values)
    return {"distinct": len(counts),
            "values": [{"value": v, "runs": c} for v, c in sorted(counts.items())]}


def determinism(values: torch.Tensor, runs: int, *, kernel: bool = True) -> dict:
    """Experiment 6: ``runs`` repetitions of the atomic sum, treefold's tree and torch.sum."""
    flat = values.contiguous().view(-1)
    return {
        "runs": runs,
        "atomic_add": _distinct([float(atomic_sum(flat)) for _ in range(runs)]),
        "treefold_order": _distinct([float(_order_row_sums(flat.view(1, -1), kernel=kernel)[0])
                                     for _ in range(runs)]),
        "torch_sum": _distinct([float(flat.sum()) for _ in range(runs)]),
    }


# --------------------------------------------------------------------------------------------
# Running everything
# --------------------------------------------------------------------------------------------

def _guarded(results_errors: list, label: str, fn, *args, **kwargs):
    """Run a device column; a failure is recorded and reported, and the demo goes on."""
    try:
        return fn(*args, **kwargs)
    except Exception as error:  # the CPU results stay useful; the failure is shown and counted
        message = f"{type(error).__name__}: {error}"
        results_errors.append(f"{label}: {message}")
        return {"error": message}


def run(sizes: Sizes, *, device: str | None = None, progress: _Progress | None = None) -> dict:
    """Run every experiment; returns the numbers (the report is rendered from them).

    ``device`` is the accelerator to run the device columns on ("cuda" when one is present; None
    for none).
    """
    progress = progress or _Progress()
    errors: list[str] = []
    results: dict = {"meta": _meta(sizes, device), "errors": errors}
    timings = results["meta"]["seconds"]

    start = time.perf_counter()
    with progress.step(f"drawing {sizes.serial_n:,} uniform float32 values"):
        serial_values = np.random.default_rng(SEED).random(sizes.serial_n, dtype=np.float32)
    with progress.step("summing them serially, in the treefold order and in float64"):
        serial = serial_sum_cpu(serial_values)
    serial["cuda"] = None
    device_values = None
    if device:
        def serial_on_device():
            nonlocal device_values
            device_values = torch.from_numpy(serial_values).to(device)
            return serial_sum_device(device_values, serial)

        with progress.step(f"summing them on {device}"):
            serial["cuda"] = _guarded(errors, "serial sum", serial_on_device)
    results["serial_sum"] = serial
    timings["serial_sum"] = time.perf_counter() - start

    start = time.perf_counter()
    with progress.step(f"adding 0.1 {sizes.tenth_count:,} times with several accumulators"):
        tenth = tenth_sum_cpu(sizes.tenth_count)
        tenth["cuda"] = (_guarded(errors, "0.1 sum", tenth_sum_device, sizes.tenth_count, device)
                         if device else None)
    results["tenth_sum"] = tenth
    timings["tenth_sum"] = time.perf_counter() - start

    start = time.perf_counter()
    with progress.step(f"row variances of {sizes.var_rows:,} x {sizes.var_cols:,} values "
                       f"at offset {sizes.var_offset:,.0f}, six ways"):
        data = variance_data(sizes)
        exact = data.astype(np.float64).var(axis=1)
        variance = {"rows": sizes.var_rows, "cols": sizes.var_cols, "offset": sizes.var_offset,
                    "median_fp64_variance": float(np.median(exact)),
                    "cpu": variance_metrics(variances(torch.from_numpy(data), kernel=False), exact),
                    "cuda": None}
        if device:
            variance["cuda"] = _guarded(
                errors, "variance",
                lambda: variance_metrics(variances(torch.from_numpy(data).to(device), kernel=True), exact))
    results["variance"] = variance
    timings["variance"] = time.perf_counter() - start

    start = time.perf_counter()
    results["softmax"] = {"scores": SCORES, "masked_row": MASKED_ROW,
                          "partly_masked_row": PARTLY_MASKED_ROW,
                          "cpu": softmax_results("cpu"),
                          "cuda": _guarded(errors, "softmax", softmax_results, device) if device else None}
    timings["softmax"] = time.perf_counter() - start

    start = time.perf_counter()
    if device and device_values is not None:
        with progress.step(f"{sizes.determinism_runs} runs each of an atomic-add sum, the treefold "
                           f"sum and torch.sum on {device}"):
            results["determinism"] = _guarded(errors, "determinism", determinism, device_values,
                                              sizes.determinism_runs)
    else:
        results["determinism"] = {"skipped": "needs a CUDA GPU: on a CPU nothing runs concurrently, "
                                              "so an atomic-add sum has only one order"}
    timings["determinism"] = time.perf_counter() - start
    return results


def _device_name(device) -> str:
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


def _meta(sizes: Sizes, device: str | None) -> dict:
    meta = {
        "treefold": __version__, "torch": torch.__version__, "triton": triton.__version__,
        "numpy": np.__version__, "python": platform.python_version(),
        "machine": platform.machine(), "cpu_threads": torch.get_num_threads(),
        "device": _device_name(device) if device else None,
        "triton_interpreter": os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
        "seed": SEED, "sizes": asdict(sizes), "quick": sizes == QUICK, "seconds": {},
    }
    return meta


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------

def _num(v, digits: int = 10) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if float(v).is_integer() and abs(v) < 1e15:
        return f"{v:,.0f}"
    return f"{v:,.{digits}g}"


def _err(v: float) -> str:
    return f"{v:+.2e}" if math.isfinite(v) else str(v)


def _table(header: list[str], rows: list[list[str]], indent: str = "   ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append(indent + "  ".join(cells).rstrip())
    return lines


def _vector(values: list[float], spec: str = ".4f") -> str:
    return "[" + ", ".join(format(v, spec) for v in values) + "]"


def _column_failed(column) -> str | None:
    return column.get("error") if isinstance(column, dict) and "error" in column else None


def render(results: dict) -> str:
    """The human-readable report of :func:`run`'s numbers."""
    meta = results["meta"]
    out = [f"treefold demo: numerics measured on this machine ({meta['machine']}, "
           f"{meta['cpu_threads']} CPU threads, torch {meta['torch']}"
           + (f"; device columns: {meta['device']}" if meta["device"] else "; no GPU") + ")", ""]

    s = results["serial_sum"]
    cuda = s["cuda"]
    on_gpu = cuda is not None and not _column_failed(cuda)
    out.append(f"1. Summing {s['n']:,} uniform [0, 1) float32 values")
    out.append(f"   float64 sum {_num(s['fp64'], 12)}; the nearest float32 is "
               f"{_num(s['correctly_rounded_fp32'])}")
    header = ["", "cpu", "rel err", "ulps"] + (["cuda", "rel err", "ulps"] if on_gpu else [])
    rows = []
    for key, label in (("serial_fp32", "float32 serial loop"), ("treefold_order", "treefold order"),
                       ("torch_sum", "torch.sum")):
        e = s["cpu"][key]
        row = [label, _num(e["value"]), _err(e["rel_err"]), f"{e['ulps_from_correctly_rounded']:+,.0f}"]
        if on_gpu:
            g = cuda.get(key)
            row += (["host only", "", ""] if g is None else
                    [_num(g["value"]), _err(g["rel_err"]), f"{g['ulps_from_correctly_rounded']:+,.0f}"])
        rows.append(row)
    out += _table(header, rows)
    serial = s["cpu"]["serial_fp32"]["value"]
    if s["cpu"]["serial_fp32"]["rel_err"] < -0.01:
        out.append(f"   The loop stalls at {_num(serial)} = 2^{math.log2(serial):g}: float32 values there "
                   f"are {_num(s['serial_spacing'])} apart, so adding a value under "
                   f"{_num(s['serial_spacing'] / 2)} rounds back to the same total.")
    out.append("   The tree only ever adds partial sums of similar size, so each add loses little.")
    if on_gpu:
        same = cuda["treefold_order"]["same_bits_as_cpu_reference"]
        out.append(f"   treefold's CUDA kernel {'gives the same bits as' if same else 'DIFFERS from'} "
                   f"the CPU reference of the order.")
    out += _failure_lines(cuda)
    out.append("")

    t = results["tenth_sum"]
    cuda = t["cuda"]
    on_gpu = cuda is not None and not _column_failed(cuda)
    out.append(f"2. Adding 0.1 {t['count']:,} times (0.1 stored in bfloat16 is {t['stored_value']!r}; "
               f"exact sum {_num(t['exact_sum_of_stored'], 11)}, nearest bfloat16 {_num(t['nearest_bf16_to_exact'])})")
    labels = (("sequential_bf16", "bfloat16 accumulator, sequential"),
              ("sequential_fp32", "float32 accumulator, sequential"),
              ("kahan_bf16", "Kahan, bfloat16 sum and compensation"),
              ("neumaier_bf16", "Neumaier, bfloat16 sum and compensation"),
              ("treefold_order_fp32", "treefold order, float32"),
              ("torch_sum_bf16", "torch.sum (bfloat16 result)"),
              ("fp32_values_sequential_fp32", "0.1 stored in float32, float32 accumulator"))
    header = ["", "cpu"] + (["cuda"] if on_gpu else [])
    rows = [[label, _num(t["cpu"][key], 11)] + ([_num(cuda[key], 11) if key in cuda else "host only"]
                                            if on_gpu else []) for key, label in labels]
    out += _table(header, rows)
    stalled, spacing = t["cpu"]["sequential_bf16"], t["bf16_spacing_at_sequential"]
    if t["stored_value"] < spacing / 2:
        out.append(f"   At {_num(stalled)} neighbouring bfloat16 values are {_num(spacing)} apart, so adding "
                   f"{t['stored_value']!r} (under half of that) rounds back to {_num(stalled)} every time.")
    out.append("   Kahan feeds the lost part back into every add; Neumaier's compensation is itself a running")
    out.append("   bfloat16 sum, which can stall the same way.")
    out += _failure_lines(cuda)
    out.append("")

    v = results["variance"]
    cuda = v["cuda"]
    on_gpu = cuda is not None and not _column_failed(cuda)
    out.append(f"3. Variance of {v['rows']:,} rows of {v['cols']:,} float32 values, mean "
               f"{_num(v['offset'])}, std 1 (median float64 variance {v['median_fp64_variance']:.4f})")
    header = ["", "cpu: var<0", "NaN std", "median rel err"] + (
        ["cuda: var<0", "NaN std", "median rel err"] if on_gpu else [])
    rows = []
    for key, label in VARIANCE_METHODS.items():
        c = v["cpu"][key]
        row = [label, str(c["negative_rows"]), str(c["nan_std_rows"]), f"{c['median_rel_err']:.2e}"]
        if on_gpu:
            g = cuda[key]
            row += [str(g["negative_rows"]), str(g["nan_std_rows"]), f"{g['median_rel_err']:.2e}"]
        rows.append(row)
    out += _table(header, rows)
    square = v["offset"] ** 2
    out.append(f"   E[x^2] is about {_num(square)}, where float32 values are {_num(_spacing(_FP32, square))} "
               f"apart, while the variance is about 1:")
    out.append("   E[x^2] - E[x]^2 subtracts two nearly equal numbers and keeps mostly their rounding errors.")
    out += _failure_lines(cuda)
    out.append("")

    sm = results["softmax"]
    cuda = sm["cuda"]
    on_gpu = cuda is not None and not _column_failed(cuda)
    header = ["", "cpu"] + (["cuda"] if on_gpu else [])
    out.append(f"4. Softmax of {_vector(sm['scores'], 'g')} in float32")
    rows = [[label, _vector(sm["cpu"][key])] + ([_vector(cuda[key])] if on_gpu else [])
            for key, label in (("naive", "naive exp(x) / sum exp(x)"),
                               ("stable", "max subtracted first"),
                               ("naive_of_shifted", "naive, of x - max(x)"),
                               ("torch_softmax", "torch.softmax"))]
    out += _table(header, rows)
    report = sm["cpu"]["stable_vs_fp64"]
    out.append(f"   exp(1000) overflows float32; the stable result against float64: rel_l2 "
               f"{report['relative_l2']:.2e}, max {report['max_ulps']:.2g} ulp "
               f"({'ok' if report['ok'] else 'FAIL'} at float32 tolerance).")
    out.append("")

    out.append(f"5. A fully masked row {_vector(sm['masked_row'], 'g')}")
    rows = [[label, _vector(sm["cpu"][key])] + ([_vector(cuda[key])] if on_gpu else [])
            for key, label in (("masked_naive", "max subtracted: -inf - (-inf)"),
                               ("masked_torch_softmax", "torch.softmax"),
                               ("masked_convention", "treefold convention"),
                               ("partly_masked_convention",
                                f"convention, row {_vector(sm['partly_masked_row'], 'g')}"))]
    out += _table(header, rows)
    out.append("   A row with no visible score has no distribution; treefold defines it as all zeros.")
    out += _failure_lines(cuda)
    out.append("")

    d = results["determinism"]
    out.append("6. Determinism: the same sum run again and again")
    if "skipped" in d:
        out.append(f"   skipped: {d['skipped']}.")
    elif _column_failed(d):
        out += _failure_lines(d)
    else:
        s_n = results["serial_sum"]["n"]
        out.append(f"   {d['runs']} runs each over the {s_n:,} values of experiment 1 on the GPU:")
        for key, label in (("atomic_add", "one pass, atomic adds"), ("treefold_order", "treefold order"),
                           ("torch_sum", "torch.sum")):
            entry = d[key]
            spread = ", ".join(f"{_num(e['value'])} (x{e['runs']})" for e in entry["values"][:8])
            more = f", ... {len(entry['values']) - 8} more" if len(entry["values"]) > 8 else ""
            out.append(f"   {label}: {entry['distinct']} distinct value(s): {spread}{more}")
    if results["errors"]:
        out += ["", "Failures (the CPU results above stand):"] + [f"   {e}" for e in results["errors"]]
    seconds = meta["seconds"]
    out += ["", "Seconds per experiment: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items())]
    return "\n".join(out)


def _failure_lines(column) -> list[str]:
    message = _column_failed(column)
    return [f"   cuda column failed: {message}"] if message else []


def _jsonable(value):
    """Non-finite floats as strings (strict JSON), NumPy scalars as Python numbers."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return v
    return value


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    """Run the demo, print the report, write JSON when asked.

    ``args`` is the namespace of the ``treefold demo`` command (``json``, ``quick``) or a list of
    its command-line arguments. Returns 0, or 1 when a GPU column failed (the report says which).
    """
    if not isinstance(args, argparse.Namespace):
        parser = argparse.ArgumentParser(prog="treefold demo")
        parser.add_argument("--json", metavar="PATH")
        parser.add_argument("--quick", action="store_true")
        args = parser.parse_args(args)
    sizes = QUICK if getattr(args, "quick", False) else FULL
    device = "cuda" if torch.cuda.is_available() else None
    results = run(sizes, device=device)
    print(render(results))
    path = getattr(args, "json", None)
    if path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(_jsonable(results), indent=2, allow_nan=False) + "\n")
        print(f"\nnumbers written to {target}")
    return 1 if results["errors"] else 0
