"""NumPy references for RMSNorm and LayerNorm, forward and backward, in the treefold order.

These define the arithmetic the kernels in ``treefold.kernels.norms`` perform, operation for
operation, in float32 with every operation rounded on its own:

- row sums are ``treefold.order.reference_sum`` with the group width of the dtype of the row
  being normalised (x, or h = x + residual), for every statistic of the forward and backward
  passes (squares and products are rounded to float32 before summing);
- the divisions and the square root are IEEE-rounded (NumPy's float32 ``sqrt`` is; torch's CPU
  float32 ``sqrt`` is not, so torch is used here only to round to bfloat16/float16, which it does
  to nearest, ties to even);
- ``rstd = 1 / sqrt(mean_square + eps)`` with both the square root and the quotient rounded.

So float32 results from the kernels are these bits exactly, and half-precision results are these
bits too (the kernels round float32 to half precision to nearest even, as torch does), NaN
payloads aside.

Weight and bias gradients are column sums over the M rows. Their order is part of the rule: the
rows are cut into blocks of ``weight_grad_rows_per_block(M, N)`` rows, each block is folded row
after row from zero, and the block partials are summed over the row axis the way the treefold
order sums segment results: one plain halving tree, zero-padded to a power of two.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import order

__all__ = [
    "CASTINGS", "WEIGHT_GRAD_BLOCKS", "WIDE_ROW", "WIDE_ROW_WEIGHT_GRAD_BLOCKS", "rms_norm_out_dtype",
    "weight_grad_rows_per_block",
    "rms_norm", "rms_norm_backward", "layer_norm", "layer_norm_backward", "column_sum",
]

#: The rounding conventions of ``treefold.rms_norm`` (see its docstring for the models each matches).
CASTINGS = ("llama", "gemma", "none")

#: At most this many row blocks (and so float32 partial rows) per weight or bias gradient.
WEIGHT_GRAD_BLOCKS = 256

#: Rows longer than WIDE_ROW take at most WIDE_ROW_WEIGHT_GRAD_BLOCKS blocks of equal length (the
#: last shorter). Their backward programs hold so many registers that one runs per SM on an
#: H100 SXM or H200 (132 SMs): 256 blocks ran there in two waves, the second 124 programs wide, and
#: 132 blocks in one (LayerNorm backward 16384 x 8192 220.3 -> 214.2 us, RMSNorm 207.1 -> 205.4).
#: The count is the order's, so it cannot follow the card: on one of fewer SMs 132 blocks take two
#: waves, the second nearly empty (an A100's 108 SMs: 24 programs; an H100 PCIe's 114: 18), where
#: 256 took three (not measured).
#: Rows of 4096 or fewer run two or more programs per SM, where 256 blocks fill the device.
WIDE_ROW = 4096
WIDE_ROW_WEIGHT_GRAD_BLOCKS = 132


def rms_norm_out_dtype(in_dtype: torch.dtype, weight_dtype: torch.dtype | None, casting: str) -> torch.dtype:
    """The output dtype ``rms_norm`` gives when ``out_dtype`` is None.

    "gemma" casts back to the normalised input's dtype (Hugging Face's ``type_as(x)``); "llama"
    and "none" follow torch's type promotion of the input and the weight (``weight * x``).
    """
    if casting == "gemma" or weight_dtype is None:
        return in_dtype
    return torch.promote_types(in_dtype, weight_dtype)


def weight_grad_rows_per_block(m: int, n: int) -> int:
    """Rows one block folds for the weight/bias gradient: a function of the shape alone.

    Rows of at most ``WIDE_ROW`` elements: the power of two at or above
    ``ceil(M / WEIGHT_GRAD_BLOCKS)``, so there are at most WEIGHT_GRAD_BLOCKS partial rows.
    Longer rows: ``ceil(M / WIDE_ROW_WEIGHT_GRAD_BLOCKS)``, at most that many partial rows. Either
    way the partials' treefold reduction is one halving tree.
    """
    if n > WIDE_ROW:
        return max(1, order.cdiv(int(m), WIDE_ROW_WEIGHT_GRAD_BLOCKS))
    return order.next_pow2(order.cdiv(int(m), WEIGHT_GRAD_BLOCKS))


# --------------------------------------------------------------------------------------------
# float32 building blocks
# --------------------------------------------------------------------------------------------

def _rows_f32(t: torch.Tensor, n: int) -> np.ndarray:
    """``t`` as float32 rows ``[prod(leading dims), n]`` (a 1-D weight is one row)."""
    rows = math.prod(t.shape[:-1])
    return np.ascontiguousarray(t.detach().to("cpu", torch.float32).reshape(rows, n).numpy())


def _round(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Round float32 values to ``dtype`` (nearest, ties to even) and widen back to float32."""
    if dtype == torch.float32:
        return a
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype).to(torch.float32).numpy()


def _tensor(a: np.ndarray, dtype: torch.dtype, shape) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(dtype).reshape(shape)


def _row_sum(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Row sums of float32 values in the treefold order, grouped as for rows of ``dtype``."""
    return order.reference_sum(a, axis=-1, dtype=dtype).astype(np.float32)


def _rstd(mean_square: np.ndarray, eps: float) -> np.ndarray:
    return (np.float32(1.0) / np.sqrt(mean_square + np.float32(eps))).astype(np.float32)


def column_sum(values: np.ndarray, rows_per_block: int) -> np.ndarray:
    """Column sums of float32 ``[M, N]`` values in the weight-gradient order (see module doc)."""
    m, n = values.shape
    blocks = order.cdiv(m, rows_per_block)
    padded = np.zeros((blocks * rows_per_block, n), dtype=np.float32)
    padded[:m] = values
    padded = padded.reshape(blocks, rows_per_block, n)
    # Fold row by row from zero; padding rows add +0, which leaves every partial unchanged
    # (a partial that starts at +0 can never become -0).
    partial = np.zeros((blocks, n), dtype=np.float32)
    for i in range(rows_per_block):
        partial = partial + padded[:, i]
    if blocks > order.MAX_LANES:
        raise ValueError(f"column_sum: {blocks} blocks exceed one tree of {order.MAX_LANES}")
    lanes = np.zeros((n, order.next_pow2(blocks)), dtype=np.float32)
    lanes[:, :blocks] = partial.T
    return order.halving_tree(lanes).astype(np.float32)


# --------------------------------------------------------------------------------------------
# RMSNorm
# --------------------------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
             residual: torch.Tensor | None = None, offset: float = 0.0, casting: str = "llama",
             out_dtype: torch.dtype | None = None):
    """RMSNorm over the last dimension; returns ``(y, h, rstd)``.

    ``h`` is ``x + residual`` rounded to the residual's dtype (None without a residual), and is
    what gets normalised. ``rstd`` is float32 with shape ``x.shape[:-1]``. ``casting`` as in
    ``treefold.rms_norm``; ``offset`` is added to the weight in float32 (only when nonzero).
    """
    n = x.shape[-1]
    in_dtype = residual.dtype if residual is not None else x.dtype
    if out_dtype is None:
        out_dtype = rms_norm_out_dtype(in_dtype, None if weight is None else weight.dtype, casting)
    v = _rows_f32(x, n)
    h = None
    if residual is not None:
        v = _round(v + _rows_f32(residual, n), residual.dtype)
        h = _tensor(v, residual.dtype, x.shape)
    if v.size == 0:
        return (torch.empty(x.shape, dtype=out_dtype), h,
                torch.full(x.shape[:-1], float("nan"), dtype=torch.float32))
    rstd = _rstd(_row_sum(v * v, in_dtype) / np.float32(n), eps)
    out = v * rstd[:, None]
    if casting == "llama":
        out = _round(out, in_dtype)
    if weight is not None:
        w = _rows_f32(weight, n)[0]
        if offset != 0.0:
            w = w + np.float32(offset)
        out = out * w
    return _tensor(out, out_dtype, x.shape), h, torch.from_numpy(rstd).reshape(x.shape[:-1])


def rms_norm_backward(dy: torch.Tensor, normed: torch.Tensor, weight: torch.Tensor | None,
                      rstd: torch.Tensor, *, offset: float = 0.0, casting: str = "llama",
                      dh_out: torch.Tensor | None = None, x_dtype: torch.dtype | None = None,
                      residual_dtype: torch.dtype | None = None, weight_grad: bool = True):
    """Gradients of ``rms_norm``; returns ``(dx, dresidual, dweight)``.

    ``normed`` is the row that was normalised (x, or h with a residual) and ``rstd`` its saved
    statistic. ``dh_out`` is the gradient arriving at the h output. ``dresidual`` is None without
    ``residual_dtype``; ``dweight`` is None without a weight or without ``weight_grad``.
    """
    n = normed.shape[-1]
    x_dtype = normed.dtype if x_dtype is None else x_dtype
    m = math.prod(normed.shape[:-1])
    v = _rows_f32(normed, n)
    g_out = _rows_f32(dy, n)
    r = rstd.detach().to("cpu", torch.float32).reshape(-1, 1).numpy()
    normalised = v * r
    w = None
    if weight is not None:
        w = _rows_f32(weight, n)[0]
        if offset != 0.0:
            w = w + np.float32(offset)
    g = g_out * w if w is not None else g_out
    c = _row_sum(g * normalised, normed.dtype) / np.float32(n)
    dx = (g - normalised * c[:, None]) * r
    if dh_out is not None:
        dx = dx + _rows_f32(dh_out, n)
    dw = None
    if weight is not None and weight_grad:
        kept = _round(normalised, normed.dtype) if casting == "llama" else normalised
        dw = _tensor(column_sum(g_out * kept, weight_grad_rows_per_block(m, n)), weight.dtype, (n,))
    dres = None if residual_dtype is None else _tensor(dx, residual_dtype, normed.shape)
    return _tensor(dx, x_dtype, normed.shape), dres, dw


# --------------------------------------------------------------------------------------------
# LayerNorm
# --------------------------------------------------------------------------------------------

def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5):
    """LayerNorm over the last dimension (two passes); returns ``(y, mean, rstd)``.

    mean = sum(x) / N, var = sum((x - mean)^2) / N, y = ((x - mean) * rstd) * w + b, in float32,
    rounded to x's dtype at the end.
    """
    n = x.shape[-1]
    v = _rows_f32(x, n)
    if v.size == 0:
        nan = torch.full(x.shape[:-1], float("nan"), dtype=torch.float32)
        return torch.empty(x.shape, dtype=x.dtype), nan, nan.clone()
    mean = _row_sum(v, x.dtype) / np.float32(n)
    d = v - mean[:, None]
    rstd = _rstd(_row_sum(d * d, x.dtype) / np.float32(n), eps)
    out = d * rstd[:, None]
    if weight is not None:
        out = out * _rows_f32(weight, n)[0]
    if bias is not None:
        out = out + _rows_f32(bias, n)[0]
    lead = x.shape[:-1]
    return _tensor(out, x.dtype, x.shape), torch.from_numpy(mean).reshape(lead), torch.from_numpy(rstd).reshape(lead)


def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                        mean: torch.Tensor, rstd: torch.Tensor, *, weight_grad: bool = True,
                        bias_dtype: torch.dtype | None = None):
    """Gradients of ``layer_norm``; returns ``(dx, dweight, dbias)``.

    ``dweight`` is None without a weight or ``weight_grad``; ``dbias`` is None without
    ``bias_dtype`` (the bias's dtype when its gradient is wanted).
    """
    n = x.shape[-1]
    m = math.prod(x.shape[:-1])
    v = _rows_f32(x, n)
    g_out = _rows_f32(dy, n)
    mu = mean.detach().to("cpu", torch.float32).reshape(-1, 1).numpy()
    r = rstd.detach().to("cpu", torch.float32).reshape(-1, 1).numpy()
    normalised = (v - mu) * r
    g = g_out * _rows_f32(weight, n)[0] if weight is not None else g_out
    c_gn = _row_sum(g * normalised, x.dtype) / np.float32(n)
    c_g = _row_sum(g, x.dtype) / np.float32(n)
    dx = ((g - c_g[:, None]) - normalised * c_gn[:, None]) * r
    block = weight_grad_rows_per_block(m, n)
    dw = None
    if weight is not None and weight_grad:
        dw = _tensor(column_sum(g_out * normalised, block), weight.dtype, (n,))
    db = None if bias_dtype is None else _tensor(column_sum(g_out, block), bias_dtype, (n,))
    return _tensor(dx, x.dtype, x.shape), dw, db
