"""Drop-in ``nn.Module``s backed by treefold's kernels.

``RMSNorm`` and ``LayerNorm`` keep the parameter names of ``torch.nn.RMSNorm`` /
``torch.nn.LayerNorm`` (and of Hugging Face's ``LlamaRMSNorm`` / ``GemmaRMSNorm``: a single
``weight``), so ``load_state_dict`` takes those modules' state dicts unchanged.
``CrossEntropyLoss`` takes ``torch.nn.CrossEntropyLoss``'s options for class-index targets.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import numpy as np
import torch
from torch import nn

from . import _checks
from .functional.norms import check_casting, layer_norm, rms_norm
from .functional.softmax import check_loss_options, cross_entropy

__all__ = ["RMSNorm", "LayerNorm", "CrossEntropyLoss"]

_Shape = Union[int, Sequence[int], torch.Size]


def _as_shape(module: str, normalized_shape: _Shape) -> tuple[int, ...]:
    """normalized_shape as a tuple of positive ints, or a ValueError/TypeError naming the module."""
    if isinstance(normalized_shape, (bool, str, bytes)):
        raise TypeError(f"{module}: normalized_shape must be an int or a sequence of ints, "
                        f"got {type(normalized_shape).__name__}")
    try:
        shape = tuple(normalized_shape)  # a sequence, array or tensor of sizes
    except TypeError:
        # one integer: an int, or one such as NumPy's, as torch's modules take
        if isinstance(normalized_shape, bool) or not hasattr(normalized_shape, "__index__"):
            raise TypeError(f"{module}: normalized_shape must be an int or a sequence of ints, "
                            f"got {type(normalized_shape).__name__}") from None
        shape = (normalized_shape,)
    if any(isinstance(d, bool) or not hasattr(d, "__index__") for d in shape):
        raise TypeError(f"{module}: normalized_shape must be an int or a sequence of ints, got "
                        f"{', '.join(type(d).__name__ for d in shape)}")
    try:
        shape = tuple(d.__index__() for d in shape)
    except TypeError:  # a float tensor, an array of more than one dimension
        raise TypeError(f"{module}: normalized_shape must be an int or a sequence of ints, got "
                        f"{_described(normalized_shape)}") from None
    if not shape or any(d < 1 for d in shape):
        raise ValueError(f"{module}: normalized_shape must be one or more positive ints, got {shape!r}")
    return shape


def _described(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a NumPy array of dtype {value.dtype} and shape {value.shape}"
    return type(value).__name__


def _parameter_options(module: str, device, dtype):
    """The ``device`` and ``dtype`` of the module's parameters, checked before torch's factory sees
    them (it raises RuntimeErrors that name neither the module nor the argument)."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        shown = dtype if isinstance(dtype, torch.dtype) else type(dtype).__name__
        raise TypeError(f"{module}: dtype must be a floating-point torch.dtype or None, got {shown}")
    if device is None:
        return None, dtype
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"{module}: device must be a torch.device, a str, an int or None, got "
                        f"{type(device).__name__}")
    try:
        return torch.device(device), dtype
    except RuntimeError:
        raise ValueError(f"{module}: device {device!r} names no device torch knows") from None


def _check_weight(module: str, name: str, value, shape: tuple[int, ...]) -> None:
    """A parameter that was replaced after construction still has the normalised shape."""
    if value is not None and tuple(value.shape) != shape:
        raise ValueError(f"{module}: {name} has shape {tuple(value.shape)}, expected normalized_shape {shape}")


def _check_input(module: str, name: str, value, shape: tuple[int, ...]) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{module}: {name} must be a torch.Tensor, got {type(value).__name__}")
    k = len(shape)
    if value.ndim < k or tuple(value.shape[-k:]) != shape:
        raise ValueError(f"{module}: expected {name} with trailing shape {shape}, got {tuple(value.shape)}")


class RMSNorm(nn.Module):
    """RMSNorm over the trailing ``normalized_shape`` dimensions, optionally fused with a residual add.

    Args:
        normalized_shape: the trailing shape to normalise (an int for the last dimension).
        eps: added to the mean square; None means the machine epsilon of float32, the type the
            statistics are computed in, as ``torch.nn.RMSNorm`` takes it for float16, bfloat16 and
            float32 inputs alike (Hugging Face's modules use 1e-6 or the model config's value).
        elementwise_affine: learn a ``weight`` of shape ``normalized_shape``.
        casting: ``"llama"``, ``"gemma"`` or ``"none"`` (see ``treefold.rms_norm``).
        offset: added to the weight (1.0 for Gemma, whose checkpoints store ``weight`` with the
            1 taken out). The weight starts at ``1 - offset`` so that a fresh module scales by 1.

    ``forward(x)`` returns the normalised x; ``forward(x, residual)`` returns
    ``(normalised(x + residual), x + residual)``.
    To stand in for Hugging Face's ``LlamaRMSNorm``: ``RMSNorm(hidden, eps=1e-6)``; for
    ``GemmaRMSNorm``: ``RMSNorm(hidden, eps=1e-6, casting="gemma", offset=1.0)``; for
    ``torch.nn.RMSNorm``: ``RMSNorm(shape, eps, casting="gemma")``.
    """

    def __init__(self, normalized_shape: _Shape, eps: Optional[float] = 1e-6, elementwise_affine: bool = True,
                 *, casting: str = "llama", offset: float = 0.0, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _as_shape("RMSNorm", normalized_shape)
        check_casting("RMSNorm", casting)
        self.eps = None if eps is None else _checks.finite_float("RMSNorm", "eps", eps, low=0.0)
        self.elementwise_affine = _checks.flag("RMSNorm", "elementwise_affine", elementwise_affine)
        device, dtype = _parameter_options("RMSNorm", device, dtype)
        self.casting = casting
        self.offset = _checks.finite_float("RMSNorm", "offset", offset)
        if self.offset != 0.0 and not elementwise_affine:
            # (as ``treefold.rms_norm``: an offset is added to a weight, and there would be none)
            raise ValueError(f"RMSNorm: offset={self.offset} needs elementwise_affine=True (the offset is added "
                             f"to the weight)")
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.offset)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        k = len(self.normalized_shape)
        _check_input("RMSNorm", "x", x, self.normalized_shape)
        if residual is not None:
            _check_input("RMSNorm", "residual", residual, self.normalized_shape)
            if residual.shape != x.shape:
                raise ValueError(f"RMSNorm: residual has shape {tuple(residual.shape)}, expected x's shape "
                                 f"{tuple(x.shape)}")
        _check_weight("RMSNorm", "weight", self.weight, self.normalized_shape)
        eps = torch.finfo(torch.float32).eps if self.eps is None else self.eps
        n = math.prod(self.normalized_shape)
        flat = x if k == 1 else x.reshape(*x.shape[:-k], n)
        res = residual if residual is None or k == 1 else residual.reshape(*residual.shape[:-k], n)
        weight = self.weight if self.weight is None or k == 1 else self.weight.reshape(n)
        out = rms_norm(flat, weight, eps, residual=res, offset=self.offset, casting=self.casting)
        if k == 1:
            return out
        if residual is None:
            return out.view(x.shape)
        return out[0].view(x.shape), out[1].view(x.shape)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"casting={self.casting!r}, offset={self.offset}")


class LayerNorm(nn.Module):
    """LayerNorm with ``torch.nn.LayerNorm``'s signature, parameters and semantics.

    Args:
        normalized_shape: the trailing shape to normalise.
        eps: added to the variance.
        elementwise_affine: learn ``weight`` (ones) and, with ``bias``, ``bias`` (zeros).
        bias: whether there is a bias.
    """

    def __init__(self, normalized_shape: _Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _as_shape("LayerNorm", normalized_shape)
        self.eps = _checks.finite_float("LayerNorm", "eps", eps, low=0.0)
        self.elementwise_affine = _checks.flag("LayerNorm", "elementwise_affine", elementwise_affine)
        _checks.flag("LayerNorm", "bias", bias)
        device, dtype = _parameter_options("LayerNorm", device, dtype)
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
            if bias:
                self.bias = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        # torch.nn.LayerNorm's own: its wording changed between releases (2.13 names the bias,
        # 2.11 does not), and a drop-in prints what the installed torch's module prints
        return nn.LayerNorm.extra_repr(self)


class CrossEntropyLoss(nn.Module):
    """``torch.nn.CrossEntropyLoss`` for class-index targets, by ``treefold.cross_entropy``
    (float32 loss; see there). Class weights and probability targets are not supported, so the
    options are keyword-only: a weight passed where torch takes it first is a TypeError."""

    def __init__(self, *, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__()
        check_loss_options("CrossEntropyLoss", ignore_index, reduction, label_smoothing)
        self.ignore_index = int(ignore_index)
        self.reduction = reduction
        self.label_smoothing = float(label_smoothing)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, target, ignore_index=self.ignore_index, reduction=self.reduction,
                             label_smoothing=self.label_smoothing)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}")
