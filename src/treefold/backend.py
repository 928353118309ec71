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


def _exact_bfloat16_casts() -> None:
    """Make the interpreter's casts between bfloat16 and float32 those of the compiled kernels.

    Triton's interpreter (3.6) casts between the two through a generic routine that gets
    subnormals wrong both ways (a bfloat16 9.18e-40 widens to 2.94e-39; float32 1.5e-39 narrows
    to 2.9e-39) and truncates instead of rounding when narrowing. bfloat16 is float32's upper 16
    bits, so both casts are exact on the bits: widening shifts them up; narrowing rounds the 16
    dropped bits to nearest, ties to even (truncates under round-toward-zero), and keeps a NaN a
    NaN, as the compiled ``cvt.rn.bf16.f32`` does. Every other cast keeps Triton's routine.
    """
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # a Triton without the interpreter's module: nothing to mend
        return
    generic = getattr(interpreter, "_convert_float", None)
    if generic is None or getattr(generic, "_treefold_exact", False):
        return
    toward_zero = getattr(getattr(interpreter, "_ir", None), "ROUNDING_MODE", None)
    toward_zero = getattr(toward_zero, "RTZ", None)

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.bfloat16 and output_dtype == tl.float32:
            bits = np.frombuffer(input.tobytes(), dtype=np.uint16).astype(np.uint32) << 16
            return bits.reshape(input.shape)
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16:
            bits = np.frombuffer(input.tobytes(), dtype=np.uint32).astype(np.uint64)
            if rounding_mode is not None and rounding_mode == toward_zero:
                upper = bits >> 16
            else:
                upper = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            nan = (bits & 0x7FFFFFFF) > 0x7F800000
            upper = np.where(nan, (bits >> 16) | 0x0040, upper)  # a NaN stays a (quiet) NaN
            return upper.astype(np.uint16).reshape(input.shape)
        return generic(input, input_dtype, output_dtype, rounding_mode)

    convert._treefold_exact = True
    interpreter._convert_float = convert


if INTERPRETED:
    _exact_bfloat16_casts()


def recording_backward() -> bool:
    """Whether a backward running now is itself being recorded (create_graph: a gradient penalty,
    a Hessian-vector product), outside torch.compile. The kernels' backward passes have no
    gradient of their own, so such a backward runs as torch's operations, which can be
    differentiated again."""
    return torch.is_grad_enabled() and not torch.compiler.is_compiling()


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
