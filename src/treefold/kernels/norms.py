"""RMSNorm and LayerNorm, forward and backward, in the treefold order.

A row of N elements is held on chip as a ``[SEGMENTS, LANES]`` block: LANES = C(N) lanes and
SEGMENTS = S(N) segments padded to a power of two (``treefold.order``). A row statistic is the
grouped halving tree over each segment (groups of GROUP = G(N, dtype) lanes, G set by the dtype of
the row being normalised), then a plain halving tree over the segment results: exactly
``treefold.order.reference_sum(values, dtype=that dtype)``.
Every product and quotient is rounded on its own (launch with ``enable_fp_fusion=False``; RMSNorm of
a float16 row is the exception that changes nothing: its squares are exact in float32, so the
launcher lets them fuse into FMAs, see ``treefold._ops.norms._fuses_squares``), and the divisions
and the square root are IEEE-rounded (``div_rn``, ``sqrt_rn``), so float32 results are the bits
of the NumPy reference in ``treefold.reference.norms``. A row may also be shared by
several programs of the forward kernel (a launch choice): each holds some of its segments, and
the segment results meet in the same tree after an exchange through memory (an atomic counter
orders the exchange; no value is summed by atomics).

The weight and bias gradients are column sums over all rows. The backward kernel gives each
program a fixed block of rows (``treefold.reference.norms.weight_grad_rows_per_block``: a function
of the shape only), folds the block's rows into float32 partials one row after another, and
``column_tree_sum_kernel`` reduces the partials over the row axis by the halving tree the order
uses for segment results. No atomics: the same bits on every run.
"""
import triton
import triton.language as tl

from .combine import (arrive, run_tree_sum, start_dependent_launch, tree_sum, wait_for_arrivals,
                      widen_again)


@triton.jit
def row_tree_sum(v, ROWS: tl.constexpr, SEGMENTS: tl.constexpr, LOG2_SEGMENTS: tl.constexpr,
                 LANES: tl.constexpr, LOG2_LANES: tl.constexpr, GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr,
                 RUNS: tl.constexpr = 1, LOG2_RUNS: tl.constexpr = 0, EXCHANGES: tl.constexpr = None):
    """Sum of each row of a ``[ROWS, SEGMENTS, RUNS, LANES // RUNS]`` float32 block in the treefold
    order (each segment's lanes cut into RUNS runs, ``combine.run_tree_sum``).

    Each segment by the grouped tree (GROUP lanes per group), then the segment results by a plain
    halving tree. Padding (lanes past N, segments past S) must hold zeros, as the order pads with
    the identity. Returns ``[ROWS]``. EXCHANGES: None, or the (first, count) levels of the tree
    over the runs, over a run's groups and over the segments that are met in one exchange between
    warps (``combine.halving_tree``; ``_ops.launch.tree_exchanges``).
    """
    if EXCHANGES is None:
        RUN_EXCHANGE: tl.constexpr = None
        SPAN_EXCHANGE: tl.constexpr = None
        SEGMENT_EXCHANGE: tl.constexpr = None
    else:
        RUN_EXCHANGE: tl.constexpr = EXCHANGES[0]
        SPAN_EXCHANGE: tl.constexpr = EXCHANGES[1]
        SEGMENT_EXCHANGE: tl.constexpr = EXCHANGES[2]
    if RUNS == 1:  # (run_tree_sum's order too; this form keeps the kernel one run compiled to before)
        seg = tree_sum(tl.reshape(v, [ROWS * SEGMENTS, LANES]), ROWS * SEGMENTS, LANES, LOG2_LANES,
                       GROUP, LOG2_GROUP, SPAN_EXCHANGE)
    else:
        seg = run_tree_sum(tl.reshape(v, [ROWS * SEGMENTS, RUNS, LANES // RUNS]), ROWS * SEGMENTS, RUNS, LOG2_RUNS,
                           LANES // RUNS, GROUP, LOG2_GROUP, LOG2_LANES - LOG2_RUNS - LOG2_GROUP, RUN_EXCHANGE,
                           SPAN_EXCHANGE)
    return tree_sum(tl.reshape(seg, [ROWS, SEGMENTS]), ROWS, SEGMENTS, LOG2_SEGMENTS, 1, 0, SEGMENT_EXCHANGE)


@triton.jit
def _over_n(total, n_float, N_POW2: tl.constexpr):
    """total / N, correctly rounded. With ``N_POW2`` (N a power of two) ``n_float`` holds 1/N,
    exact, and the product is the same correctly rounded quotient: scaling by a power of two
    rounds only where the quotient is subnormal, and there to the same neighbour as the division.
    It spares each row the division's reciprocal refinement and its slow-path check. (Only where
    products are not fused into FMAs: the launcher sets N_POW2 so.)"""
    if N_POW2:
        return total * n_float
    else:
        return tl.div_rn(total, n_float)


@triton.jit
def _affine_terms(w_ptr, b_ptr, col, n, offset, HAS_WEIGHT: tl.constexpr, HAS_OFFSET: tl.constexpr,
                  HAS_BIAS: tl.constexpr):
    """(w, b): the weight (plus ``offset`` with HAS_OFFSET) and the bias at columns ``col``, float32
    (zeros where absent; unused then)."""
    w = tl.zeros(col.shape, tl.float32)
    b = tl.zeros(col.shape, tl.float32)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + col, mask=col < n, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_OFFSET:
            w = w + offset
    if HAS_BIAS:
        b = tl.load(b_ptr + col, mask=col < n, other=0.0, eviction_policy="evict_last").to(tl.float32)
    return w, b


@triton.jit
def _row_total(v, part_ptr, arrivals_ptr, row_id, first_segment, num_segments, target, ROWS: tl.constexpr,
               HELD: tl.constexpr, SEGMENTS: tl.constexpr, LOG2_SEGMENTS: tl.constexpr, LANES: tl.constexpr,
               LOG2_LANES: tl.constexpr, GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr,
               SHARED_ROW: tl.constexpr, RUNS: tl.constexpr, LOG2_RUNS: tl.constexpr, EXCHANGES: tl.constexpr):
    """Row sums of a ``[ROWS, HELD, RUNS, LANES // RUNS]`` float32 block in the treefold order
    (``run_tree_sum``'s runs); returns ``[ROWS]``.

    Whole rows (HELD = SEGMENTS): ``row_tree_sum``. ``SHARED_ROW``: the block holds HELD segments
    of row ``row_id`` from ``first_segment`` on; their sums go to ``part_ptr`` [rows, num_segments],
    the program counts itself in on the row's counter and waits for it to reach ``target``,
    then reads the whole row's segment sums back and meets them in the same halving tree.
    """
    if SHARED_ROW:
        seg = tree_sum(tl.reshape(v, [HELD, LANES]), HELD, LANES, LOG2_LANES, GROUP, LOG2_GROUP)
        segments = first_segment + tl.arange(0, HELD)
        tl.store(part_ptr + row_id * num_segments + segments, seg, mask=segments < num_segments)
        arrived = arrive(arrivals_ptr, row_id)
        wait_for_arrivals(arrivals_ptr, row_id, arrived, target)
        every = tl.arange(0, SEGMENTS)
        seg = tl.load(part_ptr + row_id * num_segments + every, mask=every < num_segments, other=0.0,
                      cache_modifier=".cg")
        return tree_sum(tl.reshape(seg, [1, SEGMENTS]), 1, SEGMENTS, LOG2_SEGMENTS, 1, 0)
    else:
        return row_tree_sum(v, ROWS, SEGMENTS, LOG2_SEGMENTS, LANES, LOG2_LANES, GROUP, LOG2_GROUP, RUNS, LOG2_RUNS,
                            EXCHANGES)


@triton.jit
def _read_again(x_ptr, h_ptr, row4, col4, stride_x, stride_h, mask, POLICY: tl.constexpr,
                HAS_RESIDUAL: tl.constexpr):
    """The row normalised, read again in float32 (READ_TWICE): x, or with a residual h as this
    thread stored it (the same addresses in the same layout: program order makes its own store
    visible to it, no barrier needed; the bits are h's)."""
    if HAS_RESIDUAL:
        return tl.load(h_ptr + row4 * stride_h + col4, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
    return tl.load(x_ptr + row4 * stride_x + col4, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)


@triton.jit
def norm_forward_kernel(
    x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, h_ptr, mean_ptr, rstd_ptr, part_ptr, arrivals_ptr,
    rows, n, n_float, eps, offset, num_segments, programs_per_row,
    stride_x, stride_res, stride_y, stride_h,
    IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_OFFSET: tl.constexpr, ROUND_NORMALISED: tl.constexpr,
    STORE_STATS: tl.constexpr,
    ROWS: tl.constexpr, SEGMENTS: tl.constexpr, LOG2_SEGMENTS: tl.constexpr,
    LANES: tl.constexpr, LOG2_LANES: tl.constexpr, GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr,
    SHARED_ROW: tl.constexpr = False, HELD: tl.constexpr = 1, READ_POLICY: tl.constexpr = "",
    READ_TWICE: tl.constexpr = False, HOLD_16BIT: tl.constexpr = False, STORE_POLICY: tl.constexpr = "",
    RUNS: tl.constexpr = 1, LOG2_RUNS: tl.constexpr = 0, H_STORE_POLICY: tl.constexpr = "",
    EXCHANGES: tl.constexpr = None, N_POW2: tl.constexpr = False, WAIT_FOR_PRIOR: tl.constexpr = False,
):
    """RMSNorm (``IS_RMS``) or LayerNorm of ROWS rows per program, the whole row on chip, or of one
    share of a row (``SHARED_ROW``): HELD of its segments, the rest held by the other programs of
    the row, with which it exchanges segment sums (once for RMSNorm, twice for LayerNorm).

    RMSNorm:   rstd = 1 / sqrt(tree(v * v) / N + eps), y = (v * rstd) * (w [+ offset]).
    LayerNorm: mean = tree(v) / N, d = v - mean, rstd = 1 / sqrt(tree(d * d) / N + eps),
               y = (d * rstd) * w + b.
    With a residual, v is h = x + residual rounded to the residual's dtype, and h is stored.
    With ``ROUND_NORMALISED`` (the "llama" casting), v * rstd is rounded to the dtype of the
    normalised input (h, or x) before the weight multiplies it.

    Bytes: reads M x N of x (and of the residual), N of weight and bias; writes M x N of y (and of
    h), and 4 bytes (8 for LayerNorm) per row of statistics when ``STORE_STATS``. A shared row
    adds 4 bytes per segment written and read by each of its programs (twice for LayerNorm).

    Args:
        x_ptr: input rows [rows, n], last dimension contiguous.
        res_ptr: residual rows [rows, n] (used with HAS_RESIDUAL).
        w_ptr: weight [n] (used with HAS_WEIGHT).
        b_ptr: bias [n] (used with HAS_BIAS).
        y_ptr: output rows [rows, n]; its dtype is the output dtype.
        h_ptr: x + residual rows [rows, n] in the residual's dtype (written with HAS_RESIDUAL).
        mean_ptr: float32 [rows] row means (written by LayerNorm with STORE_STATS).
        rstd_ptr: float32 [rows] reciprocal standard deviations (written with STORE_STATS).
        part_ptr: SHARED_ROW: float32 [2, rows, num_segments] segment sums (the second half for
            LayerNorm's centred squares); otherwise unused (any pointer).
        arrivals_ptr: SHARED_ROW: int32 [rows], zero on entry: arrivals per row (twice per program
            for LayerNorm); otherwise unused.
        rows: number of rows M.
        n: row length N.
        n_float: N as a float (exact below 2^24), the divisor of the means; 1/N with N_POW2.
        eps: added to the mean square (variance) before the square root.
        offset: added to the weight (Gemma's 1 + w), used with HAS_OFFSET.
        num_segments: S(N).
        programs_per_row: SHARED_ROW: programs sharing a row (grid = rows * this); else unused.
        stride_x, stride_res, stride_y, stride_h: elements between consecutive rows.
        IS_RMS: RMSNorm when true, LayerNorm when false.
        HAS_RESIDUAL: add the residual first and store h.
        HAS_WEIGHT, HAS_BIAS, HAS_OFFSET: which affine terms apply.
        ROUND_NORMALISED: round v * rstd to the input dtype before the weight ("llama").
        STORE_STATS: write mean/rstd (needed for the backward pass).
        ROWS: rows per program (a launch choice; the bits do not depend on it).
        SEGMENTS: S(N) padded to a power of two; LOG2_SEGMENTS its log2.
        LANES: C(N); LOG2_LANES its log2.
        GROUP: G(N, dtype of the normalised row), lanes per group; LOG2_GROUP its log2.
        SHARED_ROW: programs share rows (ROWS = 1); HELD: the segments each holds.
        READ_POLICY: eviction policy of the first reads of x and the residual ("", "evict_first",
            or "evict_last" for a row READ_TWICE reads again; a launch choice: "evict_first" cost
            3-4 points of the roof on the H200).
        READ_TWICE: read the row again after its reduction (from L1 or L2; the last read
            "evict_first" whatever READ_POLICY says) and the weight then, rather than hold both
            through it: fewer registers, more programs per SM (a launch choice; the bits do not
            change). LayerNorm reads it a second time for the centred squares ("evict_last") and
            a third for the output. With a residual the row read again is h, from the h just
            stored. Bytes from memory: the same, the later reads hitting the caches; the caches
            serve 2 x M x N (3 x M x N for LayerNorm).
        HOLD_16BIT: hold the 16-bit row normalised (x, or h with a residual) as loaded through
            the reductions and widen it to float32 again where it is used (``widen_again``),
            rather than hold float32 copies: half the registers for the row; RMSNorm then reads
            the weight after its reduction, as with READ_TWICE (a launch choice, slower on the
            H200 wherever measured; the bits do not change).
        STORE_POLICY: eviction policy of the store of y ("" or "evict_first"; a launch choice,
            the bits do not change).
        H_STORE_POLICY: eviction policy of the store of h (HAS_RESIDUAL): STORE_POLICY's, or,
            when READ_TWICE reads h back, "evict_last" to keep it in L2 (a launch choice).
        RUNS: the block is ``[ROWS, segments, RUNS, LANES // RUNS]``, each segment cut into RUNS
            runs of lanes (``run_tree_sum``); LOG2_RUNS its log2. 1: ``[ROWS, segments, 1, LANES]``.
            A launch choice: where Triton puts the warps, not the bits.
        EXCHANGES: None, or for whole rows (not SHARED_ROW) the levels of the row's trees met in one
            exchange between warps (``row_tree_sum``): the same bits, chosen by the launcher from
            the block's layout (``_ops.launch.tree_exchanges``); never with the interpreter.
        N_POW2: N is a power of two and ``n_float`` holds 1/N: the means are products, not
            divisions (``_over_n``; the same bits).
        WAIT_FOR_PRIOR: launched as a programmatic dependent launch (sm_90; ``enable_pdl``): the
            programs may start while the previous kernel on the stream finishes, and wait for it
            and its writes before anything else (``start_dependent_launch``).
    """
    start_dependent_launch(WAIT_FOR_PRIOR, False)
    SPAN: tl.constexpr = LANES // RUNS
    if SHARED_ROW:
        pid = tl.program_id(0)
        row_id = (pid // programs_per_row).to(tl.int64)
        row = row_id + tl.arange(0, 1)
        first_segment = (pid % programs_per_row) * HELD
        segment = first_segment + tl.arange(0, HELD)
        stats_row = (row < rows) & (first_segment == 0)  # the row's first program stores them
    else:
        row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        row_id = 0  # unused: whole rows exchange nothing
        first_segment = 0
        segment = tl.arange(0, SEGMENTS)
        stats_row = row < rows
    col = (segment[:, None, None] * LANES + tl.arange(0, RUNS)[None, :, None] * SPAN
           + tl.arange(0, SPAN)[None, None, :])
    row4 = row[:, None, None, None]
    col4 = col[None, :, :, :]
    mask = (row4 < rows) & (col4 < n)
    held = tl.load(x_ptr + row4 * stride_x + col4, mask=mask, other=0.0, eviction_policy=READ_POLICY)
    v = held.to(tl.float32)
    # RMSNorm reads the weight with the row, not after its reduction: its latency (an L2 hit for
    # every row but the first) then overlaps the row's. LayerNorm, which holds the centred row
    # as well, reads weight and bias after its reductions: held through them, they took its
    # registers from 94 to 126 per thread at 8192 elements and it fell from 83% to 59% of the roof.
    # (A row read twice or held in 16 bits reads the weight after the reduction too: those
    # launches are there to hold fewer registers through it.)
    if IS_RMS and not READ_TWICE and not HOLD_16BIT:
        w, b = _affine_terms(w_ptr, b_ptr, col, n, offset, HAS_WEIGHT, HAS_OFFSET, False)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row4 * stride_res + col4, mask=mask, other=0.0,
                    eviction_policy=READ_POLICY).to(tl.float32)
        h = (v + r).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row4 * stride_h + col4, h, mask=mask, eviction_policy=H_STORE_POLICY)
        held = h
        v = h.to(tl.float32)
    if IS_RMS:
        total = _row_total(v * v, part_ptr, arrivals_ptr, row_id, first_segment, num_segments, programs_per_row,
                           ROWS, HELD, SEGMENTS, LOG2_SEGMENTS, LANES, LOG2_LANES, GROUP, LOG2_GROUP, SHARED_ROW,
                           RUNS, LOG2_RUNS, EXCHANGES)
        rstd = tl.div_rn(1.0, tl.sqrt_rn(_over_n(total, n_float, N_POW2) + eps))
        if READ_TWICE:
            v = _read_again(x_ptr, h_ptr, row4, col4, stride_x, stride_h, mask, "evict_first", HAS_RESIDUAL)
            w, b = _affine_terms(w_ptr, b_ptr, col, n, offset, HAS_WEIGHT, HAS_OFFSET, False)
        elif HOLD_16BIT:
            v = widen_again(held, rows)
            w, b = _affine_terms(w_ptr, b_ptr, col, n, offset, HAS_WEIGHT, HAS_OFFSET, False)
        normalised = v * rstd[:, None, None, None]
    else:
        total = _row_total(v, part_ptr, arrivals_ptr, row_id, first_segment, num_segments, programs_per_row,
                           ROWS, HELD, SEGMENTS, LOG2_SEGMENTS, LANES, LOG2_LANES, GROUP, LOG2_GROUP, SHARED_ROW,
                           RUNS, LOG2_RUNS, EXCHANGES)
        mean = _over_n(total, n_float, N_POW2)
        if HOLD_16BIT:
            v = widen_again(held, rows)
        if READ_TWICE:
            # read again for the centred squares (kept for the third read) and for the output
            v = _read_again(x_ptr, h_ptr, row4, col4, stride_x, stride_h, mask, "evict_last", HAS_RESIDUAL)
        d = tl.where(mask, v - mean[:, None, None, None], 0.0)
        # the second exchange: its own half of the buffer, and the counter's second round
        total_sq = _row_total(d * d, part_ptr + rows * num_segments, arrivals_ptr, row_id, first_segment,
                              num_segments, 2 * programs_per_row, ROWS, HELD, SEGMENTS, LOG2_SEGMENTS, LANES,
                              LOG2_LANES, GROUP, LOG2_GROUP, SHARED_ROW, RUNS, LOG2_RUNS, EXCHANGES)
        var = _over_n(total_sq, n_float, N_POW2)
        rstd = tl.div_rn(1.0, tl.sqrt_rn(var + eps))
        if HOLD_16BIT:
            # (n, not rows: a third widening must not be merged with the second either)
            d = tl.where(mask, widen_again(held, n) - mean[:, None, None, None], 0.0)
        elif READ_TWICE:
            v = _read_again(x_ptr, h_ptr, row4, col4, stride_x, stride_h, mask, "evict_first", HAS_RESIDUAL)
            d = tl.where(mask, v - mean[:, None, None, None], 0.0)
        normalised = d * rstd[:, None, None, None]
        if STORE_STATS:
            tl.store(mean_ptr + row, mean, mask=stats_row)
    if STORE_STATS:
        tl.store(rstd_ptr + row, rstd, mask=stats_row)
    if ROUND_NORMALISED:
        if HAS_RESIDUAL:
            normalised = normalised.to(h_ptr.dtype.element_ty).to(tl.float32)
        else:
            normalised = normalised.to(x_ptr.dtype.element_ty).to(tl.float32)
    out = normalised
    if not IS_RMS:
        w, b = _affine_terms(w_ptr, b_ptr, col, n, offset, HAS_WEIGHT, HAS_OFFSET, HAS_BIAS)
    if HAS_WEIGHT:
        out = out * w[None, :, :, :]
    if HAS_BIAS:
        out = out + b[None, :, :, :]
    tl.store(y_ptr + row4 * stride_y + col4, out.to(y_ptr.dtype.element_ty), mask=mask,
             eviction_policy=STORE_POLICY)


@triton.jit
def _load_backward_row(dy_ptr, x_ptr, mean_ptr, rstd_ptr, row, col, cmask, rows, stride_dy, stride_x,
                       IS_RMS: tl.constexpr):
    """(dy, x, rstd, mean) of one row for the backward kernel: dy and x in their own dtypes (a row
    fetched ahead holds fewer registers so), zeros past the last row; mean is rstd for RMSNorm."""
    live = row < rows
    mask = cmask & live
    dy = tl.load(dy_ptr + row * stride_dy + col, mask=mask, other=0.0)
    v = tl.load(x_ptr + row * stride_x + col, mask=mask, other=0.0)
    rstd = tl.load(rstd_ptr + row, mask=live, other=0.0)
    mean = rstd
    if not IS_RMS:
        mean = tl.load(mean_ptr + row, mask=live, other=0.0)
    return dy, v, rstd, mean


@triton.jit
def _normalised_and_g(dy, v, w, rstd, mean, mask, IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr):
    """The backward's normalised row (as the forward pass computed it before any rounding) and
    g = dy * w (dy without a weight), from float32 dy and x."""
    if IS_RMS:
        normalised = v * rstd
    else:
        normalised = tl.where(mask, v - mean, 0.0) * rstd
    if HAS_WEIGHT:
        g = dy * w
    else:
        g = dy
    return normalised, g


@triton.jit
def norm_backward_kernel(
    dy_ptr, dh_out_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dres_ptr, dw_part_ptr, db_part_ptr,
    rows, block_rows, n, n_float, offset,
    stride_dy, stride_dh_out, stride_x, stride_dx, stride_dres,
    IS_RMS: tl.constexpr, HAS_DH_OUT: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    HAS_OFFSET: tl.constexpr, ROUND_NORMALISED: tl.constexpr, STORE_DRES: tl.constexpr,
    WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    SEGMENTS: tl.constexpr, LOG2_SEGMENTS: tl.constexpr, LANES: tl.constexpr, LOG2_LANES: tl.constexpr,
    GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr, UNROLL: tl.constexpr = 1, PREFETCH: tl.constexpr = False,
    STAGES: tl.constexpr = 1, PAIRED_SUMS: tl.constexpr = True, HOLD_16BIT: tl.constexpr = False,
    RUNS: tl.constexpr = 1, LOG2_RUNS: tl.constexpr = 0, EXCHANGES: tl.constexpr = None,
    N_POW2: tl.constexpr = False, BLOCK_ROWS: tl.constexpr = 0, RELEASE_DEPENDENTS: tl.constexpr = False,
):
    """Input gradient of RMSNorm / LayerNorm, and per-block partials of the weight/bias gradients.

    Program p takes rows [p * block_rows, (p + 1) * block_rows), one row at a time:
    g = dy * (w [+ offset]) (or dy without a weight) and n = the normalised row, then
    RMSNorm:   dx = (g - n * (tree(g * n) / N)) * rstd
    LayerNorm: dx = ((g - tree(g) / N) - n * (tree(g * n) / N)) * rstd
    plus the gradient arriving at h (``HAS_DH_OUT``) when the forward pass added a residual.
    The partials fold dy * n (weight; n rounded as the forward pass rounded it) and dy (bias)
    over the block's rows in row order, starting from zero.

    Bytes: reads M x N of dy and of x (h), M x N of dh_out when present, N of weight, 4 (8) bytes of
    statistics per row; writes M x N of dx (and of dres when its dtype differs) and
    ceil(M / block_rows) x N float32 partials per gradient.

    Args:
        dy_ptr: output gradient rows [rows, n].
        dh_out_ptr: gradient of the h output [rows, n] (used with HAS_DH_OUT).
        x_ptr: the normalised input rows [rows, n] (h when a residual was added).
        w_ptr: weight [n] (used with HAS_WEIGHT).
        mean_ptr: float32 [rows] means (LayerNorm).
        rstd_ptr: float32 [rows] reciprocal standard deviations.
        dx_ptr: input gradient rows [rows, n], written in x's dtype.
        dres_ptr: residual gradient rows [rows, n] (written with STORE_DRES, its own dtype).
        dw_part_ptr: float32 [programs, n] weight-gradient partials (written with WEIGHT_GRAD).
        db_part_ptr: float32 [programs, n] bias-gradient partials (written with BIAS_GRAD).
        rows: number of rows M.
        block_rows: rows each program folds, which depends on M and N only
            (``treefold.reference.norms.weight_grad_rows_per_block``), never on the device. A
            runtime value: the rule gives other counts than powers of two (rows longer than 4096),
            and a constant would compile a kernel for each.
        n: row length N.
        n_float: N as a float; 1/N with N_POW2.
        offset: added to the weight (used with HAS_OFFSET).
        stride_dy, stride_dh_out, stride_x, stride_dx, stride_dres: elements between rows.
        IS_RMS: RMSNorm when true, LayerNorm when false.
        HAS_DH_OUT, HAS_WEIGHT, HAS_OFFSET: which inputs apply.
        ROUND_NORMALISED: the forward pass rounded the normalised row to x's dtype ("llama").
        STORE_DRES: also write the gradient in the residual's dtype.
        WEIGHT_GRAD, BIAS_GRAD: write the partials.
        SEGMENTS, LOG2_SEGMENTS, LANES, LOG2_LANES, GROUP, LOG2_GROUP: the row's block shape and
            group, as in the forward pass.
        UNROLL: unroll factor of the row loop (a launch choice: the rows still fold in order).
        PREFETCH: load each row's successor in the block before working on the row, so that the
            program keeps bytes in flight through its reductions and stores (a launch choice).
        STAGES: software-pipelining depth of the row loop: with 2 or more the compiler copies the
            next STAGES - 1 rows' dy and x into shared memory (asynchronous copies) while a row
            is worked on; an alternative to PREFETCH that holds the rows ahead outside the
            registers (a launch choice).
        PAIRED_SUMS: LayerNorm: evaluate its two row sums as one tree over a pair of rows (each
            level's exchange between threads shared), rather than one after the other. The same
            additions either way (a launch choice).
        HOLD_16BIT: hold a row's 16-bit dy and x as loaded through its sums and widen them again
            for dx and the partials (``widen_again``), rather than hold float32 g and the
            normalised row (a launch choice; the bits do not change).
        RUNS, LOG2_RUNS: each segment of the block cut into RUNS runs of lanes, as in the forward
            pass (a launch choice).
        EXCHANGES: the levels of the row sums' trees met in one exchange between warps, as in the
            forward pass (a launch choice: the same bits).
        N_POW2: as in the forward pass.
        BLOCK_ROWS: block_rows again as a constant (the row loop's trip count known when it
            compiles), or 0 to take it at run time (a launch choice; the launcher passes powers of
            two, and with Triton's interpreter every count: its loops cannot take a runtime bound).
        RELEASE_DEPENDENTS: once its rows are done, let the column sums (a programmatic dependent
            launch, sm_90) start their programs; they wait for the partials all the same.
    """
    SPAN: tl.constexpr = LANES // RUNS
    pid = tl.program_id(0).to(tl.int64)
    rows_in_block = BLOCK_ROWS if BLOCK_ROWS > 0 else block_rows
    col = (tl.arange(0, SEGMENTS)[:, None, None] * LANES + tl.arange(0, RUNS)[None, :, None] * SPAN
           + tl.arange(0, SPAN)[None, None, :])[None, :, :, :]
    cmask = col < n
    w = 1.0  # (unused without a weight)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + col, mask=cmask, other=0.0).to(tl.float32)
        if HAS_OFFSET:
            w = w + offset
    dw_acc = tl.zeros([1, SEGMENTS, RUNS, SPAN], dtype=tl.float32)
    db_acc = tl.zeros([1, SEGMENTS, RUNS, SPAN], dtype=tl.float32)
    if PREFETCH:
        next_dy, next_v, next_rstd, next_mean = _load_backward_row(
            dy_ptr, x_ptr, mean_ptr, rstd_ptr, pid * rows_in_block, col, cmask, rows, stride_dy, stride_x, IS_RMS)
    if BLOCK_ROWS == 0:
        # (without it the compiler guards a loop that may not run: at 4096 x 16384 that spilled 32
        # more bytes per thread, 179 -> 203 us on the H200)
        tl.assume(block_rows > 0)
    # (the bound written out: Triton's interpreter makes every assigned value a tensor)
    for i in tl.range(0, BLOCK_ROWS if BLOCK_ROWS > 0 else block_rows, loop_unroll_factor=UNROLL,
                      num_stages=STAGES):
        # Rows past the end load as zeros and add +0 to the partials, which changes no bits.
        row = pid * rows_in_block + i
        live = row < rows
        mask = cmask & live
        if PREFETCH:
            dy, v, rstd, mean = next_dy, next_v, next_rstd, next_mean
            # the block's last row fetches nothing: its next row is another program's
            next_row = tl.where(i + 1 < rows_in_block, row + 1, rows)
            next_dy, next_v, next_rstd, next_mean = _load_backward_row(
                dy_ptr, x_ptr, mean_ptr, rstd_ptr, next_row, col, cmask, rows, stride_dy, stride_x, IS_RMS)
        else:
            dy, v, rstd, mean = _load_backward_row(dy_ptr, x_ptr, mean_ptr, rstd_ptr, row, col, cmask, rows,
                                                   stride_dy, stride_x, IS_RMS)
        dy_held, v_held = dy, v
        dy = dy.to(tl.float32)
        v = v.to(tl.float32)
        normalised, g = _normalised_and_g(dy, v, w, rstd, mean, mask, IS_RMS, HAS_WEIGHT)
        if IS_RMS:
            s_gn = row_tree_sum(g * normalised, 1, SEGMENTS, LOG2_SEGMENTS, LANES, LOG2_LANES, GROUP, LOG2_GROUP,
                                RUNS, LOG2_RUNS, EXCHANGES)
            c_gn = _over_n(s_gn, n_float, N_POW2)[:, None, None, None]
        else:
            if PAIRED_SUMS:
                # the two row sums as one tree over a pair of rows: the same additions, each
                # level's exchange between threads shared by both sums
                pair = tl.reshape(tl.permute(tl.join(g * normalised, g), (4, 0, 1, 2, 3)), [2, SEGMENTS, RUNS, SPAN])
                sums = row_tree_sum(pair, 2, SEGMENTS, LOG2_SEGMENTS, LANES, LOG2_LANES, GROUP, LOG2_GROUP, RUNS,
                                    LOG2_RUNS, EXCHANGES)
                s_gn, s_g = tl.split(tl.permute(tl.reshape(sums, [2, 1]), (1, 0)))
            else:
                s_gn = row_tree_sum(g * normalised, 1, SEGMENTS, LOG2_SEGMENTS, LANES, LOG2_LANES, GROUP,
                                    LOG2_GROUP, RUNS, LOG2_RUNS, EXCHANGES)
                s_g = row_tree_sum(g, 1, SEGMENTS, LOG2_SEGMENTS, LANES, LOG2_LANES, GROUP, LOG2_GROUP, RUNS,
                                   LOG2_RUNS, EXCHANGES)
            c_gn = _over_n(s_gn, n_float, N_POW2)[:, None, None, None]
            c_g = _over_n(s_g, n_float, N_POW2)[:, None, None, None]
        if HOLD_16BIT:
            # the row's sums are taken: dy and the normalised row again from the held 16-bit values
            dy = widen_again(dy_held, rows)
            normalised, g = _normalised_and_g(dy, widen_again(v_held, rows), w, rstd, mean, mask, IS_RMS,
                                              HAS_WEIGHT)
        if IS_RMS:
            dx = (g - normalised * c_gn) * rstd
        else:
            dx = ((g - c_g) - normalised * c_gn) * rstd
        if HAS_DH_OUT:
            dx = dx + tl.load(dh_out_ptr + row * stride_dh_out + col, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + row * stride_dx + col, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if STORE_DRES:
            tl.store(dres_ptr + row * stride_dres + col, dx.to(dres_ptr.dtype.element_ty),
                     mask=mask)
        if WEIGHT_GRAD:
            if ROUND_NORMALISED:
                normalised = normalised.to(x_ptr.dtype.element_ty).to(tl.float32)
            dw_acc = dw_acc + dy * normalised
        if BIAS_GRAD:
            db_acc = db_acc + dy
    start_dependent_launch(False, RELEASE_DEPENDENTS)
    if WEIGHT_GRAD:
        tl.store(dw_part_ptr + pid * n + col, dw_acc, mask=cmask)
    if BIAS_GRAD:
        tl.store(db_part_ptr + pid * n + col, db_acc, mask=cmask)


@triton.jit
def _column_tree_sum(part_ptr, out_ptr, num_parts, n, PARTS: tl.constexpr, LOG2_PARTS: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    cols = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    parts = tl.arange(0, PARTS)
    mask = (parts[:, None] < num_parts) & (cols[None, :] < n)
    v = tl.load(part_ptr + parts[:, None].to(tl.int64) * n + cols[None, :], mask=mask, other=0.0)
    total = tree_sum(tl.trans(v), BLOCK_N, PARTS, LOG2_PARTS, 1, 0)
    tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=cols < n)


@triton.jit
def column_tree_sum_kernel(
    part_ptr, out_ptr, part2_ptr, out2_ptr, num_parts, n,
    PARTS: tl.constexpr, LOG2_PARTS: tl.constexpr, BLOCK_N: tl.constexpr,
    WAIT_FOR_PRIOR: tl.constexpr = False,
):
    """Column sums of ``num_parts`` float32 partial rows: a halving tree over the rows; on a grid of
    two columns (``tl.program_id(1)``), of a second set of partials too (LayerNorm's dw and db in
    one launch).

    The partials are reduced as the order reduces segment results: a plain halving tree over
    next_pow2(num_parts) zero-padded lanes (num_parts <= ``treefold.order.MAX_LANES``). Program p
    takes the columns [p * BLOCK_N, (p + 1) * BLOCK_N); the result is rounded to the output's
    dtype.

    Bytes: reads num_parts x N float32, writes N (each, for two sets).

    Args:
        part_ptr: float32 partials [num_parts, n], rows contiguous.
        out_ptr: output [n], any float dtype.
        part2_ptr, out2_ptr: the second set, summed by the programs of ``tl.program_id(1) == 1``
            (any pointers on a grid of one column).
        num_parts: number of partial rows.
        n: row length.
        PARTS: next_pow2(num_parts); LOG2_PARTS its log2.
        BLOCK_N: columns per program (a launch choice; the bits do not depend on it).
        WAIT_FOR_PRIOR: launched as a programmatic dependent launch after the backward kernel
            (sm_90): wait for it to finish and its partials to be visible.
    """
    start_dependent_launch(WAIT_FOR_PRIOR, False)
    if tl.program_id(1) == 0:
        _column_tree_sum(part_ptr, out_ptr, num_parts, n, PARTS, LOG2_PARTS, BLOCK_N)
    else:
        _column_tree_sum(part2_ptr, out2_ptr, num_parts, n, PARTS, LOG2_PARTS, BLOCK_N)
