"""Combine functions and trees shared by every treefold kernel.

``tree_sum`` realises steps 2-3 of the treefold order (``treefold.order``) over the last axis of a
``[ROWS, WIDTH]`` block: halving trees inside groups of GROUP consecutive lanes, then a halving tree
over the groups. Each level is a reduction over an axis of size two, a single combine of the two
halves, so the compiler has no order left to choose: the GPU, the interpreter and the NumPy
reference (``treefold.order.grouped_tree``) perform the same operations on the same operands.
Reshapes are free with Triton's linear layouts; with GROUP equal to the 16-byte vector each thread
loads, the group levels are register adds and the group tree needs the usual few warp shuffles.

Also here: the online-softmax merge and its tree, the round-to-nearest output conversion, the
error-free float64 pair arithmetic of the correctly rounded sum, and the (value, index) merge
with lowest-index ties used by max/min/argmax/argmin.
"""
import triton
import triton.language as tl

try:  # programmatic dependent launch (Hopper and later); Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # older Triton: the launches that would use it are never planned
    gdc_launch_dependents = gdc_wait = None

#: Whether this Triton can build kernels that take part in a programmatic dependent launch.
HAS_DEPENDENT_LAUNCH = gdc_wait is not None


@triton.jit
def start_dependent_launch(WAIT_FOR_PRIOR: tl.constexpr, RELEASE_DEPENDENTS: tl.constexpr):
    """The start of a kernel that takes part in programmatic dependent launches (sm_90).
    RELEASE_DEPENDENTS: the next launch may start its programs now (they still wait for this
    one's writes); WAIT_FOR_PRIOR: wait until the previous launch has finished and its writes
    are visible, before anything it may have written is read and before anything is written.
    A kernel may load what no launch of its call writes (its inputs) before calling this, so
    that those loads overlap the wait. Both False: nothing."""
    if RELEASE_DEPENDENTS:
        gdc_launch_dependents()
    if WAIT_FOR_PRIOR:
        gdc_wait()


@triton.jit
def halving_tree(x, OUTER: tl.constexpr, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr, INNER: tl.constexpr,
                 EXCHANGE: tl.constexpr = None):
    """Halving-tree sum over the middle axis of an ``[OUTER, WIDTH, INNER]`` block (index j takes
    j + WIDTH / 2, then WIDTH / 4, ...); returns ``[OUTER, INNER]``.

    Each level is a ``tl.sum`` over an axis of two, one combine of the two halves, except the
    levels EXCHANGE = (first, count) (None or count 0: none), which are one ``tl.sum`` over an
    axis of 2 ** count. That is the same pairs in the same order when those levels' index bits are all
    warp bits of the block's layout, and only then: Triton reduces the warps' partials of such an
    axis in one trip through shared memory, each output's partials read by 2 ** count consecutive
    lanes (lane k the partial of axis index k) and met by butterfly shuffles from the highest
    offset down, so index k meets k + 2 ** (count - 1) first, as the explicit levels pair them
    (float addition commutes, so both lanes of a pair hold the same sum). The explicit levels
    cost a trip through shared memory and two barriers each (sm_90, RMSNorm 16384 x 8192 at 16
    warps: 11 barriers, 5 with the exchange). Callers ask for it only where the launcher knows the
    layout (``_ops.launch.tree_exchanges``) and never interpreted: Triton's interpreter sums an
    axis in NumPy's order.
    """
    if EXCHANGE is None:
        for level in tl.static_range(LOG2_WIDTH):
            x = tl.sum(tl.reshape(x, [OUTER, 2, WIDTH >> (level + 1), INNER]), axis=1)
    else:
        FIRST: tl.constexpr = EXCHANGE[0]
        COUNT: tl.constexpr = EXCHANGE[1]
        for level in tl.static_range(LOG2_WIDTH):
            if COUNT == 0 or level < FIRST or level >= FIRST + COUNT:
                x = tl.sum(tl.reshape(x, [OUTER, 2, WIDTH >> (level + 1), INNER]), axis=1)
            elif level == FIRST:
                x = tl.sum(tl.reshape(x, [OUTER, 1 << COUNT, WIDTH >> (level + COUNT), INNER]), axis=1)
    return tl.reshape(x, [OUTER, INNER])


@triton.jit
def tree_sum(x, ROWS: tl.constexpr, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr,
             GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr, EXCHANGE: tl.constexpr = None):
    """Grouped halving-tree sum over the last axis of a ``[ROWS, WIDTH]`` block; returns ``[ROWS]``.

    Args:
        x: the block, float32.
        ROWS: rows in the block (a power of two).
        WIDTH: lanes per row, ``2 ** LOG2_WIDTH`` (``treefold.order.lanes``).
        LOG2_WIDTH: log2(WIDTH).
        GROUP: lanes per group, ``2 ** LOG2_GROUP`` (``treefold.order.group``), at most WIDTH.
        LOG2_GROUP: log2(GROUP).
        EXCHANGE: levels of the tree over the groups met in one exchange between warps
            (``halving_tree``).
    """
    GROUPS: tl.constexpr = WIDTH // GROUP
    x = tl.reshape(x, [ROWS, GROUPS, GROUP])
    for level in tl.static_range(LOG2_GROUP):
        x = tl.sum(tl.reshape(x, [ROWS, GROUPS, 2, GROUP >> (level + 1)]), axis=2)
    x = halving_tree(tl.reshape(x, [ROWS, GROUPS, 1]), ROWS, GROUPS, LOG2_WIDTH - LOG2_GROUP, 1, EXCHANGE)
    return tl.reshape(x, [ROWS])


@triton.jit
def run_tree_sum(x, SEGS: tl.constexpr, RUNS: tl.constexpr, LOG2_RUNS: tl.constexpr, SPAN: tl.constexpr,
                 GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr, LOG2_SPAN_GROUPS: tl.constexpr,
                 RUN_EXCHANGE: tl.constexpr = None, SPAN_EXCHANGE: tl.constexpr = None):
    """``tree_sum`` over the C = RUNS * SPAN lanes of each segment of a ``[SEGS, RUNS, SPAN]``
    block, in groups; returns ``[SEGS]``.

    The block holds lane k * SPAN + j of segment s at [s, k, j]: each segment cut into RUNS runs
    of SPAN lanes (SPAN a multiple of GROUP; ``2 ** LOG2_SPAN_GROUPS = SPAN / GROUP``). The order
    is that of ``tree_sum`` over [SEGS, C] with groups of GROUP lanes: first a halving tree inside
    each group (consecutive lanes, all inside a run), then a halving tree over the C / GROUP
    groups, whose first log2(RUNS) levels pair run k with k + RUNS / 2, ... (group g with
    g + C / (2 GROUP), ...) and whose last levels run over the SPAN / GROUP groups of each run.
    The same pairs in the same order, so the same bits.

    Why hold a segment so: with runs of one 16-byte vector per lane of a warp (SPAN = 32 x GROUP)
    Triton gives a ``[.., SEGS, RUNS, SPAN]`` block's warps to the segments, so a thread owns a
    vector of each of its segment's runs, the run levels are additions inside a thread, the
    levels within a run are shuffles inside a warp, and only the segments' own tree crosses warps.
    A ``[SEGS, C]`` block spreads each segment over all the warps, and each thread carries one
    value per segment through the exchanges between warps.

    RUN_EXCHANGE, SPAN_EXCHANGE: levels of the tree over the runs and of the tree over a run's
    groups met in one exchange between warps (``halving_tree``).
    """
    SPAN_GROUPS: tl.constexpr = SPAN // GROUP
    x = tl.reshape(x, [SEGS * RUNS * SPAN_GROUPS, GROUP])
    for level in tl.static_range(LOG2_GROUP):
        x = tl.sum(tl.reshape(x, [SEGS * RUNS * SPAN_GROUPS, 2, GROUP >> (level + 1)]), axis=1)
    x = halving_tree(tl.reshape(x, [SEGS, RUNS, SPAN_GROUPS]), SEGS, RUNS, LOG2_RUNS, SPAN_GROUPS, RUN_EXCHANGE)
    return tree_sum(x, SEGS, SPAN_GROUPS, LOG2_SPAN_GROUPS, 1, 0, SPAN_EXCHANGE)


@triton.jit
def max_sum_merge(m_a, s_a, m_b, s_b):
    """Merge two online-softmax states (running max m, sum s of exp(x - m)).

    Symmetric in its two operands (the two products are added, and float addition commutes
    exactly), so the result does not depend on which half a reduction passes first. A state
    whose max is -inf holds an empty or fully masked set and has s = 0: the max used for
    rescaling is replaced by 0 so that exp(-inf - (-inf)) never makes a NaN.
    """
    m = tl.maximum(m_a, m_b)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = s_a * tl.exp(m_a - m_safe) + s_b * tl.exp(m_b - m_safe)
    return m, s


@triton.jit
def tree_max_sum(m, s, ROWS: tl.constexpr, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr):
    """Halving tree of ``max_sum_merge`` over the last axis of ``[ROWS, WIDTH]`` states.

    Used for the segment results (step 4 of the order, S <= MAX_LANES so a single tree);
    the group split does not apply there because segment states are not loaded as vectors.
    Pad unused states with (-inf, 0).
    """
    for level in tl.static_range(LOG2_WIDTH):
        m, s = tl.reduce(
            (tl.reshape(m, [ROWS, 2, WIDTH >> (level + 1)]),
             tl.reshape(s, [ROWS, 2, WIDTH >> (level + 1)])),
            axis=1, combine_fn=max_sum_merge)
    return tl.reshape(m, [ROWS]), tl.reshape(s, [ROWS])


@triton.jit
def widen_again(held, opaque_count):
    """A 16-bit block widened to float32 once more where it is used, so that a kernel may hold
    the block as loaded through a reduction instead of float32 copies of an earlier widening (half
    the registers). Its bits are OR-ed with ``opaque_count >> 31``: zero for any row count or
    length the launchers pass (< 2^31), but not a constant, so the compiler cannot merge this
    widening with another of the same block and keep the float32 copies live after all (a count
    of 1 arrives as a constant, Triton specialising it: such a launch may hold float32 copies
    again). A kernel that widens a block three times passes a different count each time. The
    same bits as the first widening. A float32 block (a gradient in float32 beside 16-bit outputs) is returned
    as it is: it was held as float32 anyway."""
    if held.dtype.primitive_bitwidth == 16:
        bits = held.to(tl.int16, bitcast=True) | tl.cast(opaque_count >> 31, tl.int16)
        return bits.to(held.dtype, bitcast=True).to(tl.float32)
    else:
        return held.to(tl.float32)


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
def double_double_to_float32(s, c, ROUND_TO_ODD: tl.constexpr = False):
    """The float32 nearest (ties to even) to the exact value s + c, or with ``ROUND_TO_ODD`` the
    float32 round-to-odd of it (``float32_round_to_odd``: for a 16-bit result, which rounds it
    once more and must get the 16-bit value nearest s + c).

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
    odd = bits.to(tl.float64, bitcast=True)
    if ROUND_TO_ODD:
        rounded = float32_round_to_odd(odd)
    else:
        rounded = odd.to(tl.float32)
    finite = tl.abs(s) < float("inf")
    return tl.where(finite, rounded, s.to(tl.float32))


@triton.jit
def float32_round_to_odd(v):
    """float64 -> float32 by round-to-odd: the float32 nearest v when v is one (or overflows),
    else the one of its two float32 neighbours whose last bit is odd. A 24-bit round-to-odd value
    rounds to a format of at most 22 bits (bfloat16, float16) exactly as v would, so converting
    the result to 16 bits (to nearest even) is the 16-bit value nearest v: one rounding, not two.
    (Of a value that is itself a 53-bit round-to-odd result, it is the 24-bit round-to-odd of the
    exact value.)"""
    f = v.to(tl.float32)
    bits = f.to(tl.int32, bitcast=True)
    # towards v: +1 on the bit pattern (a larger magnitude) when v - f (exact) has f's sign (f's
    # sign bit, since f may be a zero that v is not), -1 otherwise
    rest = v - f.to(tl.float64)
    step = tl.where((rest > 0) == (bits >= 0), 1, -1)
    inexact = (rest != 0) & (tl.abs(f) < float("inf"))
    bits = tl.where(inexact & ((bits & 1) == 0), bits + step, bits)
    return bits.to(tl.float32, bitcast=True)


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
    """``pick`` over the last axis of ``[ROWS, WIDTH]`` (value, index) pairs; ``[ROWS]`` each.

    ``pick`` is a selection under a total order, so any tree gives the same pair: compiled,
    this is Triton's own reduction (in-thread first, then shuffles); interpreted, a halving
    tree of whole-array operations (see "Halving trees of custom combines" above).
    """
    if INTERPRETED:
        for level in tl.static_range(LOG2_WIDTH):
            v_a, v_b = halves(v, ROWS, WIDTH >> level)
            i_a, i_b = halves(i, ROWS, WIDTH >> level)
            v, i = pick(v_a, i_a, v_b, i_b, IS_MAX)
        return tl.reshape(v, [ROWS]), tl.reshape(i, [ROWS])
    elif IS_MAX:
        return tl.reduce((v, i), axis=1, combine_fn=pick_max)
    else:
        return tl.reduce((v, i), axis=1, combine_fn=pick_min)


@triton.jit
def pick_later(v_a, i_a, v_b, i_b, IS_MAX: tl.constexpr):
    """``pick`` when ``i_b > i_a`` is known (a lane folding its elements in increasing position):
    b wins only by a strictly better value, or by being NaN where a is not."""
    if IS_MAX:
        take_b = (v_b > v_a) | ((v_b != v_b) & (v_a == v_a))
    else:
        take_b = (v_b < v_a) | ((v_b != v_b) & (v_a == v_a))
    return tl.where(take_b, v_b, v_a), tl.where(take_b, i_b, i_a)


# --------------------------------------------------------------------------------------------
# Programs that share a row: an arrival counter per row
# --------------------------------------------------------------------------------------------

@triton.jit
def arrive(arrivals_ptr, row):
    """Count this program in on its row's arrival counter (int32, zero before the launch), after
    its partials are written; returns the count, this program included.

    The barrier orders every thread's partial stores before the counter's release (one thread
    performs a scalar atomic); an acquire that reads the full count (here, or in
    ``wait_for_arrivals``) orders the partial loads after it. Read the partials with the ".cg"
    cache modifier: from L2, past an L1 that has not seen other SMs' writes.
    """
    tl.debug_barrier()
    return tl.atomic_add(arrivals_ptr + row, 1, sem="acq_rel", scope="gpu") + 1


@triton.jit
def wait_for_arrivals(arrivals_ptr, row, arrived, target):
    """Wait until the row's counter reaches ``target`` (``arrived``: the count ``arrive`` returned).

    Waiting on other programs of one launch is safe when the programs of a row are consecutive
    and fewer than fit on the device at once: programs start in order of their index, so every
    program a waiting one needs has started, or starts as earlier rows finish.
    """
    while arrived < target:
        arrived = tl.atomic_add(arrivals_ptr + row, 0, sem="acquire", scope="gpu")
