"""PNG plots of a bench result: GB/s against N for each op, one line per provider and dtype, with
the same-run copy roof drawn across. matplotlib is optional: without it no plot is written and
the caller gets a line saying how to make them later from the JSON."""
from __future__ import annotations

import os
import re

MISSING = ("matplotlib is not installed: no plots written "
           "(pip install matplotlib, then: treefold bench --from-json RESULT.json --out DIR)")


def slug(name: str) -> str:
    """A file-name-safe form of a case name: 'rms_norm+residual' -> 'rms_norm-residual'."""
    return re.sub(r"[^A-Za-z0-9_]+", "-", name).strip("-")


def plot_series(result: dict) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """case -> 'provider (dtype)' -> sorted [(N, GB/s)] of the rows that ran, for cases measured at
    two or more different N."""
    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for r in result["results"]:
        if r["status"] != "ok" or not r["gbs"]:
            continue
        key = f"{r['provider']} ({r['shape']['dtype']})"
        series.setdefault(r["case"], {}).setdefault(key, []).append((r["shape"]["n"], r["gbs"]))
    out = {}
    for case, lines in series.items():
        ns = {n for pts in lines.values() for n, _ in pts}
        if len(ns) >= 2:
            out[case] = {k: sorted(v) for k, v in sorted(lines.items())}
    return out


def write_plots(result: dict, outdir: str, name: str) -> tuple[list[str], str | None]:
    """(paths written, or a line saying why none were)."""
    series = plot_series(result)
    if not series:
        return [], "no op was measured at two or more row lengths: no plots (use --shapes sweep)"
    try:
        import matplotlib  # noqa: PLC0415
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return [], MISSING
    os.makedirs(outdir, exist_ok=True)
    roof = result["roof"]["gbs"]
    where = result["machine"].get("gpu") or "CPU"
    paths = []
    for case, lines in series.items():
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for label, pts in lines.items():
            xs, ys = zip(*pts)
            style = "-o" if label.startswith("treefold") else "--."
            ax.plot(xs, ys, style, label=label, linewidth=2 if label.startswith("treefold") else 1)
        ax.axhline(roof, color="black", linestyle=":", linewidth=1, label=f"copy roof {roof:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (reduced length)")
        ax.set_ylabel("GB/s (minimum bytes)")
        ax.set_ylim(0, roof * 1.1)
        ax.set_title(f"{case} on {where}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        path = os.path.join(outdir, f"{name}-{slug(case)}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths, None
