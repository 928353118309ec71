"""Writing a bench result: JSON for machines, a markdown table for people."""
from __future__ import annotations

import json
import math
import os
from typing import Any

from .env import describe_machine


def _clean(v: Any) -> Any:
    """JSON has no NaN or Infinity: non-finite floats become null (the row's status says why)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def write_json(result: dict, path: str) -> str:
    """Write atomically (a temporary file renamed), so a run killed mid-write leaves the last
    complete checkpoint behind."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_clean(result), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read_json(path: str) -> dict:
    with open(path) as f:
        result = json.load(f)
    if not isinstance(result, dict) or "results" not in result or "roof" not in result:
        raise ValueError(f"{path} is not a treefold bench result (no 'results' or 'roof')")
    return result


def merge_results(results: list[dict], name: str) -> dict:
    """Several runs on one machine as one report (a long bench split to fit a time limit).

    Each row keeps the % of roof of its own run, so every percentage still compares numbers
    taken together; the report lists every run's roof and command.
    """
    from .runner import summarize  # noqa: PLC0415

    if not results:
        raise ValueError("merge_results: no results to merge")
    where = {r["machine"].get("gpu") or r["machine"].get("cpu") for r in results}
    if len(where) > 1:
        raise ValueError(f"merge_results: the results come from different machines ({', '.join(map(str, where))})")
    merged = dict(results[0])
    merged["name"] = name
    if len(results) > 1:
        merged["results"] = [row for r in results for row in r["results"]]
        merged["host_overhead"] = [h for r in results for h in r.get("host_overhead", [])]
        merged["skipped"] = list(dict.fromkeys(s for r in results for s in r.get("skipped", [])))
        merged["cases"] = {k: v for r in results for k, v in r.get("cases", {}).items()}
        merged["parts"] = [{"command": r["command"], "created": r["created"], "roof_gbs": r["roof"]["gbs"]}
                           for r in results]
        merged["command"] = " && ".join(r["command"] for r in results)
    merged["summary"] = summarize(merged["results"])
    return merged


# ----------------------------------------------------------------------------------------------
# cells
# ----------------------------------------------------------------------------------------------

def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def fmt_us(v) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v < 1000 else f"{v:,.0f}"


def fmt_gbs(v) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def fmt_accuracy(acc: dict | None) -> tuple[str, str]:
    """(relative L2 or count cell, max-ulp cell)."""
    if acc is None:
        return "n/a", "n/a"
    if "error" in acc:
        return "error", "error"
    if "invalid_tokens" in acc:
        return f"{acc['invalid_tokens']} invalid", "-"
    if "mismatches" in acc:
        return f"{acc['mismatches']} mismatched", "-"
    rel = acc.get("relative_l2")
    bad = acc.get("nonfinite_mismatches") or 0
    rel_text = "inf" if rel is None or (isinstance(rel, float) and math.isinf(rel)) else f"{rel:.2e}"
    if bad:
        rel_text += f" ({bad} NaN/Inf off)"
    ulp = acc.get("max_ulp")
    return rel_text, _num(ulp, ".1f")


def fmt_distinct(distinct, runs) -> str:
    if distinct is None:
        return "n/a"
    return f"{distinct}/{runs}"


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


# ----------------------------------------------------------------------------------------------
# the document
# ----------------------------------------------------------------------------------------------

def summary_table(result: dict) -> list[str]:
    rows = []
    for s in result["summary"]:
        rel, ulp = fmt_accuracy(s["accuracy"])
        if s["treefold_us"] is None:
            tf_cells = [s["treefold_status"], "-", "-"]
        else:
            tf_cells = [fmt_us(s["treefold_us"]), fmt_gbs(s["treefold_gbs"]), _num(s["treefold_pct_roof"], ".1f")]
        peer = f"{s['best_peer']} {fmt_us(s['best_peer_us'])} us ({_num(s['best_peer_pct_roof'], '.1f')}%)" \
            if s["best_peer"] else "-"
        graph = "-"
        if s.get("treefold_graph_us"):
            graph = fmt_us(s["treefold_graph_us"])
            if s.get("best_peer_graph"):
                graph += f" ({s['best_peer_graph']} {fmt_us(s['best_peer_graph_us'])})"
        kernel = "-"
        if s.get("treefold_kernel_us"):
            kernel = fmt_us(s["treefold_kernel_us"])
            if s.get("best_kernel_peer"):
                kernel += (f" ({s['best_kernel_peer']} {fmt_us(s['best_kernel_peer_us'])}; "
                           f"{_num(s['kernel_speedup_vs_best_peer'], '.3f')})")
        rows.append([s["case"], s["label"], s["dtype"], *tf_cells, peer,
                     _num(s["speedup_vs_best_peer"], ".2f"), kernel, graph, rel, ulp,
                     fmt_distinct(s["distinct"], s["runs"])])
    return markdown_table(["op", "shape", "dtype", "treefold us", "GB/s", "% roof", "best peer", "speedup",
                   "kernel us (best peer; speedup)", "CUDA graph us (best peer)", "rel. L2", "max ulp",
                   "distinct"], rows)


def detail_tables(result: dict) -> list[str]:
    lines: list[str] = []
    treefold_us = {(r["case"], r["label"], r["shape"]["dtype"]): r["us"]
                   for r in result["results"] if r["provider"] == "treefold" and r["status"] == "ok"}
    by_case: dict[str, list[dict]] = {}
    for r in result["results"]:
        by_case.setdefault(r["case"], []).append(r)
    for case, rows in by_case.items():
        lines += ["", f"### {case}: {rows[0]['title']}", ""]
        notes = result.get("cases", {}).get(case, {}).get("notes")
        if notes:
            lines += [f"{notes[0].upper()}{notes[1:]}.", ""]
        table = []
        for r in rows:
            rel, ulp = fmt_accuracy(r["accuracy"])
            tf = treefold_us.get((r["case"], r["label"], r["shape"]["dtype"]))
            vs = f"{r['us'] / tf:.2f}" if (tf and r["us"]) else "-"
            remark = "; ".join(x for x in (r.get("message", ""), r.get("note", "")) if x)
            table.append([r["label"], r["shape"]["dtype"], r["provider"], r["status"], fmt_us(r["us"]),
                          fmt_gbs(r["gbs"]), _num(r["pct_roof"], ".1f"), vs,
                          fmt_us(r["kernel_us"]) if r.get("kernel_us") else "-",
                          fmt_us(r["graph_us"]) if r.get("graph_us") else "-", rel, ulp,
                          fmt_distinct(r["distinct"], r["runs"]), remark.replace("|", "/")])
        lines += markdown_table(["shape", "dtype", "provider", "status", "us", "GB/s", "% roof", "time / treefold's",
                         "kernel us", "CUDA graph us", "rel. L2", "max ulp", "distinct", "remark"], table)
    return lines


def host_table(result: dict) -> list[str]:
    rows = [[h["case"], h["label"], h["dtype"], h["provider"],
             fmt_us(h["us_per_call"]) if h["status"] == "ok" else f"{h['status']}: {h['message']}"]
            for h in result.get("host_overhead", [])]
    return markdown_table(["op", "shape", "dtype", "provider", "host us per call"], rows) if rows else []


def render_markdown(result: dict) -> str:
    roof = result["roof"]
    if "parts" in result:
        roofs = ", ".join(f"{p['roof_gbs']:.0f}" for p in result["parts"])
        roof_line = (f"- Merged from {len(result['parts'])} runs; each row's % of roof uses its own run's "
                     f"copy roof ({roofs} GB/s; {roof['how']}).")
    else:
        roof_line = f"- Roof: **{roof['gbs']:.0f} GB/s**, {roof['how']}, in the same run."
    lines = [
        f"# treefold bench: {result['name']}",
        "",
        f"{describe_machine(result['machine'])}. Taken {result['created']}.",
        "",
        roof_line,
        f"- Timing: {result['timing']}.",
        "- GB/s counts the minimum bytes: every input read once and every output written once "
        "(backward: read y or x, read dy, write dx, plus the weight vectors).",
        "- Accuracy against a float64 reference: relative L2 error and the largest error in units "
        "in the last place of the output's dtype; indices and tokens are counted as mismatches.",
        "- distinct: different outputs, compared byte for byte, over repeated calls (1 is deterministic).",
        "- speedup: the best peer's time over treefold's (above 1, treefold is faster). A provider whose "
        "output is wrong (NaN or Inf where the reference has none, a relative L2 error above 0.05, a wrong "
        "index or token) is not counted as a peer; its row says so.",
        "- kernel us: on a GPU, the time during which at least one of the call's kernels runs, by the "
        "profiler's (CUPTI) start and end of each, each call after the same L2 flush, the median of the "
        "rounds: do_bench's window holds 1-3 us besides the kernels, which decides margins of a few "
        "percent. Gaps between a call's kernels are not in it; kernels that overlap (dependent launches) "
        "count once. Its speedup is the best peer's kernel time over treefold's.",
        "- CUDA graph us: for calls moving at most 48 MiB (decode sizes), the device time per call with "
        "20 calls captured in one CUDA graph (no host cost, no L2 flush); their eager time is mostly the host's.",
        f"- Reproduce: `{result['command']}`",
        "",
        "## Summary",
        "",
        *summary_table(result),
        "",
        "## Every provider",
        *detail_tables(result),
    ]
    host = host_table(result)
    if host:
        lines += ["", "## Host time per eager call",
                  "", f"Wall time of {result['host_overhead'][0]['calls']} calls with no synchronisation "
                  "inside the loop, divided by the number of calls.", "", *host]
    if result.get("skipped"):
        lines += ["", "## Skipped", "", *(f"- {s}" for s in result["skipped"])]
    return "\n".join(lines) + "\n"


def write_markdown(result: dict, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(render_markdown(result))
    return path
