"""Where a call runs: the Triton kernel, the interpreted Triton kernel, or the reference.

- a CUDA tensor runs the Triton kernel;
- a CPU tensor runs the same Triton kernel through Triton's interpreter when the process was
  started with ``TRITON_INTERPRET=1`` (Triton reads it when kernels are defined, so it must be
  set before ``treefold`` is imported); this is how CI, which has no GPU, tests the kernels;
- any other CPU tensor runs the pure-torch/NumPy reference in ``treefold.reference``.

No function ever moves data between devices: results live where the inputs live.
"""
from __future__ import annotations

import os

import torch

#: Whether Triton kernels in this process run through the interpreter.
INTERPRETED: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_kernel(t: torch.Tensor) -> bool:
    """True when ``t`` should go through the Triton kernel (compiled or interpreted)."""
    if t.is_cuda:
        return True
    return INTERPRETED and t.device.type == "cpu"


def describe(t: torch.Tensor) -> str:
    """Which path a tensor on this device takes, in words."""
    if t.is_cuda:
        return "triton (compiled)"
    if use_kernel(t):
        return "triton (interpreter)"
    return "reference"
