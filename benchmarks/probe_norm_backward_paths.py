"""The norm backward through its paths, bf16 on the H200: the implementation called directly,
and torch.autograd.grad through treefold.rms_norm / layer_norm (the bench's measure), three
interleaved rounds (do_bench median, L2 flushed); bytes: read x and dy, write dx.

    python benchmarks/probe_norm_backward_paths.py (CUDA); with WITH_PEERS=1 (and the peers
    installed: source .peers/activate.sh), treefold's calls are timed again after Liger's and
    QuACK's RMSNorm backward ran in the same process.
"""
import os

import torch

import treefold
from treefold._ops import norms
from treefold.bench.roofs import measure_copy_roof
from treefold.bench.timing import CudaTimer, interleaved_us
from probe_report import norm_backward_inputs


def main():
    torch.manual_seed(0)
    calls = {}
    for m, n in ((32768, 4096), (16384, 8192)):
        x, w, b, dy, rstd, _, _ = norm_backward_inputs(m, n)
        xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
        y = treefold.rms_norm(xg, wg)
        y_ln = treefold.layer_norm(xg, n, wg, bg)
        _, mean, rstd_ln = norms.layer_norm_impl(x, w, b, 1e-5)
        shape = f"{m}x{n}"
        calls[f"rms {shape} impl"] = lambda dy=dy, x=x, w=w, rstd=rstd: norms.rms_norm_backward_impl(
            dy, None, x, w, rstd, 0.0, "llama", x.dtype, None, True)
        calls[f"rms {shape} autograd.grad (x, w)"] = lambda y=y, xg=xg, wg=wg, dy=dy: torch.autograd.grad(
            y, (xg, wg), dy, retain_graph=True)
        calls[f"ln {shape} impl"] = lambda dy=dy, x=x, w=w, mean=mean, r=rstd_ln: norms.layer_norm_backward_impl(
            dy, x, w, mean, r, True, x.dtype)
        calls[f"ln {shape} autograd.grad (x, w, b)"] = lambda y=y_ln, xg=xg, wg=wg, bg=bg, dy=dy: torch.autograd.grad(
            y, (xg, wg, bg), dy, retain_graph=True)
    timer = CudaTimer(warmup_ms=10, rep_ms=50)
    times = interleaved_us(calls, timer)
    if os.environ.get("WITH_PEERS"):
        # the bench process had run Liger's and QuACK's backward passes before treefold's next
        # shape: run them here (each once), then time treefold's calls again
        from liger_kernel.transformers.functional import liger_rms_norm
        from quack.rmsnorm import rmsnorm
        for m, n in ((32768, 4096), (16384, 8192)):
            xg = torch.randn(m, n, device="cuda").bfloat16().requires_grad_()
            wg = torch.ones(n, device="cuda").bfloat16().requires_grad_()
            dy = torch.randn(m, n, device="cuda").bfloat16()
            torch.autograd.grad(liger_rms_norm(xg, wg, 1e-6, offset=0.0, casting_mode="llama", in_place=False),
                                (xg, wg), dy)
            torch.autograd.grad(rmsnorm(xg, wg, eps=1e-6), (xg, wg), dy)
        torch.cuda.synchronize()
        times.update({k + " (after peers)": ts for k, ts in interleaved_us(calls, timer).items()})
    roof = measure_copy_roof(torch.device("cuda"), CudaTimer()).gbs
    print(f"roof {roof:.0f} GB/s")
    for k, ts in times.items():
        numel = 32768 * 4096
        print(f"{k:36s} " + "  ".join(f"{t:7.1f} us {100 * 3 * numel * 2 / t / 1e3 / roof:5.1f}%" for t in ts))


if __name__ == "__main__":
    main()
