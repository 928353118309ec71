"""Accuracy of an output against a float64 reference.

- ``relative_l2``: ||actual - reference|| / ||reference|| over the finite elements;
- ``max_ulp``: the largest |actual - reference| in units in the last place of the *output's*
  dtype at the reference value (0.5 is a correctly rounded result; bf16 has 8 significant bits,
  fp16 11, fp32 24);
- ``max_abs`` and ``mean_abs``;
- ``nonfinite_mismatches``: elements where one side is NaN/Inf and the other is not the same
  NaN/Inf (those are left out of the other numbers and make the result fail loudly).

The numbers come from ``treefold.numerics.compare`` (judged in the output's dtype) when that
module is importable, so the bench and the tests speak the same numbers; they are computed here
otherwise, the same way. All arithmetic happens in float64 on the output's device.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

#: (explicit mantissa bits, smallest normal exponent) of each float dtype.
_FORMATS = {
    torch.float64: (52, -1022),
    torch.float32: (23, -126),
    torch.bfloat16: (7, -126),
    torch.float16: (10, -14),
}


def ulp(reference: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each value of ``reference`` (float64 result).

    Below the smallest normal number the spacing stays that of the smallest binade, as it does
    for subnormals.
    """
    if dtype not in _FORMATS:
        raise TypeError(f"ulp: dtype must be one of {', '.join(str(d) for d in _FORMATS)}, got {dtype}")
    mantissa_bits, min_exponent = _FORMATS[dtype]
    mag = reference.detach().to(torch.float64).abs()
    _, e = torch.frexp(mag)  # mag = m * 2**e with m in [0.5, 1): its binade is 2**(e - 1)
    binade = torch.where(mag > 0, e.to(torch.int64) - 1, torch.full_like(e, min_exponent, dtype=torch.int64))
    binade = binade.clamp(min=min_exponent)
    return torch.exp2((binade - mantissa_bits).to(torch.float64))


def _numerics_compare() -> Callable | None:
    try:
        from treefold import numerics  # noqa: PLC0415
    except Exception:
        return None
    return getattr(numerics, "compare", None)


def _field(result: Any, name: str):
    if isinstance(result, dict):
        return result.get(name)
    return getattr(result, name, None)


def _part_metrics(actual: torch.Tensor, expected: torch.Tensor) -> dict:
    if actual.shape != expected.shape:
        raise ValueError(f"accuracy: actual has shape {tuple(actual.shape)}, "
                         f"reference has shape {tuple(expected.shape)}")
    a = actual.detach().to(torch.float64)
    r = expected.detach().to(device=a.device, dtype=torch.float64)
    finite = torch.isfinite(a) & torch.isfinite(r)
    same_special = (torch.isnan(a) & torch.isnan(r)) | (torch.isinf(a) & torch.isinf(r) & (a == r))
    nonfinite_mismatches = int((~finite & ~same_special).sum())
    diff = torch.where(finite, a - r, torch.zeros_like(a)).abs()
    r_fin = torch.where(finite, r, torch.zeros_like(r))
    count = int(finite.sum())
    out = {
        "count": count,
        "sum_sq_diff": float((diff * diff).sum()),
        "sum_sq_ref": float((r_fin * r_fin).sum()),
        "sum_abs": float(diff.sum()),
        "max_abs": float(diff.max()) if diff.numel() else 0.0,
        "max_ulp": 0.0,
        "nonfinite_mismatches": nonfinite_mismatches,
    }
    if actual.dtype in _FORMATS and diff.numel():
        out["max_ulp"] = float((diff / ulp(r_fin, actual.dtype)).max())
    return out


def _relative_l2(sum_sq_diff: float, sum_sq_ref: float) -> float:
    if sum_sq_ref > 0:
        return math.sqrt(sum_sq_diff / sum_sq_ref)
    return 0.0 if sum_sq_diff == 0 else math.inf


def _parts(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _parts(o)]
    raise TypeError(f"accuracy: outputs must be tensors or tuples of tensors, got {type(out).__name__}")


def float_accuracy(actual: Any, expected: Any) -> dict:
    """Accuracy of a float output (a tensor or a tuple of tensors) against its float64 reference."""
    a_parts, r_parts = _parts(actual), _parts(expected)
    if len(a_parts) != len(r_parts):
        raise ValueError(f"accuracy: {len(a_parts)} output tensor(s) against {len(r_parts)} reference tensor(s)")
    parts = [_part_metrics(a, r) for a, r in zip(a_parts, r_parts)]
    count = sum(p["count"] for p in parts)
    sum_sq_diff = sum(p["sum_sq_diff"] for p in parts)
    sum_sq_ref = sum(p["sum_sq_ref"] for p in parts)
    result = {
        "max_abs": max(p["max_abs"] for p in parts),
        "mean_abs": sum(p["sum_abs"] for p in parts) / count if count else 0.0,
        "relative_l2": _relative_l2(sum_sq_diff, sum_sq_ref),
        "max_ulp": max(p["max_ulp"] for p in parts),
        "nonfinite_mismatches": sum(p["nonfinite_mismatches"] for p in parts),
        "source": "treefold.bench.accuracy",
    }
    compare = _numerics_compare()
    if compare is not None:
        try:
            theirs = [compare(a, r.to(a.device), dtype=a.dtype) for a, r in zip(a_parts, r_parts)]
            max_abs = [float(_field(t, "max_abs")) for t in theirs]
            mean_abs = [float(_field(t, "mean_abs")) for t in theirs]
            rel = [float(_field(t, "relative_l2")) for t in theirs]
            ulps = [_field(t, "max_ulps") for t in theirs]
        except Exception:
            return result
        # parts combine as one long vector: squared norms add, means weigh by element count
        result["max_abs"] = max(max_abs)
        if count:
            result["mean_abs"] = sum(m * p["count"] for m, p in zip(mean_abs, parts)) / count
        if sum_sq_ref > 0:
            result["relative_l2"] = _relative_l2(sum(r * r * p["sum_sq_ref"] for r, p in zip(rel, parts)),
                                                 sum_sq_ref)
        else:
            result["relative_l2"] = max(rel)
        if all(u is not None for u in ulps):
            result["max_ulp"] = max(float(u) for u in ulps)
        result["source"] = "treefold.numerics.compare"
    return result


def exact_accuracy(actual: Any, expected: Any) -> dict:
    """For outputs that must match exactly (indices, selected values): count differing elements."""
    a_parts, r_parts = _parts(actual), _parts(expected)
    if len(a_parts) != len(r_parts):
        raise ValueError(f"accuracy: {len(a_parts)} output tensor(s) against {len(r_parts)} reference tensor(s)")
    mismatches = 0
    for a, r in zip(a_parts, r_parts):
        if a.shape != r.shape:
            raise ValueError(f"accuracy: actual has shape {tuple(a.shape)}, reference has shape {tuple(r.shape)}")
        r = r.to(a.device)
        if a.dtype.is_floating_point or r.dtype.is_floating_point:
            a64, r64 = a.detach().to(torch.float64), r.detach().to(torch.float64)
            same = (a64 == r64) | (torch.isnan(a64) & torch.isnan(r64))
        else:
            same = a.detach().to(torch.int64) == r.detach().to(torch.int64)
        mismatches += int((~same).sum())
    return {"mismatches": mismatches, "source": "treefold.bench.accuracy"}


#: A relative L2 error above this is a wrong result, not a different rounding: the coarsest
#: outputs measured (bfloat16, 8 significant bits) come out near 2e-3 forward and 3e-3 backward.
WRONG_RELATIVE_L2 = 0.05


def wrong_output(acc: dict | None) -> str:
    """Why an accuracy record shows a wrong output ("" when it does not, or was not measured).

    Wrong means not the function at all: NaN or Inf where the reference has none (or the other
    way round), a relative L2 error above ``WRONG_RELATIVE_L2``, a differing index or selected
    value, or a token the filter does not keep. A provider whose output is wrong has no time
    worth comparing: the bench does not count it as a peer.
    """
    if not acc or "error" in acc:
        return ""
    if acc.get("invalid_tokens"):
        n = acc["invalid_tokens"]
        return f"{n} invalid token{'' if n == 1 else 's'}"
    if acc.get("mismatches"):
        return f"{acc['mismatches']} mismatched elements"
    if acc.get("nonfinite_mismatches"):
        return f"{acc['nonfinite_mismatches']} NaN/Inf where the reference differs"
    rel = acc.get("relative_l2")
    if rel is not None and not rel <= WRONG_RELATIVE_L2:
        return f"relative L2 error {rel:.2g}"
    return ""
