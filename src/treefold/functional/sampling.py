"""Next-token sampling and the sampling filters, without sorting the vocabulary.

``sample`` draws one token per row from ``softmax(logits / temperature)`` restricted by top-k,
top-p and min-p; ``top_k`` returns the k largest values and their indices; ``top_k_mask``,
``top_p_mask`` and ``min_p_mask`` return masked logits or renormalised probabilities for code
that samples elsewhere. All of them order the tokens of a row by logit descending, then index
ascending (ties go to the lowest index; -0.0 equals +0.0), and keep a prefix of that order.

CUDA tensors run the Triton kernels (``treefold.kernels.sampling`` explains the method); CPU
tensors run the same kernels interpreted under ``TRITON_INTERPRET=1``, otherwise the reference
(``treefold.reference.sampling``), which gives the same tokens except where a filter's boundary
lies within float32 rounding of a token (the reference decides the filters in float64; see
``sample``).

Python scalars are checked here and raise TypeError / ValueError (an eager CUDA ``sample`` call
of a kind of arguments checked before skips the checks: ``_validated_kind``); a temperature or
p is checked as it rounds to float32, the kernels' precision (one that overflows it, or a p that
rounds to 0, is out of range; a temperature that rounds to 0 is greedy). Tensor arguments on the GPU
are never read back to the host (that would stall the GPU and break CUDA graphs): a row whose own
parameter is out of range samples -1 (a mask keeps nothing in it), as does a row without a
finite logit. On the CPU the values are on the host already: a per-row parameter out of range
raises ValueError naming the rows, and so does a row without a finite logit (inside
torch.compile nothing is read back, and such rows give the GPU's results).
"""
from __future__ import annotations

import numbers
import operator

from typing import Union

import torch

from .. import _checks
from .._ops import sampling as _ops

__all__ = ["sample", "top_k", "top_k_mask", "top_p_mask", "min_p_mask"]

Number = Union[int, float]
_FLOAT_PARAMS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_INT_PARAMS = (torch.int64, torch.int32)
_INT64_MIN, _UINT64_END = -(1 << 63), 1 << 64
#: Python floats above 1 that round to 1.0 in float32 lie below 1 + 2^-24 (the tie, which goes to
#: the even 1.0, included).
_JUST_ABOVE_ONE = 1.0 + 2.0 ** -24 + 2.0 ** -52


def _dtype_name(d) -> str:
    return str(d).replace("torch.", "")


def _logits(fn: str, name: str, x) -> tuple[torch.Tensor, tuple]:
    """x as [rows, n] (a view when the rows are evenly strided) and the batch shape."""
    _checks.tensor(fn, name, x)
    if x.ndim == 0:
        raise ValueError(f"{fn}: {name} must have at least one dimension (the vocabulary), "
                         f"got a 0-d tensor")
    n = x.shape[-1]
    if n == 0:
        raise ValueError(f"{fn}: {name} has an empty last dimension (shape {tuple(x.shape)}); "
                         f"there is no token to choose")
    if n > _ops.MAX_ROW:
        raise ValueError(f"{fn}: {name} has {n} entries in its last dimension; rows longer than "
                         f"{_ops.MAX_ROW} (2^20) are not supported")
    return _checks.as_rows(x), tuple(x.shape[:-1])


def _same_device(fn: str, name: str, value: torch.Tensor, device) -> None:
    if value.device != device:
        raise ValueError(f"{fn}: {name} is on {value.device}, but logits is on {device}; move it "
                         f"first (treefold never copies between devices)")


def _row_shapes(batch: tuple, rows: int) -> str:
    """The shapes a per-row parameter may have, in words."""
    if batch == (rows,):
        return f"one element or ({rows},) (one per row of logits)"
    return f"one element, {batch} (the batch shape of logits) or ({rows},)"


def _per_row(fn: str, name: str, value: torch.Tensor, rows: int, batch: tuple, device,
             dtypes, to: torch.dtype, allow_single: bool = True) -> torch.Tensor:
    """A tensor parameter as a contiguous [rows] tensor of dtype ``to`` (one element broadcasts)."""
    _checks.tensor(fn, name, value, dtypes)  # (and dense: a sparse tensor has no reshape)
    _same_device(fn, name, value, device)
    if value.numel() == 1 and allow_single:
        flat = value.reshape(1)
        return flat.to(to).expand(rows).contiguous() if rows != 1 else flat.to(to).contiguous()
    if value.numel() != rows or tuple(value.shape) not in (batch, (rows,)):
        raise ValueError(f"{fn}: {name} has shape {tuple(value.shape)}, expected {_row_shapes(batch, rows)}")
    return value.reshape(rows).to(to).contiguous()


def _temperature(fn: str, value, rows, batch, device):
    if isinstance(value, torch.Tensor):
        return _per_row(fn, "temperature", value, rows, batch, device, _FLOAT_PARAMS, torch.float32)
    v = _checks.finite_float(fn, "temperature", value, low=0.0)
    if v >= _checks.FLOAT32_OVERFLOW:  # (the kernels take temperature, p and min_p as float32)
        raise ValueError(f"{fn}: temperature={value} overflows float32, in which the kernels take it")
    return 0.0 if v <= _checks.FLOAT32_ZERO else v  # (what the kernels would see: greedy, drawing nothing)


def _k(fn: str, name: str, value, n: int, rows, batch, device, *, optional: bool = True):
    if value is None and optional:
        return None
    if isinstance(value, torch.Tensor):
        return _per_row(fn, name, value, rows, batch, device, _INT_PARAMS, torch.int64)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        kinds = "an int, a tensor or None" if optional else "an int or a tensor"
        raise TypeError(f"{fn}: {name} must be {kinds}, got {type(value).__name__}")
    value = operator.index(value)
    if not 1 <= value <= n:
        raise ValueError(f"{fn}: {name}={value} is out of range for {n} tokens "
                         f"(expected 1 <= {name} <= {n})")
    return value


def _p(fn: str, name: str, value, rows, batch, device, *, low_open: bool, optional: bool = True):
    if value is None and optional:
        return None
    if isinstance(value, torch.Tensor):
        return _per_row(fn, name, value, rows, batch, device, _FLOAT_PARAMS, torch.float32)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        kinds = "a number, a tensor or None" if optional else "a number or a tensor"
        raise TypeError(f"{fn}: {name} must be {kinds}, got {type(value).__name__}")
    if _checks.beyond_float(value):
        raise ValueError(f"{fn}: {name} is outside {'(0, 1]' if low_open else '[0, 1]'} (a number too large "
                         f"for a float)")
    v = float(value)
    if low_open and 0.0 < v <= _checks.FLOAT32_ZERO:
        raise ValueError(f"{fn}: {name}={value} rounds to 0 in float32, in which the kernels take it "
                         f"(expected {name} > 2^-150)")
    # checked as the kernels take it, rounded to float32, as a tensor's values are (1 + 2^-30 is 1)
    v = v if not 1.0 < v < _JUST_ABOVE_ONE else 1.0
    lo_ok = v > 0.0 if low_open else v >= 0.0
    if not (lo_ok and v <= 1.0):  # NaN fails too
        raise ValueError(f"{fn}: {name}={value} is outside {'(0, 1]' if low_open else '[0, 1]'}")
    return v


def _check_rows_on_host(fn: str, n: int, temperature, top_k, top_p, min_p,
                        names=("temperature", "top_k", "top_p", "min_p")) -> None:
    """ValueError naming the rows of CPU tensor parameters that are out of range: on the host the
    values can be read for free, so a bad one is an error, as a bad scalar is (on the GPU such a
    row samples -1, or keeps nothing in a mask, with no synchronisation)."""
    checks = zip(names, (temperature, top_k, top_p, min_p),
                 (lambda v: torch.isfinite(v) & (v >= 0), lambda v: (v >= 1) & (v <= n),
                  lambda v: (v > 0) & (v <= 1), lambda v: (v >= 0) & (v <= 1)),
                 ("finite and >= 0 (as float32)", f"in [1, {n}]", "in (0, 1] (as float32)", "in [0, 1] (as float32)"))
    for name, value, ok, expected in checks:
        if isinstance(value, torch.Tensor):
            bad = (~ok(value)).nonzero().flatten().tolist()
            if bad:
                raise ValueError(f"{fn}: {name} is out of range in row(s) {_named_rows(bad)} (of the flattened "
                                 f"batch): got {value[bad[0]].item()}, expected {expected}")


def _check_finite_rows(fn: str, name: str, x: torch.Tensor, consequence: str) -> None:
    """ValueError naming the rows of CPU logits x [rows, n] (the argument ``name``) that hold no
    finite value (non-finite logits are never drawn or kept, so such a row has nothing to give)."""
    no_finite = ~torch.isfinite(x).any(dim=-1)
    if bool(no_finite.any()):
        bad = no_finite.nonzero().flatten().tolist()
        raise ValueError(f"{fn}: {name} row(s) {_named_rows(bad)} (of the flattened batch) hold no finite value "
                         f"(every logit NaN or infinite; such logits are never drawn): {consequence}")


def _named_rows(rows: list) -> str:
    """The first few of a list of row numbers, for an error message."""
    return ", ".join(map(str, rows[:5])) + (", ..." if len(rows) > 5 else "")


def _random(fn: str, name: str, value, rows, batch, device):
    if isinstance(value, torch.Tensor):
        if value.dtype not in _INT_PARAMS:
            raise TypeError(f"{fn}: {name} has dtype {_dtype_name(value.dtype)}, expected int64 "
                            f"or int32")
        _checks.tensor(fn, name, value, None)
        _same_device(fn, name, value, device)
        if value.numel() != 1 and (value.numel() != rows or tuple(value.shape) not in (batch, (rows,))):
            raise ValueError(f"{fn}: {name} has shape {tuple(value.shape)}, expected {_row_shapes(batch, rows)}")
        return value.reshape(-1).to(torch.int64).contiguous()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{fn}: {name} must be an int or an integer tensor, got {type(value).__name__}")
    value = operator.index(value)
    if not _INT64_MIN <= value < _UINT64_END:
        raise ValueError(f"{fn}: {name}={value} does not fit in 64 bits")
    return value - _UINT64_END if value >= (1 << 63) else value  # the same 64 bits, as int64


def sample(logits: torch.Tensor, *, temperature: Union[Number, torch.Tensor] = 1.0,
           top_k: Union[int, torch.Tensor, None] = None,
           top_p: Union[Number, torch.Tensor, None] = None,
           min_p: Union[Number, torch.Tensor, None] = None,
           seed: Union[int, torch.Tensor, None] = None,
           offset: Union[int, torch.Tensor] = 0) -> torch.Tensor:
    """Draw one token per row of ``logits``; returns int64 token ids of shape ``logits.shape[:-1]``.

    The distribution is ``softmax(logits / temperature)`` restricted to the tokens the filters
    keep and renormalised. Filters apply in this order, each on the tokens the previous kept:
    top-k keeps the k first tokens of the order (logit descending, index ascending); top-p keeps
    the shortest prefix whose probability mass, renormalised over the top-k tokens, reaches p
    (a token is kept when the mass strictly before it is below p); min-p keeps the tokens whose
    probability is at least ``min_p`` times the top token's. The draw is exact up to float32: an
    exponential race in which every kept token draws its own Exp(1) number, no sort and no
    prefix sum. Each token's score is ``y + g`` in float32, with ``y = logit / temperature``
    and its noise ``g = -log(E)`` (|g| < 17, from 23 random bits), and the row's maximum is not
    subtracted first: rounding a score moves the token's probability by a relative
    ``(|y| + 17) * 2^-24`` at most: about 2^-19 where |y| <= 16, growing with |y| (6e-4 at
    |y| = 10^4, 6% at 10^6: shift rows of such logits by their maximum first). Where
    |logit / temperature| passes float32's range (3.4e38) the scaled logits clamp to it and tie,
    and the lowest index among them wins; a temperature between 0 and 1e-30 acts as 1e-30 (1 /
    temperature is capped at 1e30). The compiled kernels compute the noise with fast logs,
    within 2^-21 of the float32 reference, so a GPU token differs from
    ``treefold.reference.sampling.sample`` only where two scores lie that close. On CUDA,
    under an int top_k of up to about 50 and from a few rows on, the row's top k come from one
    read of each row (as ``top_k`` finds them) and race there; min-p alone (whose kept tokens
    depend on the row's maximum alone) takes one pass for the maximum and one race over the
    tokens it keeps; the other calls pass the row through a histogram and list only the tokens
    near the filters' boundaries. All give the same tokens, so a request's token does not depend
    on which its batch takes.

    Args:
        logits: float32, bfloat16 or float16, shape ``[..., n]`` (1 <= n <= 2^20). Non-finite
            logits (NaN, +inf, -inf) are never drawn. Rows evenly strided with a contiguous
            last dimension are read in place.
        temperature: a finite number >= 0, or a float tensor with one value per row (or one
            value). 0 is greedy: the first token of the order (argmax, ties to the lowest index).
        top_k: an int in [1, n], a per-row integer tensor, or None.
        top_p: a number in (0, 1], a per-row float tensor, or None (1 keeps every token).
        min_p: a number in [0, 1], a per-row float tensor, or None (0 keeps every token).
            p and min_p are used rounded to float32. The kernels weigh each token by
            ``exp(y - y_max)`` in float32 and sum the weights in fixed point (2^-40), so a
            mass does not depend on the order of summation; a filter's decision follows those
            float32 weights, and differs from the float64 reference's only where p lies within
            their rounding of a cumulative mass, or min_p of a token's ratio to the top token
            (about ``(|y| + 2) * 2^-23`` relative: 1e-7 to 1e-6 for logits of common size).
        seed: an int, an integer tensor with one seed per row or a single seed, or None (draw
            one seed per row from torch's default generator for ``logits.device``, advancing it,
            with no host synchronisation; a greedy call with a scalar temperature of 0 draws
            nothing and leaves the generator alone). The numbers a row draws depend only on its (seed,
            offset, token id) when seeds are given per row: a request then gets the same token
            whatever batch it sits in and wherever it sits. One seed for the batch (an int or a
            one-element tensor) gives row r its own stream r.
        offset: the decode step (an int or an integer tensor, per row or one element), folded
            into the counter of the random numbers: advance it to draw fresh numbers.
            Seeds and offsets are taken as 64-bit patterns: -1 and 2^64 - 1 are the same seed
            (or offset), as are int32 and int64 tensors of the same values.

    Returns int64 token ids. On the GPU a row whose own tensor parameter is out of range
    (temperature negative or not finite, k outside [1, n], p outside (0, 1], min_p outside
    [0, 1]) or that holds no finite logit (all NaN or infinite) gives -1, without any host
    synchronisation; the same call is CUDA-graph safe when every parameter that changes between
    replays is a device tensor.

    Raises TypeError / ValueError for wrong types, shapes, devices and out-of-range scalars
    (temperature, p and min_p as they round to float32: a temperature that overflows it, a p
    that rounds to 0), and, for CPU logits, ValueError naming the rows whose tensor parameter is
    out of range or that hold no finite logit (the host can tell; inside torch.compile such rows
    give -1 there too).
    """
    kind = _validated_kind(logits, temperature, top_k, top_p, min_p, seed, offset)
    if kind is not None:
        known = _VALIDATED.get(kind)
        if known is not None:
            return _ops.sample(logits, *known, seed, offset)
    fn = "sample"
    x, batch = _logits(fn, "logits", logits)
    rows, n = x.shape
    dev = logits.device
    t = _temperature(fn, temperature, rows, batch, dev)
    k = _k(fn, "top_k", top_k, n, rows, batch, dev)
    p = _p(fn, "top_p", top_p, rows, batch, dev, low_open=True)
    mp = _p(fn, "min_p", min_p, rows, batch, dev, low_open=False)
    if seed is None and isinstance(t, float) and t == 0.0:
        s = 0  # greedy draws no random numbers: the generator is left as it is
    elif seed is None:
        s = torch.randint(_INT64_MIN, (1 << 63) - 1, (rows,), dtype=torch.int64, device=dev)
    else:
        s = _random(fn, "seed", seed, rows, batch, dev)
    o = _random(fn, "offset", offset, rows, batch, dev)
    # scalar filters that keep every token are dropped (fewer launches)
    if isinstance(k, int) and k == n:
        k = None
    if isinstance(p, float) and p == 1.0:
        p = None
    if isinstance(mp, float) and mp == 0.0:
        mp = None
    if rows == 0:
        return torch.empty(batch, dtype=torch.int64, device=dev)
    if dev.type == "cpu" and not torch.compiler.is_compiling():  # (a compiled graph reads nothing back)
        _check_rows_on_host(fn, n, t, k, p, mp)
        _check_finite_rows(fn, "logits", x, "there is nothing to sample")
    if kind is not None:
        if len(_VALIDATED) >= _MAX_VALIDATED:
            _VALIDATED.clear()
        _VALIDATED[kind] = (t, k, p, mp)
    return _ops.sample(x, t, k, p, mp, s, o).reshape(batch)


# ---- kinds of eager call already validated ---------------------------------------------------
# A decode loop calls ``sample`` with arguments of the same kinds step after step, and checking
# them again costs an eager call about as much host time as its launches' own Python. A call
# whose kind (``_validated_kind``) passed the checks before takes the normalised parameters kept
# for it and skips them: every check depends on what the kind holds alone.

_VALIDATED: dict = {}
_MAX_VALIDATED = 256


def _fast_device(logits: torch.Tensor) -> bool:
    """Where a validated kind may skip the checks: CUDA logits (on the CPU, ``sample`` also reads
    the logits to refuse rows without a finite value)."""
    return logits.is_cuda


def _validated_kind(logits, temperature, top_k, top_p, min_p, seed, offset):
    """The kind of a ``sample`` call, or None for calls that always take the checks: 2-D logits
    of a plain tensor with contiguous rows (shape, strides, dtype, device), the four parameters
    None or plain ints and floats by value (so a value checked once is known good; NaN never
    equals itself), seed and offset as ints within int64 (they pass as they are) or contiguous
    1-D int64 tensors by shape and device (used as they are). Tensor parameters, a seed of None
    (a draw from torch's generator), bools and other types, compiled code: None."""
    if (torch.compiler.is_compiling() or logits.__class__ is not torch.Tensor or logits.ndim != 2
            or logits.stride(1) != 1 or not _fast_device(logits)):
        return None
    kind = [logits.shape, logits.stride(), logits.dtype, logits.device]
    for value in (temperature, top_k, top_p, min_p):
        if value is None:
            kind.append(None)
        elif value.__class__ is float or value.__class__ is int:
            kind.append((value.__class__, value))
        else:
            return None
    for value in (seed, offset):
        if value.__class__ is int:
            if not _INT64_MIN <= value < 1 << 63:
                return None
            kind.append(int)
        elif (value.__class__ is torch.Tensor and value.dtype == torch.int64 and value.ndim == 1
              and value.is_contiguous()):
            kind.append((value.shape, value.device))
        else:
            return None
    return tuple(kind)


def top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of the last dimension, sorted descending, and their indices.

    Ties go to the lowest index; -0.0 equals +0.0; NaN ranks above +inf (torch.sort's order, so
    the result equals ``torch.sort(x, descending=True, stable=True)`` cut to k). No sort of the
    row: a histogram of the row finds the few tokens near the k-th, and only those are ranked;
    on CUDA, from a few rows to a few dozen and for k up to about 50, one read of each row
    keeps the maxima of groups of lanes instead, and only the tokens of the k best groups that
    can be among the top k are ranked. Both give the same values and indices.

    Args:
        x: float32, bfloat16 or float16, shape ``[..., n]`` (1 <= n <= 2^20).
        k: an int in [1, n]. Up to 1024 the Triton kernels serve it; beyond, a stable
            ``torch.sort``.

    Returns ``(values, indices)`` of shape ``[..., k]``: values in x's dtype, int64 indices.
    Differentiable in x through the values, as ``torch.topk``.
    """
    fn = "top_k"
    x2, batch = _logits(fn, "x", x)
    rows, n = x2.shape
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"{fn}: k must be an int, got {type(k).__name__}")
    kk = _k(fn, "k", k, n, rows, batch, x.device)
    if rows == 0:
        return (torch.empty(batch + (kk,), dtype=x.dtype, device=x.device),
                torch.empty(batch + (kk,), dtype=torch.int64, device=x.device))
    values, indices = _ops.top_k(x2, kk)
    if x2.requires_grad and torch.is_grad_enabled() and not values.requires_grad:
        values = _TopKValues.apply(x2, values, indices)
    return values.reshape(batch + (kk,)), indices.reshape(batch + (kk,))


class _TopKValues(torch.autograd.Function):
    """top_k's values as the kernels give them (bits, NaN payloads included), with torch.topk's
    gradient: each value's gradient goes back to x at its index."""

    @staticmethod
    def forward(ctx, x, values, indices):
        ctx.save_for_backward(indices)
        ctx.x_shape = x.shape
        return values.clone()

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        # out of place, so that a recorded backward is differentiable in grad
        return grad.new_zeros(ctx.x_shape).scatter(-1, indices, grad), None, None


_MASK_DOC = """
    Args:
        x: float32, bfloat16 or float16 logits, shape ``[..., n]`` (1 <= n <= 2^20).
        {arg}
        probs: return float32 probabilities, ``softmax(x)`` over the kept tokens (0 elsewhere),
            instead of x with -inf outside the kept tokens.

    The order and the rule are those of ``sample`` (which applies top-k, then top-p, then
    min-p); non-finite logits are never kept. On the CPU a row without a finite logit, or whose
    per-row parameter is out of range, raises ValueError naming the rows; on the GPU (never read
    back) such a row keeps nothing: all -inf, or all NaN with ``probs``.

    Differentiable in x with the kept set held fixed: kept logits pass their gradient through,
    dropped ones get 0; with ``probs``, the gradient of softmax over the kept tokens.
"""


def _mask(fn: str, needs: str, x, probs, top_k=None, top_p=None, min_p=None) -> torch.Tensor:
    """``fn``'s mask, whose filter's parameter (``needs``: "k", "p" or "min_p") must be given."""
    x2, batch = _logits(fn, "x", x)
    rows, n = x2.shape
    _checks.flag(fn, "probs", probs)
    dev = x.device
    k = _k(fn, "k", top_k, n, rows, batch, dev, optional=needs != "k")
    p = _p(fn, "p", top_p, rows, batch, dev, low_open=True, optional=needs != "p")
    mp = _p(fn, "min_p", min_p, rows, batch, dev, low_open=False, optional=needs != "min_p")
    if rows == 0:
        return torch.empty(x.shape, dtype=torch.float32 if probs else x.dtype, device=dev)
    if dev.type == "cpu" and not torch.compiler.is_compiling():
        _check_rows_on_host(fn, n, None, k, p, mp, names=(None, "k", "p", "min_p"))
        _check_finite_rows(fn, "x", x2, "there is nothing to keep")
    out = _ops.sampling_filter(x2, k, p, mp, probs)
    if x2.requires_grad and torch.is_grad_enabled():
        out = _with_filter_gradient(x2, out, probs)
    return out.reshape(x.shape)


def _with_filter_gradient(x: torch.Tensor, out: torch.Tensor, probs: bool) -> torch.Tensor:
    """``out`` (the kernels' result for logits ``x``) with the gradient of the filter it applied,
    the kept set held fixed: the kept logits pass theirs through; probabilities take softmax's
    over the kept tokens, computed by torch and added as an exact zero (q - q), so the values
    stay the kernels' bits."""
    if not probs:
        return torch.where(out == float("-inf"), out, x)  # kept logits are x's own (finite) values
    kept = out > 0  # (NaN, in a row that keeps nothing, is not kept)
    any_kept = kept.any(dim=-1, keepdim=True)
    # a row that keeps nothing takes the softmax of zeros, times 0: finite, and no gradient (the
    # softmax of a row of -inf would send NaN back whatever the gradient arriving)
    z = torch.where(kept, x.float(), torch.where(any_kept, float("-inf"), 0.0))
    q = torch.softmax(z, dim=-1) * any_kept
    return out + (q - q.detach())


def top_k_mask(x: torch.Tensor, k: Union[int, torch.Tensor], *, probs: bool = False) -> torch.Tensor:
    return _mask("top_k_mask", "k", x, probs, top_k=k)


def top_p_mask(x: torch.Tensor, p: Union[Number, torch.Tensor], *, probs: bool = False) -> torch.Tensor:
    return _mask("top_p_mask", "p", x, probs, top_p=p)


def min_p_mask(x: torch.Tensor, min_p: Union[Number, torch.Tensor], *,
               probs: bool = False) -> torch.Tensor:
    return _mask("min_p_mask", "min_p", x, probs, min_p=min_p)


top_k_mask.__doc__ = ("Keep the k first tokens of each row (logit descending, index ascending).\n"
                      + _MASK_DOC.format(arg="k: an int in [1, n], or an integer tensor per row."))
top_p_mask.__doc__ = ("Keep the shortest prefix of each row whose probability reaches p.\n"
                      + _MASK_DOC.format(arg="p: a number in (0, 1], or a float tensor per row."))
min_p_mask.__doc__ = ("Keep the tokens whose probability is at least min_p times the largest.\n"
                      + _MASK_DOC.format(arg="min_p: a number in [0, 1], or a float tensor per row."))
