"""Combine functions and halving trees shared by every treefold kernel.

Each tree here realises step 3 of the treefold order (``treefold.order``): over the last axis of a
``[ROWS, WIDTH]`` block, lane j takes lane j + WIDTH/2, then j + WIDTH/4, ... A level is written as
a reduction over an axis of size two, which is a single combine of the two halves, so the
compiler has no order left to choose: the GPU, the interpreter and the NumPy reference
(``treefold.order.halving_tree``) perform the same operations on the same operands.
"""
import triton
import triton.language as tl


@triton.jit
def tree_sum(x, ROWS: tl.constexpr, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr):
    """Halving-tree sum over the last axis of a ``[ROWS, WIDTH]`` block; returns ``[ROWS]``.

    Args:
        x: the block, float32.
        ROWS: rows in the block (a power of two).
        WIDTH: lanes per row (a power of two, ``2 ** LOG2_WIDTH``).
        LOG2_WIDTH: tree depth.
    """
    for level in tl.static_range(LOG2_WIDTH):
        x = tl.sum(tl.reshape(x, [ROWS, 2, WIDTH >> (level + 1)]), axis=1)
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
    """Halving tree of ``max_sum_merge`` over the last axis of ``[ROWS, WIDTH]`` states."""
    for level in tl.static_range(LOG2_WIDTH):
        m, s = tl.reduce(
            (tl.reshape(m, [ROWS, 2, WIDTH >> (level + 1)]),
             tl.reshape(s, [ROWS, 2, WIDTH >> (level + 1)])),
            axis=1, combine_fn=max_sum_merge)
    return tl.reshape(m, [ROWS]), tl.reshape(s, [ROWS])
