"""RMSNorm and LayerNorm (with the fused residual add): the public functions.

Each function validates its arguments, then runs the Triton kernel (CUDA, or the interpreter on
CPU with ``TRITON_INTERPRET=1``) or the NumPy reference (``treefold.backend``). Without a
gradient to track, eager calls go straight to the launcher; with one, through plain autograd
Functions; under ``torch.compile`` (or with tensor subclasses), through the ``treefold::`` custom
ops, which carry the autograd formulas and fake implementations. A repeated eager call of a kind
seen before skips its checks and takes a prepared launch (``treefold._ops.norms.norm_prepared``).

Gradients (x, weight, bias, the residual) come from the backward kernel. Eager calls are twice
differentiable: a backward recorded with ``create_graph=True`` (a gradient penalty, a
Hessian-vector product) is computed by torch's operations in float32 from the saved inputs, so
that it can be differentiated again, and its bits may differ from the kernel's in the last place.
Inside ``torch.compile`` a second derivative raises.
"""
from __future__ import annotations

import math
import operator
from typing import Optional, Sequence, Union

import torch

from .. import _checks
from .._ops import norms as _ops
from ..reference.norms import CASTINGS, rms_norm_out_dtype

__all__ = ["rms_norm", "fused_add_rms_norm_", "layer_norm"]


def _eps(fn: str, eps) -> float:
    # The common case (a finite float >= 0) costs one comparison; anything else gets the full check.
    if type(eps) is float and 0.0 <= eps < math.inf:
        return eps
    return _checks.finite_float(fn, "eps", eps, low=0.0)


def _offset(fn: str, offset) -> float:
    if type(offset) is float and -math.inf < offset < math.inf:
        return offset
    return _checks.finite_float(fn, "offset", offset)


def _needs_op(a: torch.Tensor, b: Optional[torch.Tensor], c: Optional[torch.Tensor]) -> bool:
    """Go through the custom op (autograd, torch.compile) rather than straight to the launcher."""
    if torch.compiler.is_compiling():
        return True
    return torch.is_grad_enabled() and (a.requires_grad or (b is not None and b.requires_grad)
                                        or (c is not None and c.requires_grad))


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _check_row_length(fn: str, n: int) -> None:
    if n > _ops.MAX_ROW_LENGTH:
        raise ValueError(f"{fn}: rows of {n} elements are longer than {_ops.MAX_ROW_LENGTH}, "
                         f"the longest row these kernels hold on chip")


def _check_vector(fn: str, name: str, value, n: int, x: torch.Tensor, what: str) -> None:
    _checks.tensor(fn, name, value)
    _checks.same_device(fn, name, value, "x", x)
    if value.ndim != 1 or value.shape[0] != n:
        raise ValueError(f"{fn}: {name} has shape {_shape(value)}, expected ({n},) ({what})")


def _check_x(fn: str, x) -> torch.Tensor:
    _checks.tensor(fn, "x", x)
    if x.ndim == 0:
        raise ValueError(f"{fn}: x must have at least one dimension, got a 0-d tensor")
    return x


def _check_residual(fn: str, residual, x: torch.Tensor) -> None:
    _checks.tensor(fn, "residual", residual)
    _checks.same_device(fn, "residual", residual, "x", x)
    if residual.shape != x.shape:
        raise ValueError(f"{fn}: residual has shape {_shape(residual)}, expected {_shape(x)} (x.shape)")


def check_casting(fn: str, casting) -> None:
    """One of ``CASTINGS`` (a TypeError for what is not a str, a ValueError for another str)."""
    if type(casting) is not str:  # (type(): torch 2.11's Dynamo gets a constant's __class__ wrong)
        raise TypeError(f"{fn}: casting must be a str (one of {', '.join(map(repr, CASTINGS))}), "
                        f"got {type(casting).__name__}")
    if casting not in CASTINGS:
        raise ValueError(f"{fn}: casting must be one of {', '.join(map(repr, CASTINGS))}, got {casting!r}")


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6, *,
             residual: Optional[torch.Tensor] = None, offset: float = 0.0, casting: str = "llama",
             out_dtype: Optional[torch.dtype] = None):
    """RMSNorm over the last dimension, optionally after adding a residual, in one kernel.

    ``y = normalise(v) * (offset + weight)`` where ``v`` is ``x``, or ``h = x + residual`` when a
    residual is given (h is rounded to the residual's dtype and is what gets normalised), and
    ``normalise(v) = v * rstd`` with ``rstd = 1 / sqrt(sum(v * v) / N + eps)``. The sum follows
    the treefold order; the statistics are always float32; the division and square root are
    IEEE-rounded, so float32 results equal ``treefold.reference.norms.rms_norm`` bit for bit, and
    every dtype gives the same bits for a row whatever the batch size or its position.

    Args:
        x: input ``[..., N]``, float32, bfloat16 or float16. Any strides (rows that are not evenly
            strided with a contiguous last dimension are copied first).
        weight: ``[N]`` scale, or None for no scale.
        eps: added to the mean square, >= 0.
        residual: optional ``x.shape`` tensor added to x first; the function then returns
            ``(y, h)`` with ``h = x + residual`` in the residual's dtype (the new residual stream).
        offset: added to the weight in float32 (1.0 for Gemma's ``1 + weight``); needs a weight.
        casting: where intermediate results are rounded, to match a model's reference code:

            - ``"llama"``: statistics in float32; the normalised row is rounded to the input's
              dtype, then multiplied by the weight (in torch's promotion of the two dtypes).
              Hugging Face's ``LlamaRMSNorm`` and its copies (Mistral, Mixtral, Qwen2, Qwen3,
              Phi-3, DeepSeek-V3), and vLLM's CUDA ``rms_norm``. On bfloat16 the
              output equals Hugging Face's bit for bit on all but a few elements in 10^5
              (4096 x 4096 on the CPU: 99.9997%); the rest are one or two ulps apart: the
              mean square is summed in the treefold order, not torch's, so the rounded
              normalised value can land one ulp away, and the weight's multiply scales that ulp
              by the weight's significand (1 to 2), which the product's rounding can make two
              ulps of the product (any weight that is not a power of two, whatever its size).
            - ``"gemma"``: everything in float32 (``weight`` widened, ``offset`` added in float32),
              one rounding to the input's dtype at the end. Hugging Face's ``GemmaRMSNorm``
              (Gemma, Gemma 2, Gemma 3) with ``offset=1.0``; with ``offset=0.0`` it is the
              arithmetic of ``torch.nn.functional.rms_norm`` and of FlashInfer's ``rmsnorm``
              (which rounds once, at the end; its approximate rsqrt moves the last bits).
            - ``"none"``: no intermediate rounding either, and the output dtype is torch's
              promotion of the input and weight dtypes (bfloat16 activations with a float32
              weight give float32), as an unrounded ``x * rstd * weight`` would: T5's
              ``T5LayerNorm`` and its copies (mT5, UMT5, LongT5, Pix2Struct) with a float32
              weight, within a few float32 ulps (their rsqrt); with a 16-bit weight they round
              as "llama".
        out_dtype: output dtype; by default as stated for each casting.

    Returns:
        ``y`` (``x.shape``), or ``(y, h)`` when a residual is given.

    Raises:
        TypeError: a non-tensor or non-float argument, or an unknown ``out_dtype``.
        ValueError: a weight or residual of the wrong shape or device, an unknown casting,
            a negative or non-finite eps, an offset without a weight, rows over 65536 elements.
    """
    if x.__class__ is torch.Tensor:
        out = _ops.norm_prepared(True, x, residual, weight, None, eps, offset, casting, out_dtype)
        if out is not None:
            return out
    fn = "rms_norm"
    _check_x(fn, x)
    n = x.shape[-1]
    if weight is not None:
        _check_vector(fn, "weight", weight, n, x, "x.shape[-1]")
    if residual is not None:
        _check_residual(fn, residual, x)
    eps = _eps(fn, eps)
    offset = _offset(fn, offset)
    check_casting(fn, casting)
    if offset != 0.0 and weight is None:
        raise ValueError(f"{fn}: offset={offset} needs a weight (the offset is added to the weight)")
    out_dtype_arg = out_dtype
    if out_dtype is None:
        in_dtype = x.dtype if residual is None else residual.dtype
        out_dtype = rms_norm_out_dtype(in_dtype, None if weight is None else weight.dtype, casting)
    elif out_dtype not in _checks.FLOAT_DTYPES:
        raise TypeError(f"{fn}: out_dtype must be one of float32, bfloat16, float16, got {out_dtype}")
    _check_row_length(fn, n)
    if _needs_op(x, weight, residual):
        if _ops.eager_autograd(x, weight, residual):
            key = _ops.norm_prepare_key(True, x, residual, weight, None, eps, offset, casting, out_dtype_arg,
                                        None, True)
            return _ops.RmsNormFunction.apply(x, weight, residual, eps, offset, casting, out_dtype, None, key)
        y, h, _ = torch.ops.treefold.rms_norm(x, weight, residual, eps, offset, casting, out_dtype)
    else:
        out = _ops.norm_prepare(True, x, residual, weight, None, eps, offset, casting, out_dtype_arg, None,
                                out_dtype)
        if out is not None:
            return out
        y, h, _ = _ops.rms_norm_impl(x, weight, residual, eps, offset, casting, out_dtype, store_stats=False)
    return y if residual is None else (y, h)


def fused_add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor],
                        eps: float = 1e-6, enable_pdl: Optional[bool] = None) -> None:
    """In place, the serving engines' fused add + RMSNorm: ``residual += x``, then
    ``x = rms_norm(residual) * weight``.

    vLLM's ``fused_add_rms_norm`` semantics, and the call signature of FlashInfer's
    ``fused_add_rmsnorm``: the sum is rounded to the residual's dtype and is what gets
    normalised; the normalisation uses the ``"llama"`` casting and is written in x's dtype.
    (FlashInfer's own kernel normalises the float32 sum before its rounding and rounds the
    output once, at the end: on 16-bit inputs its bits differ from these in the last place.)
    Both tensors are overwritten; nothing is returned. It has no autograd formula (it is for
    inference): for training use ``rms_norm(x, weight, residual=residual)``, which returns
    ``(y, h)`` and is differentiable.

    ``enable_pdl=True`` launches the kernel as a programmatic dependent launch on GPUs that
    take one (sm_90 and later): its programs may start while the previous kernel on the stream
    finishes, and wait for that kernel and its writes before reading anything, so that the
    launch's latency overlaps the previous kernel's tail. Elsewhere, and inside a
    ``torch.compile`` graph, the launch is an ordinary one. None or False (the default, unlike
    FlashInfer's None, which turns it on where supported): an ordinary launch. The bits are the
    same either way. What it is worth is small: on an H100, in a CUDA graph after the kernel that
    writes x, 0.05-0.08 us a call at decode sizes (1 x 4096 to 64 x 8192), and 0.5 us lost at
    4096 x 4096, where the waiting programs hold places the previous kernel's last wave could use
    (benchmarks/results/h100-norm-pdl.txt).

    Raises:
        TypeError: a non-tensor or non-float argument, an ``enable_pdl`` that is not a bool or
            None.
        ValueError: a residual or weight of the wrong shape or device, x and residual sharing
            memory (told exactly where each is rows of a contiguous last dimension one row
            stride apart; for other strides, memory ranges that intersect are refused), a weight
            that shares memory with x or the residual, an x or residual whose own elements may
            share memory (expanded, or strides that interleave), a tensor that requires grad while
            grad mode is on, a bad eps.
    """
    fn = "fused_add_rms_norm_"
    _check_x(fn, x)
    _check_residual(fn, residual, x)
    n = x.shape[-1]
    if weight is not None:
        _check_vector(fn, "weight", weight, n, x, "x.shape[-1]")
    eps = _eps(fn, eps)
    _checks.flag(fn, "enable_pdl", enable_pdl, optional=True)
    _check_row_length(fn, n)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, residual, weight)):
        raise ValueError(f"{fn}: an input requires grad, but this in-place op has no autograd formula; "
                         f"use rms_norm(x, weight, residual=residual) to train")
    # The implementation refuses x and residual that share memory (both are written), and a weight
    # inside either.
    if torch.compiler.is_compiling():
        torch.ops.treefold.fused_add_rms_norm_(x, residual, weight, eps)
    else:
        _ops.fused_add_rms_norm_impl(x, residual, weight, eps, enable_pdl=bool(enable_pdl))


def _dimension(d) -> Optional[int]:
    """d as a Python int where it is an integer that is not a bool (NumPy's integers included,
    as torch takes them), else None."""
    # (no try/except around operator.index: torch.compile of torch 2.11 fails on the TypeError
    # it raises for a tuple instead of taking the except branch)
    if isinstance(d, (bool, torch.Tensor, tuple, list)) or not hasattr(d, "__index__") or getattr(d, "ndim", 0):
        # (a NumPy array of more than a scalar has __index__, and raises a TypeError that names nothing)
        return None
    return operator.index(d)


def _normalized_shape(fn: str, normalized_shape) -> tuple[int, ...]:
    single = _dimension(normalized_shape)
    if single is not None:
        return (single,)
    if isinstance(normalized_shape, (tuple, list, torch.Size)) and len(normalized_shape) > 0:
        dims = tuple(_dimension(d) for d in normalized_shape)
        if None not in dims:
            return dims
    raise TypeError(f"{fn}: normalized_shape must be an int or a non-empty sequence of ints, "
                    f"got {normalized_shape!r}")


def layer_norm(x: torch.Tensor, normalized_shape: Union[int, Sequence[int]],
               weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
               eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the trailing ``normalized_shape`` dimensions, as ``torch.nn.functional.layer_norm``.

    Two passes over a row held on chip: ``mean = sum(x) / N``, ``var = sum((x - mean)^2) / N``
    (never ``E[x^2] - E[x]^2``), ``y = ((x - mean) * rstd) * weight + bias`` with
    ``rstd = 1 / sqrt(var + eps)``; float32 statistics and arithmetic, rounded to x's dtype at
    the end. Sums in the treefold order; float32 results equal
    ``treefold.reference.norms.layer_norm`` bit for bit.

    Args:
        x: input whose trailing dimensions equal ``normalized_shape``.
        normalized_shape: an int or a sequence of ints; N is their product (at most 65536).
        weight: optional scale of shape ``normalized_shape``.
        bias: optional shift of shape ``normalized_shape``.
        eps: added to the variance, >= 0.

    Returns:
        ``y`` with x's shape and dtype.

    Raises:
        TypeError: a non-tensor or non-float argument, a malformed ``normalized_shape``.
        ValueError: ``normalized_shape`` not matching x, a weight or bias of the wrong shape or
            device, a bad eps, rows over 65536 elements.
    """
    if x.__class__ is torch.Tensor:
        out = _ops.norm_prepared(False, x, None, weight, bias, eps, normalized_shape=normalized_shape)
        if out is not None:
            return out
    fn = "layer_norm"
    _check_x(fn, x)
    shape = _normalized_shape(fn, normalized_shape)
    k = len(shape)
    if x.ndim < k or tuple(x.shape[-k:]) != shape:
        raise ValueError(f"{fn}: normalized_shape={shape} does not match the trailing dimensions of x "
                         f"with shape {_shape(x)}")
    for name, value in (("weight", weight), ("bias", bias)):
        if value is not None:
            _checks.tensor(fn, name, value)
            _checks.same_device(fn, name, value, "x", x)
            if tuple(value.shape) != shape:
                raise ValueError(f"{fn}: {name} has shape {_shape(value)}, expected {shape} (normalized_shape)")
    eps = _eps(fn, eps)
    n = math.prod(shape)
    _check_row_length(fn, n)
    rows = x if k == 1 else x.reshape(*x.shape[:-k], n)
    w = weight if weight is None or k == 1 else weight.reshape(n)
    b = bias if bias is None or k == 1 else bias.reshape(n)
    if _needs_op(x, weight, bias):
        if _ops.eager_autograd(x, weight, bias):
            key = None if k != 1 else _ops.norm_prepare_key(False, x, None, weight, bias, eps, 0.0, "", None,
                                                             normalized_shape, True)
            y = _ops.LayerNormFunction.apply(rows, w, b, eps, None, key)
        else:
            y, _, _ = torch.ops.treefold.layer_norm(rows, w, b, eps)
    else:
        if k == 1:
            y = _ops.norm_prepare(False, x, None, weight, bias, eps, 0.0, "", None, normalized_shape, x.dtype)
            if y is not None:
                return y
        y, _, _ = _ops.layer_norm_impl(rows, w, b, eps, store_stats=False)
    return y if k == 1 else y.view(x.shape)
