"""RMSNorm forward, bf16, rows held whole against rows streamed one segment at a time
(``stream_segments``: both passes of a row read twice go segment by segment, so one to eight
warps can hold a long row; the fewer the warps, the fewer tree levels cross warps). Every variant
is first checked bit for bit against the default launch, then all are timed in three
interleaved rounds (do_bench median, L2 flushed) as a percentage of the same-run copy roof.

    python benchmarks/probe_rms_stream.py [OUT_DIR]
"""
import os
import sys

import torch

from treefold._ops import norms
from probe_report import time_against_roof

SHAPES = ((4096, 16384), (16384, 8192), (32768, 4096))
STREAM_WARPS = (1, 2, 4, 8)


def main(out_dir: str = "") -> None:
    torch.manual_seed(0)
    calls, nbytes, differ = {}, {}, []
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda").bfloat16()
        w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16()
        name = f"rms {m}x{n}"

        def impl(x=x, w=w, **launch):
            return norms.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", x.dtype, store_stats=False, **launch)[0]

        calls[f"{name} default"] = impl
        for warps in STREAM_WARPS:
            calls[f"{name} streamed {warps}w"] = (
                lambda impl=impl, warps=warps: impl(read_twice=True, stream_segments=True, num_warps=warps))
        want = impl()
        for key in [k for k in calls if k.startswith(name + " ")]:
            nbytes[key] = 2 * m * n * 2
            if not torch.equal(calls[key](), want):
                differ.append(key)
    print(f"variants that differ from the default bit for bit: {differ}")
    rows = time_against_roof(calls, nbytes, os.path.join(out_dir, "probe-rms-stream.json") if out_dir else "",
                             differ=differ)
    print(f"{'variant':34s} % of roof (median of the rounds)")
    for r in rows:
        print(f"{r['name']:34s} {sorted(r['pct'])[1]:5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
