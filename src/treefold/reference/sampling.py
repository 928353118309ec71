"""Pure torch/NumPy references for the sampling family (correct, not fast).

They define what the kernels compute (``treefold.kernels.sampling`` explains the method):

- the *composite order* of a row: logit descending, then token index ascending (-0.0 == +0.0);
- every filter keeps a prefix of that order (top-k, then top-p on the top-k set renormalised,
  then min-p), decided here in float64;
- the sample is the exponential race over the kept tokens with the same Philox numbers and the
  same float32 arithmetic as the kernels, so the interpreted kernels give the same tokens (the
  compiled ones use fast logs and division, within 2^-21 of this noise);
- non-finite logits (NaN, +inf, -inf) are never kept or drawn; a row without a finite logit, or
  with an out-of-range per-row parameter, samples -1.

``filtered_probs`` gives the float64 distribution a row samples from (for statistical tests).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

__all__ = ["philox4x32", "race_noise", "kept_mask", "filtered_probs", "sample", "top_k",
           "filter_mask", "row_parameters"]

_M32 = np.uint64(0xFFFFFFFF)
_ROUND_A, _ROUND_B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_KEY_A, _KEY_B = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_F32 = np.float32
_FLT_MAX = _F32(3.4028234663852886e38)
_MAX_INV_TEMPERATURE = _F32(1e30)


def philox4x32(seed, c0, c1, c2, c3, rounds: int = 10):
    """Philox4x32 (Salmon et al. 2011) as ``triton.language.philox`` computes it: key = the two
    32-bit halves of the int64 seed (low first), counters c0..c3 (uint32). Returns four uint32
    arrays."""
    seed = np.asarray(seed, dtype=np.int64).astype(np.uint64)
    k0, k1 = seed & _M32, (seed >> np.uint64(32)) & _M32
    c = [np.asarray(v).astype(np.uint64) & _M32 for v in (c0, c1, c2, c3)]
    c0, c1, c2, c3 = np.broadcast_arrays(*c)
    k0, k1 = np.broadcast_to(k0, c0.shape), np.broadcast_to(k1, c0.shape)
    for _ in range(rounds):
        p0, p2 = _ROUND_B * c2, _ROUND_A * c0  # < 2^64: exact in uint64
        n0 = (p0 >> np.uint64(32)) ^ c1 ^ k0
        n2 = (p2 >> np.uint64(32)) ^ c3 ^ k1
        c0, c1, c2, c3 = n0, p0 & _M32, n2, p2 & _M32
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return tuple(v.astype(np.uint32) for v in (c0, c1, c2, c3))


def _noise_from_bits(r: np.ndarray) -> np.ndarray:
    """-log(E), E = -log(u), u = (2j + 1) / 2^24: the kernels' float32 arithmetic, step by step."""
    u = ((r >> np.uint32(9)).astype(np.int32).astype(_F32) * _F32(2.0) + _F32(1.0)) \
        * _F32(5.9604644775390625e-08)
    s = (u - _F32(1.0)) / (u + _F32(1.0))
    s2 = s * s
    series = _F32(1.0) + s2 * (_F32(1 / 3) + s2 * (_F32(0.2) + s2 * (_F32(1 / 7) + s2 * (
        _F32(1 / 9) + s2 * (_F32(1 / 11) + s2 * (_F32(1 / 13) + s2 * _F32(1 / 15)))))))
    with np.errstate(divide="ignore"):
        log_u = np.where(u >= _F32(0.5), _F32(2.0) * s * series, np.log(u)).astype(_F32)
        return (-np.log(-log_u)).astype(_F32)


def race_noise(tokens, seed: int, stream: int, offset: int) -> np.ndarray:
    """The race noise of ``tokens`` for one row: Philox block token // 4 with counters
    (token // 4, stream, offset low, offset high), output token % 4."""
    tokens = np.asarray(tokens, dtype=np.int64)
    off = np.int64(offset)
    r = philox4x32(np.int64(seed), tokens >> 2, np.uint64(np.int64(stream)) & _M32,
                   np.uint64(off) & _M32, np.uint64(off >> np.int64(32)) & _M32)
    lane = tokens & 3
    bits = np.choose(lane, r)
    return _noise_from_bits(bits)


def _inv_temperature(t: float):
    """(1 / t in float32, noise scale, valid), as the kernels compute them."""
    t = _F32(t)
    ok = bool(t >= 0 and np.isfinite(t))
    if not ok or t == 0:
        return _F32(1.0), 0.0 if t == 0 else 1.0, ok
    with np.errstate(over="ignore", divide="ignore"):
        inv = _F32(1.0) / max(t, _F32(1.5e-38))
    return min(inv, _MAX_INV_TEMPERATURE), 1.0, ok


def _scaled(x: np.ndarray, inv_t) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.clip((x * inv_t).astype(_F32), -_FLT_MAX, _FLT_MAX)


def composite_order(x: np.ndarray) -> np.ndarray:
    """Indices of ``x`` (one row, float32) in the composite order."""
    xv = x.astype(np.float64)
    xv = np.where(np.isnan(xv), np.inf, xv)  # NaN ranks above +inf (top_k); callers mask it
    return np.lexsort((np.arange(x.size), -xv))


def kept_mask(x: np.ndarray, inv_t, k: Optional[int], p: Optional[float],
              min_p: Optional[float]) -> np.ndarray:
    """Tokens of one row (float32 logits) that the filters keep, decided in float64:
    top-k, then top-p on the renormalised top-k set, then min-p."""
    x = np.asarray(x, dtype=_F32)
    valid = np.isfinite(x)
    keep = np.zeros(x.size, dtype=bool)
    if not valid.any():
        return keep
    y = _scaled(x, inv_t).astype(np.float64)
    m = y[valid].max()
    w = np.where(valid, np.exp(np.where(valid, y - m, 0.0)), 0.0)
    order = composite_order(x)
    order = order[valid[order]]
    ws = w[order]
    keep_sorted = np.ones(order.size, dtype=bool)
    if k is not None and k < order.size:
        keep_sorted[k:] = False
    if p is not None and p < 1.0:
        mass = ws[keep_sorted].sum()
        before = np.cumsum(ws) - ws
        keep_sorted &= before < p * mass
    if min_p is not None and min_p > 0.0:
        keep_sorted &= ws >= min_p
    keep[order[keep_sorted]] = True
    return keep


def row_parameters(rows: int, temperature, top_k, top_p, min_p, seed, offset):
    """Per-row Python values (None for an absent filter) from scalars or tensors, plus the
    Philox stream of each row: a per-row seed tensor gives stream 0, one seed gives stream r.
    temperature, p and min_p are rounded to float32, as the kernels receive them."""
    def per_row(v, kind):
        if v is None:
            return [None] * rows
        if isinstance(v, torch.Tensor):
            flat = v.detach().reshape(-1).cpu()
            vals = flat.tolist() if flat.numel() == rows else flat.tolist() * rows
            return [kind(a) for a in vals]
        return [kind(v)] * rows
    per_row_seed = isinstance(seed, torch.Tensor) and seed.numel() == rows
    streams = [0] * rows if per_row_seed else list(range(rows))
    as_f32 = lambda a: float(np.float32(a))  # noqa: E731  (the kernels take these as float32)
    return (per_row(temperature, as_f32), per_row(top_k, int), per_row(top_p, as_f32),
            per_row(min_p, as_f32), per_row(seed, int), per_row(offset, int), streams)


def _params_ok(n: int, t, k, p, mp) -> bool:
    if not (t >= 0 and np.isfinite(t)):
        return False
    if k is not None and not 1 <= k <= n:
        return False
    if p is not None and not 0.0 < p <= 1.0:
        return False
    if mp is not None and not 0.0 <= mp <= 1.0:
        return False
    return True


def filtered_probs(logits: torch.Tensor, temperature=1.0, top_k=None, top_p=None,
                   min_p=None) -> torch.Tensor:
    """The float64 distribution each row samples from ([rows, n]; zeros for a row that samples
    -1, one-hot on the composite-order top token for temperature 0)."""
    x2 = logits.detach().reshape(-1, logits.shape[-1]).to("cpu", torch.float32).numpy()
    rows, n = x2.shape
    ts, ks, ps, mps, _, _, _ = row_parameters(rows, temperature, top_k, top_p, min_p, 0, 0)
    out = np.zeros((rows, n), dtype=np.float64)
    for r in range(rows):
        if not _params_ok(n, ts[r], ks[r], ps[r], mps[r]):
            continue
        inv_t, noise_scale, _ = _inv_temperature(ts[r])
        keep = kept_mask(x2[r], inv_t, ks[r], ps[r], mps[r])
        if not keep.any():
            continue
        if noise_scale == 0.0:
            order = composite_order(x2[r])
            out[r, order[keep[order]][0]] = 1.0
            continue
        y = _scaled(x2[r], inv_t).astype(np.float64)
        w = np.where(keep, np.exp(np.where(keep, y - y[keep].max(), 0.0)), 0.0)
        out[r] = w / w.sum()
    return torch.from_numpy(out)


def sample(logits: torch.Tensor, temperature=1.0, top_k=None, top_p=None, min_p=None,
           seed=0, offset=0) -> torch.Tensor:
    """Token ids ([rows], int64) of ``logits`` ([rows, n]); parameters as ``treefold.sample``
    takes them after validation (scalars, or tensors of one or ``rows`` elements)."""
    x2 = logits.detach().reshape(-1, logits.shape[-1]).to("cpu", torch.float32).numpy()
    rows, n = x2.shape
    ts, ks, ps, mps, seeds, offs, streams = row_parameters(rows, temperature, top_k, top_p, min_p,
                                                           seed, offset)
    out = np.full(rows, -1, dtype=np.int64)
    keep = np.zeros((rows, n), dtype=bool)
    scores = np.full((rows, n), -np.inf, dtype=_F32)
    noisy = np.zeros(rows, dtype=bool)
    cache = {}  # rows with the same logits and filters share their kept set
    for r in range(rows):
        if not _params_ok(n, ts[r], ks[r], ps[r], mps[r]):
            continue
        inv_t, noise_scale, _ = _inv_temperature(ts[r])
        key = (x2[r].tobytes(), float(inv_t), ks[r], ps[r], mps[r])
        if key not in cache:
            cache[key] = kept_mask(x2[r], inv_t, ks[r], ps[r], mps[r])
        keep[r] = cache[key]
        scores[r] = np.where(keep[r], _scaled(x2[r], inv_t), -np.inf)
        noisy[r] = noise_scale > 0.0
    # the race noise of every kept token of the noisy rows, in one vectorised Philox call
    rr, tt = np.nonzero(keep & noisy[:, None])
    if rr.size:
        seed_a = np.array(seeds, dtype=np.int64)[rr]
        stream_a = np.array(streams, dtype=np.int64)[rr]
        off_a = np.array(offs, dtype=np.int64)[rr]
        bits = philox4x32(seed_a, tt >> 2, stream_a.astype(np.uint64) & _M32,
                          off_a.astype(np.uint64) & _M32,
                          (off_a >> np.int64(32)).astype(np.uint64) & _M32)
        noise = _noise_from_bits(np.choose(tt & 3, bits))
        scores[rr, tt] = (scores[rr, tt] + noise).astype(_F32)
    any_kept = keep.any(axis=1)
    out[any_kept] = np.argmax(scores[any_kept], axis=1)  # the first maximum: the lowest index
    return torch.from_numpy(out).to(logits.device)


def top_k(x: torch.Tensor, k: int):
    """The k largest values along the last dim, sorted descending, ties to the lowest index;
    NaN ranks above +inf and -0.0 equals +0.0 (as torch.sort orders them)."""
    values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k].contiguous(), indices[..., :k].contiguous()


def filter_mask(x: torch.Tensor, top_k=None, top_p=None, min_p=None, probs: bool = False):
    """Masked logits (-inf outside the kept set; x's dtype) or renormalised probabilities
    (float32; NaN for a row without a finite logit)."""
    x2 = x.detach().reshape(-1, x.shape[-1]).to("cpu", torch.float32).numpy()
    rows, n = x2.shape
    _, ks, ps, mps, _, _, _ = row_parameters(rows, 1.0, top_k, top_p, min_p, 0, 0)
    keep = np.zeros((rows, n), dtype=bool)
    for r in range(rows):
        if _params_ok(n, 1.0, ks[r], ps[r], mps[r]):  # a row with a bad parameter keeps nothing
            keep[r] = kept_mask(x2[r], _F32(1.0), ks[r], ps[r], mps[r])
    keep_t = torch.from_numpy(keep).reshape(x.shape).to(x.device)
    if not probs:
        return torch.where(keep_t, x, torch.full_like(x, float("-inf")))
    xd = torch.from_numpy(x2.astype(np.float64))
    kd = torch.from_numpy(keep)
    masked = torch.where(kd, xd, torch.full_like(xd, float("-inf")))
    m = masked.max(dim=-1, keepdim=True).values
    w = torch.where(kd, torch.exp(masked - torch.where(torch.isfinite(m), m, 0.0)), 0.0)
    total = w.sum(dim=-1, keepdim=True)
    prob = torch.where(total > 0, w / total, torch.full_like(w, float("nan")))
    return prob.to(torch.float32).reshape(x.shape).to(x.device)
