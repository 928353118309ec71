"""Whole-tensor and row sums in the treefold order.

One kernel computes segment results: program (row, p) reduces segments
p * SEGMENTS_PER_PROGRAM ... of one row, each segment being LANES elements reduced by the grouped
halving tree (``treefold.order``). Applied again to its own output while a row has more than one
segment, it realises the whole order. How many segments a program takes is a launch choice and
does not change the bits.

Bytes: reads N elements of the input once and writes S = N / C float32 partials; each further
level reads and writes S(S(...)) floats, under 1/1000 of N for every N.
"""
import triton
import triton.language as tl

from .combine import tree_sum


@triton.jit
def segment_sum_kernel(
    x_ptr, out_ptr, n, row_stride_x, row_stride_out, num_segments, programs_per_row,
    LANES: tl.constexpr, LOG2_LANES: tl.constexpr, GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr,
    SEGMENTS_PER_PROGRAM: tl.constexpr, SQUARE: tl.constexpr,
):
    """Segment results of a sum (or, with SQUARE, a sum of squares) over rows.

    Args:
        x_ptr: input rows, any float dtype, last dimension contiguous.
        out_ptr: float32 output, ``num_segments`` results per row.
        n: elements per row (the reduced length N).
        row_stride_x: elements between consecutive input rows.
        row_stride_out: elements between consecutive output rows.
        num_segments: S(N), results per row.
        programs_per_row: programs sharing one row (the grid is rows * programs_per_row).
        LANES: C(N), elements per segment.
        LOG2_LANES: log2(C).
        GROUP: G, lanes per group (``treefold.order.group``).
        LOG2_GROUP: log2(G).
        SEGMENTS_PER_PROGRAM: segments one program handles (power of two; a launch choice).
        SQUARE: square each element (after conversion to float32) before summing.
    """
    pid = tl.program_id(0).to(tl.int64)
    row = pid // programs_per_row
    first = (pid % programs_per_row) * SEGMENTS_PER_PROGRAM
    segments = first + tl.arange(0, SEGMENTS_PER_PROGRAM)
    offsets = segments[:, None] * LANES + tl.arange(0, LANES)[None, :]
    x = tl.load(x_ptr + row * row_stride_x + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    if SQUARE:
        x = x * x
    result = tree_sum(x, SEGMENTS_PER_PROGRAM, LANES, LOG2_LANES, GROUP, LOG2_GROUP)
    tl.store(out_ptr + row * row_stride_out + segments, result, mask=segments < num_segments)
