"""Whole-tensor and row reductions: sums in the treefold order, extremes under a total order.

``segment_sum_kernel`` computes segment results of the treefold order (``treefold.order``):
program (row group, p) loads segments p * SEGMENTS_PER_PROGRAM ... of ROWS_PER_PROGRAM rows as
one ``[ROWS * SEGMENTS, LANES]`` block and reduces every segment with the grouped halving tree.
Applied again to its own output while a row has more than one segment, it realises the whole
order; with FINISH one program holds every segment of its rows and also performs the next
level, which is a single halving tree when a row has at most ``order.MAX_LANES`` segments.
With NODE_SEGMENTS > 1 (whole-tensor sums) a program instead reduces segments spaced
NODE_STRIDE apart and adds their results with the first levels of the next level's halving
tree, so a whole tensor takes two launches whatever its size (up to 2^34 elements): the nodes,
then one program finishing every tree; the second is a programmatic dependent launch on sm_90,
which starts while the first drains and waits for its writes (no atomics anywhere).
How many segments or rows a program takes, num_warps and the eviction policy are launch
choices: none changes an operation or an operand, so none changes the bits.

Accumulation (ACCUMULATE):
  * ACC_FP32: float32, the default sum.
  * ACC_DOUBLE_DOUBLE: the accurate sum. Every value is an unevaluated pair (s, c) of float64
    words and every add of the trees is Knuth's error-free TwoSum (s + e == a + b exactly) with
    the error added into c. Rounded once at the end, to float32 by way of round-to-odd, so the
    result is the float nearest s + c (``treefold.functional.reductions.sum`` says when s + c
    is the exact sum).
  * ACC_INT64: integer sums in int64 (wrapping, like torch); the order cannot matter.

``segment_extreme_kernel`` computes max / min with the index of the chosen element. Its combine
(``pick``) is a selection under a total order on (value, index) pairs -- NaN above everything,
then the larger (smaller) value, then the lower index -- so its result does not depend on the
order of evaluation at all; the kernel folds tiles lane by lane, which streams fastest, and ends
with a halving tree.

Bytes moved: a level reads each of its N inputs once (two float64 words per input at later
levels of the accurate sum) and writes S partials (a value and an int64 index for extremes);
later levels read and write fewer than 1/4000 of N. With FINISH a level writes one value per row.
"""
import triton
import triton.language as tl

from .combine import (double_double_to_float32, float32_round_to_odd, pick_later, run_tree_sum,
                      start_dependent_launch, tree_double_double, tree_pick, tree_sum)

ACC_FP32: tl.constexpr = tl.constexpr(0)
ACC_DOUBLE_DOUBLE: tl.constexpr = tl.constexpr(1)
ACC_INT64: tl.constexpr = tl.constexpr(2)

TRANSFORM_NONE: tl.constexpr = tl.constexpr(0)
TRANSFORM_SQUARE: tl.constexpr = tl.constexpr(1)
TRANSFORM_ABS: tl.constexpr = tl.constexpr(2)

FINAL_NONE: tl.constexpr = tl.constexpr(0)
FINAL_MEAN: tl.constexpr = tl.constexpr(1)
FINAL_SQRT: tl.constexpr = tl.constexpr(2)


@triton.jit
def _load(ptrs, mask, EVEN: tl.constexpr, EVICT_FIRST: tl.constexpr):
    # EVEN: every element of the block is in bounds, so no mask is computed at all. Padding
    # is +0.0, as in the reference.
    if EVEN:
        if EVICT_FIRST:
            v = tl.load(ptrs, eviction_policy="evict_first")
        else:
            v = tl.load(ptrs)
    else:
        if EVICT_FIRST:
            v = tl.load(ptrs, mask=mask, other=0, eviction_policy="evict_first")
        else:
            v = tl.load(ptrs, mask=mask, other=0)
    return v


# --------------------------------------------------------------------------------------------
# Sums
# --------------------------------------------------------------------------------------------

@triton.jit
def _segment_results(x_ptr, x_lo_ptr, offsets, mask, BLOCK: tl.constexpr, LANES: tl.constexpr,
                     LOG2_LANES: tl.constexpr, GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr,
                     ACCUMULATE: tl.constexpr, TRANSFORM: tl.constexpr, PAIR_INPUT: tl.constexpr,
                     EXACT_GROUPS: tl.constexpr, INTERPRETED: tl.constexpr, EVEN: tl.constexpr,
                     EVICT_FIRST: tl.constexpr, RUNS: tl.constexpr, LOG2_RUNS: tl.constexpr):
    """Load a ``[BLOCK, RUNS, LANES // RUNS]`` block of segments (each cut into runs,
    ``combine.run_tree_sum``) and reduce each with the grouped halving tree: ``(s, c)``, ``[BLOCK]``
    each (``c`` is ``s`` unless ACCUMULATE is ACC_DOUBLE_DOUBLE)."""
    v = _load(x_ptr + offsets, mask, EVEN, EVICT_FIRST)
    if ACCUMULATE == ACC_INT64:
        v = v.to(tl.int64)
    elif ACCUMULATE == ACC_FP32:
        v = v.to(tl.float32)
    else:
        v = v.to(tl.float64)
    if TRANSFORM == TRANSFORM_SQUARE:
        v = v * v
    elif TRANSFORM == TRANSFORM_ABS:
        v = tl.abs(v)
    if ACCUMULATE == ACC_DOUBLE_DOUBLE:
        if PAIR_INPUT:
            c = _load(x_lo_ptr + offsets, mask, EVEN, EVICT_FIRST)
        else:
            # -0.0 is the exact identity of addition, so the compiler drops the first adds of c.
            c = tl.full(v.shape, -0.0, tl.float64)
        # (the pairs' tree over [BLOCK, LANES]: the same order whatever the runs)
        return tree_double_double(tl.reshape(v, [BLOCK, LANES]), tl.reshape(c, [BLOCK, LANES]), BLOCK, LANES,
                                  LOG2_LANES, GROUP, LOG2_GROUP, EXACT_GROUPS, INTERPRETED)
    if RUNS == 1:  # (run_tree_sum's order too; this form keeps the kernel one run compiled to before)
        s = tree_sum(tl.reshape(v, [BLOCK, LANES]), BLOCK, LANES, LOG2_LANES, GROUP, LOG2_GROUP)
    else:
        s = run_tree_sum(v, BLOCK, RUNS, LOG2_RUNS, LANES // RUNS, GROUP, LOG2_GROUP,
                         LOG2_LANES - LOG2_RUNS - LOG2_GROUP)
    return s, s


@triton.jit
def segment_sum_kernel(
    x_ptr, x_lo_ptr, out_ptr, out_lo_ptr,
    n, rows, row_stride_x, row_stride_out, num_segments, programs_per_row, count,
    LANES: tl.constexpr, LOG2_LANES: tl.constexpr, GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr,
    SEGMENTS_PER_PROGRAM: tl.constexpr, LOG2_SEGMENTS_PER_PROGRAM: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    ACCUMULATE: tl.constexpr, TRANSFORM: tl.constexpr, PAIR_INPUT: tl.constexpr,
    EXACT_GROUPS: tl.constexpr, FINISH: tl.constexpr, FINAL: tl.constexpr,
    INTERPRETED: tl.constexpr, EVEN: tl.constexpr, EVICT_FIRST: tl.constexpr,
    NODE_SEGMENTS: tl.constexpr = 1, LOG2_NODE_SEGMENTS: tl.constexpr = 0, NODE_STRIDE: tl.constexpr = 1,
    WAIT_FOR_PRIOR: tl.constexpr = False, RELEASE_DEPENDENTS: tl.constexpr = False,
    RUNS: tl.constexpr = 1, LOG2_RUNS: tl.constexpr = 0,
):
    """Segment results, tree nodes (NODE_SEGMENTS > 1) or, with FINISH, final results of a sum
    in the treefold order.

    Args:
        x_ptr: input rows (any float or integer dtype, last dimension contiguous); at later
            levels of the accurate sum the leading float64 words of the partial pairs.
        x_lo_ptr: trailing float64 words of the partial pairs (read only with PAIR_INPUT).
        out_ptr: without FINISH, ``num_segments`` partials per row (float32, leading float64
            words, or int64), or with NODE_SEGMENTS > 1 ``programs_per_row`` tree nodes; with
            FINISH one result per row, in the output dtype.
        out_lo_ptr: trailing float64 words of the partials (written by the accurate sum).
        n: elements per row at this level.
        rows: number of rows.
        row_stride_x: elements between consecutive input rows (also for ``x_lo_ptr``).
        row_stride_out: elements between consecutive rows of partials.
        num_segments: S(n), segments per row.
        programs_per_row: programs sharing one row (grid = row groups * programs_per_row).
        count: elements of the original row (the divisor of a mean).
        LANES: C(n), the segment width.
        LOG2_LANES: log2(LANES).
        GROUP: G, lanes per group (``order.group``: of the input dtype at the first level, 1 later).
        LOG2_GROUP: log2(GROUP).
        SEGMENTS_PER_PROGRAM: segments loaded as one block (power of two; with FINISH
            next_pow2(S); with NODE_SEGMENTS > 1 the segments in flight per loop step).
        LOG2_SEGMENTS_PER_PROGRAM: its log2.
        ROWS_PER_PROGRAM: rows per program (power of two; more than one only with FINISH).
        ACCUMULATE: ACC_FP32, ACC_DOUBLE_DOUBLE or ACC_INT64.
        TRANSFORM: TRANSFORM_NONE, TRANSFORM_SQUARE or TRANSFORM_ABS, applied to each element
            after conversion (launch with enable_fp_fusion=False so x * x is rounded on its own).
        PAIR_INPUT: the inputs are float64 pairs (levels after the first of the accurate sum).
        EXACT_GROUPS: the accurate sum adds inside groups with TwoSum (else plain float64 adds;
            the group tree and later levels always use pairs).
        FINISH: also reduce this program's SEGMENTS_PER_PROGRAM results with one halving tree
            and write the final value.
        FINAL: with FINISH, FINAL_NONE, FINAL_MEAN (divide by ``count`` in float64, round once)
            or FINAL_SQRT (correctly rounded square root).
        INTERPRETED: run by Triton's interpreter: split trees into halves (see ``combine.halves``).
        EVEN: no element of the block is out of bounds (no masks).
        EVICT_FIRST: load with the evict-first cache policy.
        NODE_SEGMENTS: > 1: each program computes one node of the next level's halving tree
            instead of segment results. The next level cuts the S segment results into runs of
            C' = NODE_SEGMENTS * NODE_STRIDE; program j of a row (run k = j // NODE_STRIDE,
            q = j % NODE_STRIDE) reduces segments k C' + q + m NODE_STRIDE, m < NODE_SEGMENTS,
            and adds their results with a halving tree over m. Those are exactly the first
            log2(NODE_SEGMENTS) levels of run k's halving tree (it pairs results C'/2 apart), so
            the node is the value that tree holds at position q; the launch after this one
            finishes the tree over the NODE_STRIDE nodes of every run (LANES = NODE_STRIDE,
            GROUP = 1). Segments past the end hold +0.0, the order's padding.
        LOG2_NODE_SEGMENTS: log2(NODE_SEGMENTS).
        NODE_STRIDE: positions between the segments of one node (a power of two).
        WAIT_FOR_PRIOR: launched as a programmatic dependent launch: wait for the previous
            kernel's writes before reading (``start_dependent_launch``).
        RELEASE_DEPENDENTS: let a dependent launch start its programs early
            (``start_dependent_launch``); they still wait for this kernel's writes.
        RUNS: each loaded segment held as RUNS runs of LANES / RUNS lanes (``run_tree_sum``):
            with runs of 32 vectors Triton gives the warps to the block's segments or rows, and a
            segment's tree stays inside its warps (a launch choice; LOG2_RUNS its log2).
    """
    start_dependent_launch(WAIT_FOR_PRIOR, RELEASE_DEPENDENTS)
    BLOCK: tl.constexpr = ROWS_PER_PROGRAM * SEGMENTS_PER_PROGRAM
    pid = tl.program_id(0).to(tl.int64)
    group = pid // programs_per_row
    SPAN: tl.constexpr = LANES // RUNS
    lanes = (tl.arange(0, RUNS)[:, None] * SPAN + tl.arange(0, SPAN)[None, :])[None, :, :]
    if NODE_SEGMENTS > 1:
        # One row per program; the node j of the row is stored at position j.
        node = pid % programs_per_row
        run = node // NODE_STRIDE
        first_segment = run * (NODE_SEGMENTS * NODE_STRIDE) + node % NODE_STRIDE
        row_base = group * row_stride_x
        STEPS: tl.constexpr = NODE_SEGMENTS // SEGMENTS_PER_PROGRAM
        b = tl.arange(0, SEGMENTS_PER_PROGRAM)
        step = tl.arange(0, STEPS)[:, None]
        acc_s = tl.zeros([STEPS, SEGMENTS_PER_PROGRAM], out_ptr.dtype.element_ty)
        acc_c = acc_s
        for m in tl.range(0, STEPS):
            segment = first_segment + (m * SEGMENTS_PER_PROGRAM + b) * NODE_STRIDE
            offsets = segment[:, None, None] * LANES + lanes
            s, c = _segment_results(x_ptr + row_base, x_lo_ptr + row_base, offsets, offsets < n,
                                    SEGMENTS_PER_PROGRAM, LANES, LOG2_LANES, GROUP, LOG2_GROUP,
                                    ACCUMULATE, TRANSFORM, PAIR_INPUT, EXACT_GROUPS, INTERPRETED,
                                    EVEN, EVICT_FIRST, RUNS, LOG2_RUNS)
            acc_s = tl.where(step == m, s[None, :], acc_s)
            if ACCUMULATE == ACC_DOUBLE_DOUBLE:
                acc_c = tl.where(step == m, c[None, :], acc_c)
        # Position m * SEGMENTS_PER_PROGRAM + b of the flattened block holds segment m' = that.
        acc_s = tl.reshape(acc_s, [1, NODE_SEGMENTS])
        if ACCUMULATE == ACC_DOUBLE_DOUBLE:
            s, c = tree_double_double(acc_s, tl.reshape(acc_c, [1, NODE_SEGMENTS]), 1, NODE_SEGMENTS,
                                      LOG2_NODE_SEGMENTS, 1, 0, True, INTERPRETED)
            tl.store(out_lo_ptr + group * row_stride_out + node + tl.arange(0, 1), c)
        else:
            s = tree_sum(acc_s, 1, NODE_SEGMENTS, LOG2_NODE_SEGMENTS, 1, 0)
        tl.store(out_ptr + group * row_stride_out + node + tl.arange(0, 1), s)
        return

    first = (pid % programs_per_row) * SEGMENTS_PER_PROGRAM
    b = tl.arange(0, BLOCK)
    row = group * ROWS_PER_PROGRAM + b // SEGMENTS_PER_PROGRAM
    segment = first + b % SEGMENTS_PER_PROGRAM
    offsets = row[:, None, None] * row_stride_x + segment[:, None, None] * LANES + lanes
    mask = (row[:, None, None] < rows) & (segment[:, None, None] * LANES + lanes < n)
    seg_s, seg_c = _segment_results(x_ptr, x_lo_ptr, offsets, mask, BLOCK, LANES, LOG2_LANES, GROUP,
                                    LOG2_GROUP, ACCUMULATE, TRANSFORM, PAIR_INPUT, EXACT_GROUPS,
                                    INTERPRETED, EVEN, EVICT_FIRST, RUNS, LOG2_RUNS)

    if FINISH:
        # The next level of the order is one plain halving tree over the segment results; the
        # segments past the end of a row hold +0.0, which is the order's padding there.
        out_rows = group * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
        if ACCUMULATE == ACC_DOUBLE_DOUBLE:
            s, c = tree_double_double(
                tl.reshape(seg_s, [ROWS_PER_PROGRAM, SEGMENTS_PER_PROGRAM]),
                tl.reshape(seg_c, [ROWS_PER_PROGRAM, SEGMENTS_PER_PROGRAM]),
                ROWS_PER_PROGRAM, SEGMENTS_PER_PROGRAM, LOG2_SEGMENTS_PER_PROGRAM, 1, 0, True,
                INTERPRETED)
            # A 16-bit result takes the float32 round-to-odd value, which the store rounds once
            # more: the 16-bit value nearest the float64 one, not a rounding of a rounding.
            SIXTEEN_BIT_OUT: tl.constexpr = out_ptr.dtype.element_ty.primitive_bitwidth == 16
            if FINAL == FINAL_MEAN:
                hi = tl.where(c == 0, s, s + c)
                # float64 division compiles to div.rn.f64 (correctly rounded, like NumPy's).
                quotient = hi / tl.cast(count, tl.float64)
                if SIXTEEN_BIT_OUT:
                    result = float32_round_to_odd(quotient)
                else:
                    result = quotient.to(tl.float32)
                result = tl.where(tl.abs(s) < float("inf"), result, s.to(tl.float32))
            else:
                result = double_double_to_float32(s, c, SIXTEEN_BIT_OUT)
        else:
            total = tree_sum(tl.reshape(seg_s, [ROWS_PER_PROGRAM, SEGMENTS_PER_PROGRAM]),
                             ROWS_PER_PROGRAM, SEGMENTS_PER_PROGRAM, LOG2_SEGMENTS_PER_PROGRAM, 1, 0)
            if FINAL == FINAL_MEAN:
                result = (total.to(tl.float64) / tl.cast(count, tl.float64)).to(tl.float32)
            elif FINAL == FINAL_SQRT:
                result = tl.sqrt_rn(total)
            else:
                result = total
        tl.store(out_ptr + out_rows, result.to(out_ptr.dtype.element_ty),
                 mask=out_rows < rows)
    else:
        out_offsets = row * row_stride_out + segment
        out_mask = (row < rows) & (segment < num_segments)
        tl.store(out_ptr + out_offsets, seg_s, mask=out_mask)
        if ACCUMULATE == ACC_DOUBLE_DOUBLE:
            tl.store(out_lo_ptr + out_offsets, seg_c, mask=out_mask)


# --------------------------------------------------------------------------------------------
# Max, min and their indices
# --------------------------------------------------------------------------------------------

@triton.jit
def segment_extreme_kernel(
    x_ptr, index_ptr, source_ptr, value_out_ptr, index_out_ptr,
    n, rows, row_stride_x, row_stride_source, row_stride_out, num_segments,
    LANES: tl.constexpr, LOG2_LANES: tl.constexpr, TILES: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    IS_MAX: tl.constexpr, ABSOLUTE: tl.constexpr, WORST: tl.constexpr,
    INDEXED_INPUT: tl.constexpr, FINISH: tl.constexpr, LOADS_IN_FLIGHT: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Max (or min) of rows with the index of the chosen element, one segment per program.

    Args:
        x_ptr: input rows (float or integer dtype, last dimension contiguous), or at the second
            level the partial values.
        index_ptr: with INDEXED_INPUT, the partial indices (same row stride as ``x_ptr``).
        source_ptr: the original input; with FINISH (and not ABSOLUTE) the value written is the
            source element at the chosen index, bit for bit (NaN payloads included).
        value_out_ptr: partial values ([rows, num_segments], float32 for float inputs) or,
            with FINISH, one value per row in the output dtype.
        index_out_ptr: int64 indices, laid out like ``value_out_ptr``.
        n: elements per row at this level.
        rows: number of rows.
        row_stride_x: elements between consecutive input rows.
        row_stride_source: elements between consecutive rows of ``source_ptr``.
        row_stride_out: elements between consecutive rows of partials.
        num_segments: segments per row (programs per row); 1 with FINISH.
        LANES: elements per tile and row (power of two).
        LOG2_LANES: log2(LANES).
        TILES: tiles of LANES elements per segment (the last segment of a row may have fewer:
            positions past ``n`` are masked).
        ROWS_PER_PROGRAM: rows per program (power of two).
        IS_MAX: max / argmax (else min / argmin).
        ABSOLUTE: compare |x| (the infinity norm) and write |x| (converted from float32).
        WORST: the identity, also loaded for positions out of bounds: -inf / +inf for floats,
            the integer dtype's min / max; 0.0 for the max of |x| (|-inf| would win).
        INDEXED_INPUT: the inputs are partials whose indices are read from ``index_ptr``.
        FINISH: the program covers whole rows: write the final pair.
        LOADS_IN_FLIGHT: tiles loaded before they are combined (1, 2 or 4).
        INTERPRETED: run by Triton's interpreter (trees split into halves, see ``combine.halves``).
    """
    pid = tl.program_id(0).to(tl.int64)
    group = pid // num_segments
    segment = pid % num_segments
    row = group * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_ok = row[:, None] < rows
    lane = tl.arange(0, LANES)
    segment_start = segment * (TILES * LANES)
    limit = tl.minimum(segment_start + TILES * LANES, n)
    offsets = segment_start + lane[None, :]
    row_base = row[:, None] * row_stride_x
    if x_ptr.dtype.element_ty.is_floating():
        acc_v = tl.full([ROWS_PER_PROGRAM, LANES], WORST, tl.float32)
    else:
        acc_v = tl.full([ROWS_PER_PROGRAM, LANES], WORST, x_ptr.dtype.element_ty)
    # A lane's candidates arrive in increasing position, so the tile number stands for the index
    # while folding; positions are rebuilt before the tree.
    acc_t = tl.zeros([ROWS_PER_PROGRAM, LANES], dtype=tl.int32)
    for t in range(0, TILES, LOADS_IN_FLIGHT):
        o = offsets + t * LANES
        v0 = tl.load(x_ptr + row_base + o, mask=row_ok & (o < limit), other=WORST)
        if LOADS_IN_FLIGHT >= 2:
            v1 = tl.load(x_ptr + row_base + o + LANES, mask=row_ok & (o + LANES < limit), other=WORST)
        if LOADS_IN_FLIGHT >= 4:
            v2 = tl.load(x_ptr + row_base + o + 2 * LANES, mask=row_ok & (o + 2 * LANES < limit),
                         other=WORST)
            v3 = tl.load(x_ptr + row_base + o + 3 * LANES, mask=row_ok & (o + 3 * LANES < limit),
                         other=WORST)
        v0 = v0.to(acc_v.dtype)
        if ABSOLUTE:
            v0 = tl.abs(v0)
        acc_v, acc_t = pick_later(acc_v, acc_t, v0, t, IS_MAX)
        if LOADS_IN_FLIGHT >= 2:
            v1 = v1.to(acc_v.dtype)
            if ABSOLUTE:
                v1 = tl.abs(v1)
            acc_v, acc_t = pick_later(acc_v, acc_t, v1, t + 1, IS_MAX)
        if LOADS_IN_FLIGHT >= 4:
            v2 = v2.to(acc_v.dtype)
            v3 = v3.to(acc_v.dtype)
            if ABSOLUTE:
                v2 = tl.abs(v2)
                v3 = tl.abs(v3)
            acc_v, acc_t = pick_later(acc_v, acc_t, v2, t + 2, IS_MAX)
            acc_v, acc_t = pick_later(acc_v, acc_t, v3, t + 3, IS_MAX)

    position = offsets + acc_t.to(tl.int64) * LANES
    if INDEXED_INPUT:
        # A lane that saw only padding keeps position >= limit: give it the largest index so it
        # loses every tie (its value is the identity).
        index = tl.load(index_ptr + row_base + position, mask=row_ok & (position < limit),
                        other=9223372036854775807)
    else:
        index = position
    value, index = tree_pick(acc_v, index, ROWS_PER_PROGRAM, LANES, LOG2_LANES, IS_MAX, INTERPRETED)
    if FINISH:
        if not ABSOLUTE:
            value = tl.load(source_ptr + row * row_stride_source + index, mask=row < rows)
        tl.store(value_out_ptr + row, value.to(value_out_ptr.dtype.element_ty), mask=row < rows)
        tl.store(index_out_ptr + row, index, mask=row < rows)
    else:
        out_offsets = row * row_stride_out + segment
        tl.store(value_out_ptr + out_offsets, value, mask=row < rows)
        tl.store(index_out_ptr + out_offsets, index, mask=row < rows)
