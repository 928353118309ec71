"""Host time of the softmax backward through autograd, piece by piece (CUDA; 2000 calls, no sync
inside, wall time per call): what torch.autograd.grad costs with treefold's autograd.Function,
with an empty Python autograd.Function (the engine's own cost), with torch.softmax, with Liger's
softmax when it is installed, and the backward launcher called directly. At 8192 x 4096 a call
that costs the host less than its kernel reads as the kernel's time (200 calls queue up).

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


if __name__ == "__main__":
    main()
