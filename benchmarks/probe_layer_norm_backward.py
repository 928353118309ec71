"""LayerNorm backward with its two row sums evaluated as one tree over a pair of rows
(``paired_sums``; the default for rows of at most 4096) against one after the other, called
directly, bf16, on the H200: three
interleaved rounds (do_bench median, L2 flushed); the two checked bit for bit first.

    python benchmarks/probe_layer_norm_backward.py [OUT_DIR]   (CUDA; writes probe-layer-norm-backward.json)

Bytes: read x and dy, write dx (3 x M x N x 2; the weight and bias gradients' partials not counted).
"""
import os
import sys

import torch

from treefold._ops import norms
from probe_report import norm_backward_inputs, time_against_roof


def main(out_dir: str = "") -> None:
    torch.manual_seed(0)
    calls, nbytes, differ = {}, {}, []
    for m, n in ((16384, 8192), (32768, 4096), (8192, 4096)):
        x, w, _, dy, _, mean, rstd = norm_backward_inputs(m, n)
        for paired in (True, False):
            calls[f"ln.bwd {m}x{n} paired={paired}"] = (
                lambda x=x, w=w, dy=dy, mean=mean, rstd=rstd, p=paired: norms.layer_norm_backward_impl(
                    dy, x, w, mean, rstd, True, x.dtype, paired_sums=p))
            nbytes[f"ln.bwd {m}x{n} paired={paired}"] = 3 * m * n * 2
        a, c = calls[f"ln.bwd {m}x{n} paired=True"](), calls[f"ln.bwd {m}x{n} paired=False"]()
        if not all(torch.equal(u, v) for u, v in zip(a, c) if u is not None):
            differ.append(f"{m}x{n}")
    print(f"shapes whose paired and single sums differ bit for bit: {differ}")
    rows = time_against_roof(calls, nbytes, os.path.join(out_dir, "probe-layer-norm-backward.json") if out_dir else "",
                             differ=differ)
    for r in rows:
        print(f"{r['name']:36s} {sorted(r['pct'])[1]:5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
