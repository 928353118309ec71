"""Measuring floating-point error honestly.

- :func:`formats` describes the number formats LLM work uses (fp32, tf32, bf16, fp16, fp8, fp4):
  how many bits go to the exponent and the mantissa, and what that buys in precision and range.
- :func:`compare` turns two tensors into an :class:`ErrorReport`: aggregate and worst-case errors,
  the worst error in units in the last place, NaN/Inf disagreements, and a verdict against the
  per-dtype tolerances of :data:`TOLERANCES` (stated once, each with its reason).
- :func:`three_way` makes the three comparisons that separate a bug from the cost of low
  precision: trusted fp32 against yours in fp32, trusted low precision against trusted fp32, and
  yours in low precision against trusted low precision.
- :func:`sequential_sum`, :func:`kahan_sum` and :func:`neumaier_sum` add values one after another
  on the host, rounding the running sum (and the compensation) to a storage format after every
  step, so the effect of the accumulator's precision can be measured.
- :func:`warn_if_tf32` warns when float32 matmuls may secretly run as TF32 while float32 results
  are being compared.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import torch

from . import _checks

__all__ = [
    "FloatFormat", "formats", "format_table",
    "Tolerance", "TOLERANCES",
    "ErrorReport", "compare",
    "ThreeWayReport", "three_way",
    "sequential_sum", "kahan_sum", "neumaier_sum",
    "tf32_enabled", "warn_if_tf32",
]


# --------------------------------------------------------------------------------------------
# Number formats
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: sign, exponent and mantissa (fraction) bits.

    ``special`` says what the top exponent field encodes: ``"ieee"`` (infinities and NaNs, as in
    IEEE 754), ``"nan-only"`` (no infinities; only the all-ones exponent *and* mantissa pattern is
    NaN, as in the OCP fp8 e4m3 "fn" variant), or ``"none"`` (every pattern is a finite number, as
    in fp4 e2m1). Subnormals exist in all of them.
    """

    name: str
    sign_bits: int
    exponent_bits: int
    mantissa_bits: int
    special: str
    torch_dtype: torch.dtype | None
    note: str = ""

    @property
    def bias(self) -> int:
        return (1 << (self.exponent_bits - 1)) - 1

    @property
    def precision(self) -> int:
        """Significand bits p, the implicit leading one included."""
        return self.mantissa_bits + 1

    @property
    def epsilon(self) -> float:
        """Distance from 1 to the next larger number: 2^-mantissa_bits."""
        return 2.0 ** -self.mantissa_bits

    @property
    def unit_roundoff(self) -> float:
        """Largest relative error of one round-to-nearest: epsilon / 2."""
        return 2.0 ** -self.precision

    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal number (1 - bias)."""
        return 1 - self.bias

    @property
    def max_exponent(self) -> int:
        """Exponent of the largest finite number."""
        top_field = (1 << self.exponent_bits) - 1
        # IEEE formats reserve the top exponent field for Inf/NaN; the others use it for numbers.
        return (top_field - 1 if self.special == "ieee" else top_field) - self.bias

    @property
    def max_finite(self) -> float:
        """Largest finite value."""
        mantissa_steps = (1 << self.mantissa_bits) - 1
        if self.special == "nan-only":
            mantissa_steps -= 1  # the all-ones mantissa at the top exponent is the NaN
        return math.ldexp(1.0 + mantissa_steps * self.epsilon, self.max_exponent)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, 2^(1 - bias)."""
        return math.ldexp(1.0, self.min_exponent)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value, the spacing of the subnormals."""
        return math.ldexp(1.0, self.min_exponent - self.mantissa_bits)

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits, (mantissa_bits + 1) * log10(2)."""
        return self.precision * math.log10(2.0)

    @property
    def has_inf(self) -> bool:
        return self.special == "ieee"

    @property
    def bits(self) -> int:
        return self.sign_bits + self.exponent_bits + self.mantissa_bits

    def as_dict(self) -> dict:
        return {
            "name": self.name, "bits": self.bits, "sign_bits": self.sign_bits,
            "exponent_bits": self.exponent_bits, "mantissa_bits": self.mantissa_bits,
            "epsilon": self.epsilon, "max_finite": self.max_finite, "min_normal": self.min_normal,
            "min_subnormal": self.min_subnormal, "decimal_digits": self.decimal_digits,
            "has_inf": self.has_inf, "torch_dtype": _dtype_name(self.torch_dtype), "note": self.note,
        }

    def round(self, value: float) -> float:
        """``value`` rounded to the nearest number of this format (ties to even), as a float.

        Values beyond the largest finite number become infinities in IEEE formats; the formats
        without infinities have no single rounding rule for overflow, so they raise.
        """
        if value.__class__ is not float:  # (the checks off the sums' per-value loop)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"FloatFormat.round: value must be a number, got {type(value).__name__}")
            if _checks.beyond_float(value):
                raise ValueError("FloatFormat.round: value is a number too large for a float")
            value = float(value)
        if value == 0.0 or not math.isfinite(value):
            return value
        _, exponent = math.frexp(value)  # value = m * 2**exponent with 0.5 <= |m| < 1
        quantum = max(exponent - 1, self.min_exponent) - self.mantissa_bits
        # value / 2**quantum is exact (power-of-two scaling) and below 2**precision, so round()
        # (ties to even on floats) rounds it to the nearest representable significand.
        rounded = math.ldexp(round(math.ldexp(value, -quantum)), quantum)
        if abs(rounded) > self.max_finite:
            if self.special != "ieee":
                raise ValueError(f"FloatFormat.round: {value!r} overflows {self.name} "
                                 f"(largest finite {self.max_finite}), which has no infinity")
            return math.copysign(math.inf, value)
        return rounded


def _bits_format(name, exponent_bits, mantissa_bits, special, dtype_name, note):
    return FloatFormat(name, 1, exponent_bits, mantissa_bits, special,
                       getattr(torch, dtype_name) if dtype_name else None, note)


_FLOAT64 = _bits_format("float64", 11, 52, "ieee", "float64", "IEEE binary64; references")
_FORMATS = (
    _bits_format("float32", 8, 23, "ieee", "float32", "IEEE binary32; the accumulation type"),
    _bits_format("tfloat32", 8, 10, "ieee", None,
                 "tensor-core matmul input format: fp32 range, fp16 precision; no torch dtype"),
    _bits_format("bfloat16", 8, 7, "ieee", "bfloat16", "fp32's range with 8 bits of precision"),
    _bits_format("float16", 5, 10, "ieee", "float16", "IEEE binary16; overflows above 65504"),
    _bits_format("float8_e4m3fn", 4, 3, "nan-only", "float8_e4m3fn",
                 "OCP fp8 E4M3: no infinities, largest 448; needs a scale factor"),
    _bits_format("float8_e5m2", 5, 2, "ieee", "float8_e5m2",
                 "OCP fp8 E5M2: IEEE-like, largest 57344; needs a scale factor"),
    _bits_format("float4_e2m1fn", 2, 1, "none", None,
                 "OCP MX fp4 E2M1: values 0, 0.5, 1, 1.5, 2, 3, 4, 6; torch only stores it packed"),
)
_FORMAT_BY_NAME = {f.name: f for f in (_FLOAT64, *_FORMATS)}
_FORMAT_BY_DTYPE = {f.torch_dtype: f for f in (_FLOAT64, *_FORMATS) if f.torch_dtype is not None}


def formats() -> list[FloatFormat]:
    """The formats of LLM work, widest first: fp32, tf32, bf16, fp16, fp8 e4m3, fp8 e5m2, fp4 e2m1.

    Each row gives sign/exponent/mantissa bits and the derived epsilon (2^-mantissa_bits),
    largest finite value, smallest normal value and decimal digits ((mantissa_bits + 1) log10 2).
    The exponent bits buy range; the mantissa bits buy precision.
    """
    return list(_FORMATS)


def format_table() -> str:
    """:func:`formats` as an aligned text table."""
    head = ("format", "s/e/m", "epsilon", "largest", "smallest normal", "digits")
    rows = [head] + [
        (f.name, f"{f.sign_bits}/{f.exponent_bits}/{f.mantissa_bits}", f"{f.epsilon:.3g}",
         f"{f.max_finite:.4g}", f"{f.min_normal:.4g}", f"{f.decimal_digits:.2f}")
        for f in _FORMATS
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))) for r in rows)


def _dtype_name(dtype) -> str | None:
    return None if dtype is None else str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------------------------
# Tolerances: the single table
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tolerance:
    """Elementwise tolerance |actual - expected| <= atol + rtol * |expected|, with its reason."""

    atol: float
    rtol: float
    reason: str


#: Tolerances per dtype, for results of ordinary depth (an elementwise op, a reduction, a norm)
#: on data of order one. u is the unit roundoff, 2^-precision.
TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(atol=1e-12, rtol=1e-12, reason=(
        "53 bits, u = 2^-53 = 1.1e-16: references computed in different orders agree to far "
        "better than 1e-12, while a single float32 rounding anywhere (6e-8) is caught")),
    "float32": Tolerance(atol=1e-5, rtol=1.3e-6, reason=(
        "24 bits, u = 2^-24 = 6.0e-8: rtol ~ 22u covers the log2(N) <= 20 roundings a tree "
        "reduction adds to each term plus a few elementwise ones; atol covers results near zero "
        "left by cancellation of order-one terms")),
    "tfloat32": Tolerance(atol=1e-3, rtol=2.0 ** -10, reason=(
        "11 bits, u = 2^-11 = 4.9e-4: each fp32 operand is rounded to tf32 once before an "
        "fp32-accumulated product, about 2u = 1e-3 relative; a dot product that cancels keeps "
        "that error relative to its order-one terms, hence the same atol")),
    "bfloat16": Tolerance(atol=1e-5, rtol=1.6e-2, reason=(
        "8 bits, u = 2^-8 = 3.9e-3: the inputs and the result are each rounded once and the op "
        "adds a couple more, about 4u; bf16 has fp32's range, so small values keep their "
        "relative precision and atol only absorbs results that should be zero")),
    "float16": Tolerance(atol=1e-5, rtol=1e-3, reason=(
        "11 bits, u = 2^-11 = 4.9e-4: the inputs and the result are each rounded once, about 2u; "
        "below 6.1e-5 fp16 is subnormal with a fixed spacing of 6e-8, well inside atol")),
    "float8_e4m3fn": Tolerance(atol=2.0 ** -7, rtol=0.125, reason=(
        "4 bits, u = 2^-4: the input and the result are each rounded once, 2u; below the "
        "smallest normal 2^-6 the spacing is a fixed 2^-9 and atol allows four of them")),
    "float8_e5m2": Tolerance(atol=2.0 ** -14, rtol=0.25, reason=(
        "3 bits, u = 2^-3: the input and the result are each rounded once, 2u; below the "
        "smallest normal 2^-14 the spacing is a fixed 2^-16 and atol allows four of them")),
}


def _resolve_format(fn: str, dtype) -> FloatFormat:
    """The FloatFormat named by a torch dtype or a name in TOLERANCES, for compare/three_way."""
    if isinstance(dtype, torch.dtype):
        fmt = _FORMAT_BY_DTYPE.get(dtype)
    elif isinstance(dtype, str):
        fmt = _FORMAT_BY_NAME.get(dtype)
    else:
        raise TypeError(f"{fn}: dtype must be a torch.dtype or a format name, got {type(dtype).__name__}")
    if fmt is None or fmt.name not in TOLERANCES:
        raise ValueError(f"{fn}: no tolerance for dtype={dtype!r}; expected one of "
                         f"{', '.join(TOLERANCES)}")
    return fmt


# --------------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ErrorReport:
    """What :func:`compare` measured. Errors are over the positions where both are finite.

    Attributes:
        dtype: format whose tolerance and ulp are used.
        numel: elements compared.
        max_abs, mean_abs: largest and mean |actual - expected|.
        relative_l2: ||actual - expected||_2 / ||expected||_2 (0 when both are zero, inf when
            only the expected is zero).
        max_ulps: largest |actual - expected| in units of the last place of ``dtype`` at the
            expected value.
        nan_mismatches: positions where exactly one of the two is NaN.
        inf_mismatches: positions where one is infinite and the other is not the same infinity
            (NaN positions are counted above, not here).
        violations: finite positions with |actual - expected| > atol + rtol * |expected|.
        atol, rtol: the tolerance used, from :data:`TOLERANCES`.
        ok: no violations and no NaN/Inf mismatches.
        worst_index: flat index of the element furthest outside (or least inside) its tolerance,
            with ``worst_actual``/``worst_expected`` its values; None when nothing was finite.
    """

    dtype: str
    numel: int
    max_abs: float
    mean_abs: float
    relative_l2: float
    max_ulps: float
    nan_mismatches: int
    inf_mismatches: int
    violations: int
    atol: float
    rtol: float
    ok: bool
    worst_index: int | None = None
    worst_actual: float | None = None
    worst_expected: float | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        text = (f"{self.dtype} {'ok' if self.ok else 'FAIL'}: max_abs {self.max_abs:.3g}, "
                f"mean_abs {self.mean_abs:.3g}, rel_l2 {self.relative_l2:.3g}, "
                f"max {self.max_ulps:.3g} ulp; {self.violations}/{self.numel} outside "
                f"atol {self.atol:.3g} + rtol {self.rtol:.3g}")
        if self.nan_mismatches or self.inf_mismatches:
            text += f"; NaN mismatches {self.nan_mismatches}, Inf mismatches {self.inf_mismatches}"
        if self.worst_index is not None and self.max_abs > 0 and self.numel > 1:
            text += f"; worst [{self.worst_index}] {self.worst_actual:.7g} vs {self.worst_expected:.7g}"
        return text


#: The NumPy dtypes that torch takes as they are (NumPy's longdouble has no torch dtype).
_NUMPY_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _as_tensor(fn: str, name: str, value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        t = value.detach()
    elif isinstance(value, np.ndarray):
        if value.dtype not in _NUMPY_FLOATS:
            raise TypeError(f"{fn}: {name} has NumPy dtype {value.dtype}, expected a floating-point dtype "
                            f"(float16, float32 or float64)")
        # (a copy where the strides are negative: torch.from_numpy takes no such array)
        t = torch.from_numpy(value if all(st >= 0 for st in value.strides) else value.copy())
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        if _checks.beyond_float(value):
            raise ValueError(f"{fn}: {name} is a number too large for a float")
        t = torch.tensor(float(value), dtype=torch.float64)
    else:
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, a NumPy array or a number, "
                        f"got {type(value).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{fn}: {name} has dtype {_dtype_name(t.dtype)}, expected a floating-point dtype")
    return t


def _ulp(reference: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Spacing of ``fmt`` at each (finite, float64) reference value."""
    _, exponent = torch.frexp(reference)  # |r| = m * 2**exponent, 0.5 <= m < 1; 0 for r = 0
    leading = torch.where(reference == 0, fmt.min_exponent, exponent.to(torch.int64) - 1)
    leading = leading.clamp(fmt.min_exponent, fmt.max_exponent)
    return _exact_pow2(leading - fmt.mantissa_bits)


def _exact_pow2(k: torch.Tensor) -> torch.Tensor:
    """2.0**k in float64 for int64 k in [-1074, 1023], built from exponent bits (no pow/exp2,
    whose accuracy varies by device). k below -1022 is a subnormal: made as a product of two
    normal powers of two, which is exact."""
    normal = k.clamp(-1022, 1023)
    rest = k - normal  # in [-52, 0]
    def from_bits(e):
        return ((e + 1023) << 52).view(torch.float64)
    return from_bits(normal) * from_bits(rest)


def compare(actual, expected, *, dtype=None) -> ErrorReport:
    """Measure how far ``actual`` is from ``expected``; a report, with a verdict.

    Args:
        actual: the result under test (tensor, NumPy array or number).
        expected: the reference, same shape and device.
        dtype: the format the result is judged in (a torch dtype or a name in
            :data:`TOLERANCES`, e.g. ``"tfloat32"``): it picks the tolerance and the ulp. By
            default the coarser of the two inputs' dtypes, so a bfloat16 result checked against
            a float32 reference is judged as bfloat16.

    All arithmetic is float64 on the inputs' device. When both inputs are float32 CUDA tensors
    and TF32 matmuls are enabled, warns (see :func:`warn_if_tf32`).
    """
    a = _as_tensor("compare", "actual", actual)
    r = _as_tensor("compare", "expected", expected)
    if a.device != r.device:
        raise ValueError(f"compare: actual is on {a.device}, but expected is on {r.device}; "
                         f"move one first (treefold never copies between devices)")
    if a.shape != r.shape:
        raise ValueError(f"compare: actual has shape {tuple(a.shape)}, expected has shape "
                         f"{tuple(r.shape)}; they must match (no broadcasting)")
    if dtype is None:
        formats_seen = [_resolve_format("compare", t.dtype) for t in (a, r)]
        fmt = max(formats_seen, key=lambda f: f.unit_roundoff)
    else:
        fmt = _resolve_format("compare", dtype)
    if a.dtype == torch.float32 and r.dtype == torch.float32:
        warn_if_tf32(a, r, stacklevel=3)
    tol = TOLERANCES[fmt.name]

    a = a.to(torch.float64).reshape(-1)
    r = r.to(torch.float64).reshape(-1)
    nan_a, nan_r = torch.isnan(a), torch.isnan(r)
    nan_mismatches = int((nan_a ^ nan_r).sum())
    infinite = (torch.isinf(a) | torch.isinf(r)) & ~(nan_a | nan_r)
    inf_mismatches = int((infinite & (a != r)).sum())
    finite = torch.isfinite(a) & torch.isfinite(r)
    af, rf = a[finite], r[finite]
    diff = (af - rf).abs()
    if diff.numel() == 0:
        return ErrorReport(fmt.name, a.numel(), 0.0, 0.0, 0.0, 0.0, nan_mismatches, inf_mismatches,
                           0, tol.atol, tol.rtol, nan_mismatches == 0 and inf_mismatches == 0)
    # both norms over the same power-of-two scale: float64 squares of values beyond 1e+-154
    # would overflow or underflow, and the scale cancels in the ratio (exactly: a power of two).
    # The difference is taken after the scaling: finite values of opposite signs near the top of
    # float64 have a difference that overflows (max_abs says inf), but not a scaled one.
    largest = float(torch.maximum(af.abs().max(), rf.abs().max()))
    scale = math.ldexp(1.0, math.frexp(largest)[1] - 1) if largest > 0 else 1.0  # (at most 2^1023)
    diff_norm = float(torch.linalg.vector_norm(af / scale - rf / scale))
    ref_norm = float(torch.linalg.vector_norm(rf / scale))
    if ref_norm > 0:
        relative_l2 = diff_norm / ref_norm
    else:
        relative_l2 = 0.0 if diff_norm == 0 else math.inf
    allowed = tol.atol + tol.rtol * rf.abs()
    violations = int((diff > allowed).sum())
    worst = int(torch.argmax(diff / allowed))
    worst_flat = int(torch.nonzero(finite).reshape(-1)[worst])
    return ErrorReport(
        dtype=fmt.name, numel=a.numel(), max_abs=float(diff.max()), mean_abs=float(diff.mean()),
        relative_l2=relative_l2, max_ulps=float((diff / _ulp(rf, fmt)).max()),
        nan_mismatches=nan_mismatches, inf_mismatches=inf_mismatches, violations=violations,
        atol=tol.atol, rtol=tol.rtol,
        ok=violations == 0 and nan_mismatches == 0 and inf_mismatches == 0,
        worst_index=worst_flat, worst_actual=float(af[worst]), worst_expected=float(rf[worst]),
    )


# --------------------------------------------------------------------------------------------
# three_way
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ThreeWayReport:
    """The three comparisons of :func:`three_way`, plus the one the verdict rests on.

    Attributes:
        impl_fp32: (1) yours in fp32 vs trusted in fp32, judged as float32: tests the algorithm.
        precision_cost: (2) trusted in ``low`` vs trusted in fp32: what the low dtype costs.
        impl_low: (3) yours in ``low`` vs trusted in ``low``: should be about as close as (2).
        impl_low_vs_fp32: yours in ``low`` vs trusted in fp32, the number set against (2).
        low: the low-precision dtype's name.
        factor: how many times (2)'s relative L2 error yours may have.
        budget: factor * max((2).relative_l2, u_low / 2), the relative L2 allowed.
        ok: (1) passes, yours in ``low`` adds no NaN/Inf mismatches beyond (2)'s, and its
            relative L2 error against trusted fp32 is within ``budget``.
        reason: one sentence on why the verdict is what it is.
    """

    impl_fp32: ErrorReport
    precision_cost: ErrorReport
    impl_low: ErrorReport
    impl_low_vs_fp32: ErrorReport
    low: str
    factor: float
    budget: float
    ok: bool
    reason: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        labels = ("(1) yours fp32 vs trusted fp32", f"(2) trusted {self.low} vs trusted fp32",
                  f"(3) yours {self.low} vs trusted {self.low}", f"    yours {self.low} vs trusted fp32")
        reports = (self.impl_fp32, self.precision_cost, self.impl_low, self.impl_low_vs_fp32)
        width = max(map(len, labels))
        return "\n".join(
            [f"three-way comparison, low = {self.low}: {'ok' if self.ok else 'FAIL'} ({self.reason})"]
            + [f"  {label.ljust(width)}  {report}" for label, report in zip(labels, reports)])


def _call(fn_name: str, fn: Callable, x: torch.Tensor, shape) -> torch.Tensor:
    out = fn(x)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"three_way: {fn_name} must return a torch.Tensor, got {type(out).__name__}")
    if shape is not None and out.shape != shape:
        raise ValueError(f"three_way: {fn_name} returned shape {tuple(out.shape)} for a "
                         f"{_dtype_name(x.dtype)} input but {tuple(shape)} for float32")
    return out


def three_way(fn_impl: Callable, fn_trusted: Callable, x: torch.Tensor, *,
              low: torch.dtype = torch.bfloat16, factor: float = 2.0) -> ThreeWayReport:
    """Separate bugs from the cost of low precision with three comparisons.

    Runs both functions on ``x`` in float32 and in ``low`` and compares (1) yours fp32 with
    trusted fp32, (2) trusted low with trusted fp32 and (3) yours low with trusted low. A
    correct implementation passes (1) at float32 tolerance and, in ``low``, lands about as close
    to trusted fp32 as the trusted function itself does in ``low``: its relative L2 error
    against trusted fp32 is at most ``factor`` times (2)'s (or ``factor`` times half a unit
    roundoff of ``low`` when (2) is smaller, as when ``low`` happens to represent everything
    exactly). Much worse than (2) means a bug or a low-precision accumulator.

    Args:
        fn_impl: your function, tensor -> tensor.
        fn_trusted: the trusted function (e.g. the torch op), tensor -> tensor.
        x: input, any floating dtype; it is converted to float32 and to ``low``.
        low: torch.bfloat16 or torch.float16.
        factor: allowed ratio of yours-in-low to trusted-in-low error, > 1.
    """
    for name, fn in (("fn_impl", fn_impl), ("fn_trusted", fn_trusted)):
        if not callable(fn):
            raise TypeError(f"three_way: {name} must be callable, got {type(fn).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"three_way: x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"three_way: x has dtype {_dtype_name(x.dtype)}, expected a floating-point dtype")
    if not isinstance(low, torch.dtype):
        raise TypeError(f"three_way: low must be a torch.dtype (torch.bfloat16 or torch.float16), "
                        f"got {type(low).__name__}")
    if low not in (torch.bfloat16, torch.float16):
        raise ValueError(f"three_way: low={low} is not supported; expected torch.bfloat16 or torch.float16")
    if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
        raise TypeError(f"three_way: factor must be a number > 1, got {type(factor).__name__}")
    if _checks.beyond_float(factor) or not 1 < float(factor) < math.inf:
        raise ValueError(f"three_way: factor must be a finite number > 1, got "
                         f"{'a number too large for a float' if _checks.beyond_float(factor) else repr(factor)}")

    x32, x_low = x.detach().float(), x.detach().to(low)
    trusted32 = _call("fn_trusted", fn_trusted, x32, None)
    impl32 = _call("fn_impl", fn_impl, x32, trusted32.shape)
    trusted_low = _call("fn_trusted", fn_trusted, x_low, trusted32.shape)
    impl_low = _call("fn_impl", fn_impl, x_low, trusted32.shape)

    c1 = compare(impl32.float(), trusted32.float(), dtype=torch.float32)
    c2 = compare(trusted_low, trusted32.float(), dtype=low)
    c3 = compare(impl_low, trusted_low, dtype=low)
    c4 = compare(impl_low, trusted32.float(), dtype=low)
    u_low = _FORMAT_BY_DTYPE[low].unit_roundoff
    budget = float(factor) * max(c2.relative_l2, u_low / 2)
    low_name = _dtype_name(low)
    if not c1.ok:
        ok, reason = False, "yours differs from trusted already in float32: a bug, not rounding"
    elif c4.nan_mismatches > c2.nan_mismatches or c4.inf_mismatches > c2.inf_mismatches:
        ok, reason = False, f"yours in {low_name} makes NaN/Inf where trusted does not"
    elif c4.relative_l2 > budget:
        ok, reason = False, (f"yours in {low_name} is {c4.relative_l2:.3g} from trusted fp32, over "
                             f"{factor:g}x the {c2.relative_l2:.3g} that {low_name} itself costs: a bug "
                             f"or a low-precision accumulator")
    else:
        ok, reason = True, (f"yours in {low_name} is {c4.relative_l2:.3g} from trusted fp32, within "
                            f"{factor:g}x of the {c2.relative_l2:.3g} that {low_name} itself costs")
    return ThreeWayReport(c1, c2, c3, c4, low_name, float(factor), budget, ok, reason)


# --------------------------------------------------------------------------------------------
# Sequential and compensated sums (host side)
# --------------------------------------------------------------------------------------------

_STORAGE = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _storage_format(fn: str, storage_dtype) -> FloatFormat:
    if not isinstance(storage_dtype, torch.dtype):
        raise TypeError(f"{fn}: storage_dtype must be a torch.dtype, got {type(storage_dtype).__name__}")
    if storage_dtype not in _STORAGE:
        raise ValueError(f"{fn}: storage_dtype={storage_dtype} is not supported; expected one of "
                         f"{', '.join(_dtype_name(d) for d in _STORAGE)}")
    return _FORMAT_BY_DTYPE[storage_dtype]


def _host_array(fn: str, values) -> np.ndarray:
    """The values as a 1-D NumPy float array, without a copy where one is not needed
    (bfloat16 tensors, which NumPy cannot hold, become float64, exactly)."""
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            raise ValueError(f"{fn}: values is on {values.device}; the sum runs on the host, so "
                             f"move it with .cpu() first (treefold never copies between devices)")
        if not values.is_floating_point():
            raise TypeError(f"{fn}: values has dtype {_dtype_name(values.dtype)}, expected a floating-point dtype")
        values = values.detach()
        if values.dtype not in (torch.float64, torch.float32, torch.float16):
            values = values.to(torch.float64)
        array = values.numpy()
    elif isinstance(values, np.ndarray):
        if values.dtype.kind != "f":
            raise TypeError(f"{fn}: values has dtype {values.dtype}, expected a floating-point dtype")
        array = values
    elif isinstance(values, (list, tuple)):
        for v in values:
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f"{fn}: values must hold numbers, found {type(v).__name__}")
            if _checks.beyond_float(v):
                raise ValueError(f"{fn}: values holds a number too large for a float")
        array = np.asarray(values, dtype=np.float64)
    else:
        raise TypeError(f"{fn}: values must be a 1-D torch.Tensor, NumPy array, list or tuple, "
                        f"got {type(values).__name__}")
    if array.ndim != 1:
        raise ValueError(f"{fn}: values must be 1-D, got shape {tuple(array.shape)}")
    return array


def _rounded_inputs(array: np.ndarray, fmt: FloatFormat) -> Iterable[float]:
    """The values as Python floats, each rounded to ``fmt``."""
    as_floats = array.astype(np.float64, copy=False).tolist()
    if fmt is _FLOAT64:
        return as_floats
    return (fmt.round(v) for v in as_floats)


#: NumPy types whose element-by-element accumulate (cumsum) is a true sequential fold in the
#: storage format; checked against the plain loop in the tests.
_NUMPY_FOLD = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16}
_FOLD_CHUNK = 1 << 22


def sequential_sum(values, storage_dtype: torch.dtype = torch.float32) -> float:
    """Left-to-right sum with the running total stored in ``storage_dtype`` after every add.

    This is what a plain loop ``s += v`` with an accumulator of that type computes. Each value is
    first rounded to ``storage_dtype`` (as storing it there would). Sums of float64, float32 and
    float16 run through NumPy's element-by-element accumulate (fast: 2^26 values in about half a
    second); bfloat16 runs a Python loop.

    Args:
        values: a 1-D CPU tensor or NumPy array of floats, or a list/tuple of numbers.
        storage_dtype: torch.float64, float32, bfloat16 or float16.

    Returns:
        The sum as a Python float (a value of ``storage_dtype``); 0.0 for no values.
    """
    fmt = _storage_format("sequential_sum", storage_dtype)
    array = _host_array("sequential_sum", values)
    np_type = _NUMPY_FOLD.get(storage_dtype)
    if np_type is None:
        total = 0.0
        for v in _rounded_inputs(array, fmt):
            total = fmt.round(total + v)
        return total
    total = np_type(0)
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, array.size, _FOLD_CHUNK):
            chunk = array[start:start + _FOLD_CHUNK].astype(np_type)  # a copy, rounded
            # Carry the running total into the chunk's first element, then fold the chunk.
            chunk[0] = total + chunk[0]
            total = np.cumsum(chunk, dtype=np_type, out=chunk)[-1]
    return float(total)


def kahan_sum(values, storage_dtype: torch.dtype = torch.float32) -> float:
    """Kahan's compensated sum, with the sum and the compensation stored in ``storage_dtype``.

    Each step carries the rounding error of the previous add in a compensation term c and
    subtracts it from the next value (y = v - c; t = s + y; c = (t - s) - y; s = t), every
    operation rounded to ``storage_dtype``. The error stays near 2u * sum|v| instead of growing
    with the count, so even a bfloat16 accumulator tracks a long sum. Values are first rounded to
    ``storage_dtype``. Once the running sum overflows or meets Inf/NaN the compensation is dropped
    and the sum continues as IEEE addition would (Inf, or NaN for Inf - Inf).

    Args:
        values: a 1-D CPU tensor or NumPy array of floats, or a list/tuple of numbers.
        storage_dtype: torch.float64, float32, bfloat16 or float16.

    Returns:
        The sum s as a Python float (a value of ``storage_dtype``); 0.0 for no values.
    """
    fmt = _storage_format("kahan_sum", storage_dtype)
    rnd = fmt.round
    total, compensation, compensating = 0.0, 0.0, True
    for v in _rounded_inputs(_host_array("kahan_sum", values), fmt):
        if compensating:
            y = rnd(v - compensation)
            t = rnd(total + y)
            if math.isfinite(t):
                compensation = rnd(rnd(t - total) - y)
                total = t
                continue
            compensating = False
        total = rnd(total + v)
    return total


def neumaier_sum(values, storage_dtype: torch.dtype = torch.float32) -> float:
    """Neumaier's compensated sum (Kahan-Babuska), sum and compensation in ``storage_dtype``.

    Unlike Kahan's, it also captures the error when the new value is larger than the running
    sum (it compares magnitudes and takes the error of the smaller operand), and it adds the
    compensation once at the end. [1e8, 1, -1e8] in float32 gives 1 here and 0 with Kahan.
    Values are first rounded to ``storage_dtype``; overflow and Inf/NaN end the compensation as
    in :func:`kahan_sum`.

    Args:
        values: a 1-D CPU tensor or NumPy array of floats, or a list/tuple of numbers.
        storage_dtype: torch.float64, float32, bfloat16 or float16.

    Returns:
        s + c as a Python float (a value of ``storage_dtype``); 0.0 for no values.
    """
    fmt = _storage_format("neumaier_sum", storage_dtype)
    rnd = fmt.round
    total, compensation, compensating = 0.0, 0.0, True
    for v in _rounded_inputs(_host_array("neumaier_sum", values), fmt):
        t = rnd(total + v)
        if compensating and math.isfinite(t):
            if abs(total) >= abs(v):
                compensation = rnd(compensation + rnd(rnd(total - t) + v))
            else:
                compensation = rnd(compensation + rnd(rnd(v - t) + total))
        else:
            compensating = False
        total = t
    return rnd(total + compensation) if compensating else total


# --------------------------------------------------------------------------------------------
# TF32
# --------------------------------------------------------------------------------------------

def tf32_enabled() -> bool:
    """Whether float32 matmuls on CUDA may run on TF32 tensor cores (10-bit mantissa)."""
    matmul = torch.backends.cuda.matmul
    # Newer torch also has a per-backend setting, "tf32" / "ieee" / "none" (inherit).
    per_backend = str(getattr(matmul, "fp32_precision", "none")).lower()
    return (bool(matmul.allow_tf32)
            or torch.get_float32_matmul_precision() != "highest"
            or per_backend == "tf32")


def warn_if_tf32(*tensors: torch.Tensor, stacklevel: int = 2) -> bool:
    """Warn (``UserWarning``) when TF32 matmuls are enabled while float32 results are compared.

    With TF32 on, a "float32" matmul rounds its operands to 10 mantissa bits and is only good to
    about 1e-3 relative, which float32 tolerances would misread as a bug. With tensors given,
    warns only when all of them are float32 CUDA tensors (TF32 touches nothing else); with none,
    checks the setting alone. Set ``torch.backends.cuda.matmul.allow_tf32 = False`` (or
    ``torch.set_float32_matmul_precision("highest")``) before comparing.

    Returns:
        True when it warned.
    """
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"warn_if_tf32: argument {i} must be a torch.Tensor, got {type(t).__name__}")
    if tensors and not all(t.is_cuda and t.dtype == torch.float32 for t in tensors):
        return False
    if not tf32_enabled():
        return False
    warnings.warn(
        "float32 results are being compared while TF32 matmuls are enabled "
        f"(allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
        f"float32_matmul_precision={torch.get_float32_matmul_precision()!r}): matmuls round their "
        "inputs to 10 mantissa bits (~1e-3 relative error); set "
        "torch.backends.cuda.matmul.allow_tf32 = False to compare float32 as float32",
        UserWarning, stacklevel=stacklevel)
    return True
