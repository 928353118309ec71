"""Pure NumPy / torch references for the reductions family, and exact sums to judge them.

The sums follow the treefold order exactly (``treefold.order.reference_sum``), so the kernels
give the same bits; the accurate sum mirrors the kernels' double-double arithmetic operation
for operation. ``exact_sum`` and ``round_to_float32`` compute the exact sum of float values
(a ``Fraction``) and the float32 nearest to it, the yardstick of ``accurate=True``.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch

from .. import order

__all__: list[str] = []

_SUM_KINDS = ("sum", "sum_accurate", "mean", "mean_accurate", "norm1", "norm2")


def _as_float32(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu").float().numpy()
    return np.asarray(x, dtype=np.float32)


# ---- double-double arithmetic, as in treefold.kernels.reduce -------------------------------

def _two_sum(a: np.ndarray, b: np.ndarray):
    s = a + b
    b_virtual = s - a
    a_virtual = s - b_virtual
    return s, (a - a_virtual) + (b - b_virtual)


def _dd_add(s_a, c_a, s_b, c_b):
    s, e = _two_sum(s_a, s_b)
    return s, (c_a + c_b) + e


def _dd_halving_tree(s: np.ndarray, c: np.ndarray):
    w = s.shape[-1]
    while w > 1:
        w //= 2
        s, c = _dd_add(s[..., :w], c[..., :w], s[..., w:], c[..., w:])
    return s[..., 0], c[..., 0]


def _dd_level(s_in: np.ndarray, c_in: np.ndarray, group_width: int, exact_groups: bool):
    """One level of the order over the last axis with float64 pairs: [..., N] -> [..., S]."""
    n = s_in.shape[-1]
    lanes, segments = order.lanes(n), order.num_segments(n)

    def shape(a):
        if segments * lanes != n:
            a = np.concatenate([a, np.zeros(a.shape[:-1] + (segments * lanes - n,))], axis=-1)
        return a.reshape(a.shape[:-1] + (segments, lanes // group_width, group_width))

    s, c = shape(s_in), shape(c_in)
    w = group_width
    while w > 1:
        w //= 2
        if exact_groups:
            s, c = _dd_add(s[..., :w], c[..., :w], s[..., w:], c[..., w:])
        else:
            s, c = s[..., :w] + s[..., w:], c[..., :w]
    return _dd_halving_tree(s[..., 0], c[..., 0])


def accurate_sum_parts(x, axis: int = -1, exact_groups: bool = True, dtype=None):
    """The unevaluated pair (s, c), float64, of the accurate sum along ``axis``: the treefold
    order (groups of the input ``dtype``, default x's) with double-double arithmetic, TwoSum
    inside the groups too with ``exact_groups``, as the kernels compute it."""
    if isinstance(x, torch.Tensor):
        dtype = x.dtype if dtype is None else dtype
    a = np.moveaxis(_as_float32(x), axis, -1)
    dtype = np.float32 if dtype is None else dtype
    if a.shape[-1] == 0:
        zero = np.zeros(a.shape[:-1])
        return zero, zero.copy()
    s = a.astype(np.float64)
    c = np.full_like(s, -0.0)  # the kernels start c at -0.0, the exact identity of addition
    with np.errstate(invalid="ignore", over="ignore"):
        s, c = _dd_level(s, c, order.group(s.shape[-1], dtype), exact_groups)
        while s.shape[-1] > 1:
            s, c = _dd_level(s, c, 1, True)
    return s[..., 0], c[..., 0]


def double_double_to_float32(s: np.ndarray, c: np.ndarray, round_to_odd: bool = False) -> np.ndarray:
    """The float32 nearest to s + c (ties to even), by round-to-odd; as the kernel does. With
    ``round_to_odd`` the float32 round-to-odd of s + c instead (``float32_round_to_odd``), which a
    16-bit result rounds once more."""
    s = np.asarray(s, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        hi, lo = _two_sum(s, c)
        zero_c = c == 0
        hi = np.where(zero_c, s, hi)
        lo = np.where(zero_c, 0.0, lo)
        bits = np.asarray(hi, dtype=np.float64).view(np.int64)
        step = np.where((lo > 0) == (hi > 0), 1, -1).astype(np.int64)
        bits = np.where((lo != 0) & ((bits & 1) == 0), bits + step, bits)
        odd = np.asarray(bits, dtype=np.int64).view(np.float64)
        rounded = float32_round_to_odd(odd) if round_to_odd else odd.astype(np.float32)
        return np.where(np.abs(s) < np.inf, rounded, s.astype(np.float32))


def float32_round_to_odd(v: np.ndarray) -> np.ndarray:
    """float64 -> float32 by round-to-odd, as the kernels' ``combine.float32_round_to_odd``: v's
    nearest float32 when that is v (or infinite), else the neighbour of v with an odd last bit.
    Converted to 16 bits (to nearest even), the result is the 16-bit value nearest v."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        f = v.astype(np.float32)
        bits = np.asarray(f, dtype=np.float32).view(np.int32).astype(np.int64)
        rest = v - f.astype(np.float64)  # exact
        step = np.where((rest > 0) == (bits >= 0), 1, -1)
        inexact = (rest != 0) & (np.abs(f) < np.inf)
        bits = np.where(inexact & ((bits & 1) == 0), bits + step, bits)
        return np.asarray(bits.astype(np.int32), dtype=np.int32).view(np.float32)


def accurate_sum(x, axis: int = -1, exact_groups: bool = True, dtype=None, round_to_odd: bool = False) -> np.ndarray:
    """``sum(x, accurate=True)`` along ``axis``: float32, the same bits as the kernel (with
    ``round_to_odd``, the float32 that a 16-bit result is rounded from)."""
    s, c = accurate_sum_parts(x, axis, exact_groups, dtype)
    return double_double_to_float32(s, c, round_to_odd)


def accurate_mean(x, axis: int = -1, dtype=None, exact_groups: bool = True, round_to_odd: bool = False) -> np.ndarray:
    """``mean(x, accurate=True)``: fl64(s + c) / n in float64, rounded once to float32 (with
    ``round_to_odd``, to the float32 round-to-odd that a 16-bit result is rounded from)."""
    if isinstance(x, torch.Tensor):
        dtype = x.dtype if dtype is None else dtype
    a = _as_float32(x)
    n = a.shape[axis]
    if n == 0:
        return np.full(np.delete(a.shape, axis % max(a.ndim, 1)), np.nan, dtype=np.float32)
    s, c = accurate_sum_parts(a, axis, exact_groups, dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        hi = np.where(c == 0, s, s + c)
        quotient = hi / np.float64(n)
        mean = float32_round_to_odd(quotient) if round_to_odd else quotient.astype(np.float32)
        return np.where(np.abs(s) < np.inf, mean, s.astype(np.float32))


# ---- exact sums: the yardstick of accurate=True --------------------------------------------

def exact_sum(x) -> Fraction:
    """The exact sum of finite float32 values (or bfloat16 / float16 ones, widened exactly), as
    a Fraction.

    Each value is m * 2^k with an integer m of at most 24 bits; the m of each exponent k are
    summed in int64 (exact for up to 2^39 values) and the per-exponent totals combined with
    Python integers. Vectorised: 2^28 values take seconds.
    """
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu")
        if x.dtype == torch.float64:
            x = x.numpy()
        else:
            x = x.float().numpy()
    a = np.asarray(x).ravel()
    if a.dtype != np.float32:
        as32 = a.astype(np.float32)
        if not np.array_equal(as32.astype(a.dtype), a, equal_nan=True):
            raise ValueError(f"exact_sum: expected float32 values, got {a.dtype} values that are not all float32")
        a = as32
    if not np.all(np.isfinite(a)):
        raise ValueError("exact_sum: the values must be finite")
    a = a[a != 0].astype(np.float64)
    if a.size == 0:
        return Fraction(0)
    mant, expo = np.frexp(a)
    m = (mant * float(1 << 24)).astype(np.int64)
    k = expo.astype(np.int64) - 24
    order_k = np.argsort(k, kind="stable")
    k_sorted, m_sorted = k[order_k], m[order_k]
    starts = np.flatnonzero(np.r_[True, k_sorted[1:] != k_sorted[:-1]])
    totals = np.add.reduceat(m_sorted, starts)
    exps = k_sorted[starts]
    k_min = int(exps.min())
    total = 0
    for t, e in zip(totals.tolist(), exps.tolist()):
        total += int(t) << (int(e) - k_min)
    return Fraction(total) * (Fraction(2) ** k_min)


_F32_MAX = Fraction(float(np.finfo(np.float32).max))
_F32_OVERFLOW = _F32_MAX + Fraction(2) ** 103  # half an ulp above the largest float32


def round_to_float32(q: Fraction) -> np.float32:
    """The float32 nearest to the rational ``q``, ties to even (overflow to +-inf)."""
    if abs(q) >= _F32_OVERFLOW:
        return np.float32(math.copysign(math.inf, q))
    guess = np.float32(float(q))  # float(Fraction) is correctly rounded; float32() may double-round
    best = None
    for cand in (np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))):
        if not np.isfinite(cand):
            continue
        dist = abs(Fraction(float(cand)) - q)
        key = (dist, int(np.array(cand).view(np.int32)) & 1)
        if best is None or key < best[0]:
            best = (key, cand)
    return np.float32(best[1])


def correctly_rounded_sum(x) -> np.float32:
    """The float32 nearest to the exact sum of ``x`` (ties to even)."""
    return round_to_float32(exact_sum(x))


def fsum_float32(values) -> np.float32:
    """The float32 nearest to the exact sum of ``values`` using only ``math.fsum``.

    fsum gives s1, the float64 nearest the exact sum; fsum of the values and -s1 gives the sign
    of the remainder. A float32 midpoint is a float64, so only when s1 is one does the remainder
    decide the side: the round-to-odd step does exactly that.
    """
    vals = [float(v) for v in _as_float32(values).ravel()]
    s1 = math.fsum(vals)
    if not math.isfinite(s1):
        return np.float32(s1)
    rest = math.fsum(vals + [-s1])
    return np.float32(double_double_to_float32(np.float64(s1), np.float64(rest)))


def reference_sum_chunked(x: torch.Tensor, chunk_segments: int = 1 << 14) -> np.float32:
    """``order.reference_sum`` of all elements of ``x`` (any device, float dtype), computed a
    chunk of whole segments at a time so that only one chunk is ever widened to float32 on the
    host: for tensors too large to copy at once (over 2^31 elements)."""
    flat = x.reshape(-1)
    n = flat.numel()
    if n == 0:
        return np.float32(0.0)
    lanes, group = order.lanes(n), order.group(n, x.dtype)
    step = chunk_segments * lanes
    parts = []
    for start in range(0, n, step):
        chunk = flat[start:start + step].to("cpu").float().numpy()
        segments = order.cdiv(chunk.size, lanes)
        if segments * lanes != chunk.size:
            chunk = np.concatenate([chunk, np.zeros(segments * lanes - chunk.size, dtype=np.float32)])
        parts.append(order.grouped_tree(chunk.reshape(segments, lanes), group))
    partials = np.concatenate(parts)
    # The segment results are reduced with groups of one lane: a "dtype" of 16 bytes per element.
    return np.float32(order.reference_sum(partials, dtype=16)) if partials.size > 1 else partials[0]


# ---- the references the kernels are tested against ----------------------------------------

def sum_rows(x: torch.Tensor, kind: str, out_dtype: torch.dtype, exact_groups: bool = True) -> torch.Tensor:
    """``kind`` of each row of the 2-D ``x`` as the kernels compute it, as ``out_dtype``.

    kind: "sum", "mean" (float32 sum in the order, divided by n in float64, rounded once),
    "sum_accurate", "mean_accurate", "norm1" (sum of |x|), "norm2" (correctly rounded square
    root of the float32 sum of float32 squares). Integer inputs sum in int64.
    """
    if kind not in _SUM_KINDS:
        raise ValueError(f"sum_rows: unknown kind {kind!r}, expected one of {_SUM_KINDS}")
    rows, n = x.shape
    if not x.dtype.is_floating_point:
        return torch.sum(x.to(torch.int64), dim=1).to(out_dtype)
    if rows == 0:
        return torch.empty(0, dtype=out_dtype, device=x.device)
    if n == 0:
        fill = float("nan") if kind.startswith("mean") else 0.0
        return torch.full((rows,), fill, dtype=out_dtype, device=x.device)
    a = _as_float32(x)
    dt = x.dtype  # the dtype the kernel reads sets the group width
    # the accurate kinds give a 16-bit result the float32 round-to-odd value to round (once)
    odd = out_dtype.itemsize == 2
    with np.errstate(invalid="ignore", over="ignore"):
        if kind == "sum":
            r = order.reference_sum(a, dtype=dt)
        elif kind == "sum_accurate":
            r = accurate_sum(a, exact_groups=exact_groups, dtype=dt, round_to_odd=odd)
        elif kind == "mean":
            r = (order.reference_sum(a, dtype=dt).astype(np.float64) / np.float64(n)).astype(np.float32)
        elif kind == "mean_accurate":
            r = accurate_mean(a, dtype=dt, exact_groups=exact_groups, round_to_odd=odd)
        elif kind == "norm1":
            r = order.reference_sum(np.abs(a), dtype=dt)
        else:
            r = np.sqrt(order.reference_sum(a * a, dtype=dt))
    return torch.from_numpy(np.ascontiguousarray(r, dtype=np.float32)).to(device=x.device, dtype=out_dtype)


def extreme_rows(x: torch.Tensor, is_max: bool, absolute: bool = False):
    """(values, int64 indices) of the max / min of each row of the 2-D ``x``: the first NaN if
    a row has one, else the first occurrence of the extreme value (NumPy's rule too)."""
    rows, n = x.shape
    if n == 0:
        raise ValueError(f"extreme_rows: cannot reduce rows of length 0 (x has shape {tuple(x.shape)})")
    v = x.abs() if absolute else x
    a = v.detach().to("cpu")
    a = a.float().numpy() if a.dtype.is_floating_point else a.numpy()
    idx = np.argmax(a, axis=1) if is_max else np.argmin(a, axis=1)
    indices = torch.from_numpy(idx.astype(np.int64)).to(x.device)
    if v.dtype.is_floating_point:
        # gather the raw bits: torch's CPU gather may rewrite a half-precision NaN's payload
        as_int = {2: torch.int16, 4: torch.int32}[v.element_size()]
        values = v.view(as_int).gather(1, indices[:, None])[:, 0].view(v.dtype)
    else:
        values = v.gather(1, indices[:, None])[:, 0]
    return values, indices
