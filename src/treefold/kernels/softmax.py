"""Softmax, log-softmax and log-sum-exp over rows, forward and backward, in the treefold order.

The order (``treefold.order``) for a row of N <= MAX_LANES^2 elements: S = num_segments(N)
segments of C = lanes(N) lanes, the last one padded; inside a segment, groups of
G = group(N, dtype read) consecutive lanes (one 16-byte vector); every sum over a segment is
``combine.tree_sum`` with those groups (a halving tree inside each group, then one over the
groups), and the S segment results meet in one plain halving tree padded to next_pow2(S).

Forward, for each segment s of the (temperature-scaled, float32) row x:
    m_s  = max of the segment (exact in any order; padded lanes are -inf),
    s_s  = tree_sum over the C lanes of exp(x - m_s'), where m_s' = 0 when m_s is infinite and
           m_s otherwise (padded lanes give exp(-inf) = 0),
and the S states (m_s, s_s), padded to next_pow2(S) with (-inf, 0), meet in ``tree_max_sum``,
giving (M, Z). With M' = 0 when M = -inf and M otherwise:
    softmax      y = exp(x - m_s') * f_s,  f_s = exp(m_s' - M') * (1 / Z)
                 (1 / Z rounded once per row, 0 when Z = 0; f_s = 0 for a segment that is all
                 -inf; the exp(x - m_s') are those the segment sum already took, so each element
                 meets one exp; for rows of one segment f_s = 1 / Z)
    log_softmax  y = (x - M') - log(Z)            (log(Z) replaced by 0 when Z = 0)
    logsumexp      M + log(Z)                     (+inf when the row holds +inf and no NaN)
A row that is entirely -inf has M = -inf and Z = 0: softmax gives 0, log_softmax and logsumexp
give -inf. A row holding NaN has Z = NaN, so every output of the row is NaN. A row holding +inf
(and no NaN) gets Z = NaN as well (as in torch, whose exp(inf - inf) is NaN), except logsumexp,
which is +inf as in torch. Mapping a +inf segment maximum to m_s' = 0 (rather than only -inf)
keeps such a segment's s_s free of NaN, so s_s is NaN exactly when the segment holds a NaN, and
logsumexp can tell the two cases apart.

Backward (dy given; y the saved forward output; dx scaled by 1/temperature when one was used):
    softmax      dx = y * (dy - sum(dy * y))
    log_softmax  dx = dy - exp(y) * sum(dy)
    logsumexp    dx = dlse * exp(x - lse'), lse' = 0 when lse = -inf (a fully masked row gets 0)
where each row sum is ``tree_sum`` over the lanes of every segment (groups of the dtype of y)
followed by a plain halving tree over the S segment sums padded with zeros: exactly
``order.reference_sum(..., dtype=y.dtype)``.

Cross-entropy is the logsumexp launches with TARGETS: the forward writes the row's M' and log Z
(float32; their sum is the lse) and, from the row's logit at its target t (one more load per
row), loss = log Z - (x[t] - M'), or with label smoothing eps
loss = (1 - eps) * loss + eps * (log Z - (sum(x) / N - M')), sum(x) given per row
(``_store_row_results``); the backward is dx = dloss * (exp((x - M') - log Z) - one_hot(t)), the
one-hot row (1 - eps) at t plus eps / N with label smoothing (``_given_constants``), every column
written with eps / N alone and the target's column written again after
(``_store_target_outputs``).

Every launch strategy computes the same segment partials with the same code and merges them with
the same trees, so the bits do not depend on the strategy, the batch size, the position of a row,
``num_warps`` or how segments are shared out. (The launcher disables FMA contraction so that the
compiler cannot fuse products differently in different specialisations.)

Bytes each launch must move (rows x N elements, b_in / b_out bytes per element):
    forward, whole row(s) per program or split:  read N * b_in, write N * b_out per row (the split
        finish pass re-reads the row, which for decode shapes is still in L2), plus 8 bytes per
        segment of partials for split;
    forward, cooperative:  read N * b_in, write N * b_out per row, plus 8 bytes per segment of
        partials (written once, read by every program of the row, or by the last one for
        logsumexp) and one 4-byte counter per row;
    forward, online:  read N * b_in twice (the second time from L2 while the row fits there),
        write N * b_out;
    logsumexp:  read N * b_in, write one value per row;
    backward softmax / log_softmax:  read y and dy, write dx (online and split read them twice,
        cooperative once);
    backward logsumexp:  read x, write dx, plus two values per row.
    cross-entropy forward:  logsumexp's, plus per row the target (8 bytes), its logit, M', log Z
        and the loss written (12 bytes) and, with label smoothing, the row sum read (4 bytes);
    cross-entropy backward:  read x, write dx, plus per row M', log Z, dloss and the target.
"""
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..backend import INTERPRETED
from .combine import (arrive, run_tree_sum, start_dependent_launch, tree_max_sum, tree_sum,
                      wait_for_arrivals, widen_again)

#: The exp of every element, compiled: one FMUL and one MUFU.EX2 with results below 2^-126 flushed
#: to zero (libdevice's fast_expf). Triton's tl.exp is the same approximation plus three
#: instructions per element that keep such results as subnormals, and these kernels sit near the
#: H200's instruction budget of about 32 per element. The interpreter has no libdevice: there it
#: is NumPy's exp. The per-segment merges keep tl.exp.
FAST_EXP = tl.constexpr(not INTERPRETED)

#: Which function: the OP constexpr.
SOFTMAX = tl.constexpr(0)
LOG_SOFTMAX = tl.constexpr(1)
LOGSUMEXP = tl.constexpr(2)

#: What a program does: the PHASE constexpr.
#: WHOLE_ROWS: partials, merge and outputs of whole rows (registers or streaming).
WHOLE_ROWS = tl.constexpr(0)
#: PARTIALS: the partials of one group of segments of one row, written to the partial buffers.
PARTIALS = tl.constexpr(1)
#: FINISH: merge a row's partials from the buffers, then the outputs of one group of segments.
FINISH = tl.constexpr(2)
#: COOPERATIVE: PARTIALS and FINISH in one program that holds its group of segments in registers
#: between them: it writes its partials, counts itself in on the row's arrival counter, waits until
#: every program of the row has, then merges the row's partials and writes its outputs from the
#: values it holds (one read of the row instead of two). Forward logsumexp, with one output per
#: row, waits for no one: the row's last program to arrive writes it.
COOPERATIVE = tl.constexpr(3)


@triton.jit
def _exp(x):
    """exp of every element of a block (see FAST_EXP)."""
    if FAST_EXP:
        return libdevice.fast_expf(x)
    else:
        return tl.exp(x)


@triton.jit
def _load_raw_tiles(src_ptrs, grad_ptrs, mask, FOR_PARTIALS: tl.constexpr, OP: tl.constexpr,
                    BACKWARD: tl.constexpr, POLICY: tl.constexpr):
    """Load one block of a row as stored (in its own dtype): returns (raw_a, raw_b) for ``_widen_tiles``.

    Forward: x (masked lanes -inf). Backward softmax / log_softmax: y and dy (masked lanes 0);
    for the partials of log_softmax, which need dy only, y is not read. Backward logsumexp: x
    (masked lanes 0). Where one tensor serves as both, raw_b is raw_a.
    """
    if BACKWARD:
        if OP == LOGSUMEXP:
            raw_a = tl.load(src_ptrs, mask=mask, other=0.0, eviction_policy=POLICY)
            raw_b = raw_a
        else:
            raw_b = tl.load(grad_ptrs, mask=mask, other=0.0, eviction_policy=POLICY)
            if FOR_PARTIALS and OP == LOG_SOFTMAX:
                raw_a = raw_b
            else:
                raw_a = tl.load(src_ptrs, mask=mask, other=0.0, eviction_policy=POLICY)
    else:
        raw_a = tl.load(src_ptrs, mask=mask, other=float("-inf"), eviction_policy=POLICY)
        raw_b = raw_a
    return raw_a, raw_b


@triton.jit
def _widen_tiles(raw_a, raw_b, inv_temperature, opaque_count, AGAIN: tl.constexpr, FOR_PARTIALS: tl.constexpr,
                 OP: tl.constexpr, BACKWARD: tl.constexpr, HAS_TEMPERATURE: tl.constexpr):
    """(a, b) as float32 from ``_load_raw_tiles``: forward a = x * inv_temperature, b = a;
    backward a = y (or dy where raw_b is raw_a), b = dy; backward logsumexp a = b = x.

    ``AGAIN``: a held 16-bit block widened once more where its outputs need it
    (``combine.widen_again`` with ``opaque_count``), rather than reuse float32 copies.
    """
    if AGAIN:
        a = widen_again(raw_a, opaque_count)
    else:
        a = raw_a.to(tl.float32)
    if BACKWARD:
        if OP == LOGSUMEXP or (FOR_PARTIALS and OP == LOG_SOFTMAX):
            b = a
        elif AGAIN:
            b = widen_again(raw_b, opaque_count)
        else:
            b = raw_b.to(tl.float32)
    else:
        if HAS_TEMPERATURE:
            a = a * inv_temperature
        b = a
    return a, b


@triton.jit
def _held_tiles(raw_a, raw_b, inv_temperature, rows, FOR_PARTIALS: tl.constexpr, OP: tl.constexpr,
                BACKWARD: tl.constexpr, HAS_TEMPERATURE: tl.constexpr, HOLD_16BIT: tl.constexpr):
    """(a, b, a_for_exp) of a block held through the row's merge: ``_widen_tiles``' (a, b), and the
    block the forward's segment exps are taken of (``_segment_partials``): ``a`` itself, or with
    HOLD_16BIT the held 16-bit block widened once more (``rows`` keeps that widening apart)."""
    a, b = _widen_tiles(raw_a, raw_b, inv_temperature, 0, False, FOR_PARTIALS, OP, BACKWARD, HAS_TEMPERATURE)
    a_for_exp = a
    if HOLD_16BIT:
        a_for_exp, _ = _widen_tiles(raw_a, raw_b, inv_temperature, rows, True, FOR_PARTIALS, OP, BACKWARD,
                                    HAS_TEMPERATURE)
    return a, b, a_for_exp


@triton.jit
def _load_tiles(src_ptrs, grad_ptrs, mask, inv_temperature, FOR_PARTIALS: tl.constexpr,
                OP: tl.constexpr, BACKWARD: tl.constexpr, HAS_TEMPERATURE: tl.constexpr,
                POLICY: tl.constexpr):
    """Load one block of a row as float32: returns (a, b), as ``_widen_tiles`` gives them."""
    raw_a, raw_b = _load_raw_tiles(src_ptrs, grad_ptrs, mask, FOR_PARTIALS, OP, BACKWARD, POLICY)
    return _widen_tiles(raw_a, raw_b, inv_temperature, 0, False, FOR_PARTIALS, OP, BACKWARD, HAS_TEMPERATURE)


@triton.jit
def _segment_partials(a, b, a_for_exp, OUTER: tl.constexpr, LOG2_OUTER: tl.constexpr, SEGS: tl.constexpr,
                      INNER: tl.constexpr, GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr,
                      LOG2_INNER_GROUPS: tl.constexpr, OP: tl.constexpr, BACKWARD: tl.constexpr):
    """Partials of the segments of a ``[SEGS, OUTER, INNER]`` block: (p, q), each [SEGS].

    Forward: p = m_s (segment max), q = s_s (tree sum of exp(x - m_s')), the exps taken of
    ``a_for_exp``: ``a`` itself, or the same values widened again from a held 16-bit block (so
    that neither the maximum nor the sum holds float32 copies of the block through the other).
    Backward softmax: p = q = tree sum of dy * y. Backward log_softmax: p = q = tree sum of dy.
    """
    if BACKWARD:
        if OP == SOFTMAX:
            p = run_tree_sum(a * b, SEGS, OUTER, LOG2_OUTER, INNER, GROUP, LOG2_GROUP, LOG2_INNER_GROUPS)
        else:
            p = run_tree_sum(b, SEGS, OUTER, LOG2_OUTER, INNER, GROUP, LOG2_GROUP, LOG2_INNER_GROUPS)
        q = p
    else:
        p = tl.max(tl.max(a, axis=2), axis=1)
        q = run_tree_sum(_segment_exp(a_for_exp, p), SEGS, OUTER, LOG2_OUTER, INNER, GROUP, LOG2_GROUP,
                         LOG2_INNER_GROUPS)
    return p, q


@triton.jit
def _shift(p):
    """m_s' from segment maxima m_s: 0 where infinite (an all -inf segment, or one holding +inf)."""
    return tl.where((p == float("-inf")) | (p == float("inf")), 0.0, p)


@triton.jit
def _segment_exp(a, p):
    """exp(x - m_s') over a ``[SEGS, OUTER, INNER]`` block, from its segment maxima p = m_s ([SEGS])."""
    return _exp(a - _shift(p)[:, None, None])


@triton.jit
def _softmax_factors(p, c0, c1):
    """Per-segment factors f_s = exp(m_s' - M') * (1 / Z) of the softmax output y = exp(x - m_s') * f_s,
    from the segment maxima p = m_s and the row constants (c0, c1) = (M', 1 / Z), all of one shape.

    A segment that is entirely -inf gets 0 (its exp(x - m_s') are 0, and exp(0 - M') could
    overflow). For a row of one segment m_s' = M' (or the row is -inf, +inf or NaN, where
    1 / Z is 0 or NaN), so f = 1 / Z exactly.
    """
    return tl.where(p == float("-inf"), 0.0, tl.exp(_shift(p) - c0)) * c1


@triton.jit
def _merge_partials(p, q, ROWS: tl.constexpr, SEG_POW2: tl.constexpr, LOG2_SEG_POW2: tl.constexpr,
                    OP: tl.constexpr, BACKWARD: tl.constexpr):
    """Merge the ``[ROWS, SEG_POW2]`` segment partials of each row (padding already holds the
    identity) into the row constants (c0, c1), each [ROWS], that ``_outputs`` uses.

    Forward softmax: (M', 1 / Z). Forward log_softmax: (M', log Z). Forward logsumexp:
    (M', log Z), whose sum is the logsumexp (``_store_row_results``), with log Z = +inf for a
    row holding +inf and no NaN (M' = +inf there, so that the sum is +inf, as in torch).
    Backward softmax / log_softmax: (row sum, row sum).
    """
    if BACKWARD:
        c0 = tree_sum(p, ROWS, SEG_POW2, LOG2_SEG_POW2, 1, 0)
        c1 = c0
    else:
        m, z = tree_max_sum(p, q, ROWS, SEG_POW2, LOG2_SEG_POW2)
        # A +inf maximum makes every output NaN (as exp(inf - inf) does in torch), also for a row
        # of one segment, which meets no merge.
        z = tl.where(m == float("inf"), float("nan"), z)
        c0 = tl.where(m == float("-inf"), 0.0, m)
        if OP == LOGSUMEXP:
            has_nan = tl.max(tl.where(q != q, 1, 0), axis=1)
            c1 = tl.where((m == float("inf")) & (has_nan == 0), float("inf"), tl.log(z))
        else:
            if OP == SOFTMAX:
                ones = tl.full([ROWS], 1.0, tl.float32)
                c1 = tl.where(z == 0.0, 0.0, tl.div_rn(ones, z))
            else:
                c1 = tl.where(z == 0.0, 0.0, tl.log(z))
    return c0, c1


@triton.jit
def _exp_and_factors(a, p, c0, c1, OP: tl.constexpr, BACKWARD: tl.constexpr):
    """The (e, f) that ``_outputs`` takes for a ``[SEGS, OUTER, INNER]`` block with segment maxima
    p ([SEGS]) and row constants (c0, c1) ([1]): for the forward softmax, exp(x - m_s') and the
    segments' factors; for the other ops, which use neither, (a, c1)."""
    if OP == SOFTMAX and not BACKWARD:
        return _segment_exp(a, p), _softmax_factors(p, c0, c1)[:, None, None]
    else:
        return a, c1[:, None, None]


@triton.jit
def _store_partials(part_p_ptr, part_q_ptr, row64, num_segments, segments, p, q, BACKWARD: tl.constexpr):
    """Write the partials (p, q) of ``segments`` of a row (q only forward; backward has one)."""
    part_offsets = row64 * num_segments + segments
    tl.store(part_p_ptr + part_offsets, p, mask=segments < num_segments)
    if not BACKWARD:
        tl.store(part_q_ptr + part_offsets, q, mask=segments < num_segments)


@triton.jit
def _spread(n, smoothing, SMOOTHING: tl.constexpr):
    """What the cross-entropy backward subtracts from softmax(x) at every column: eps / n with
    label smoothing eps = ``smoothing``, else 0."""
    if SMOOTHING:
        return tl.div_rn(smoothing, tl.cast(n, tl.float32))  # (tl.cast: n = 1 arrives as a constexpr)
    else:
        return 0.0


@triton.jit
def _store_target_outputs(src_rows, dst_rows, target_col, c0, c1, log_z, n, smoothing, SMOOTHING: tl.constexpr,
                          first_col, end_col):
    """The cross-entropy gradient at each row's target column, written over the value the
    program's elementwise outputs gave it there (``_outputs``, which subtract ``_spread`` alone):
    dloss * (exp((x[t] - M') - log Z) - ((1 - eps) + eps / n)), or - 1 without label smoothing.

    ``src_rows``, ``dst_rows``: the rows' pointers (x and dx); ``target_col``: their target
    columns (-1 for an ignored row or a target out of range, whose outputs stand as written);
    only columns in [first_col, end_col), the program's share of the row, are written. One
    load, one exp and one store per row, where a compare of every column with the target cost
    48 registers and 9 instructions per element (sm_90 SASS of the streaming backward). The
    barrier first makes the program's own stores of those columns visible before this one.
    """
    tl.debug_barrier()
    own = (target_col >= first_col) & (target_col < end_col)
    x_t = tl.load(src_rows + target_col, mask=own, other=0.0).to(tl.float32)
    if SMOOTHING:
        hit = (1.0 - smoothing) + _spread(n, smoothing, SMOOTHING)
    else:
        hit = 1.0
    out = c1 * (_exp((x_t - c0) - log_z) - hit)
    tl.store(dst_rows + target_col, out.to(dst_rows.dtype.element_ty), mask=own)


@triton.jit
def _outputs(a, b, e, f, c0, c1, inv_temperature, log_z, target_term, OP: tl.constexpr, BACKWARD: tl.constexpr,
             HAS_TEMPERATURE: tl.constexpr, TARGETS: tl.constexpr):
    """The elementwise outputs from the loaded block (a, b) and the row constants (c0, c1); the
    forward softmax is y = e * f from the block's exp(x - m_s') (``_segment_exp``) and its
    segments' factors (``_softmax_factors``), so that each element meets one exp. ``TARGETS``
    (the logsumexp backward of cross-entropy, c0 = M'): dx = dloss * (softmax(x) - ``target_term``)
    with softmax(x) = exp((x - M') - ``log_z``), as torch's exp(log_softmax(x)), and
    ``target_term`` = ``_spread`` (the target's column is written again after, by
    ``_store_target_outputs``); ``log_z`` and ``target_term`` are unused otherwise."""
    if TARGETS:  # (the backward, or the forward that writes the gradient too: FUSED)
        out = c1 * (_exp((a - c0) - log_z) - target_term)
    elif BACKWARD:
        if OP == SOFTMAX:
            out = a * (b - c0)
        elif OP == LOG_SOFTMAX:
            out = b - _exp(a) * c0
        else:
            out = c1 * _exp(a - c0)
        if HAS_TEMPERATURE:
            out = out * inv_temperature
    else:
        if OP == SOFTMAX:
            out = e * f
        else:
            out = (a - c0) - c1
    return out


@triton.jit
def _segment_maxima(part_p_ptr, row64, num_segments, segments):
    """The forward softmax's segment maxima m_s' of ``segments`` from PARTIALS' buffer (-inf
    past the row's last segment)."""
    return tl.load(part_p_ptr + row64 * num_segments + segments, mask=segments < num_segments,
                   other=float("-inf"))


@triton.jit
def _store_block_outputs(dst_block_ptrs, mask, a, b, p, c0, c1, inv_temperature, log_z, target_term,
                         OP: tl.constexpr, BACKWARD: tl.constexpr, HAS_TEMPERATURE: tl.constexpr,
                         STORE_POLICY: tl.constexpr, TARGETS: tl.constexpr):
    """Write the outputs of a loaded ``[SEGS, OUTER, INNER]`` block (a, b) whose segment maxima
    are p ([SEGS]; read by the forward softmax alone) under the row constants (c0, c1) ([1])
    (``log_z`` ([1]) and ``target_term``: see ``_outputs``; any values without TARGETS)."""
    e, f = _exp_and_factors(a, p, c0, c1, OP, BACKWARD)
    out = _outputs(a, b, e, f, c0[:, None, None], c1[:, None, None], inv_temperature, log_z[:, None, None],
                   target_term, OP, BACKWARD, HAS_TEMPERATURE, TARGETS)
    tl.store(dst_block_ptrs, out.to(dst_block_ptrs.dtype.element_ty), mask=mask,
             eviction_policy=STORE_POLICY)


@triton.jit
def _constants_from_partials(part_p_ptr, part_q_ptr, row64, num_segments, SEG_POW2: tl.constexpr,
                             LOG2_SEG_POW2: tl.constexpr, OP: tl.constexpr, BACKWARD: tl.constexpr,
                             CACHE: tl.constexpr):
    """Row constants (c0, c1), each [1], from a row's segment partials in the buffers (written
    by other programs). ``CACHE``: the loads' cache modifier (".cg" reads them from L2, past an
    L1 that may not have seen another SM's writes)."""
    segments = tl.arange(0, SEG_POW2)
    part_offsets = row64 * num_segments + segments
    valid = segments < num_segments
    if BACKWARD:
        p = tl.load(part_p_ptr + part_offsets, mask=valid, other=0.0, cache_modifier=CACHE)
        q = p
    else:
        p = tl.load(part_p_ptr + part_offsets, mask=valid, other=float("-inf"), cache_modifier=CACHE)
        q = tl.load(part_q_ptr + part_offsets, mask=valid, other=0.0, cache_modifier=CACHE)
    return _merge_partials(tl.reshape(p, [1, SEG_POW2]), tl.reshape(q, [1, SEG_POW2]), 1, SEG_POW2,
                           LOG2_SEG_POW2, OP, BACKWARD)


@triton.jit
def _target_constants(max_shift, log_z, dloss, target_ptr, rows_idx, row_ok, n, ignore_index):
    """The cross-entropy gradient's row constants (M', dloss, target column, log Z) for
    ``_outputs`` and ``_store_target_outputs``, from each row's M' and log Z and its dloss: an
    ignored row's dloss is 0 and its target column -1; log Z is NaN, so that the whole row's
    gradient is NaN as its loss is, for a row holding +inf (M' = +inf), a row that is entirely
    -inf (log Z = -inf) and a target outside [0, n) that is not ``ignore_index``."""
    target = tl.load(target_ptr + rows_idx, mask=row_ok, other=ignore_index).to(tl.int64)
    counted = target != ignore_index
    inside = (target >= 0) & (target < n)
    log_z = tl.where((max_shift == float("inf")) | (log_z == float("-inf")) | (counted & ~inside), float("nan"),
                     log_z)
    target_col = tl.where(counted & inside, target, -1).to(tl.int32)
    return max_shift, tl.where(counted, dloss, 0.0), target_col, log_z


@triton.jit
def _given_constants(row_ptr, grad_ptr, target_ptr, rows_idx, row_ok, rows, n, stride_grad, ignore_index,
                     TARGETS: tl.constexpr):
    """Row constants of the logsumexp backward, read from memory: (c0, dlse, target column,
    log Z), the output being dlse * exp(x - c0) (``_outputs``); dlse is each row's value at
    ``grad_ptr`` ``stride_grad`` apart (0: one value for every row).

    logsumexp: c0 = lse', lse or 0 for a row that is entirely -inf (its gradient is 0), the
    target column -1, log Z unused. Cross-entropy (TARGETS): M' and log Z as the forward wrote
    them (``_store_row_results``), through ``_target_constants``.
    """
    c0 = tl.load(row_ptr + rows_idx, mask=row_ok, other=0.0).to(tl.float32)
    dlse = tl.load(grad_ptr + rows_idx * stride_grad, mask=row_ok, other=0.0).to(tl.float32)
    if TARGETS:
        log_z = tl.load(row_ptr + rows + rows_idx, mask=row_ok, other=0.0)
        c0, dlse, target_col, log_z = _target_constants(c0, log_z, dlse, target_ptr, rows_idx, row_ok, n,
                                                        ignore_index)
    else:
        c0 = tl.where(c0 == float("-inf"), 0.0, c0)
        log_z = c0
        target_col = tl.full(rows_idx.shape, -1, tl.int32)
    return c0, dlse, target_col, log_z


@triton.jit
def _store_row_results(dst_ptr, row_ptr, src_ptr, target_ptr, loss_ptr, row_sum_ptr, rows_idx, row_ok, rows,
                       max_shift, log_z, n, stride_src, ignore_index, smoothing, TARGETS: tl.constexpr,
                       SMOOTHING: tl.constexpr):
    """The forward logsumexp's results for rows ``rows_idx`` (where ``row_ok``) from the row
    constants (M', log Z) of ``_merge_partials``: lse = M' + log Z to ``dst`` [rows]; or, with
    TARGETS, M' and log Z themselves to ``row_ptr`` [2, rows] (float32, what the backward reads)
    and the cross-entropy loss to ``loss_ptr`` (float32), from the row's logit at its target
    (one more load per row) and, with SMOOTHING, its sum (``row_sum_ptr``):

        loss = log Z - (x[t] - M')                                     (eps = 0)
        loss = (1 - eps) * loss + eps * (log Z - (sum(x) / n - M'))      (label smoothing eps)

    (torch's -log_softmax(x)[t] = -((x[t] - max) - log Z), and the same for the mean of x:
    rounded where torch's are, not lse - x[t], whose lse holds half an ulp of the maximum).
    0 for a row whose target is ``ignore_index``; NaN for a target outside [0, n) (nothing is
    read there) and for a row holding +inf (as torch's log_softmax gives); a row that is
    entirely -inf (M' = 0, log Z = -inf) gives NaN from the formula itself.
    """
    if TARGETS:
        tl.store(row_ptr + rows_idx, max_shift, mask=row_ok)
        tl.store(row_ptr + rows + rows_idx, log_z, mask=row_ok)
        target = tl.load(target_ptr + rows_idx, mask=row_ok, other=ignore_index).to(tl.int64)
        counted = target != ignore_index
        inside = (target >= 0) & (target < n)
        logit = tl.load(src_ptr + rows_idx.to(tl.int64) * stride_src + target, mask=row_ok & counted & inside,
                        other=0.0).to(tl.float32)
        loss = log_z - (logit - max_shift)
        if SMOOTHING:
            row_sum = tl.load(row_sum_ptr + rows_idx, mask=row_ok, other=0.0)
            mean = tl.div_rn(row_sum, tl.cast(n, tl.float32))  # (tl.cast: n = 1 arrives as a constexpr)
            loss = (1.0 - smoothing) * loss + smoothing * (log_z - (mean - max_shift))
        loss = tl.where((max_shift == float("inf")) | ~inside, float("nan"), loss)
        tl.store(loss_ptr + rows_idx, tl.where(counted, loss, 0.0), mask=row_ok)
    else:
        tl.store(dst_ptr + rows_idx, (max_shift + log_z).to(dst_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def softmax_kernel(
    src_ptr, grad_ptr, dst_ptr, row_ptr, part_p_ptr, part_q_ptr, arrivals_ptr,
    rows, n, num_segments, programs_per_row,
    stride_src, stride_grad, stride_dst, inv_temperature,
    target_ptr, loss_ptr, row_sum_ptr, ignore_index, smoothing,
    OP: tl.constexpr, BACKWARD: tl.constexpr, PHASE: tl.constexpr, IN_REGISTERS: tl.constexpr,
    HAS_TEMPERATURE: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
    LANES: tl.constexpr, INNER: tl.constexpr, OUTER: tl.constexpr, LOG2_OUTER: tl.constexpr,
    GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr, LOG2_INNER_GROUPS: tl.constexpr,
    SEG_POW2: tl.constexpr, LOG2_SEG_POW2: tl.constexpr,
    SEG_BLOCK: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr, ONLINE_BLOCKS: tl.constexpr,
    FIRST_READ_POLICY: tl.constexpr, SECOND_READ_POLICY: tl.constexpr,
    WAIT_FOR_PRIOR: tl.constexpr = False, RELEASE_DEPENDENTS: tl.constexpr = False,
    STAGES: tl.constexpr = 1, HOLD_16BIT: tl.constexpr = False, STORE_POLICY: tl.constexpr = "",
    TARGETS: tl.constexpr = False, SMOOTHING: tl.constexpr = False, FUSED: tl.constexpr = False,
    RESUME: tl.constexpr = False,
):
    """The softmax family: one kernel, specialised by the constexpr flags.

    Args:
        src_ptr: forward: x [rows, n]; backward softmax / log_softmax: y; backward logsumexp: x.
            Last dimension contiguous, rows ``stride_src`` elements apart.
        grad_ptr: backward softmax / log_softmax: dy [rows, n] (rows ``stride_grad`` apart);
            backward logsumexp: dlse [rows] (``stride_grad`` apart: 0 for one value for every
            row; RESUME: [2], the dloss asked for and the one the forward wrote dx for); forward
            FUSED: the dloss to write dx for (one value, ``stride_grad`` 0); forward: unused.
        dst_ptr: forward softmax / log_softmax: y [rows, n]; forward logsumexp: lse [rows]
            (TARGETS: unused, FUSED: dx [rows, n]); backward: dx [rows, n]. Rows ``stride_dst``
            elements apart; written in its dtype.
        row_ptr: backward logsumexp: the forward result lse [rows]; TARGETS: float32 [2, rows],
            each row's M' and log Z, written by the forward (``_store_row_results``) and read by
            the backward; otherwise unused.
        part_p_ptr, part_q_ptr: float32 [rows, num_segments] segment partials, written by the
            PARTIALS phase and read by the FINISH phase, or both by COOPERATIVE (forward: m_s and
            s_s; backward: the segment sums, q unused); unused by WHOLE_ROWS.
        arrivals_ptr: COOPERATIVE: int32 [rows], zero on entry: how many programs of each row
            have written their partials; otherwise unused (any pointer).
        rows: number of rows.
        n: elements per row (N <= MAX_LANES^2).
        num_segments: S(N).
        programs_per_row: PARTIALS / FINISH / COOPERATIVE: programs sharing one row (grid =
            rows * this).
        stride_src, stride_grad, stride_dst: elements between consecutive rows.
        inv_temperature: float32 1 / temperature (forward x is multiplied by it first; backward
            dx is multiplied by it last); used only when HAS_TEMPERATURE.
        target_ptr: TARGETS: int64 or int32 [rows], each row's target class; otherwise unused.
        loss_ptr: forward TARGETS: float32 [rows], the cross-entropy losses; otherwise unused.
        row_sum_ptr: forward SMOOTHING: float32 [rows], each row's sum of x (in the order's
            trees, from the row-sum kernel); otherwise unused.
        ignore_index: TARGETS: the target value whose rows count for nothing (loss 0, dx 0).
        smoothing: SMOOTHING: the label smoothing eps, float32 in (0, 1].
        OP: SOFTMAX, LOG_SOFTMAX or LOGSUMEXP.
        BACKWARD: compute dx instead of the forward output.
        PHASE: WHOLE_ROWS, PARTIALS, FINISH or COOPERATIVE (see the module constants).
        IN_REGISTERS: WHOLE_ROWS only: hold ROWS_PER_PROGRAM whole rows (all SEG_POW2 segments
            of each) in one block (one read); otherwise stream one row in blocks of SEG_BLOCK
            segments (two reads).
        HAS_TEMPERATURE: inv_temperature != 1 (multiplying by 1 is exact, so this only saves work).
        ROWS_PER_PROGRAM: rows per program when IN_REGISTERS (power of two), else 1.
        LANES: C(N), lanes per segment, = OUTER * INNER.
        INNER: lanes along the fast (contiguous) axis of a block (a multiple of GROUP).
        OUTER, LOG2_OUTER: LANES / INNER, and log2: a segment is held as [OUTER, INNER].
        GROUP, LOG2_GROUP: G(N, dtype read), lanes per group of the order, and log2.
        LOG2_INNER_GROUPS: log2(INNER / GROUP).
        SEG_POW2, LOG2_SEG_POW2: next_pow2(S(N)) and its log2: the width of the merge tree.
        SEG_BLOCK: segments per streamed block (power of two, <= SEG_POW2).
        SEGMENTS_PER_PROGRAM: PARTIALS / FINISH / COOPERATIVE: segments per program (a multiple
            of SEG_BLOCK; COOPERATIVE holds them in one block: equal to SEG_BLOCK).
        ONLINE_BLOCKS: streaming WHOLE_ROWS: cdiv(S, SEG_BLOCK), the blocks of a row (a
            constexpr so that the loops have static trip counts).
        FIRST_READ_POLICY, SECOND_READ_POLICY: eviction policies ("", "evict_last",
            "evict_first") of the reads of a row that is read twice.
        WAIT_FOR_PRIOR: FINISH launched as a programmatic dependent launch (sm_90): wait for
            the PARTIALS launch's writes before reading the partials (``start_dependent_launch``);
            with one block per program, after issuing that block's loads.
        RELEASE_DEPENDENTS: PARTIALS lets the dependent FINISH launch start its programs early
            (``start_dependent_launch``); they still wait for this launch's writes.
        STAGES: software-pipelining depth of the streaming loops (online, PARTIALS, FINISH): with
            2 or more, the compiler issues the loads of the next STAGES - 1 blocks into shared
            memory (asynchronous copies) while the current block is reduced, so a program keeps
            bytes in flight without holding them in registers. 1: each block's loads are issued
            when the loop reaches it. Never changes bits.
        HOLD_16BIT: the phases that hold a block through the row's merge (WHOLE_ROWS in
            registers, COOPERATIVE) hold 16-bit inputs as loaded, and widen them again, and
            take the forward softmax's exps again, for the outputs: half the registers for the
            block, one more exp per element. Never changes bits.
        STORE_POLICY: eviction policy of the stores of the elementwise outputs ("" or
            "evict_first"). Never changes bits.
        TARGETS: OP = LOGSUMEXP as cross-entropy's kernel: the forward writes each row's M' and
            log Z (float32) and its loss (``_store_row_results``); the backward takes dx = dloss * (softmax(x)
            - one_hot(target)), from the saved M' and log Z (``_given_constants``,
            ``_store_target_outputs``).
        SMOOTHING: TARGETS with label smoothing (``smoothing`` > 0).
        FUSED: TARGETS forward that also writes dx for the dloss at ``grad_ptr`` (one value),
            planned as the softmax forward (every program of a row writes its share of the
            elementwise outputs; the row's first program writes its loss): the gradient
            costs one write in the forward instead of a read and a write after it.
        RESUME: TARGETS backward into the dx a FUSED forward wrote: nothing to do (every program
            returns at once) when the dloss asked for, ``grad_ptr[0]``, is the one it was written
            for, ``grad_ptr[1]``; otherwise the plain backward, writing over it.

    A block is a ``[segments, OUTER, INNER]`` tensor: element (s, k, j) is lane k * INNER + j of
    segment s, i.e. column s * LANES + k * INNER + j of the row.
    """
    # FINISH with one block per program (the decode launches) loads its block before it waits
    # for PARTIALS: see that branch below.
    EARLY_FINISH: tl.constexpr = (PHASE == FINISH and SEGMENTS_PER_PROGRAM == SEG_BLOCK) and OP != LOGSUMEXP
    start_dependent_launch(WAIT_FOR_PRIOR and not EARLY_FINISH, RELEASE_DEPENDENTS)
    pid = tl.program_id(0)
    if RESUME:
        if tl.load(grad_ptr) == tl.load(grad_ptr + 1):
            return
    lane_cols = (tl.arange(0, OUTER)[:, None] * INNER + tl.arange(0, INNER)[None, :])[None, :, :]
    LSE_FORWARD: tl.constexpr = (OP == LOGSUMEXP) and (not BACKWARD)
    LSE_BACKWARD: tl.constexpr = (OP == LOGSUMEXP) and BACKWARD
    # whether the program writes elementwise outputs (all but the forward logsumexp, unless FUSED)
    ELEMENTWISE: tl.constexpr = (not LSE_FORWARD) or FUSED
    if PHASE == WHOLE_ROWS and IN_REGISTERS:
        # The block is [ROWS_PER_PROGRAM, SEG_POW2, OUTER, INNER]: the row constants then broadcast
        # onto it with expand_dims alone. (Reshaping them to one value per held segment first made
        # the compiler compute the outputs in the constants' layout and move the whole tile through
        # shared memory: 2000+ shared stores per program at N = 4096.)
        HELD: tl.constexpr = ROWS_PER_PROGRAM * SEG_POW2
        rows_idx = pid * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
        cols = (tl.arange(0, SEG_POW2) * LANES)[None, :, None, None] + lane_cols[None, :, :, :]
        mask = (rows_idx < rows)[:, None, None, None] & (cols < n)
        rows64 = rows_idx.to(tl.int64)[:, None, None, None]
        raw_a, raw_b = _load_raw_tiles(src_ptr + rows64 * stride_src + cols, grad_ptr + rows64 * stride_grad + cols,
                                       mask, False, OP, BACKWARD, "")
        a, b, a_for_exp = _held_tiles(raw_a, raw_b, inv_temperature, rows, False, OP, BACKWARD, HAS_TEMPERATURE,
                                      HOLD_16BIT)
        target_col = tl.full([ROWS_PER_PROGRAM], -1, tl.int32)
        log_z = tl.zeros([ROWS_PER_PROGRAM], tl.float32)
        if LSE_BACKWARD:
            c0, c1, target_col, log_z = _given_constants(row_ptr, grad_ptr, target_ptr, rows_idx, rows_idx < rows,
                                                         rows, n, stride_grad, ignore_index, TARGETS)
        else:
            p, q = _segment_partials(tl.reshape(a, [HELD, OUTER, INNER]), tl.reshape(b, [HELD, OUTER, INNER]),
                                     tl.reshape(a_for_exp, [HELD, OUTER, INNER]),
                                     OUTER, LOG2_OUTER, HELD, INNER, GROUP, LOG2_GROUP,
                                     LOG2_INNER_GROUPS, OP, BACKWARD)
            c0, c1 = _merge_partials(tl.reshape(p, [ROWS_PER_PROGRAM, SEG_POW2]),
                                     tl.reshape(q, [ROWS_PER_PROGRAM, SEG_POW2]),
                                     ROWS_PER_PROGRAM, SEG_POW2, LOG2_SEG_POW2, OP, BACKWARD)
        if LSE_FORWARD:
            _store_row_results(dst_ptr, row_ptr, src_ptr, target_ptr, loss_ptr, row_sum_ptr, rows_idx, rows_idx < rows,
                               rows, c0, c1, n, stride_src, ignore_index, smoothing, TARGETS, SMOOTHING)
            if FUSED:
                dloss = tl.load(grad_ptr + rows_idx * stride_grad, mask=rows_idx < rows, other=0.0)
                c0, c1, target_col, log_z = _target_constants(c0, c1, dloss, target_ptr, rows_idx, rows_idx < rows,
                                                              n, ignore_index)
        if ELEMENTWISE:
            if HOLD_16BIT:
                a, b = _widen_tiles(raw_a, raw_b, inv_temperature, n, True, False, OP, BACKWARD, HAS_TEMPERATURE)
            e, f = a, c1[:, None, None, None]
            if OP == SOFTMAX and not BACKWARD:
                # the partials' exp tile (the same operations on the same values: computed once;
                # twice with HOLD_16BIT, whose widened block is a new value)
                e = tl.reshape(_segment_exp(tl.reshape(a, [HELD, OUTER, INNER]), p),
                               [ROWS_PER_PROGRAM, SEG_POW2, OUTER, INNER])
                f = _softmax_factors(tl.reshape(p, [ROWS_PER_PROGRAM, SEG_POW2]), c0[:, None],
                                     c1[:, None])[:, :, None, None]
            out = _outputs(a, b, e, f, c0[:, None, None, None], c1[:, None, None, None], inv_temperature,
                           log_z[:, None, None, None], _spread(n, smoothing, SMOOTHING), OP, BACKWARD,
                           HAS_TEMPERATURE, TARGETS)
            tl.store(dst_ptr + rows64 * stride_dst + cols, out.to(dst_ptr.dtype.element_ty),
                     mask=mask, eviction_policy=STORE_POLICY)
            if TARGETS:
                row_offsets = rows_idx.to(tl.int64)
                _store_target_outputs(src_ptr + row_offsets * stride_src, dst_ptr + row_offsets * stride_dst,
                                      target_col, c0, c1, log_z, n, smoothing, SMOOTHING, 0, n)
    else:
        # One row per program in the streaming phases; blocks of SEG_BLOCK segments.
        if PHASE == WHOLE_ROWS:
            row = pid
            first_segment = 0
            block_count: tl.constexpr = ONLINE_BLOCKS
        else:
            row = pid // programs_per_row
            first_segment = (pid % programs_per_row) * SEGMENTS_PER_PROGRAM
            block_count: tl.constexpr = SEGMENTS_PER_PROGRAM // SEG_BLOCK
        row64 = row.to(tl.int64)
        one_row = row + tl.arange(0, 1)
        block_segments = tl.arange(0, SEG_BLOCK)
        block_cols = (block_segments * LANES)[:, None, None] + lane_cols
        src_row = src_ptr + row64 * stride_src
        grad_row = grad_ptr + row64 * stride_grad
        if PHASE == COOPERATIVE:
            segments = first_segment + block_segments
            cols = first_segment * LANES + block_cols
            mask = cols < n
            raw_a, raw_b = _load_raw_tiles(src_row + cols, grad_row + cols, mask, LSE_FORWARD, OP, BACKWARD, "")
            a, b, a_for_exp = _held_tiles(raw_a, raw_b, inv_temperature, rows, LSE_FORWARD, OP, BACKWARD,
                                          HAS_TEMPERATURE, HOLD_16BIT)
            p, q = _segment_partials(a, b, a_for_exp, OUTER, LOG2_OUTER, SEG_BLOCK, INNER, GROUP, LOG2_GROUP,
                                     LOG2_INNER_GROUPS, OP, BACKWARD)
            _store_partials(part_p_ptr, part_q_ptr, row64, num_segments, segments, p, q, BACKWARD)
            arrived = arrive(arrivals_ptr, row)
            if not ELEMENTWISE:
                # One value per row: the last program to arrive merges and writes it; no one waits.
                if arrived == programs_per_row:
                    c0, c1 = _constants_from_partials(part_p_ptr, part_q_ptr, row64, num_segments, SEG_POW2,
                                                      LOG2_SEG_POW2, OP, BACKWARD, ".cg")
                    _store_row_results(dst_ptr, row_ptr, src_ptr, target_ptr, loss_ptr, row_sum_ptr, one_row,
                                       one_row < rows, rows, c0, c1, n, stride_src, ignore_index, smoothing, TARGETS,
                                       SMOOTHING)
            else:
                wait_for_arrivals(arrivals_ptr, row, arrived, programs_per_row)
                c0, c1 = _constants_from_partials(part_p_ptr, part_q_ptr, row64, num_segments, SEG_POW2,
                                                  LOG2_SEG_POW2, OP, BACKWARD, ".cg")
                log_z = c0
                target_col = tl.full([1], -1, tl.int32)
                if FUSED:
                    if first_segment == 0:  # (the row's first program writes its results)
                        _store_row_results(dst_ptr, row_ptr, src_ptr, target_ptr, loss_ptr, row_sum_ptr, one_row,
                                           one_row < rows, rows, c0, c1, n, stride_src, ignore_index, smoothing,
                                           TARGETS, SMOOTHING)
                    dloss = tl.load(grad_ptr + one_row * stride_grad)
                    c0, c1, target_col, log_z = _target_constants(c0, c1, dloss, target_ptr, one_row, one_row < rows,
                                                                  n, ignore_index)
                # (the forward softmax's exp tile is the partials' own, computed once, unless
                # HOLD_16BIT widens the held block again)
                if HOLD_16BIT:
                    a, b = _widen_tiles(raw_a, raw_b, inv_temperature, n, True, False, OP, BACKWARD,
                                        HAS_TEMPERATURE)
                dst_row = dst_ptr + row64 * stride_dst
                _store_block_outputs(dst_row + cols, mask, a, b, p, c0, c1, inv_temperature, log_z,
                                     _spread(n, smoothing, SMOOTHING), OP, BACKWARD, HAS_TEMPERATURE, STORE_POLICY,
                                     FUSED)
                if FUSED:
                    _store_target_outputs(src_row, dst_row, target_col, c0, c1, log_z, n, smoothing, SMOOTHING,
                                          first_segment * LANES, (first_segment + SEG_BLOCK) * LANES)
        elif PHASE == PARTIALS:
            for block in tl.range(block_count, num_stages=STAGES):
                segments = first_segment + block * SEG_BLOCK + block_segments
                cols = (first_segment + block * SEG_BLOCK) * LANES + block_cols
                a, b = _load_tiles(src_row + cols, grad_row + cols, cols < n, inv_temperature, True,
                                   OP, BACKWARD, HAS_TEMPERATURE, FIRST_READ_POLICY)
                p, q = _segment_partials(a, b, a, OUTER, LOG2_OUTER, SEG_BLOCK, INNER, GROUP, LOG2_GROUP,
                                         LOG2_INNER_GROUPS, OP, BACKWARD)
                _store_partials(part_p_ptr, part_q_ptr, row64, num_segments, segments, p, q, BACKWARD)
        elif EARLY_FINISH:
            # The block's loads depend on nothing PARTIALS writes, so they go out first: their
            # latency overlaps the wait for PARTIALS (a dependent launch) and the load and merge
            # of the row's partials, which a program otherwise finishes before it starts them.
            cols = first_segment * LANES + block_cols
            mask = cols < n
            a, b = _load_tiles(src_row + cols, grad_row + cols, mask, inv_temperature, False, OP, BACKWARD,
                               HAS_TEMPERATURE, SECOND_READ_POLICY)
            start_dependent_launch(WAIT_FOR_PRIOR, False)
            p = tl.zeros([SEG_BLOCK], tl.float32)  # segment maxima: read by the softmax forward alone
            if OP == SOFTMAX and not BACKWARD:
                # (loaded with the partials, not after their merge)
                p = _segment_maxima(part_p_ptr, row64, num_segments, first_segment + block_segments)
            c0, c1 = _constants_from_partials(part_p_ptr, part_q_ptr, row64, num_segments, SEG_POW2,
                                              LOG2_SEG_POW2, OP, BACKWARD, "")
            _store_block_outputs(dst_ptr + row64 * stride_dst + cols, mask, a, b, p, c0, c1, inv_temperature,
                                 c0, 0.0, OP, BACKWARD, HAS_TEMPERATURE, STORE_POLICY, False)
        else:
            target_col = tl.full([1], -1, tl.int32)
            log_z = tl.zeros([1], tl.float32)
            if LSE_BACKWARD:
                c0, c1, target_col, log_z = _given_constants(row_ptr, grad_ptr, target_ptr, one_row, one_row < rows,
                                                             rows, n, stride_grad, ignore_index, TARGETS)
            elif PHASE == FINISH:
                c0, c1 = _constants_from_partials(part_p_ptr, part_q_ptr, row64, num_segments, SEG_POW2,
                                                  LOG2_SEG_POW2, OP, BACKWARD, "")
            else:
                # Online: the partials of every block are placed in a [blocks, SEG_BLOCK] array
                # that starts as the padding identity, then merged once, as the tree demands.
                BLOCKS: tl.constexpr = SEG_POW2 // SEG_BLOCK
                block_ids = tl.arange(0, BLOCKS)[:, None]
                if BACKWARD:
                    p_all = tl.zeros([BLOCKS, SEG_BLOCK], tl.float32)
                else:
                    p_all = tl.full([BLOCKS, SEG_BLOCK], float("-inf"), tl.float32)
                q_all = tl.zeros([BLOCKS, SEG_BLOCK], tl.float32)
                for block in tl.range(block_count, num_stages=STAGES):
                    cols = block * (SEG_BLOCK * LANES) + block_cols
                    a, b = _load_tiles(src_row + cols, grad_row + cols, cols < n, inv_temperature, True,
                                       OP, BACKWARD, HAS_TEMPERATURE, FIRST_READ_POLICY)
                    p, q = _segment_partials(a, b, a, OUTER, LOG2_OUTER, SEG_BLOCK, INNER, GROUP, LOG2_GROUP,
                                             LOG2_INNER_GROUPS, OP, BACKWARD)
                    p_all = tl.where(block_ids == block, p[None, :], p_all)
                    q_all = tl.where(block_ids == block, q[None, :], q_all)
                c0, c1 = _merge_partials(tl.reshape(p_all, [1, SEG_POW2]), tl.reshape(q_all, [1, SEG_POW2]),
                                         1, SEG_POW2, LOG2_SEG_POW2, OP, BACKWARD)
            if LSE_FORWARD:
                if first_segment == 0:  # (FINISH: the row's first program writes its results)
                    _store_row_results(dst_ptr, row_ptr, src_ptr, target_ptr, loss_ptr, row_sum_ptr, one_row,
                                       one_row < rows, rows, c0, c1, n, stride_src, ignore_index, smoothing, TARGETS,
                                       SMOOTHING)
                if FUSED:
                    dloss = tl.load(grad_ptr + one_row * stride_grad)
                    c0, c1, target_col, log_z = _target_constants(c0, c1, dloss, target_ptr, one_row, one_row < rows,
                                                                  n, ignore_index)
            if ELEMENTWISE:
                dst_row = dst_ptr + row64 * stride_dst
                for block in tl.range(block_count, num_stages=STAGES):
                    cols = (first_segment + block * SEG_BLOCK) * LANES + block_cols
                    mask = cols < n
                    a, b = _load_tiles(src_row + cols, grad_row + cols, mask, inv_temperature, False,
                                       OP, BACKWARD, HAS_TEMPERATURE, SECOND_READ_POLICY)
                    p = c0  # segment maxima: read by the softmax forward alone, set below
                    if OP == SOFTMAX and not BACKWARD:
                        # the segment maxima of this block, from the buffers or the online array
                        if PHASE == FINISH:
                            p = _segment_maxima(part_p_ptr, row64, num_segments,
                                                first_segment + block * SEG_BLOCK + block_segments)
                        else:
                            p = tl.max(tl.where(block_ids == block, p_all, float("-inf")), axis=0)
                    _store_block_outputs(dst_row + cols, mask, a, b, p, c0, c1, inv_temperature, log_z,
                                         _spread(n, smoothing, SMOOTHING), OP, BACKWARD, HAS_TEMPERATURE,
                                         STORE_POLICY, TARGETS)
                if TARGETS:
                    _store_target_outputs(src_row, dst_row, target_col, c0, c1, log_z, n, smoothing, SMOOTHING,
                                          first_segment * LANES,
                                          (first_segment + block_count * SEG_BLOCK) * LANES)
