"""References for the softmax family: float64 torch (the CPU path) and the treefold order in NumPy.

``softmax``, ``logsumexp`` and their backward functions compute in float64 from the same float32
inputs the kernels see (x converted to float32 and multiplied by float32(1 / temperature)), then
round once to the output dtype: correct to the last bit of bf16/fp16 outputs and to about one ulp
of float32 ones. They are what a CPU tensor gets when the Triton interpreter is off, so their
results are contiguous whatever the input's strides, like the kernels' (the registered ops' fake
implementations promise that layout to torch.compile).

``order_forward`` and ``order_backward`` follow the kernels' order operation for operation in
float32 NumPy (segment maxima, ``order.halving_tree`` sums of exponentials, the halving tree of
(max, sum) merges, the same output formulas). With NumPy's ``exp`` and ``log`` they give the bits
of the kernels run through the Triton interpreter; the compiled kernels use the GPU's exp and log,
so on the GPU they agree to a few ulp, not to the bit.

The rules shared with the kernels: a row that is entirely -inf gives softmax 0, log_softmax
-inf and logsumexp -inf (and a zero gradient); a row holding NaN gives NaN; a row holding +inf
gives NaN for softmax and log_softmax, and +inf for logsumexp when it holds no NaN.
"""
from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
import torch

from .. import order

__all__ = ["softmax", "logsumexp", "softmax_backward", "logsumexp_backward", "cross_entropy",
           "cross_entropy_backward", "order_forward", "order_backward", "order_states"]


def _inverse_temperature32(temperature: float) -> float:
    return float(np.float32(1.0 / temperature))


def _scaled64(x: torch.Tensor, temperature: float) -> torch.Tensor:
    x32 = x.float()
    if temperature != 1.0:
        x32 = x32 * torch.tensor(_inverse_temperature32(temperature), dtype=torch.float32)
    return x32.double()


def softmax(x: torch.Tensor, log: bool = False, temperature: float = 1.0,
            out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """softmax (or log_softmax) over the last dim, computed in float64, rounded to ``out_dtype``."""
    out_dtype = out_dtype or x.dtype
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=out_dtype, device=x.device)
    xs = _scaled64(x, temperature)
    m = xs.amax(dim=-1, keepdim=True)
    m_safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    z = torch.exp(xs - m_safe).sum(dim=-1, keepdim=True)
    if log:
        log_z = torch.where(z == 0, torch.zeros_like(z), torch.log(z))
        y = (xs - m_safe) - log_z
    else:
        y = torch.where(z == 0, torch.zeros_like(xs), torch.exp(xs - m_safe) / z)
    return y.to(out_dtype, memory_format=torch.contiguous_format)


def logsumexp(x: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dim, computed in float64, rounded to ``x.dtype``; -inf for n = 0."""
    if x.shape[-1] == 0:
        return torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    xs = x.double()
    m = xs.amax(dim=-1)
    # Shifting by 0 when the maximum is infinite: a -inf row sums to 0 (log: -inf); a row with
    # +inf sums to +inf; NaN stays NaN.
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    lse = m_safe + torch.log(torch.exp(xs - m_safe[..., None]).sum(dim=-1))
    return lse.to(x.dtype, memory_format=torch.contiguous_format)


def softmax_backward(grad: torch.Tensor, y: torch.Tensor, log: bool = False, temperature: float = 1.0,
                     x_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """dx of softmax / log_softmax from dy and the forward output y, in float64."""
    dy, yy = grad.double(), y.double()
    if log:
        dx = dy - torch.exp(yy) * dy.sum(dim=-1, keepdim=True)
    else:
        dx = yy * (dy - (dy * yy).sum(dim=-1, keepdim=True))
    if temperature != 1.0:
        dx = dx * _inverse_temperature32(temperature)
    return dx.to(x_dtype or y.dtype, memory_format=torch.contiguous_format)


def logsumexp_backward(grad: torch.Tensor, x: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """dx of logsumexp: dlse * exp(x - lse), 0 for a row that is entirely -inf."""
    lse64 = lse.double()
    lse64 = torch.where(lse64 == float("-inf"), torch.zeros_like(lse64), lse64)
    dx = grad.double()[..., None] * torch.exp(x.double() - lse64[..., None])
    return dx.to(x.dtype, memory_format=torch.contiguous_format)


def _max_and_log_z(xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M', log Z) of float64 rows (n >= 1), M' the row maximum (0 for an all -inf row) and
    log Z = log(sum(exp(x - M'))), so that their sum is the logsumexp by the rules above (+inf
    for a row holding +inf and no NaN: log Z is +inf there, as in the kernels)."""
    m = xs.amax(dim=-1)
    m_shift = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return m_shift, torch.log(torch.exp(xs - m_safe[..., None]).sum(dim=-1))


def _cross_entropy_rows(xs: torch.Tensor, target: torch.Tensor, ignore_index: int):
    """(M', log Z, target as int64, counted rows, rows whose target is in [0, n)) of float64 rows."""
    t = target.long()
    return (*_max_and_log_z(xs), t, t != ignore_index, (t >= 0) & (t < xs.shape[-1]))


def cross_entropy(x: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                  smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss [rows], stats [2, rows]), float32, of logits ``x`` [rows, n >= 1] and class indices
    ``target`` [rows], computed in float64 and rounded once:

        loss = lse - x[t], or with label smoothing eps = ``smoothing``
        loss = (1 - eps) * (lse - x[t]) + eps * (lse - sum(x) / n);

    0 for a row whose target is ``ignore_index``; NaN for a target outside [0, n) and for a row
    holding +inf (torch's log_softmax is NaN there); a row that is entirely -inf gives NaN.
    ``stats`` are each row's M' and log Z as the kernels save them (see ``_max_and_log_z``)."""
    xs = x.double()
    m_shift, log_z, t, counted, inside = _cross_entropy_rows(xs, target, ignore_index)
    lse = m_shift + log_z
    logit = xs.gather(-1, torch.where(inside, t, 0)[:, None])[:, 0]
    loss = lse - logit
    if smoothing:
        eps = float(np.float32(smoothing))
        loss = (1.0 - eps) * loss + eps * (lse - xs.sum(dim=-1) / xs.shape[-1])
    loss = torch.where((m_shift == float("inf")) | ~inside, float("nan"), loss)
    loss = torch.where(counted, loss, 0.0)
    return loss.float(), torch.stack((m_shift, log_z)).float()


def cross_entropy_backward(grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                           smoothing: float = 0.0) -> torch.Tensor:
    """dx of ``cross_entropy``'s loss, dloss = ``grad`` [rows], in float64, rounded once to
    x's dtype: dloss * (softmax(x) - (1 - eps) * one_hot(t) - eps / n). An ignored row gets
    dloss = 0 (so 0, unless the row holds NaN or an infinity); a row whose loss is NaN for its
    lse or its target gets NaN. Torch's operations: differentiable again."""
    xs = x.double()
    m_shift, log_z, t, counted, inside = _cross_entropy_rows(xs, target, ignore_index)
    lse = m_shift + log_z
    eps = float(np.float32(smoothing)) if smoothing else 0.0
    hit = torch.arange(xs.shape[-1], device=x.device)[None, :] == torch.where(counted & inside, t, -1)[:, None]
    term = torch.where(hit, 1.0 - eps, 0.0).double() + eps / xs.shape[-1]
    g = torch.where(counted, grad.double(), 0.0)
    dx = g[:, None] * (torch.exp(xs - lse[:, None]) - term)
    bad = torch.isinf(lse) | (counted & ~inside)
    dx = torch.where(bad[:, None], float("nan"), dx)
    return dx.to(x.dtype, memory_format=torch.contiguous_format)


# ---- the kernels' order in float32 NumPy ---------------------------------------------------

def _rows32(x, temperature: float = 1.0) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").float().numpy()
    a = np.asarray(x).astype(np.float32)
    a = a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
    if temperature != 1.0:
        a = a * np.float32(_inverse_temperature32(temperature))
    return a


def _dtype_of(dtype):
    """A NumPy-sized stand-in for a torch dtype (only its item size matters to the order)."""
    if isinstance(dtype, torch.dtype):
        return {1: np.int8, 2: np.float16, 4: np.float32, 8: np.float64}[dtype.itemsize]
    return dtype


def _pad_segments(a: np.ndarray, fill: float) -> np.ndarray:
    rows, n = a.shape
    lanes, seg_pow2 = order.lanes(n), order.next_pow2(order.num_segments(n))
    padded = np.full((rows, seg_pow2 * lanes), fill, dtype=np.float32)
    padded[:, :n] = a
    return padded.reshape(rows, seg_pow2, lanes)


def _read_dtype(x, dtype):
    return dtype if dtype is not None else getattr(x, "dtype", np.float32)


def order_states(x, temperature: float = 1.0, dtype=None):
    """(M, Z, any segment sum NaN) per row of ``x`` ([..., n]), in the kernels' order, float32.

    ``dtype`` is the dtype the kernel reads (it sets the group width); default ``x.dtype``.
    """
    _, _, big_m, z, has_nan = _states(x, temperature, dtype)
    return big_m, z, has_nan


def _states(x, temperature: float = 1.0, dtype=None):
    """``order_states`` with the segments' maxima m_s [rows, S'] and exp(x - m_s') tiles
    [rows, S', C] first (S' = next_pow2(S), padding -inf and 0)."""
    group = order.group(np.shape(x)[-1] if np.ndim(x) else 1, order.itemsize(_dtype_of(_read_dtype(x, dtype))))
    a = _rows32(x, temperature)
    tiles = _pad_segments(a, float("-inf"))
    with np.errstate(all="ignore"):
        # The segment max skips NaN, as the interpreter's tl.max (np.nanmax) and the GPU's max do
        # (a NaN still reaches every output through the segment's sum).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN segment: NaN, as intended
            m = np.nanmax(tiles, axis=-1).astype(np.float32)
        segment_max = m
        shift = np.where(np.isinf(m), np.float32(0), m).astype(np.float32)
        exps = np.exp(tiles - shift[..., None])
        s = order.grouped_tree(exps, group)
        has_nan = np.isnan(s).any(axis=-1)
        w = m.shape[-1]
        while w > 1:
            w //= 2
            ma, mb, sa, sb = m[:, :w], m[:, w:], s[:, :w], s[:, w:]
            m = np.maximum(ma, mb)
            m_safe = np.where(m == -np.inf, np.float32(0), m).astype(np.float32)
            s = sa * np.exp(ma - m_safe) + sb * np.exp(mb - m_safe)
        big_m, z = m[:, 0], s[:, 0]
        z = np.where(big_m == np.inf, np.float32(np.nan), z).astype(np.float32)
    return segment_max, exps, big_m, z, has_nan


def order_forward(x, op: str = "softmax", temperature: float = 1.0, dtype=None) -> np.ndarray:
    """The kernels' float32 result of ``op`` ("softmax", "log_softmax", "logsumexp") on rows of x.

    ``dtype``: the dtype the kernel reads (default ``x.dtype``), which sets the group width.
    """
    a = _rows32(x, temperature if op != "logsumexp" else 1.0)
    segment_max, exps, m, z, has_nan = _states(a, dtype=_read_dtype(x, dtype))
    with np.errstate(all="ignore"):
        if op == "logsumexp":
            lse = (m + np.log(z)).astype(np.float32)
            return np.where((m == np.inf) & ~has_nan, np.float32(np.inf), lse).astype(np.float32)
        c0 = np.where(m == -np.inf, np.float32(0), m).astype(np.float32)[:, None]
        if op == "softmax":
            # y = exp(x - m_s') * f_s, f_s = exp(m_s' - M') * (1 / Z), 0 for an all -inf segment
            c1 = np.where(z == 0, np.float32(0), np.float32(1) / z).astype(np.float32)[:, None]
            shift = np.where(np.isinf(segment_max), np.float32(0), segment_max).astype(np.float32)
            f = np.where(segment_max == -np.inf, np.float32(0), np.exp(shift - c0)).astype(np.float32) * c1
            y = (exps * f[..., None]).astype(np.float32).reshape(a.shape[0], -1)
            return y[:, :a.shape[1]]
        c1 = np.where(z == 0, np.float32(0), np.log(z)).astype(np.float32)[:, None]
        return ((a - c0) - c1).astype(np.float32)


def order_backward(grad, y, op: str = "softmax", temperature: float = 1.0, dtype=None) -> np.ndarray:
    """The kernels' float32 dx of softmax / log_softmax; the row sums are ``order.reference_sum``
    with the group width of ``dtype``, the dtype the kernel reads (default ``y.dtype``)."""
    read = _dtype_of(_read_dtype(y, dtype))
    dy, yy = _rows32(grad), _rows32(y)
    with np.errstate(all="ignore"):
        if op == "softmax":
            dot = order.reference_sum(dy * yy, dtype=read)[:, None]
            dx = yy * (dy - dot)
        else:
            total = order.reference_sum(dy, dtype=read)[:, None]
            dx = dy - np.exp(yy) * total
        if temperature != 1.0:
            dx = dx * np.float32(_inverse_temperature32(temperature))
    return dx.astype(np.float32)
