"""Launcher for sums in the treefold order over the last dimension of a 2-D tensor."""
from __future__ import annotations

import torch

from .. import order
from ..kernels.reduce import segment_sum_kernel

#: Elements one program of a level aims to cover (a launch choice; the bits do not depend on it).
_ELEMENTS_PER_PROGRAM = 8192


def _segments_per_program(segment_len: int, num_segments: int) -> int:
    spp = max(1, _ELEMENTS_PER_PROGRAM // segment_len)
    return min(order.next_pow2(spp), order.next_pow2(num_segments))


def tree_sum_rows(x: torch.Tensor, square: bool = False) -> torch.Tensor:
    """Sum of each row of ``x`` ([rows, n], last dim contiguous) in the treefold order, float32.

    With ``square`` the elements are squared (in float32) before summing. Runs the Triton
    kernel (compiled or interpreted); the caller decides that it should.
    """
    rows, n = x.shape
    if n == 0 or rows == 0:
        return torch.zeros(rows, dtype=torch.float32, device=x.device)
    if x.stride(-1) != 1 and n > 1:
        raise ValueError(f"tree_sum_rows: x must have a contiguous last dimension, got strides {tuple(x.stride())}")
    cur, cur_n, dtype = x, n, x.dtype
    while True:
        lanes = order.lanes(cur_n)
        group = order.group(cur_n, dtype)
        segments = order.num_segments(cur_n)
        spp = _segments_per_program(lanes, segments)
        programs = order.cdiv(segments, spp)
        out = torch.empty((rows, segments), dtype=torch.float32, device=x.device)
        segment_sum_kernel[(rows * programs,)](
            cur, out, cur_n, cur.stride(0), out.stride(0), segments, programs,
            LANES=lanes, LOG2_LANES=order.log2(lanes), GROUP=group, LOG2_GROUP=order.log2(group),
            SEGMENTS_PER_PROGRAM=spp, SQUARE=square,
        )
        if segments == 1:
            return out[:, 0]
        cur, cur_n, square, dtype = out, segments, False, None
