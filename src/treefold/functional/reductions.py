"""Whole-tensor and last-dimension reductions: sum, mean, amax, amin, argmax, argmin, norm.

Every function reduces either the whole tensor (``dim=None``, in the tensor's logical
row-major order) or its last dimension (``dim=-1`` or ``x.ndim - 1``). Other dimensions raise
ValueError: move the dimension last first (``x.movedim(d, -1)``), which makes the copy visible.

Inputs are float32, bfloat16 or float16 (accumulated in float32), and for sum, amax, amin,
argmax and argmin also int32 and int64 (sums in int64, wrapping like torch).

Sums, means and norms follow the treefold order (``treefold.order``): the same bits on every
run, for every launch choice, on the GPU and on the CPU (the compiled kernel, the interpreted
kernel and the NumPy reference agree bit for bit; one exception: a float32 sum that is exactly
-0.0 comes out +0.0 under Triton's interpreter, whose ``tl.sum`` starts from +0.0), and no
atomics. Max and min are exact; their ties go to the lowest index and NaN wins (the first NaN),
as in torch.

Memory: a whole-tensor reduction of a non-contiguous tensor reduces a contiguous copy (one
extra read and write of the tensor); a last-dimension reduction reads rows in place when the
last dimension is contiguous and the rows are evenly strided (e.g. ``x[:, :n]`` of a wider
buffer), and copies otherwise. Offsets are 64-bit: tensors over 2^31 elements are fine.
"""
from __future__ import annotations

import math
import numbers

import torch

from .. import _checks
from .._ops import reduce as ops

__all__ = ["sum", "mean", "amax", "amin", "argmax", "argmin", "norm"]

_FLOATS = _checks.FLOAT_DTYPES
_INTS = (torch.int32, torch.int64)
_INDEX_DTYPES = (torch.int64, torch.int32)


def _dtype_name(d) -> str:
    return str(d).replace("torch.", "")


def _out_dtype(fn: str, dtype, default: torch.dtype, allowed) -> torch.dtype:
    if dtype is None:
        return default
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{fn}: dtype must be a torch.dtype or None, got {type(dtype).__name__}")
    if dtype not in allowed:
        raise TypeError(f"{fn}: dtype={_dtype_name(dtype)} is not supported for this input; "
                        f"expected one of {', '.join(_dtype_name(d) for d in allowed)}")
    return dtype


def _rows(fn: str, x: torch.Tensor, dim, keepdim) -> tuple[torch.Tensor, tuple]:
    """x as [rows, n] and the shape of the result."""
    _checks.flag(fn, "keepdim", keepdim)
    if dim is None:
        # the elements in logical order as one row: a view of a contiguous tensor, else a copy
        # (reshape alone can give a view whose last stride is not 1: x[:, :1], an expanded x)
        rows = x.view(1, x.numel()) if x.is_contiguous() else _checks.as_rows(x.reshape(-1))
        return rows, ((1,) * x.ndim if keepdim else ())
    d = _checks.dim(fn, dim, x.ndim)
    last = max(x.ndim, 1) - 1
    if d != last:
        raise ValueError(f"{fn}: dim={dim} is not supported; only the last dimension (dim=-1 or dim={last}) "
                         f"or dim=None (the whole tensor) is; move it last first, e.g. x.movedim({dim}, -1)")
    shape = () if x.ndim == 0 else tuple(x.shape[:-1]) + ((1,) if keepdim else ())
    if x.numel() == 0:  # (nothing is read: rows of the right shape whatever x's strides, in x's graph)
        return x.as_strided((math.prod(x.shape[:-1]), x.shape[-1]), (max(x.shape[-1], 1), 1)), shape
    return _checks.as_rows(x), shape


def _preparation(key, x: torch.Tensor, x2: torch.Tensor, shape: tuple, dtype: torch.dtype,
                 result: int = 0):
    """What an eager call passes down to keep its launches under ``key`` (``ops.Preparation``),
    or None: no key, or rows that are not the caller's contiguous tensor itself (a copy, or a
    strided view: a prepared call passes the caller's tensor)."""
    if key is None or not x.is_contiguous() or x2.data_ptr() != x.data_ptr():
        return None
    return ops.Preparation(key, shape, dtype, result)


def _not_empty(fn: str, x: torch.Tensor, x2: torch.Tensor, dim) -> None:
    if x2.shape[1] == 0:
        what = "an empty tensor" if dim is None else f"an empty dimension (dim={dim})"
        raise ValueError(f"{fn}: cannot reduce {what} of x with shape {tuple(x.shape)}: "
                         f"it has no identity (torch raises too)")


def sum(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None,
        accurate: bool = False) -> torch.Tensor:
    """Sum of all elements (``dim=None``) or along the last dimension, in the treefold order.

    Args:
        x: float32, bfloat16, float16, int32 or int64 tensor.
        dim: None (the whole tensor) or the last dimension.
        keepdim: keep the reduced dimension(s) with size 1.
        dtype: result dtype. Floats accumulate in float32 and default to x's dtype (rounded
            once from float32); ``dtype=torch.float32`` returns the float32 sum itself. Integers
            accumulate in int64 and default to int64 (int32 wraps, like torch).
        accurate: return the correctly rounded sum (float inputs): the same trees in float64
            double-double arithmetic (every add an error-free TwoSum, its error kept in a
            second word), rounded once at the end to the result dtype.

    Default: the same bits as ``treefold.order.reference_sum`` on every device, run and launch.
    The error is at most D * 2^-24 * sum|x_i| / (1 - D * 2^-24), D = the adds per element
    (``order.pairwise_error_bound``).

    With ``accurate=True`` every input is converted to float64 and every add, inside the 16-byte
    groups (4 float32, or 8 bfloat16 / float16) and after them, is an error-free TwoSum on
    unevaluated pairs (s, c). The pair s + c is the exact sum whenever every input is a multiple
    of a power of two q with sum|x_i| < 2^106 / D * q, D the adds an element passes through (at
    most 36 below 2^36 elements; 64 is used below): every TwoSum is exact, and every error word
    is a multiple of q below 2^53 q, so adding them is exact too. A float32 value m is a multiple
    of 2^-24 m, so this covers all data whose nonzero magnitudes span less than a factor
    2^(76 - log2 N) (2^50 for N = 2^26; cancellation such as 1e8 + 1.5e-7 - 1e8 included), and
    the result is the float32 nearest the exact sum, ties to even. Beyond that condition,
    |s + c - exact| <= 2 D^2 2^-106 * sum|x_i|, and the result is still the nearest float32
    unless the exact sum lies that close to a midpoint between two float32 values.
    (``treefold._ops.reduce.ACCURATE_EXACT_GROUPS = False`` adds inside the groups in plain
    float64 instead: exact only while a group's nonzero magnitudes span less than 2^27 for
    float32 (2^42 bfloat16, 2^39 float16); at 2^28 float32 on the H200 it took 0.99x-1.02x the
    default sum's time where TwoSum groups took 1.06x; see benchmarks/NOTES.md.)
    A bfloat16 or float16 result is rounded once too: the float32 step is taken by round-to-odd
    (the neighbour with an odd last bit wherever the sum is not a float32), which rounds to 16
    bits exactly as the sum itself would, so the result is the 16-bit value nearest the sum (not
    a rounding of the nearest float32: [1, 2^-8, 2^-30] in bfloat16 sums to 1.0078125, where
    rounding 1.00390625 again would give 1.0). Empty: 0.
    """
    fn = "sum"
    key = ops.prepared_key(fn, x, dim, keepdim, dtype, accurate)
    prepared, result = ops.prepared_call(key, x)
    if result is not None:
        return result
    _checks.tensor(fn, "x", x, _FLOATS + _INTS)
    _checks.flag(fn, "accurate", accurate)
    integer = x.dtype in _INTS
    out = _out_dtype(fn, dtype, torch.int64 if integer else x.dtype, _INTS if integer else _FLOATS)
    x2, shape = _rows(fn, x, dim, keepdim)
    kind = "sum_accurate" if accurate and not integer else "sum"
    prepare = None if prepared else _preparation(key, x, x2, shape, out)
    return ops.sum_rows(x2, kind, out, prepare).reshape(shape)


def mean(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None,
         accurate: bool = False) -> torch.Tensor:
    """Mean of all elements (``dim=None``) or along the last dimension.

    The float32 treefold sum divided by the element count in float64 and rounded once to
    float32 (then to ``dtype``, default x's dtype). With ``accurate=True`` the dividend is the
    float64 nearest the accurate sum's pair instead, and the float64 quotient is rounded once to
    the result dtype, 16-bit ones included (as ``sum``'s). Empty: NaN, like torch.

    Args:
        x: float32, bfloat16 or float16 tensor.
        dim, keepdim: as in ``sum``.
        dtype: float32, bfloat16 or float16 result.
        accurate: divide the accurate sum (see ``sum``).
    """
    fn = "mean"
    key = ops.prepared_key(fn, x, dim, keepdim, dtype, accurate)
    prepared, result = ops.prepared_call(key, x)
    if result is not None:
        return result
    _checks.tensor(fn, "x", x, _FLOATS)
    _checks.flag(fn, "accurate", accurate)
    out = _out_dtype(fn, dtype, x.dtype, _FLOATS)
    x2, shape = _rows(fn, x, dim, keepdim)
    prepare = None if prepared else _preparation(key, x, x2, shape, out)
    return ops.sum_rows(x2, "mean_accurate" if accurate else "mean", out, prepare).reshape(shape)


def _extreme(fn: str, x, dim, keepdim, dtype, is_max: bool, want_index: bool):
    key = ops.prepared_key(fn, x, dim, keepdim, dtype)
    prepared, result = ops.prepared_call(key, x)
    if result is not None:
        return result
    _checks.tensor(fn, "x", x, _FLOATS + _INTS)
    if want_index:
        out = _out_dtype(fn, dtype, torch.int64, _INDEX_DTYPES)
    else:
        out = _out_dtype(fn, dtype, x.dtype, _INTS if x.dtype in _INTS else _FLOATS)
    x2, shape = _rows(fn, x, dim, keepdim)
    _not_empty(fn, x, x2, dim)
    if want_index and out == torch.int32 and x2.shape[1] > 2**31 - 1:
        raise ValueError(f"{fn}: dtype=int32 cannot hold indices of {x2.shape[1]} elements; use int64")
    # (a prepared call returns the kernel's output itself: only where no conversion follows)
    natural = torch.int64 if want_index else x.dtype
    prepare = None if prepared or out != natural else _preparation(key, x, x2, shape, out, int(want_index))
    values, indices = ops.extremes(x2, is_max, prepare=prepare)
    result = indices if want_index else values
    return result.to(out).reshape(shape)


def amax(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    """Maximum of all elements (``dim=None``) or along the last dimension.

    NaN propagates. The value returned is the element ``argmax`` picks, so equal values
    (-0.0 and +0.0) give the first one. The gradient goes to that element only. Empty: raises.

    Args:
        x: float32, bfloat16, float16, int32 or int64 tensor.
        dim, keepdim: as in ``sum``.
        dtype: result dtype (default x's; floats for float inputs, integers for integer ones).
    """
    return _extreme("amax", x, dim, keepdim, dtype, True, False)


def amin(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    """Minimum of all elements or along the last dimension; the counterpart of ``amax``."""
    return _extreme("amin", x, dim, keepdim, dtype, False, False)


def argmax(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    """Index of the maximum of the flattened tensor (``dim=None``) or of each last-dim row.

    Ties go to the lowest index; a NaN is larger than everything (the first NaN's index), as
    in torch. Empty: raises.

    Args:
        x: float32, bfloat16, float16, int32 or int64 tensor.
        dim, keepdim: as in ``sum``.
        dtype: int64 (default) or int32.
    """
    return _extreme("argmax", x, dim, keepdim, dtype, True, True)


def argmin(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    """Index of the minimum; ties to the lowest index, the first NaN wins (as in torch)."""
    return _extreme("argmin", x, dim, keepdim, dtype, False, True)


def norm(x: torch.Tensor, dim=None, keepdim: bool = False, *, dtype=None, ord=2) -> torch.Tensor:
    """Vector norm of all elements (``dim=None``) or along the last dimension.

    Args:
        x: float32, bfloat16 or float16 tensor.
        dim, keepdim: as in ``sum``.
        dtype: float32, bfloat16 or float16 result (default x's dtype).
        ord: 2 (default): the correctly rounded square root of the treefold float32 sum of
            float32 squares (each square rounded on its own; no scaling, so sums of squares
            above 3.4e38 overflow to inf); 1: the treefold sum of |x|; ``math.inf``: max |x|.

    Same bits as the reference on every device for ord 1 and 2. Empty: 0 (ord 1, 2); ord inf
    raises, like torch. The gradient of ord inf goes to the first element of largest |x| only,
    as ``amax``'s does (torch shares it among the ties).
    """
    fn = "norm"
    key = ops.prepared_key(fn, x, dim, keepdim, dtype, ord)
    prepared, result = ops.prepared_call(key, x)
    if result is not None:
        return result
    _checks.tensor(fn, "x", x, _FLOATS)
    if isinstance(ord, bool) or not isinstance(ord, numbers.Real):
        raise TypeError(f"norm: ord must be 1, 2 or math.inf, got {type(ord).__name__}")
    if ord not in (1, 2, math.inf):
        raise ValueError(f"norm: ord must be 1, 2 or math.inf, got {ord!r}")
    out = _out_dtype(fn, dtype, x.dtype, _FLOATS)
    x2, shape = _rows(fn, x, dim, keepdim)
    if ord == math.inf:
        _not_empty(fn, x, x2, dim)
        prepare = None if prepared or out != x.dtype else _preparation(key, x, x2, shape, out)
        values, _ = ops.extremes(x2, True, absolute=True, prepare=prepare)
        return values.to(out).reshape(shape)
    prepare = None if prepared else _preparation(key, x, x2, shape, out)
    return ops.sum_rows(x2, "norm2" if ord == 2 else "norm1", out, prepare).reshape(shape)
