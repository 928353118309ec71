"""Whole-tensor and row sums in the treefold order.

One kernel computes segment results: program (row, p) reduces segments
p * SEGMENTS_PER_PROGRAM ... of one row, each segment being TILES tiles of LANES elements folded
lane by lane, then a halving tree over the lanes (``treefold.order``). Applied again to its own
output while a row has more than one segment, it realises the whole order. How many segments a
program takes is a launch choice and does not change the bits.

Bytes: reads N elements of the input once and writes S float32 partials; each further level
reads and writes S(S(...)) floats, which is under 1/1000 of N for every N.
"""
import triton
import triton.language as tl

from .combine import tree_sum


@triton.jit
def segment_sum_kernel(
    x_ptr, out_ptr, n, row_stride_x, row_stride_out, num_segments, programs_per_row,
    LANES: tl.constexpr, LOG2_LANES: tl.constexpr, TILES: tl.constexpr,
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
        LANES: C(N), lanes per tile.
        LOG2_LANES: log2(C).
        TILES: F(N), tiles folded sequentially per segment.
        SEGMENTS_PER_PROGRAM: segments one program handles (power of two; a launch choice).
        SQUARE: square each element (after conversion to float32) before summing.
    """
    pid = tl.program_id(0).to(tl.int64)
    row = pid // programs_per_row
    first = (pid % programs_per_row) * SEGMENTS_PER_PROGRAM
    segments = first + tl.arange(0, SEGMENTS_PER_PROGRAM)
    lane = tl.arange(0, LANES)
    base = x_ptr + row * row_stride_x
    offsets = segments[:, None] * (LANES * TILES) + lane[None, :]
    acc = tl.load(base + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    if SQUARE:
        acc = acc * acc
    for tile in range(1, TILES):
        offsets += LANES
        v = tl.load(base + offsets, mask=offsets < n, other=0.0).to(tl.float32)
        if SQUARE:
            v = v * v
        acc += v
    result = tree_sum(acc, SEGMENTS_PER_PROGRAM, LANES, LOG2_LANES)
    tl.store(out_ptr + row * row_stride_out + segments, result, mask=segments < num_segments)
