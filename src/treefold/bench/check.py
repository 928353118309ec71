"""``treefold check``: every available op against float64 references, next to torch eager.

The error budget of an op in a dtype is what the output format and the established
implementation allow: twice the larger of (a) torch eager's own relative L2 error on the same
inputs and (b) the unit roundoff of the output dtype, the error of rounding a correct result once.
An op is within budget when its relative L2 error is inside that and no NaN/Inf appears where the
reference has a finite value (or the reverse). Indices, selected values and sampled tokens must
match exactly. ``treefold.numerics.three_way`` adds its three-source comparison when available.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .cases import DTYPES, Case, Shape, select_cases
from .env import short_error
from .providers import TorchProvider, TreefoldProvider
from .report import fmt_accuracy, markdown_table
from .runner import clone_inputs, compute_reference, make_inputs, make_runner

#: Unit roundoff (half an ulp at 1) of each output dtype.
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11,
                 torch.float64: 2.0 ** -53}


@dataclass
class CheckConfig:
    ops: list[str] = field(default_factory=list)
    dtype: str | None = None
    backward: bool = False
    cpu: bool = False
    seed: int = 0


def _first_float(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out if out.dtype.is_floating_point else None
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _first_float(o)
            if t is not None:
                return t
    return None


def _output_accuracy(case: Case, provider, inputs: dict, shape: Shape, reference) -> tuple[dict | None, Any, str]:
    """(accuracy, output, error message) of one provider on one shape."""
    own = clone_inputs(case, inputs)
    try:
        impl = provider.build(case, own, shape)
        if impl is None:
            return None, None, "no implementation"
        _, first = make_runner(case, impl, reference.grad_outputs)
        return case.accuracy(first, reference.value, impl.inputs), first, ""
    except Exception as e:
        return None, None, short_error(e)


def verdict(ours: dict | None, theirs: dict | None, out_dtype: torch.dtype | None) -> tuple[str, str]:
    """(budget text, verdict) for one op, dtype and shape."""
    if ours is None:
        return "-", "ERROR"
    if "invalid_tokens" in ours:
        return "0 invalid", "ok" if ours["invalid_tokens"] == 0 else "OVER"
    if "mismatches" in ours:
        return "0 mismatched", "ok" if ours["mismatches"] == 0 else "OVER"
    u = UNIT_ROUNDOFF.get(out_dtype, 2.0 ** -24)
    torch_rel = (theirs or {}).get("relative_l2") or 0.0
    budget = 2.0 * max(torch_rel, u)
    rel = ours.get("relative_l2")
    ok = rel is not None and rel <= budget and not ours.get("nonfinite_mismatches")
    return f"{budget:.2e}", "ok" if ok else "OVER"


def _three_way(case: Case, treefold_ns: Any, inputs: dict) -> tuple[str, bool]:
    """(one line per low dtype, whether any comparison failed); ("", False) without numerics."""
    try:
        from treefold import numerics  # noqa: PLC0415
        three_way = numerics.three_way
    except Exception:
        return "", False
    base = dict(inputs)

    def with_x(x: torch.Tensor) -> dict:
        d = {k: (v.to(x.dtype) if isinstance(v, torch.Tensor) and v.dtype.is_floating_point else v)
             for k, v in base.items()}
        d["x"] = x
        return d

    texts, failed = [], False
    for low in (torch.bfloat16, torch.float16):
        try:
            report = three_way(lambda x: case.call_treefold(treefold_ns, with_x(x)),
                               lambda x: case.eager(with_x(x)), inputs["x"].detach().float(), low=low)
        except Exception as e:
            texts.append(f"{str(low).replace('torch.', '')}: three_way failed ({short_error(e)})")
            failed = True
            continue
        ok = report.get("ok") if isinstance(report, dict) else getattr(report, "ok", None)
        reason = report.get("reason") if isinstance(report, dict) else getattr(report, "reason", None)
        name = str(low).replace("torch.", "")
        failed = failed or not ok
        texts.append(f"{name}: {'ok' if ok else 'FAIL'} ({reason})" if reason is not None else f"{name}: {report}")
    return "; ".join(texts), failed


def run_check(config: CheckConfig, *, treefold_namespace: Any = None, log: Callable[[str], None] = print,
              cases: list[Case] | None = None) -> dict:
    device = torch.device("cpu") if config.cpu else torch.device("cuda", torch.cuda.current_device())
    treefold = TreefoldProvider(treefold_namespace)
    treefold.load()
    eager = TorchProvider()
    shape_set = "small" if config.cpu else "check"
    dtypes = [config.dtype] if config.dtype else list(DTYPES)
    rows, notes, skipped = [], [], []
    for case in select_cases(config.ops, config.backward, cases):
        if not treefold.has(case):
            line = f"treefold has no {case.treefold_op}() yet: {case.name} not checked"
            skipped.append(line)
            log(line)
            continue
        for dtype in dtypes:
            for shape in case.shapes_for(shape_set, dtype):
                try:
                    inputs = make_inputs(case, shape, device, config.seed)
                    reference = compute_reference(case, inputs, config.seed)
                except Exception as e:
                    line = f"{case.name} {case.label(shape)} {dtype}: no float64 reference ({short_error(e)})"
                    skipped.append(line)
                    log(line)
                    continue
                ours, out, error = _output_accuracy(case, treefold, inputs, shape, reference)
                theirs, _, torch_error = _output_accuracy(case, eager, inputs, shape, reference)
                out_float = _first_float(out)
                budget, judged = verdict(ours, theirs, out_float.dtype if out_float is not None else None)
                rows.append({"case": case.name, "label": case.label(shape), "dtype": dtype, "treefold": ours,
                             "torch": theirs, "budget": budget, "verdict": judged,
                             "message": error or (f"torch: {torch_error}" if torch_error else "")})
        if case.unary and case.outputs == "float":
            shape = case.shapes_for(shape_set, "fp32")[0]
            text, failed = _three_way(case, treefold.namespace, make_inputs(case, shape, device, config.seed))
            if text:
                notes.append({"case": case.name, "label": case.label(shape), "three_way": text, "failed": failed})
    return {"device": str(device), "rows": rows, "three_way": notes, "skipped": skipped,
            "over_budget": sum(r["verdict"] != "ok" for r in rows) + sum(n["failed"] for n in notes)}


def render_check(result: dict) -> str:
    table = []
    for r in result["rows"]:
        ours_rel, ours_ulp = fmt_accuracy(r["treefold"])
        torch_rel, torch_ulp = fmt_accuracy(r["torch"])
        table.append([r["case"], r["dtype"], r["label"], ours_rel, ours_ulp, torch_rel, torch_ulp, r["budget"],
                      r["verdict"], r["message"].replace("|", "/")])
    lines = [f"treefold check on {result['device']}: error budget = 2 x max(torch eager's relative L2, "
             f"unit roundoff of the output dtype); indices and tokens must match exactly", ""]
    lines += markdown_table(["op", "dtype", "shape", "treefold rel. L2", "max ulp", "torch rel. L2", "max ulp",
                     "budget", "verdict", "remark"], table)
    if result["three_way"]:
        lines += ["", "three-way comparison (treefold.numerics.three_way, fp32 input):"]
        lines += [f"- {n['case']} {n['label']}: {n['three_way']}" for n in result["three_way"]]
    lines += ["", f"{len(result['rows'])} checked; {result['over_budget']} over budget or failed "
                  f"(three-way failures included)"]
    return "\n".join(lines)
