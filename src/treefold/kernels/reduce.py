"""Whole-tensor and row reductions: sums in the treefold order, extremes under a total order.

``segment_sum_kernel`` computes segment results of the treefold order (``treefold.order``):
program (row group, p) loads segments p * SEGMENTS_PER_PROGRAM ... of ROWS_PER_PROGRAM rows as
one ``[ROWS * SEGMENTS, LANES]`` block and reduces every segment with the grouped halving tree.
Applied again to its own output while a row has more than one segment, it realises the whole
order; with FINISH one program holds every segment of its rows and also performs the next
level, which is a single halving tree when a row has at most ``order.MAX_LANES`` segments.
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

from .combine import round_to, tree_sum

ACC_FP32: tl.constexpr = tl.constexpr(0)
ACC_DOUBLE_DOUBLE: tl.constexpr = tl.constexpr(1)
ACC_INT64: tl.constexpr = tl.constexpr(2)

TRANSFORM_NONE: tl.constexpr = tl.constexpr(0)
TRANSFORM_SQUARE: tl.constexpr = tl.constexpr(1)
TRANSFORM_ABS: tl.constexpr = tl.constexpr(2)

FINAL_NONE: tl.constexpr = tl.constexpr(0)
FINAL_MEAN: tl.constexpr = tl.constexpr(1)
FINAL_SQRT: tl.constexpr = tl.constexpr(2)


# --------------------------------------------------------------------------------------------
# Halving trees of custom combines
#
# Compiled, a level is ``tl.reduce`` over an axis of size two (the compiler's shuffles and shared
# memory exchanges, no order to choose). Triton's interpreter runs a custom ``tl.reduce`` one
# element at a time in Python, so with INTERPRETED the two halves are split out (reshape,
# permute, split: NumPy views) and combined as whole arrays. Every combine used here is
# symmetric in its two operands, so both forms compute the same values: the lower half's
# element j meets the upper half's element j.
# --------------------------------------------------------------------------------------------

@triton.jit
def halves(x, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """Split ``[ROWS, WIDTH]`` into its lower and upper halves along the last axis."""
    return tl.split(tl.permute(tl.reshape(x, [ROWS, 2, WIDTH // 2]), (0, 2, 1)))


# --------------------------------------------------------------------------------------------
# Error-free float64 arithmetic for the accurate sum
# --------------------------------------------------------------------------------------------

@triton.jit
def two_sum(a, b):
    """Knuth's TwoSum: s = fl(a + b) and e with s + e == a + b exactly, for any |a|, |b|.

    No products appear, so contraction into FMA cannot change it. The exact error of a finite
    sum is unique, so two_sum(a, b) and two_sum(b, a) give the same pair.
    """
    s = a + b
    b_virtual = s - a
    a_virtual = s - b_virtual
    e = (a - a_virtual) + (b - b_virtual)
    return s, e


@triton.jit
def double_double_add(s_a, c_a, s_b, c_b):
    """Merge two unevaluated sums (s_a + c_a) + (s_b + c_b): TwoSum of the leading words, its
    rounding error added to the sum of the trailing words. Symmetric in its two operands."""
    s, e = two_sum(s_a, s_b)
    return s, (c_a + c_b) + e


@triton.jit
def tree_double_double(s, c, ROWS: tl.constexpr, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr,
                       GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr, EXACT_GROUPS: tl.constexpr,
                       INTERPRETED: tl.constexpr):
    """``combine.tree_sum``'s grouped halving tree over ``[ROWS, WIDTH]`` float64 pairs.

    The same pairs meet at the same levels as in ``tree_sum``. Inside groups the adds are
    TwoSums with ``EXACT_GROUPS``, else plain float64 adds (then ``c`` must hold -0.0 on entry,
    as it does for raw inputs). INTERPRETED: see "Halving trees of custom combines" above.
    """
    GROUPS: tl.constexpr = WIDTH // GROUP
    s = tl.reshape(s, [ROWS * GROUPS, GROUP])
    c = tl.reshape(c, [ROWS * GROUPS, GROUP])
    for level in tl.static_range(LOG2_GROUP):
        if EXACT_GROUPS:
            if INTERPRETED:
                s_a, s_b = halves(s, ROWS * GROUPS, GROUP >> level)
                c_a, c_b = halves(c, ROWS * GROUPS, GROUP >> level)
                s, c = double_double_add(s_a, c_a, s_b, c_b)
            else:
                s, c = tl.reduce((tl.reshape(s, [ROWS * GROUPS, 2, GROUP >> (level + 1)]),
                                  tl.reshape(c, [ROWS * GROUPS, 2, GROUP >> (level + 1)])),
                                 axis=1, combine_fn=double_double_add)
        elif INTERPRETED:
            s_a, s_b = halves(s, ROWS * GROUPS, GROUP >> level)
            s = s_a + s_b
        else:
            s = tl.sum(tl.reshape(s, [ROWS * GROUPS, 2, GROUP >> (level + 1)]), axis=1)
    s = tl.reshape(s, [ROWS, GROUPS])
    if EXACT_GROUPS or LOG2_GROUP == 0:
        c = tl.reshape(c, [ROWS, GROUPS])
    else:
        c = tl.full([ROWS, GROUPS], -0.0, tl.float64)
    for level in tl.static_range(LOG2_WIDTH - LOG2_GROUP):
        if INTERPRETED:
            s_a, s_b = halves(s, ROWS, GROUPS >> level)
            c_a, c_b = halves(c, ROWS, GROUPS >> level)
            s, c = double_double_add(s_a, c_a, s_b, c_b)
        else:
            s, c = tl.reduce((tl.reshape(s, [ROWS, 2, GROUPS >> (level + 1)]),
                              tl.reshape(c, [ROWS, 2, GROUPS >> (level + 1)])),
                             axis=1, combine_fn=double_double_add)
    return tl.reshape(s, [ROWS]), tl.reshape(c, [ROWS])


@triton.jit
def double_double_to_float32(s, c):
    """The float32 nearest (ties to even) to the exact value s + c.

    s + c is first renormalised to hi + lo with hi = fl(s + c) and lo exact (a zero c leaves s
    alone, keeping the sign of a zero sum). hi is then replaced by its neighbour towards lo when
    lo != 0 and hi's last bit is even (round-to-odd): a 53-bit round-to-odd value rounds to any
    format of at most 51 bits exactly as the exact value would, so the final float64 -> float32
    conversion (to nearest even) is the correct rounding of s + c. Infinite or NaN sums return
    s itself (TwoSum of an infinity leaves NaN in c).
    """
    hi, lo = two_sum(s, c)
    zero_c = c == 0
    hi = tl.where(zero_c, s, hi)
    lo = tl.where(zero_c, 0.0, lo)
    bits = hi.to(tl.int64, bitcast=True)
    even = (bits & 1) == 0
    # For a positive hi a larger bit pattern is a larger magnitude; the same holds for a negative
    # hi, so "towards lo" is +1 when lo and hi have the same sign and -1 otherwise.
    step = tl.where((lo > 0) == (hi > 0), 1, -1).to(tl.int64)
    bits = tl.where((lo != 0) & even, bits + step, bits)
    rounded = bits.to(tl.float64, bitcast=True).to(tl.float32)
    finite = tl.abs(s) < float("inf")
    return tl.where(finite, rounded, s.to(tl.float32))


# --------------------------------------------------------------------------------------------
# The (value, index) combine: the one rule behind max, min, argmax and argmin
# --------------------------------------------------------------------------------------------

@triton.jit
def pick(v_a, i_a, v_b, i_b, IS_MAX: tl.constexpr):
    """Choose between (v_a, i_a) and (v_b, i_b): NaN wins (the lower index among NaNs), then
    the larger value (smaller with ``IS_MAX`` false), then the lower index. The indices of the
    two operands always differ, so this is a selection under a total order: associative,
    commutative, and any evaluation order gives the same pair."""
    if IS_MAX:
        b_better = v_b > v_a
    else:
        b_better = v_b < v_a
    b_first = i_b < i_a
    b_nan = v_b != v_b
    a_nan = v_a != v_a
    take_b = b_better | ((v_b == v_a) & b_first) | (b_nan & (b_first | ~a_nan))
    return tl.where(take_b, v_b, v_a), tl.where(take_b, i_b, i_a)


@triton.jit
def pick_max(v_a, i_a, v_b, i_b):
    """``pick`` for max / argmax, in the two-pair form ``tl.reduce`` calls."""
    return pick(v_a, i_a, v_b, i_b, True)


@triton.jit
def pick_min(v_a, i_a, v_b, i_b):
    """``pick`` for min / argmin, in the two-pair form ``tl.reduce`` calls."""
    return pick(v_a, i_a, v_b, i_b, False)


@triton.jit
def tree_pick(v, i, ROWS: tl.constexpr, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr,
              IS_MAX: tl.constexpr, INTERPRETED: tl.constexpr):
    """Halving tree of ``pick`` over the last axis of ``[ROWS, WIDTH]`` (value, index) pairs."""
    for level in tl.static_range(LOG2_WIDTH):
        if INTERPRETED:
            v_a, v_b = halves(v, ROWS, WIDTH >> level)
            i_a, i_b = halves(i, ROWS, WIDTH >> level)
            v, i = pick(v_a, i_a, v_b, i_b, IS_MAX)
        elif IS_MAX:
            v, i = tl.reduce((tl.reshape(v, [ROWS, 2, WIDTH >> (level + 1)]),
                              tl.reshape(i, [ROWS, 2, WIDTH >> (level + 1)])),
                             axis=1, combine_fn=pick_max)
        else:
            v, i = tl.reduce((tl.reshape(v, [ROWS, 2, WIDTH >> (level + 1)]),
                              tl.reshape(i, [ROWS, 2, WIDTH >> (level + 1)])),
                             axis=1, combine_fn=pick_min)
    return tl.reshape(v, [ROWS]), tl.reshape(i, [ROWS])


# --------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------

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
def segment_sum_kernel(
    x_ptr, x_lo_ptr, out_ptr, out_lo_ptr,
    n, rows, row_stride_x, row_stride_out, num_segments, programs_per_row, count,
    LANES: tl.constexpr, LOG2_LANES: tl.constexpr, GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr,
    SEGMENTS_PER_PROGRAM: tl.constexpr, LOG2_SEGMENTS_PER_PROGRAM: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    ACCUMULATE: tl.constexpr, TRANSFORM: tl.constexpr, PAIR_INPUT: tl.constexpr,
    EXACT_GROUPS: tl.constexpr, FINISH: tl.constexpr, FINAL: tl.constexpr,
    INTERPRETED: tl.constexpr, EVEN: tl.constexpr, EVICT_FIRST: tl.constexpr,
):
    """Segment results (or, with FINISH, final results) of a sum in the treefold order.

    Args:
        x_ptr: input rows (any float or integer dtype, last dimension contiguous); at later
            levels of the accurate sum the leading float64 words of the partial pairs.
        x_lo_ptr: trailing float64 words of the partial pairs (read only with PAIR_INPUT).
        out_ptr: without FINISH, ``num_segments`` partials per row (float32, leading float64
            words, or int64); with FINISH one result per row, in the output dtype.
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
        SEGMENTS_PER_PROGRAM: segments per program (power of two; with FINISH next_pow2(S)).
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
        INTERPRETED: run by Triton's interpreter: round float32 -> bfloat16 on the bits (the
            interpreter truncates) and split trees into halves (see above).
        EVEN: no element of the block is out of bounds (no masks).
        EVICT_FIRST: load with the evict-first cache policy.
    """
    BLOCK: tl.constexpr = ROWS_PER_PROGRAM * SEGMENTS_PER_PROGRAM
    pid = tl.program_id(0).to(tl.int64)
    group = pid // programs_per_row
    first = (pid % programs_per_row) * SEGMENTS_PER_PROGRAM
    b = tl.arange(0, BLOCK)
    row = group * ROWS_PER_PROGRAM + b // SEGMENTS_PER_PROGRAM
    segment = first + b % SEGMENTS_PER_PROGRAM
    offsets = segment[:, None] * LANES + tl.arange(0, LANES)[None, :]
    row_base = row[:, None] * row_stride_x
    mask = (row[:, None] < rows) & (offsets < n)

    v = _load(x_ptr + row_base + offsets, mask, EVEN, EVICT_FIRST)
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
            c = _load(x_lo_ptr + row_base + offsets, mask, EVEN, EVICT_FIRST)
        else:
            # -0.0 is the exact identity of addition, so the compiler drops the first adds of c.
            c = tl.full([BLOCK, LANES], -0.0, tl.float64)
        seg_s, seg_c = tree_double_double(v, c, BLOCK, LANES, LOG2_LANES, GROUP, LOG2_GROUP,
                                          EXACT_GROUPS, INTERPRETED)
    else:
        seg_s = tree_sum(v, BLOCK, LANES, LOG2_LANES, GROUP, LOG2_GROUP)
        seg_c = seg_s

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
            if FINAL == FINAL_MEAN:
                hi = tl.where(c == 0, s, s + c)
                # float64 division compiles to div.rn.f64 (correctly rounded, like NumPy's).
                result = (hi / tl.cast(count, tl.float64)).to(tl.float32)
                result = tl.where(tl.abs(s) < float("inf"), result, s.to(tl.float32))
            else:
                result = double_double_to_float32(s, c)
        else:
            total = tree_sum(tl.reshape(seg_s, [ROWS_PER_PROGRAM, SEGMENTS_PER_PROGRAM]),
                             ROWS_PER_PROGRAM, SEGMENTS_PER_PROGRAM, LOG2_SEGMENTS_PER_PROGRAM, 1, 0)
            if FINAL == FINAL_MEAN:
                result = (total.to(tl.float64) / tl.cast(count, tl.float64)).to(tl.float32)
            elif FINAL == FINAL_SQRT:
                result = tl.sqrt_rn(total)
            else:
                result = total
        tl.store(out_ptr + out_rows, round_to(result, out_ptr.dtype.element_ty, INTERPRETED),
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
        INTERPRETED: run by Triton's interpreter (trees split into halves, see above).
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
        acc_v, acc_t = pick(acc_v, acc_t, v0, t, IS_MAX)
        if LOADS_IN_FLIGHT >= 2:
            v1 = v1.to(acc_v.dtype)
            if ABSOLUTE:
                v1 = tl.abs(v1)
            acc_v, acc_t = pick(acc_v, acc_t, v1, t + 1, IS_MAX)
        if LOADS_IN_FLIGHT >= 4:
            v2 = v2.to(acc_v.dtype)
            v3 = v3.to(acc_v.dtype)
            if ABSOLUTE:
                v2 = tl.abs(v2)
                v3 = tl.abs(v3)
            acc_v, acc_t = pick(acc_v, acc_t, v2, t + 2, IS_MAX)
            acc_v, acc_t = pick(acc_v, acc_t, v3, t + 3, IS_MAX)

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
