"""Argument validation shared by the public functions.

Every message names the function, the argument and what was seen, e.g.
``rms_norm: weight has 4095 elements, expected 4096 (x.shape[-1])``. Errors are TypeError for a
wrong kind of value (not a tensor, wrong dtype) and ValueError for a wrong value (shape, range,
device).
"""
from __future__ import annotations

import math
import numbers
import operator
from typing import Iterable, Optional

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Python floats the kernels take as float32 round to inf from FLOAT32_OVERFLOW up (the midpoint
#: above float32's largest, a tie that goes to inf) and to 0 up to FLOAT32_ZERO (half the smallest
#: subnormal): checks of such arguments test the values the kernels will see.
FLOAT32_OVERFLOW = 2.0 ** 128 - 2.0 ** 103
FLOAT32_ZERO = 2.0 ** -150


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def tensor(fn: str, name: str, value, dtypes=FLOAT_DTYPES) -> torch.Tensor:
    """Check that ``value`` is a tensor of one of ``dtypes``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(value).__name__}")
    if dtypes is not None and value.dtype not in dtypes:
        raise TypeError(f"{fn}: {name} has dtype {str(value.dtype).replace('torch.', '')}, "
                        f"expected one of {_dtype_names(dtypes)}")
    if value.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{fn}: {name} is on {value.device}; treefold runs on cuda and cpu tensors")
    if value.layout is not torch.strided:
        raise TypeError(f"{fn}: {name} is a {str(value.layout).replace('torch.', '')} tensor; treefold takes "
                        f"dense (strided) tensors")
    return value


def same_device(fn: str, name: str, value: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """treefold never moves data between devices: inputs must already share one."""
    if value.device != ref.device:
        raise ValueError(f"{fn}: {name} is on {value.device}, but {ref_name} is on {ref.device}; "
                         f"move it first (treefold never copies between devices)")


def dim(fn: str, value: int, ndim: int, name: str = "dim") -> int:
    """Normalise a dimension index (negative allowed) for a tensor of ``ndim`` dimensions."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__}")
    value = operator.index(value)
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    if not lo <= value <= hi:
        raise ValueError(f"{fn}: {name}={value} is out of range for a tensor with {ndim} dimension(s) "
                         f"(expected {lo} to {hi})")
    return value % max(ndim, 1)


def flag(fn: str, name: str, value, *, optional: bool = False):
    """A Python bool, or with ``optional`` also None (a NumPy bool is named as such: its type is
    also called "bool")."""
    # type(), not value.__class__: under torch.compile, torch 2.11's Dynamo takes a constant's
    # __class__ for another object, and every bool would be refused
    if type(value) is not bool and not (optional and value is None):
        kind = type(value)
        shown = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
        wanted = "a bool or None" if optional else "a bool"
        raise TypeError(f"{fn}: {name} must be {wanted}, got {shown}")
    return value


def beyond_float(value) -> bool:
    """Whether ``value`` is an int or fraction too large for a float: ``float()`` of it raises
    OverflowError, a message that names no argument, so the callers refuse it first."""
    return isinstance(value, numbers.Rational) and abs(value) >= _FLOAT_OVERFLOW


#: 2^1024: an int or fraction of at least this magnitude has no float (float() overflows).
_FLOAT_OVERFLOW = 2 ** 1024


def finite_float(fn: str, name: str, value, *, low=None, high=None, low_open=False) -> float:
    """A finite Python number inside [low, high] (or (low, high] with ``low_open``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fn}: {name} must be a number, got {type(value).__name__}")
    if beyond_float(value):
        raise ValueError(f"{fn}: {name} must be finite, got a number too large for a float")
    v = float(value)
    # comparisons, not math.isfinite: traced by torch.compile, a float argument that changed
    # between calls arrives symbolic, and a comparison is a guard where isfinite is a graph break
    if not -math.inf < v < math.inf:  # (NaN fails too)
        raise ValueError(f"{fn}: {name} must be finite, got {value}")
    if low is not None and (v < low or (low_open and v == low)):
        raise ValueError(f"{fn}: {name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and v > high:
        raise ValueError(f"{fn}: {name} must be <= {high}, got {value}")
    return v


def last_dim_contiguous(t: torch.Tensor) -> bool:
    return t.ndim == 0 or t.stride(-1) == 1 or t.shape[-1] <= 1


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """View ``t`` as [rows, n] without copying when the rows are evenly strided and the last dim
    contiguous; otherwise a contiguous copy (documented by callers as such)."""
    n = t.shape[-1] if t.ndim else 1
    if t.ndim <= 1:
        # (not reshape: a strided vector would come back a view whose last stride is not 1)
        return t.view(1, n) if t.ndim == 0 or n <= 1 or t.stride(0) == 1 else t.contiguous().view(1, n)
    if last_dim_contiguous(t):
        try:
            return t.view(-1, n) if t.is_contiguous() else _strided_rows(t, n)
        except RuntimeError:
            pass
    return t.contiguous().view(-1, n)


def _strided_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    # Rows evenly spaced in memory (e.g. x[:, :n] of a wider buffer) can be viewed as 2-D
    # with a row stride, no copy. Leading dims must collapse into one stride.
    rows, stride = row_stride(t)
    if stride is None:
        raise RuntimeError("rows not evenly strided")
    return t.as_strided((rows, n), (stride if rows > 1 else max(n, 1), 1))


def row_stride(t: torch.Tensor) -> tuple[int, Optional[int]]:
    """(rows, the stride in elements from one row of the last dimension to the next) of ``t``,
    the stride None where its leading dimensions do not collapse into one (0 for one row).
    Dimensions of one entry are left out: their strides mean nothing (a [B, 1, T, K] slice
    may carry any stride on its 1)."""
    rows = math.prod(t.shape[:-1])
    if rows <= 1:
        return rows, 0
    inner, stride = 1, 0  # rows of the dimensions taken so far, innermost first
    for extent, s in reversed([(e, s) for e, s in zip(t.shape[:-1], t.stride()[:-1]) if e > 1]):
        if inner == 1:
            stride = s
        elif s != stride * inner:  # each must step over the ones inside it
            return rows, None
        inner *= extent
    return rows, stride
