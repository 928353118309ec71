"""The tail the probe_* scripts share: time their calls in interleaved rounds, measure the
same-run copy roof, print each call's times and fractions of it, and write them as JSON."""
import json
import os

import torch

from treefold.bench.roofs import measure_copy_roof
from treefold.bench.timing import CudaTimer, interleaved_us


def time_against_roof(calls: dict, nbytes: dict, out_path: str = "", **extra) -> list[dict]:
    """Rows of (name, us per round, % of the roof per round) for ``calls`` (name -> callable),
    each moving ``nbytes[name]`` bytes; written to ``out_path`` (with ``extra``) when given."""
    times = interleaved_us(calls, CudaTimer(warmup_ms=10, rep_ms=50))
    roof = measure_copy_roof(torch.device("cuda"), CudaTimer())
    rows = [dict(name=name, us=ts, pct=[roof.percent(nbytes[name], t) for t in ts]) for name, ts in times.items()]
    print(f"roof {roof.gbs:.0f} GB/s")
    width = max((len(r["name"]) for r in rows), default=0)
    for r in rows:
        print(f"{r['name']:{width}s}  " + "  ".join(f"{t:8.1f} us {p:5.1f}%" for t, p in zip(r["us"], r["pct"])))
    if out_path:
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(dict(roof_gbs=roof.gbs, rows=rows, **extra), f, indent=1)
    return rows
