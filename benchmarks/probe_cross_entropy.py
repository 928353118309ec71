"""cross_entropy's launches at training shapes under every strategy that fits, warps and shares
swept, on the GPU: three interleaved rounds (do_bench median, L2 flushed); every variant checked
bit for bit against the default first (loss, the saved M' and log Z, dx), and torch's
F.cross_entropy (forward, and forward + backward) timed beside them for scale. Also the forward
that writes dx (``dloss=``, the softmax forward's launches) against the forward then the
backward: a training step's two ways, and the backward launch that finds its dx written.

    python benchmarks/probe_cross_entropy.py [OUT_DIR] [ROWSxN ...]   (CUDA; default 8192x128256 4096x151936)

Writes probe-cross-entropy-ROWSxN.json into OUT_DIR. Bytes: the forward reads the logits once
and writes 12 bytes per row (loss, M', log Z); the backward reads the logits and writes dx; the
fused forward writes dx too; both ways of a training step are declared with the same bytes (read
the logits, write dx), so their percentages compare as times do.
Label smoothing adds one row-sum read to the forward; it is timed once, at the default launch.
"""
import os
import sys

import torch
import torch.nn.functional as F

from treefold._ops import softmax as sm
from probe_report import time_against_roof


def _variants():
    out = {}
    for spp in (2, 4, 8, 16):
        for warps in (4, 8):
            out[f"cooperative {spp} seg/program {warps}w"] = ("cooperative", sm.Tuning(segments_per_program=spp,
                                                                                      num_warps=warps))
    for warps in (4, 8, 16):
        out[f"online {warps}w"] = ("online", sm.Tuning(num_warps=warps))
        out[f"online {warps}w no hints"] = ("online", sm.Tuning(num_warps=warps, hints=False))
    for spp in (1, 4):
        out[f"split {spp} seg/program"] = ("split", sm.Tuning(segments_per_program=spp))
    return out


def probe(rows: int, n: int, out_dir: str) -> None:
    torch.manual_seed(0)
    x = (torch.randn(rows, n, device="cuda") * 2).bfloat16()
    t = torch.randint(0, n, (rows,), device="cuda")
    t[::97] = -100
    g = torch.rand(rows, device="cuda")
    loss, stats = sm.cross_entropy_forward(x, t, -100, 0.0)
    dx = sm.cross_entropy_backward(g, x, t, stats, -100, 0.0)
    fwd_bytes, bwd_bytes = rows * n * 2 + rows * (8 + 12), 2 * rows * n * 2 + rows * (8 + 12)
    calls, nbytes, differ = {}, {}, []
    fwd_default = sm._plan_for(sm._LOGSUMEXP, False, n, rows, x).strategy
    bwd_default = sm._plan_for(sm._LOGSUMEXP, True, n, rows, x).strategy
    calls[f"fwd default ({fwd_default})"] = lambda: sm.cross_entropy_forward(x, t, -100, 0.0)
    nbytes[f"fwd default ({fwd_default})"] = fwd_bytes
    calls["fwd default, label smoothing 0.1"] = lambda: sm.cross_entropy_forward(x, t, -100, 0.1)
    nbytes["fwd default, label smoothing 0.1"] = fwd_bytes
    calls[f"bwd default ({bwd_default})"] = lambda: sm.cross_entropy_backward(g, x, t, stats, -100, 0.0)
    nbytes[f"bwd default ({bwd_default})"] = bwd_bytes
    for label, (s, tuning) in _variants().items():
        for direction in ("fwd", "bwd"):
            if direction == "bwd" and s == "cooperative":
                continue  # the backward is elementwise: "cooperative" is "split" there
            try:
                if direction == "fwd":
                    got = sm.cross_entropy_forward(x, t, -100, 0.0, strategy=s, tuning=tuning)
                    same = torch.equal(got[0].view(torch.int32), loss.view(torch.int32)) and torch.equal(
                        got[1].view(torch.int32), stats.view(torch.int32))
                    call = lambda s=s, tuning=tuning: sm.cross_entropy_forward(x, t, -100, 0.0, strategy=s,
                                                                               tuning=tuning)
                else:
                    got = sm.cross_entropy_backward(g, x, t, stats, -100, 0.0, strategy=s, tuning=tuning)
                    same = torch.equal(got.view(torch.int16), dx.view(torch.int16))
                    call = lambda s=s, tuning=tuning: sm.cross_entropy_backward(g, x, t, stats, -100, 0.0,
                                                                                strategy=s, tuning=tuning)
            except ValueError as e:
                print(f"{direction} {label}: refused ({e})")
                continue
            if not same:
                differ.append(f"{direction} {label}")
            calls[f"{direction} {label}"] = call
            nbytes[f"{direction} {label}"] = fwd_bytes if direction == "fwd" else bwd_bytes
    # the fused forward: dx written for one dloss, under the softmax forward's launches
    one = torch.ones((), device="cuda")
    want_dx = sm.cross_entropy_backward(one, x, t, stats, -100, 0.0)
    fused_default = sm._plan_for(sm._SOFTMAX, False, n, rows, x).strategy
    fused = {f"fused fwd default ({fused_default})": ("auto", sm.Tuning())}
    for spp in (1, 2, 4):
        fused[f"fused fwd cooperative {spp} seg/program"] = ("cooperative", sm.Tuning(segments_per_program=spp))
    for warps in (4, 8):
        fused[f"fused fwd online {warps}w"] = ("online", sm.Tuning(num_warps=warps))
    for label, (s, tuning) in fused.items():
        try:
            got = sm.cross_entropy_forward(x, t, -100, 0.0, dloss=one, strategy=s, tuning=tuning)
        except ValueError as e:
            print(f"{label}: refused ({e})")
            continue
        if not (torch.equal(got[2].view(torch.int16), want_dx.view(torch.int16))
                and torch.equal(got[0].view(torch.int32), loss.view(torch.int32))):
            differ.append(label)
        calls[label] = lambda s=s, tuning=tuning: sm.cross_entropy_forward(x, t, -100, 0.0, dloss=one, strategy=s,
                                                                           tuning=tuning)
        nbytes[label] = fwd_bytes + rows * n * 2
    written = sm.cross_entropy_forward(x, t, -100, 0.0, dloss=one)[2]
    calls["backward into the dx written (returns at once)"] = lambda: sm.cross_entropy_backward(
        one, x, t, stats, -100, 0.0, written=(written, one))
    nbytes["backward into the dx written (returns at once)"] = 8
    calls["step: fwd, then bwd"] = lambda: sm.cross_entropy_backward(
        one, x, t, sm.cross_entropy_forward(x, t, -100, 0.0)[1], -100, 0.0)
    nbytes["step: fwd, then bwd"] = rows * n * 4 + rows * 8
    calls["step: fwd writing dx, then bwd into it"] = lambda: sm.cross_entropy_backward(
        one, x, t, stats, -100, 0.0, written=(sm.cross_entropy_forward(x, t, -100, 0.0, dloss=one)[2], one))
    nbytes["step: fwd writing dx, then bwd into it"] = rows * n * 4 + rows * 8
    xg = x.detach().requires_grad_()
    calls["torch F.cross_entropy fwd"] = lambda: F.cross_entropy(x, t, reduction="none")
    nbytes["torch F.cross_entropy fwd"] = fwd_bytes
    calls["torch F.cross_entropy fwd + bwd"] = lambda: torch.autograd.grad(
        F.cross_entropy(xg, t, reduction="none"), xg, g.bfloat16())
    nbytes["torch F.cross_entropy fwd + bwd"] = fwd_bytes + bwd_bytes
    print(f"{rows}x{n} bf16: bits: variants that differ from their default: {differ or 'none'}")
    name = f"probe-cross-entropy-{rows}x{n}.json"
    table = time_against_roof(calls, nbytes, os.path.join(out_dir, name) if out_dir else "", differ=differ)
    print(f"{'variant':48s} us and % of roof of the bytes declared (median of the rounds)")
    for r in table:
        print(f"{r['name']:48s} {sorted(r['us'])[1]:9.1f} {sorted(r['pct'])[1]:6.1f}%")


def main(out_dir: str = "", shapes=("8192x128256", "4096x151936")) -> None:
    for shape in shapes:
        rows, n = (int(v) for v in shape.split("x"))
        probe(rows, n, out_dir)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "", sys.argv[2:] or ("8192x128256", "4096x151936"))
