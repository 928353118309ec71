"""Public softmax functions and cross-entropy: validation, docstrings, dispatch (kernel /
interpreter / reference).

All of them reduce one dimension in the treefold order (``treefold.kernels.softmax`` documents it),
so a row gives the same bits whatever the batch size, its position in the batch or the launch
strategy. They accept float32, bfloat16 and float16 and compute in float32.
"""
from __future__ import annotations

import numbers
import struct
from typing import Optional

import torch

from .. import _checks
from .._ops import reduce as _reduce_ops
from .._ops import softmax as _ops

__all__ = ["softmax", "log_softmax", "logsumexp", "cross_entropy"]

_COMMON_DOC = """
    Args:
        x: float32, bfloat16 or float16 tensor of any shape.
        dim: the dimension to reduce (negative counts from the end). The last dimension is the
            fast path; rows that are evenly strided with a contiguous last dimension (for
            example ``x[:, :n]`` of a wider buffer) are read in place. Any other ``dim`` is
            moved last with one copy, and the result is returned contiguous in ``x``'s shape.
        temperature: a finite number > 0 whose inverse float32 holds (about 3e-39 to 1e45).
            The float32 input is multiplied by float32(1 / temperature) before anything else,
            in every strategy and in the gradient.
        dtype: the output dtype (float32, bfloat16 or float16); default ``x.dtype``. Unlike
            torch, ``x`` is not rounded to ``dtype`` first: the result is computed from ``x``
            in float32 and rounded once to ``dtype``.

    On the GPU the per-element exp is the hardware's fast one, which returns 0 for results below
    2^-126 (float32's smallest normal): outputs smaller than about 1.2e-38 are 0, not subnormal.

    Rows of at most 2^24 elements. A row that is entirely -inf (fully masked) gives {masked};
    its gradient is finite where torch's is NaN: zero for softmax, ``dy`` itself for log_softmax
    (dx = dy - softmax(x) * sum(dy), with softmax(x) = 0).
    A row holding NaN gives NaN for the whole row, as does a row holding +inf (as in torch).
    Differentiable (the backward pass is a Triton kernel too, with its row sums in the same
    order); works under ``torch.compile(fullgraph=True)`` through the ``treefold::softmax`` op.
    Eager calls are twice differentiable (gradient penalties, Hessian-vector products): a
    backward recorded with ``create_graph=True`` is computed by torch's operations (the float64
    reference, rounded once to x's dtype), so its bits may differ from the kernel's in the last
    place. Inside ``torch.compile`` a second derivative raises.
"""


def _prepare(fn: str, x, dim, temperature, dtype):
    _checks.tensor(fn, "x", x)
    d = _checks.dim(fn, dim, x.ndim)
    t = _checks.finite_float(fn, "temperature", temperature, low=0.0, low_open=True)
    inverse = 1.0 / t
    if not _checks.FLOAT32_ZERO < inverse < _checks.FLOAT32_OVERFLOW:
        raise ValueError(f"{fn}: temperature={temperature} has an inverse that rounds to "
                         f"{'0' if inverse <= _checks.FLOAT32_ZERO else 'inf'} in float32, which the kernels "
                         f"multiply by")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"{fn}: dtype must be a torch.dtype or None, got {type(dtype).__name__}")
    if dtype is not None and dtype not in _checks.FLOAT_DTYPES:
        raise TypeError(f"{fn}: dtype={str(dtype).replace('torch.', '')} is not supported, "
                        f"expected one of float32, bfloat16, float16")
    n = x.shape[d] if x.ndim else 1
    if n > _ops.MAX_ROW:
        raise ValueError(f"{fn}: x has {n} elements along dim {dim}; rows longer than "
                         f"{_ops.MAX_ROW} elements are not supported")
    return d, t


def _softmax(fn: str, x, dim, temperature, dtype, log: bool) -> torch.Tensor:
    d, t = _prepare(fn, x, dim, temperature, dtype)
    if x.ndim == 0:
        return _ops.softmax(x.reshape(1), log, t, dtype).reshape(())
    if d == x.ndim - 1:
        return _ops.softmax(x, log, t, dtype)
    return _ops.softmax(x.movedim(d, -1), log, t, dtype).movedim(-1, d).contiguous()


def _plain_call(x, dim, temperature, dtype) -> bool:
    """The common call (last dim, no temperature, no dtype, a supported tensor whose rows are not
    too long) needs no further validation: checked here in a few attribute reads."""
    return (dim.__class__ is int and dim == -1 and temperature.__class__ is float and temperature == 1.0
            and dtype is None and isinstance(x, torch.Tensor) and x.dtype in _checks.FLOAT_DTYPES
            and x.ndim > 0 and x.shape[-1] <= _ops.MAX_ROW and (x.is_cuda or x.is_cpu) and x.layout is torch.strided)


def softmax(x: torch.Tensor, dim: int = -1, *, temperature: float = 1.0,
            dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    if _plain_call(x, dim, temperature, dtype):
        return _ops.softmax(x, False, 1.0, None)
    return _softmax("softmax", x, dim, temperature, dtype, log=False)


def log_softmax(x: torch.Tensor, dim: int = -1, *, temperature: float = 1.0,
                dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    if _plain_call(x, dim, temperature, dtype):
        return _ops.softmax(x, True, 1.0, None)
    return _softmax("log_softmax", x, dim, temperature, dtype, log=True)


softmax.__doc__ = ("Softmax of ``x / temperature`` along ``dim``: exp(x - max) / sum(exp(x - max)).\n"
                   + _COMMON_DOC.format(masked="zeros"))
log_softmax.__doc__ = ("Log-softmax of ``x / temperature`` along ``dim``: (x - max) - log(sum(exp(x - max))).\n"
                       + _COMMON_DOC.format(masked="-inf"))


def logsumexp(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """log(sum(exp(x))) along ``dim``, computed stably as max + log(sum(exp(x - max))).

    Args:
        x: float32, bfloat16 or float16 tensor of any shape.
        dim: the dimension to reduce (an int; negative counts from the end).
        keepdim: keep the reduced dimension with size 1.

    Returns a tensor of ``x.dtype``. A row that is entirely -inf (fully masked) or empty gives
    -inf (and a zero gradient); a row holding NaN gives NaN; a row holding +inf and no NaN gives
    +inf, as in torch. Rows of at most 2^24 elements. Differentiable (Triton backward kernel);
    works under ``torch.compile(fullgraph=True)`` through the ``treefold::logsumexp`` op.
    """
    if (dim.__class__ is int and dim == -1 and keepdim is False and isinstance(x, torch.Tensor)
            and x.dtype in _checks.FLOAT_DTYPES and x.ndim > 0 and x.shape[-1] <= _ops.MAX_ROW
            and (x.is_cuda or x.is_cpu) and x.layout is torch.strided):
        return _ops.logsumexp(x)
    fn = "logsumexp"
    _checks.tensor(fn, "x", x)
    d = _checks.dim(fn, dim, x.ndim)
    _checks.flag(fn, "keepdim", keepdim)
    n = x.shape[d] if x.ndim else 1
    if n > _ops.MAX_ROW:
        raise ValueError(f"{fn}: x has {n} elements along dim {dim}; rows longer than "
                         f"{_ops.MAX_ROW} elements are not supported")
    if x.ndim == 0:
        return _ops.logsumexp(x.reshape(1))
    out = _ops.logsumexp(x if d == x.ndim - 1 else x.movedim(d, -1))
    return out.unsqueeze(d) if keepdim else out


_REDUCTIONS = ("mean", "sum", "none")
_TARGET_DTYPES = (torch.int64, torch.int32)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def check_loss_options(fn: str, ignore_index, reduction, label_smoothing) -> float:
    """Check cross_entropy's options (also ``treefold.nn.CrossEntropyLoss``'s, at construction);
    returns label_smoothing as the float32 the kernels take."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"{fn}: ignore_index must be an int, got {type(ignore_index).__name__}")
    if not _INT64[0] <= int(ignore_index) <= _INT64[1]:
        raise ValueError(f"{fn}: ignore_index={ignore_index} is outside int64")
    if not isinstance(reduction, str):
        raise TypeError(f"{fn}: reduction must be a str, got {type(reduction).__name__}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{fn}: reduction={reduction!r} is not one of {', '.join(map(repr, _REDUCTIONS))}")
    eps = _checks.finite_float(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0)
    if torch.compiler.is_compiling():
        # a value that changed between calls arrives symbolic, which struct cannot pack: the
        # kernels (and the reference) round it to float32 themselves
        return eps
    return struct.unpack("f", struct.pack("f", eps))[0]


def _check_cross_entropy(fn: str, logits, target, ignore_index, reduction, label_smoothing) -> float:
    """Validate a cross_entropy call; returns label_smoothing as the float32 the kernels take."""
    _checks.tensor(fn, "logits", logits)
    if isinstance(target, torch.Tensor) and target.dtype.is_floating_point:
        raise TypeError(f"{fn}: target has dtype {str(target.dtype).replace('torch.', '')}; class "
                        f"probabilities are not supported, give class indices (int64 or int32)")
    _checks.tensor(fn, "target", target, _TARGET_DTYPES)
    _checks.same_device(fn, "target", target, "logits", logits)
    if logits.ndim not in (1, 2):
        raise ValueError(f"{fn}: logits must be [batch, classes] or [classes], got shape {tuple(logits.shape)}")
    if logits.shape[-1] == 0:
        raise ValueError(f"{fn}: logits has 0 classes (shape {tuple(logits.shape)}); a target needs at least one")
    if logits.shape[-1] > _ops.MAX_ROW:
        raise ValueError(f"{fn}: logits has {logits.shape[-1]} classes; rows longer than {_ops.MAX_ROW} "
                         f"elements are not supported")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"{fn}: target has shape {tuple(target.shape)}, expected {tuple(logits.shape[:-1])} "
                         f"(logits.shape[:-1]) for logits of shape {tuple(logits.shape)}")
    eps = check_loss_options(fn, ignore_index, reduction, label_smoothing)
    if target.is_cpu and target.numel() and not torch.compiler.is_compiling():
        # (free on the host; on the GPU this would wait for the device, and inside a compiled
        # graph it would be data-dependent control flow, so a bad target there gives a NaN loss)
        t = target.long().reshape(-1)
        bad = (t != int(ignore_index)) & ((t < 0) | (t >= logits.shape[-1]))
        if bool(bad.any()):
            where = int(bad.nonzero()[0, 0])
            name = f"target[{where}]" if target.ndim else "target"
            raise ValueError(f"{fn}: {name} = {int(t[where])} is not a class index in "
                             f"[0, {logits.shape[-1]}) nor ignore_index={ignore_index}")
    return eps


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy of class indices ``target`` under ``logits``, as ``torch.nn.functional.cross_entropy``
    takes them (class dimension last), computed in float32 without forming log_softmax.

    Args:
        logits: float32, bfloat16 or float16, [batch, classes] or [classes]. Rows that are
            evenly strided with a contiguous last dimension are read in place.
        target: int64 or int32 class indices, shape ``logits.shape[:-1]``, on logits' device.
        ignore_index: rows whose target equals it count for nothing: loss 0, gradient 0, and
            left out of the mean's count.
        reduction: "mean" (over the rows not ignored; NaN when every row is ignored, as in
            torch), "sum" or "none" (one loss per row).
        label_smoothing: eps in [0, 1], taken as float32: the target distribution is
            (1 - eps) * one_hot(target) + eps / classes, as in torch.

    Each row's loss is lse - x[t], computed as ``log Z - (x[t] - M)`` from the row's maximum M
    and log Z = log(sum(exp(x - M))), in the treefold order (the logsumexp kernel writes the
    loss beside them: one read of the logits), which rounds where torch's -log_softmax does; with
    label smoothing, ``(1 - eps) * that + eps * (log Z - (sum(x) / classes - M))``, sum(x) in the
    order's trees (one more read). "sum" and "mean" add the row losses with ``treefold.sum``'s
    trees, so every result is the same bits for any launch, and a row's loss the same in any
    batch.

    The loss is float32 whatever the logits' dtype (torch returns the logits' dtype). Its
    gradient, ``dloss * (softmax(x) - (1 - eps) * one_hot(t) - eps / classes)`` rounded once to
    the logits' dtype, is one more kernel: one read of the logits, one write of dx. For an eager
    "mean" or "sum" whose logits need a gradient, the forward writes that gradient for the dloss
    of a plain ``loss.backward()`` instead (one write; the backward then launches a kernel that
    returns at once), and a backward with any other dloss (a scaled loss) computes it anew over
    it: the same bits either way. That gradient is held from the forward on: a loss that is never
    backpropagated holds it too. Not under saved-tensor hooks (activation checkpointing,
    ``save_on_cpu``), nor inside ``torch.compile``: there the backward computes it.

    A target outside [0, classes) that is not ``ignore_index`` is a ValueError for CPU tensors;
    on the GPU, where checking would wait for the device, and inside ``torch.compile``, that
    row's loss and gradient are NaN (nothing is read out of bounds). A row holding NaN or +inf,
    or entirely -inf, gives NaN, as in torch. Class weights and probability targets are not
    supported. Works under ``torch.compile(fullgraph=True)`` through the ``treefold::cross_entropy``
    op.
    """
    fn = "cross_entropy"
    eps = _check_cross_entropy(fn, logits, target, ignore_index, reduction, label_smoothing)
    ignore_index = int(ignore_index)
    if reduction != "none" and _ops.fuses_gradient(logits):
        rows = logits.reshape(1, -1) if logits.ndim == 1 else logits
        return _ops.cross_entropy_reduced(rows, target.reshape(-1), ignore_index, eps, reduction == "mean")
    if logits.ndim == 1:
        losses = _ops.cross_entropy(logits.reshape(1, -1), target.reshape(1), ignore_index, eps).reshape(())
    else:
        losses = _ops.cross_entropy(logits, target, ignore_index, eps)
    if reduction == "none":
        return losses
    total = _reduce_ops.sum_rows(losses.reshape(1, -1), "sum", torch.float32).reshape(())
    if reduction == "sum":
        return total
    # (compared as int64: an ignore_index beyond int32 must not wrap against int32 targets)
    return total / (target.long() != ignore_index).sum()
