"""Combine functions and trees shared by every treefold kernel.

``tree_sum`` realises steps 2-3 of the treefold order (``treefold.order``) over the last axis of a
``[ROWS, WIDTH]`` block: halving trees inside groups of GROUP consecutive lanes, then a halving tree
over the groups. Each level is a reduction over an axis of size two, a single combine of the two
halves, so the compiler has no order left to choose: the GPU, the interpreter and the NumPy
reference (``treefold.order.grouped_tree``) perform the same operations on the same operands.
Reshapes are free with Triton's linear layouts; with GROUP equal to the 16-byte vector each thread
loads, the group levels are register adds and the group tree needs the usual few warp shuffles.
"""
import triton
import triton.language as tl


@triton.jit
def tree_sum(x, ROWS: tl.constexpr, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr,
             GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr):
    """Grouped halving-tree sum over the last axis of a ``[ROWS, WIDTH]`` block; returns ``[ROWS]``.

    Args:
        x: the block, float32.
        ROWS: rows in the block (a power of two).
        WIDTH: lanes per row, ``2 ** LOG2_WIDTH`` (``treefold.order.lanes``).
        LOG2_WIDTH: log2(WIDTH).
        GROUP: lanes per group, ``2 ** LOG2_GROUP`` (``treefold.order.group``), at most WIDTH.
        LOG2_GROUP: log2(GROUP).
    """
    GROUPS: tl.constexpr = WIDTH // GROUP
    x = tl.reshape(x, [ROWS, GROUPS, GROUP])
    for level in tl.static_range(LOG2_GROUP):
        x = tl.sum(tl.reshape(x, [ROWS, GROUPS, 2, GROUP >> (level + 1)]), axis=2)
    x = tl.reshape(x, [ROWS, GROUPS])
    for level in tl.static_range(LOG2_WIDTH - LOG2_GROUP):
        x = tl.sum(tl.reshape(x, [ROWS, 2, GROUPS >> (level + 1)]), axis=1)
    return tl.reshape(x, [ROWS])


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
def round_to(x, dtype: tl.constexpr, SOFT_BF16: tl.constexpr):
    """Round float32 ``x`` to ``dtype``, to nearest with ties to even (other dtypes: a plain cast).

    The compiled cast does this in one instruction. Triton's interpreter truncates float32 to
    bfloat16 instead, so with ``SOFT_BF16`` (set when interpreted) the rounding is done on the
    bits first: add 0x7FFF plus the lowest kept bit, clear the 16 dropped bits (NaN kept as is),
    after which the truncating cast is exact.
    """
    if SOFT_BF16 and dtype == tl.bfloat16 and x.dtype == tl.float32:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + (0x7FFF + ((bits >> 16) & 1))
        rounded = (bits & 0xFFFF0000).to(tl.float32, bitcast=True)
        rounded = tl.where(x != x, x, rounded)
        return rounded.to(dtype)
    else:
        return x.to(dtype)
