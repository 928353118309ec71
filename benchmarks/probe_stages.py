"""Software-pipelined streaming loops (``STAGES``: the compiler copies the next blocks into shared
memory while the current one is worked on) against the current launch choices, bf16 on the H200,
three interleaved rounds (do_bench median, L2 flushed); every variant is checked bit for bit
against the default launch first.

    python benchmarks/probe_stages.py [OUT_DIR]   (CUDA; writes probe-stages.json there)

Softmax: "online" (two reads) with 1-4 stages, blocks of 4096 or 8192 elements, 4-16 warps, at
the long-row shapes, and the backward at 4096 x 32768 (online, and "block" at 16 or 32 warps);
"split" with stages at the decode shapes. Norm backward: the row loop pipelined (no PREFETCH)
at 32768 x 4096 and 16384 x 8192, RMSNorm and LayerNorm.
Bytes: softmax forward and norm backward as the bench counts them (read + write once; the norm
backward reads x and dy, writes dx); softmax backward reads y and dy, writes dx.
"""
import os
import sys

import torch

from treefold import order
from treefold._ops import norms
from treefold._ops import softmax as sm
from probe_report import norm_backward_inputs, time_against_roof


def softmax_calls(calls, nbytes, check):
    shapes = [(4096, 32768), (256, 131072), (32768, 8192), (64, 151936)]
    for rows, n in shapes:
        x = (torch.randn(rows, n, device="cuda") * 3).bfloat16()
        name = f"softmax {rows}x{n}"
        default = lambda x=x: sm.softmax_forward(x)
        calls[f"{name} default ({sm._plan_for(sm._SOFTMAX, False, n, rows, x).strategy})"] = default
        variants = {}
        lanes = order.lanes(n)
        if rows >= 256:
            for warps in (4, 8, 16):
                for elements in (4096, 8192):
                    for stages in (1, 2, 3, 4):
                        variants[f"online {elements}/block {warps}w {stages} stages"] = (
                            "online", sm.Tuning(num_warps=warps, seg_block=max(1, elements // lanes), stages=stages))
        else:
            for stages in (1, 2, 3):
                for spp in (2, 4):
                    variants[f"split {spp} seg/program {stages} stages"] = (
                        "split", sm.Tuning(segments_per_program=spp, stages=stages))
        for label, (strategy, tuning) in variants.items():
            calls[f"{name} {label}"] = lambda x=x, s=strategy, t=tuning: sm.softmax_forward(x, strategy=s, tuning=t)
        for key in [k for k in calls if k.startswith(name + " ")]:
            nbytes[key] = 2 * x.numel() * 2
            check.append((key, default))
    rows, n = 4096, 32768
    y = torch.softmax(torch.randn(rows, n, device="cuda") * 3, -1).bfloat16()
    dy = torch.randn(rows, n, device="cuda").bfloat16()
    name = f"softmax.bwd {rows}x{n}"
    default = lambda: sm.softmax_backward(dy, y)
    calls[f"{name} default ({sm._plan_for(sm._SOFTMAX, True, n, rows, y).strategy})"] = default
    lanes = order.lanes(n)
    variants = {"block 32w": ("block", sm.Tuning(num_warps=32)), "block 16w": ("block", sm.Tuning(num_warps=16))}
    for warps in (4, 8):
        for stages in (1, 2, 3, 4):
            variants[f"online 4096/block {warps}w {stages} stages"] = (
                "online", sm.Tuning(num_warps=warps, seg_block=max(1, 4096 // lanes), stages=stages))
    for label, (strategy, tuning) in variants.items():
        calls[f"{name} {label}"] = lambda s=strategy, t=tuning: sm.softmax_backward(dy, y, strategy=s, tuning=t)
    for key in [k for k in calls if k.startswith(name + " ")]:
        nbytes[key] = 3 * y.numel() * 2
        check.append((key, default))


def norm_calls(calls, nbytes, check):
    for m, n in ((32768, 4096), (16384, 8192)):
        x, w, b, dy, rstd, mean, rstd_ln = norm_backward_inputs(m, n)
        for kind in ("rms", "ln"):
            if kind == "rms":
                run = lambda kw, dy=dy, x=x, w=w, r=rstd: norms.rms_norm_backward_impl(
                    dy, None, x, w, r, 0.0, "llama", x.dtype, None, True, **kw)
            else:
                run = lambda kw, dy=dy, x=x, w=w, mean=mean, r=rstd_ln: norms.layer_norm_backward_impl(
                    dy, x, w, mean, r, True, x.dtype, **kw)
            name = f"{kind}.bwd {m}x{n}"
            calls[f"{name} default"] = lambda run=run: run({})
            for warps in (8, 16):
                for stages in (2, 3, 4):
                    calls[f"{name} {warps}w {stages} stages"] = (
                        lambda run=run, kw=dict(prefetch=False, num_warps=warps, num_stages=stages): run(kw))
            for key in [k for k in calls if k.startswith(name + " ")]:
                nbytes[key] = 3 * x.numel() * 2
                check.append((key, calls[f"{name} default"]))


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    torch.manual_seed(0)
    calls, nbytes, check = {}, {}, []
    softmax_calls(calls, nbytes, check)
    norm_calls(calls, nbytes, check)
    bad = []
    for key, default in check:
        want, got = default(), calls[key]()
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        if not all((a is None and b is None) or torch.equal(a, b) for a, b in zip(want, got)):
            bad.append(key)
    torch.cuda.synchronize()
    print(f"bits: {len(check) - len(bad)} of {len(check)} variants equal to their default; differ: {bad}", flush=True)
    time_against_roof(calls, nbytes, os.path.join(out_dir, "probe-stages.json"), differ=bad)


if __name__ == "__main__":
    main()
