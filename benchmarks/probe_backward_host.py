"""Host time of the softmax backward through autograd, piece by piece (CUDA; 2000 calls, no sync
inside, wall time per call): what torch.autograd.grad costs with treefold's autograd.Function,
with an empty Python autograd.Function (the engine's own cost), with torch.softmax, with Liger's
softmax when it is installed, and the backward launcher called directly. At 8192 x 4096 a call
that costs the host less than its kernel reads as the kernel's time (200 calls queue up).
Then the same for RMSNorm and LayerNorm with a weight that requires grad (a training step's
forward and its autograd.grad over x and the weight), against torch and Liger.

    python benchmarks/probe_backward_host.py
"""
import importlib

import torch

import treefold
from treefold._ops import softmax as ops

from host_overhead import per_call_us  # noqa: E402 (this folder: the same timing loop)


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad


def main():
    for rows, n in ((1, 4096), (8192, 4096)):
        x = torch.randn(rows, n, device="cuda").bfloat16().requires_grad_()
        dy = torch.randn_like(x)
        y_tf = treefold.softmax(x)
        y_torch = torch.softmax(x, -1)
        y_id = _Identity.apply(x)
        y = y_tf.detach()
        pieces = {
            "autograd.grad, treefold.softmax": lambda: torch.autograd.grad(y_tf, x, dy, retain_graph=True),
            "autograd.grad, torch.softmax": lambda: torch.autograd.grad(y_torch, x, dy, retain_graph=True),
            "autograd.grad, empty Python Function": lambda: torch.autograd.grad(y_id, x, dy, retain_graph=True),
            "ops.softmax_backward alone": lambda: ops.softmax_backward(dy, y, x_dtype=x.dtype),
            "torch._softmax_backward_data alone": lambda: torch._softmax_backward_data(dy, y, -1, x.dtype),
            "treefold.softmax forward with grad": lambda: treefold.softmax(x),
        }
        try:
            liger = importlib.import_module("liger_kernel.ops.softmax").LigerSoftmaxFunction.apply
        except ImportError:
            liger = None
        if liger is not None:
            y_liger = liger(x)
            pieces["autograd.grad, Liger softmax"] = lambda: torch.autograd.grad(y_liger, x, dy, retain_graph=True)
            pieces["Liger softmax forward with grad"] = lambda: liger(x)
        for name, fn in pieces.items():
            print(f"{rows}x{n} bf16  {name:40s} {per_call_us(fn, 2000 if rows == 1 else 200):8.1f} us per call")


def main_norms():
    try:
        liger = importlib.import_module("liger_kernel.transformers.functional")
    except ImportError:
        liger = None
    for rows, n in ((1, 4096), (8192, 4096)):
        x = torch.randn(rows, n, device="cuda").bfloat16().requires_grad_()
        w = torch.nn.Parameter(torch.randn(n, device="cuda").bfloat16())
        b = torch.nn.Parameter(torch.randn(n, device="cuda").bfloat16())
        dy = torch.randn_like(x)
        calls = {
            "treefold.rms_norm": lambda: treefold.rms_norm(x, w),
            "F.rms_norm": lambda: torch.nn.functional.rms_norm(x, (n,), w, 1e-6),
            "treefold.layer_norm": lambda: treefold.layer_norm(x, (n,), w, b),
            "F.layer_norm": lambda: torch.nn.functional.layer_norm(x, (n,), w, b),
        }
        if liger is not None:
            calls["Liger rms_norm"] = lambda: liger.liger_rms_norm(x, w, 1e-6)
            calls["Liger layer_norm"] = lambda: liger.liger_layer_norm(x, w, b, 1e-5)
        for name, fn in calls.items():
            try:
                y = fn()
            except Exception as e:  # a peer's signature that changed: say so, go on
                print(f"{rows}x{n} bf16  {name}: {type(e).__name__}: {e}")
                continue
            inputs = (x, w) if "rms" in name else (x, w, b)
            pieces = {f"{name} forward with grad": fn,
                      f"autograd.grad, {name}": lambda y=y, inputs=inputs: torch.autograd.grad(
                          y, inputs, dy, retain_graph=True)}
            for piece, call in pieces.items():
                print(f"{rows}x{n} bf16  {piece:40s} {per_call_us(call, 2000 if rows == 1 else 200):8.1f} us per call")


if __name__ == "__main__":
    main()
    main_norms()
