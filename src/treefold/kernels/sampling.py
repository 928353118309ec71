"""Next-token sampling, top-k and nucleus filters without sorting the vocabulary.

Everything is a reduction over the vocabulary of one row. The token order used by every filter is
the *composite order*: logit descending, then token index ascending (ties go to the lowest index;
-0.0 equals +0.0). A filter keeps a prefix of that order, so the filters compose into one prefix:

- top-k keeps the first k tokens;
- top-p keeps the shortest prefix whose probability mass reaches p (a token is kept when the mass
  strictly before it is < p * M, M being the mass of the top-k set, or of the whole row);
- min-p keeps the tokens with exp(y - y_max) >= min_p (a prefix too; renormalising does not
  change the ratio to the top token).

The sample is an exponential race over the kept tokens: token i scores y_i - log(E_i), with
y = logit / temperature and E_i ~ Exp(1) drawn by Philox from (seed, stream, offset, i) alone;
the highest score wins (lowest index on a tie). The winner is distributed exactly as the
renormalised filtered distribution, no prefix sum or sort of the vocabulary is needed, and a row
draws the same numbers whatever batch it sits in.

Finding the prefix boundary without a sort (the filtered path: five launches; one more on a
grid large enough for the pre-list, one more for the masks):

1. ``segment_max_kernel``: the maximum of y over each program's share of the row. One read of
   the logits, the only one that reaches HBM.
2. ``bin_histogram_kernel``: with the row maximum m, every token falls in a bin
   floor((m - y) * BINS_PER_NAT) (the last bin collects everything further away). A histogram
   of the bins (integer atomics: exact in any order) and the row's mass, the sum of
   w = exp(y - m) in fixed point. In filtered calls on large grids it lists the tokens of the
   first bins instead of counting the bins (the pre-list: within 10 nats of the maximum), and
   ``bin_count_kernel`` counts them after it: from the pre-list where the list holds the row's
   kept prefix (the rest of the row one lump of known count and exact mass), from the row
   where not.
3. ``plan_kernel``: one warp per row. From the histogram, bounds on the probability mass of
   every bin prefix locate the bins that can hold the prefix boundary (``_plan``): the row's plan.
4. ``compact_kernel``: tokens in bins before the plan's boundary bins are kept for sure:
   their mass is summed and, when sampling, their indices are written from the end of the
   row's list. Tokens in the boundary bins are written from the front; when they are many, a
   histogram of sub-bins of the boundary bins is counted too. A row whose boundary lies inside
   its complete pre-list reads the pre-list instead of the row.
   When sampling, a row with more sure-kept tokens than the resolve pass races cheaply races
   them in place, drawing noise for whole segments: in the compaction itself on grids the device
   holds at once (RACE_SURE), else in race programs of the same launch (RACE_PROGRAMS).
5. ``resolve_kernel``: one program per row. When sampling, it first runs the race among the
   sure-kept tokens (their noise is drawn for them alone). A long boundary list is cut down with
   the sub-bins (``_refine``: the same bounds, much narrower bins). The remaining tokens are
   ranked in the composite order (all pairwise comparisons, or a sort for top_k), which gives
   the exact cumulative counts and masses, hence every filter's decision, and the race goes on
   among the kept ones. A list still long after that (a huge tie group) is resolved by a bracket
   search with 15 thresholds per pass.
6. ``apply_filter_kernel`` (the mask functions only): writes masked logits or probabilities.

Greedy decoding and sampling without filters take ``race_kernel`` + ``race_combine_kernel``.
Sampling under min-p alone takes them too, after ``segment_max_kernel``: its kept tokens depend
on the row maximum alone, and the race (MIN_P) reads only the segments whose maximum can keep one.
Sampling under top-p and min-p without top-k can take ``descent_kernel`` instead: the race over
the row first, then, while its winner lies outside the kept prefix, the race among the tokens
before it (the same scores: the same token as the race over the kept prefix; see the section).

Masses are summed in fixed point (w * 2^40 truncated to int64, w = exp(y - m) <= 1), so sums
taken in any order, by any number of programs, give the same integers: results never depend on
the batch size or the launch configuration (programs per row, segment width, warps). Only top-p
and the mask functions' probabilities read a mass: other calls sum none (MASSES). The row
passes keep per-lane maxima, races and integer sums across their segments and reduce them once
per program: on the H200 these passes are bound by instructions, not by the logits' bytes.
"""
import triton
import triton.language as tl

from triton.language.extra import libdevice

from ..backend import INTERPRETED
from .combine import arrive, start_dependent_launch, wait_for_arrivals

#: Compiled, ``_fast_log`` and ``_fixed_weight``'s exp are libdevice's fast approximations; the
#: interpreter has no libdevice: there they are NumPy's log and exp.
LIBDEVICE = tl.constexpr(not INTERPRETED)
#: Compiled, reductions that meet at the same point are one ``tl.reduce`` over several operands
#: (a race's best score and its lowest index; the resolve pass's partials): one set of shuffles
#: and one shared-memory exchange instead of one per value (sm_90: 2 barriers instead of 6-8).
#: Triton's interpreter runs such a reduce one element at a time in Python (about 200x slower than
#: its max and sum), so interpreted they stay separate reductions: the same values, since the sums
#: are of integers and a race's scores are never NaN.
FUSED_REDUCTIONS = tl.constexpr(not INTERPRETED)

#: Fixed-point scale of probability masses (w in (0, 1] times 2^40; 2^20 tokens sum below 2^63).
FIXED_ONE = tl.constexpr(1099511627776.0)
FLT_MAX = tl.constexpr(3.4028234663852886e38)
#: Largest 1 / temperature used: keeps y = x / t finite-friendly for tiny temperatures.
MAX_INV_TEMPERATURE = tl.constexpr(1e30)
#: Min-p's race skips a segment whose maximum lies more than ln(1 / min_p) + this many nats below
#: the row's: none of its tokens can reach min_p. The gaps y - m are the same float32 differences
#: the tokens' test takes (and rounding is monotone), so the margin covers only the exp's and the
#: log's approximations, under 1e-5 nats while exp(gap) is a normal float32. A min_p below the
#: least normal one (MIN_P_SKIP_LEAST), where exp's subnormal results round by far more, skips
#: nothing.
MIN_P_SKIP_MARGIN = tl.constexpr(2.0 ** -6)
MIN_P_SKIP_LEAST = tl.constexpr(1.1754943508222875e-38)
INT64_MIN = tl.constexpr(-9223372036854775808)
INT64_MAX = tl.constexpr(9223372036854775807)
#: Larger than any key the bracket search meets (keys are int32 values or minus an index).
SEARCH_BIG = tl.constexpr(4611686018427387904)
#: Slack, in bins, on the bin edges when bounding masses (covers float rounding of the bin).
BIN_EDGE_SLACK = tl.constexpr(0.01)
#: Slack on the mass bounds, relative to the row's total mass (bins; the narrower sub-bins).
MASS_SLACK = tl.constexpr(1e-3)
FINE_MASS_SLACK = tl.constexpr(1e-4)

#: The plan of a row that ``plan_kernel`` writes for the passes after it (int32 slots).
PLAN_SLOTS = tl.constexpr(8)
PLAN_LO = tl.constexpr(0)
PLAN_HI = tl.constexpr(1)
PLAN_COUNT_ABOVE = tl.constexpr(2)
PLAN_VALID = tl.constexpr(3)
PLAN_RACE_IN_PLACE = tl.constexpr(4)
PLAN_MIN_P_BITS = tl.constexpr(5)
PLAN_MAX_BITS = tl.constexpr(6)
PLAN_RANGE = tl.constexpr(7)

MODE_SAMPLE = tl.constexpr(0)
MODE_THRESHOLD = tl.constexpr(1)
MODE_TOPK = tl.constexpr(2)

#: A program lists tokens (``_list_lane_tokens``) once per LIST_CHUNK of its segments: each lane
#: keeps one bit per segment of the chunk in an int32.
LIST_CHUNK = tl.constexpr(32)
#: A histogram program of at most this many segments sums the weights of the tokens it leaves
#: off a pre-list of at least 10 nats in int32 lanes: each weighs less than exp(-10) * 2^40 <
#: 5.0e7, and 42 of them stay below 2^31.
UNLISTED_SEGMENTS = tl.constexpr(42)


# ------------------------------------------------------------------------------------------
# Keys, scaling, bins
# ------------------------------------------------------------------------------------------

@triton.jit
def _ordered_key(x):
    """float32 -> int32 whose signed order is the float order; -0.0 maps to +0.0 and every NaN
    to the largest key (above +inf), as torch.sort orders them."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return tl.where(x != x, 0x7FFFFFFF, key)


@triton.jit
def _key_value(key):
    """Inverse of ``_ordered_key`` (NaN comes back as the canonical quiet NaN)."""
    bits = key ^ ((key >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _composite(key, index):
    """int64 whose order is the composite order: key descending, then index ascending."""
    # (key << 32) + (2^32 - 1 - index), written so that every literal is an int64.
    return ((key.to(tl.int64) << 32) - index.to(tl.int64) - 1) + 4294967296


@triton.jit
def _split_composite(c):
    hi = c >> 32
    low = c - (hi << 32)
    return hi.to(tl.int32), 4294967296 - (low + 1)


@triton.jit
def _bin_of(x, y, m, finite, NUM_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr,
            ALL_VALUES: tl.constexpr):
    """floor((m - y) * BINS_PER_NAT), clamped to [0, NUM_BINS - 1]. Non-increasing in x, so a set
    of bins starting at 0 is a prefix of the composite order. With ALL_VALUES, NaN and +inf go
    to bin 0 and -inf to the last bin (top_k orders every value)."""
    return _bin_of_gap(x, _gap(y, m, finite), finite, NUM_BINS, BINS_PER_NAT, ALL_VALUES)


@triton.jit
def _gap(y, m, finite):
    """y - m where finite, -inf elsewhere: what a token's bin and weight are both taken from. A
    masked-out token's weight is then exp(-inf) = 0 with no select of its own (its bin is
    selected by ``finite`` in ``_bin_of_gap``); the subtraction comes first so that a row whose
    maximum is -inf (no finite logit) never meets -inf - -inf."""
    return tl.where(finite, y - m, float("-inf"))


@triton.jit
def _bin_of_gap(x, gap, finite, NUM_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr, ALL_VALUES: tl.constexpr):
    """``_bin_of`` from the token's ``_gap``: m - y is -(y - m) exactly (rounding to nearest is
    symmetric), so the bins are the same bits whichever difference is taken. (Multiplied by
    -BINS_PER_NAT: Triton negates as 0 - x, one more instruction per token.) A non-finite token's
    gap is -inf: it lands in the last bin, and every caller masks it out by ``finite`` (or, with
    ALL_VALUES, places it below)."""
    b = tl.minimum(tl.maximum(gap * (-BINS_PER_NAT), 0.0), NUM_BINS - 1.0).to(tl.int32)
    if ALL_VALUES:
        b = tl.where(finite, b, tl.where(x == float("-inf"), NUM_BINS - 1, 0))
    return b


@triton.jit
def _in_first_bins(x, gap, FIRST_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr, ALL_VALUES: tl.constexpr):
    """``_bin_of_gap(x, gap, finite, ...) < FIRST_BINS`` (FIRST_BINS < NUM_BINS) without the bin
    or ``finite``, for the histogram's pre-list, for every token in the row (a masked-off token
    is never marked): gap * -BINS_PER_NAT is the bin's clamped quantity, and its integer part is
    below FIRST_BINS exactly when it is, that is when gap > -FIRST_BINS / BINS_PER_NAT: a power
    of two (``_ops.sampling.BINS_PER_NAT``, tested) scales gap exactly, an overflow to +inf
    included. One compare per token instead of the bin's multiply, two clamps, conversion and
    compare (sm_90, 64 x 151936: the histogram's segment loop 8 instructions shorter per 8 tokens
    per thread than with the multiply)."""
    near = gap > -FIRST_BINS / BINS_PER_NAT
    if ALL_VALUES:
        # NaN and +inf are in bin 0, -inf in the last: the non-finite tokens that are not at most
        # FLT_MAX (NaN compares false). A non-finite token's gap is -inf, so ``near`` is false
        # for it, and a token masked off (loaded as 0) stays unmarked: no select on ``finite``,
        # whose predicates per token had spilled into bit masks (sm_90, 64 x 151936 top_k: the
        # histogram's segment loop 241 instructions per 8 tokens per thread against 137 without
        # ALL_VALUES).
        near = near | ((x <= FLT_MAX) == 0)
    return near


# ------------------------------------------------------------------------------------------
# Random numbers: Philox4x32-10 on (token // 4, stream, offset), key = seed
# ------------------------------------------------------------------------------------------

#: The kernels' arguments Triton compiles no value specialisation for: a request's seed and its
#: decode step change from call to call, and only feed the Philox counter, so specialising them
#: (Triton makes the value 1 a constant and marks multiples of 16) gains nothing and would compile
#: every kernel of a call again at offset 1 and again at offset 16 (the top-p pipeline's resolve
#: pass alone takes 13.6 s to compile for sm_90).
RANDOM_ARGS = ("seed", "offset")


@triton.jit
def _philox_bits(seed, groups, stream, offset):
    c0 = groups.to(tl.uint32)
    zero = c0 * 0
    c1 = zero + stream.to(tl.uint32)
    c2 = zero + offset.to(tl.uint32)
    c3 = zero + (offset >> 32).to(tl.uint32)
    return tl.philox(seed, c0, c1, c2, c3)


@triton.jit
def _fast_log(x):
    """Natural log. Compiled: lg2.approx times ln 2, one MUFU instruction (relative error about
    2^-22, absolute near 1); libdevice's logf is a polynomial of some twenty FMAs, which made the
    race noise, not the logits' bytes, the cost of a sampling pass. Interpreted: NumPy's log."""
    if LIBDEVICE:
        return libdevice.fast_logf(x)
    else:
        return tl.log(x)


@triton.jit
def _race_noise(r):
    """-log(E) for E ~ Exp(1) from 32 random bits: a Gumbel variable, finite by construction.

    u = (2j + 1) / 2^24 with j the top 23 bits lies strictly inside (0, 1). E = -log(u) must keep
    its relative accuracy when u is close to 1 (E tiny, the rare tokens that win easily), where a
    fast log loses it; there log(u) = 2 atanh(s), s = (u - 1) / (u + 1), |s| <= 1/3, summed to
    8 terms (error below 2^-26). Compiled, the division and the logs are the fast ones
    (``_fast_log``; division within 2 ulp): the noise is within 2^-21 of the exact -log(E) of
    the same u, below half an ulp of a score of magnitude 8 or more.
    """
    u = ((r >> 9).to(tl.int32).to(tl.float32) * 2.0 + 1.0) * 5.9604644775390625e-08
    s = (u - 1.0) / (u + 1.0)
    s2 = s * s
    series = 1.0 + s2 * (0.3333333333333333 + s2 * (0.2 + s2 * (0.14285714285714285 + s2 * (
        0.1111111111111111 + s2 * (0.09090909090909091 + s2 * (0.07692307692307693
                                                                 + s2 * 0.06666666666666667))))))
    log_u = tl.where(u >= 0.5, 2.0 * s * series, _fast_log(u))
    return -_fast_log(-log_u)


@triton.jit
def _noise_at(tokens, seed, stream, offset):
    """Race noise of arbitrary tokens (int64): token t uses output t % 4 of Philox block t // 4."""
    r0, r1, r2, r3 = _philox_bits(seed, tokens >> 2, stream, offset)
    lane = tokens & 3
    r = tl.where(lane == 0, r0, tl.where(lane == 1, r1, tl.where(lane == 2, r2, r3)))
    return _race_noise(r)


@triton.jit
def _noise_tile(first_group, seed, stream, offset, GROUPS: tl.constexpr):
    """Race noise of the 4 * GROUPS consecutive tokens from 4 * first_group: one Philox block
    per four tokens, the same numbers ``_noise_at`` gives.

    Built as a [GROUPS, 4] tile (a thread's four consecutive tokens share their Philox block)
    and flattened in place, so the noise lands in the registers of the logits it is added to."""
    groups = first_group + tl.arange(0, GROUPS)[:, None]
    r0, r1, r2, r3 = _philox_bits(seed, groups, stream, offset)
    lane = tl.arange(0, 4)[None, :]
    r = tl.where(lane == 0, r0, tl.where(lane == 1, r1, tl.where(lane == 2, r2, r3)))
    return _race_noise(tl.reshape(r, (GROUPS * 4,)))


# ------------------------------------------------------------------------------------------
# Per-row parameters
# ------------------------------------------------------------------------------------------

@triton.jit
def _row_temperature(temperature, row, T_ROW: tl.constexpr):
    """(1 / t, noise scale, valid). t = 0 is greedy (no noise); t < 0, NaN or inf is invalid."""
    if T_ROW:
        t = tl.load(temperature + row).to(tl.float32)
    else:
        t = tl.full([], temperature, tl.float32)
    ok = (t >= 0.0) & (t < float("inf"))
    greedy = t == 0.0
    inv_t = tl.where(greedy | (ok == 0), 1.0, tl.minimum(tl.div_rn(1.0, tl.maximum(t, 1.5e-38)),
                                                      MAX_INV_TEMPERATURE))
    noise_scale = tl.where(greedy, 0.0, 1.0)
    return inv_t, noise_scale, ok


@triton.jit
def _row_filters(row, n, top_k, top_p, min_p, filters, K_ROW: tl.constexpr, P_ROW: tl.constexpr,
                 MINP_ROW: tl.constexpr):
    """(k, p, min_p, valid) of a row. ``filters`` has bit 1 for top-k, 2 for top-p, 4 for min-p;
    an absent filter reads as k = n, p = 1, min_p = 0, which keep every token.
    Valid ranges: 1 <= k <= n, 0 < p <= 1, 0 <= min_p <= 1."""
    nn = tl.full([], n, tl.int64)
    if K_ROW:
        k = tl.load(top_k + row).to(tl.int64)
    else:
        k = tl.full([], top_k, tl.int64)
    if P_ROW:
        p = tl.load(top_p + row).to(tl.float32)
    else:
        p = tl.full([], top_p, tl.float32)
    if MINP_ROW:
        mp = tl.load(min_p + row).to(tl.float32)
    else:
        mp = tl.full([], min_p, tl.float32)
    k = tl.where((filters & 1) != 0, k, nn)
    p = tl.where((filters & 2) != 0, p, 1.0)
    mp = tl.where((filters & 4) != 0, mp, 0.0)
    ok = (k >= 1) & (k <= nn) & (p > 0.0) & (p <= 1.0) & (mp >= 0.0) & (mp <= 1.0)
    return k, p, mp, ok


@triton.jit
def _row_random(seed, seed_stride, offset, offset_stride, row, SEED_TENSOR: tl.constexpr,
                OFFSET_TENSOR: tl.constexpr):
    """(seed, stream, offset) of a row. A per-row seed (stride 1) names the row's stream alone,
    so a request draws the same numbers in any batch; one seed for the whole batch (an int, or a
    tensor of one element: stride 0) gives row r the stream r."""
    if SEED_TENSOR:
        s = tl.load(seed + row * seed_stride).to(tl.int64)
        stream = tl.where(seed_stride == 0, row, 0).to(tl.int64)
    else:
        s = tl.full([], seed, tl.int64)
        stream = tl.full([], row, tl.int64)
    if OFFSET_TENSOR:
        o = tl.load(offset + row * offset_stride).to(tl.int64)
    else:
        o = tl.full([], offset, tl.int64)
    return s, stream, o


@triton.jit
def _scaled(x, inv_t):
    """y = x / t clamped to the finite floats (y - m then never overflows into a NaN)."""
    return tl.minimum(tl.maximum(x * inv_t, -FLT_MAX), FLT_MAX)


@triton.jit
def _logits_from(raw, mask, inv_t, UNIT_T: tl.constexpr = False):
    """Loaded logits (0 where masked off) as float32, whether each is finite, and their scaled
    values y (``_scaled``).

    UNIT_T: the call's temperature is the scalar 1 (or 0, greedy: no scaling either), so y is x
    itself: for a finite x that is ``_scaled``'s value bit for bit, and a non-finite x, where the
    clamp would differ, takes part in no pass (every use of y is masked by ``finite``, or by lists
    of finite tokens). A multiply and two clamps fewer per token in the row passes."""
    x = raw.to(tl.float32)
    if UNIT_T:
        y = x
    else:
        y = _scaled(x, inv_t)
    return x, mask & (tl.abs(x) < float("inf")), y


@triton.jit
def _logits_at(x_ptr, row, stride_x, offsets, mask, inv_t, UNIT_T: tl.constexpr = False):
    """A row's logits at ``offsets``: ``_logits_from`` of their load. How every pass reads them."""
    return _logits_from(tl.load(x_ptr + row * stride_x + offsets, mask=mask, other=0.0), mask, inv_t, UNIT_T)


@triton.jit
def _segment_logits(x_ptr, row, stride_x, prog, j, lanes, n, inv_t, next_raw,
                    SEGMENTS_PER_PROGRAM: tl.constexpr, WIDTH: tl.constexpr, PREFETCH: tl.constexpr,
                    UNIT_T: tl.constexpr, READ_POLICY: tl.constexpr):
    """Segment j of a program's consecutive segments: its columns, which of them lie in the row,
    (x, finite, y) as ``_logits_at`` gives them, and the loaded logits of segment j + 1 (in their
    own dtype).

    With ``PREFETCH`` the segment's logits are ``next_raw``, loaded by the previous step, and
    this step issues the next segment's loads before the caller works on this one, so that a
    program keeps bytes in flight through its arithmetic (none past its last segment).
    Otherwise it loads segment j and returns ``next_raw`` unchanged. ``READ_POLICY``: the loads'
    L2 eviction policy ("", "evict_last", "evict_first"). It has no default, nor has
    ``_first_segment``'s: Triton 3.6 fails to compile a call that leaves a string constexpr of a
    jit helper to its default ("'str' object has no attribute 'type'"), so every caller names it.
    """
    cols = (prog * SEGMENTS_PER_PROGRAM + j) * WIDTH + lanes
    in_row = cols < n
    if PREFETCH:
        raw = next_raw
        following = cols + WIDTH
        next_raw = tl.load(x_ptr + row * stride_x + following, mask=(following < n) & (j + 1 < SEGMENTS_PER_PROGRAM),
                           other=0.0, eviction_policy=READ_POLICY)
    else:
        raw = tl.load(x_ptr + row * stride_x + cols, mask=in_row, other=0.0, eviction_policy=READ_POLICY)
    x, finite, y = _logits_from(raw, in_row, inv_t, UNIT_T)
    return cols, in_row, x, finite, y, next_raw


@triton.jit
def _first_segment(x_ptr, row, stride_x, prog, lanes, n, SEGMENTS_PER_PROGRAM: tl.constexpr, WIDTH: tl.constexpr,
                   PREFETCH: tl.constexpr, READ_POLICY: tl.constexpr):
    """The loaded logits of a program's first segment with ``PREFETCH`` (a placeholder of the same
    type otherwise), for ``_segment_logits``."""
    cols = prog * SEGMENTS_PER_PROGRAM * WIDTH + lanes
    if PREFETCH:
        return tl.load(x_ptr + row * stride_x + cols, mask=cols < n, other=0.0, eviction_policy=READ_POLICY)
    else:
        return tl.zeros([WIDTH], x_ptr.dtype.element_ty)


@triton.jit
def _row_max(part_max_ptr, row, programs_per_row, POW2: tl.constexpr):
    """The row maximum from the per-program maxima of ``segment_max_kernel`` (POW2 >= programs)."""
    q = tl.arange(0, POW2)
    v = tl.load(part_max_ptr + row * programs_per_row + q, mask=q < programs_per_row,
                other=float("-inf"))
    return tl.max(v, axis=0)


@triton.jit
def _row_sum(part_ptr, row, programs_per_row, POW2: tl.constexpr):
    """A row's integer total from its programs' partials (POW2 >= programs): the fixed-point
    masses (int64) of ``bin_histogram_kernel``, the row's or its pre-list's, or the valid tokens
    it counted."""
    q = tl.arange(0, POW2)
    v = tl.load(part_ptr + row * programs_per_row + q, mask=q < programs_per_row, other=0)
    return tl.sum(v, axis=0)


@triton.jit
def _fixed_mass(y, m, finite):
    """w = exp(y - m) of each token and w * 2^40 truncated to int64 (0 where not finite: the
    ``_gap`` of such a token is -inf): the weights every mass is summed from, exactly and in any
    order."""
    w = tl.exp(_gap(y, m, finite))
    return w, (w * FIXED_ONE).to(tl.int64)


@triton.jit
def _min_p_keeps(w, mp, minp_on):
    """Whether min-p keeps each token of weight w = exp(y - y_max) (``_fixed_mass``'s): w >= min_p,
    or every token where min-p is off (``minp_on``: mp > 0). Every pass that decides min-p takes
    this test, so all of them keep the same tokens; passes whose mp is already 0 where min-p is
    off (the plan's slot, the descent's) pass ``minp_on`` = True, which compiles to w >= mp alone
    (every weight is >= 0)."""
    return (minp_on == 0) | (w >= mp)


@triton.jit
def _fixed_weight(gap):
    """The fixed-point weight of ``_fixed_mass`` alone, from the token's ``_gap`` (0 where that is
    -inf), for passes that need no float w. Compiled, its exp flushes results below 2^-126 to
    zero (libdevice's fast exp: no range fix-up, three instructions fewer per token): those
    truncate to 0 times 2^40 either way, and above them both exps are the same MUFU.EX2 of the
    same argument, so the fixed-point weights are the same bits as ``_fixed_mass``'s."""
    if LIBDEVICE:
        w = libdevice.fast_expf(gap)
    else:
        w = tl.exp(gap)
    return (w * FIXED_ONE).to(tl.int64)


@triton.jit
def _popcount(bits):
    """Set bits of each int32: compiled, the POPC instruction; interpreted (Triton's interpreter
    has no libdevice), SWAR arithmetic."""
    if LIBDEVICE:
        return libdevice.popc(bits)
    v = bits - ((bits >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return (v + (v >> 8) + (v >> 16) + (v >> 24)) & 0x3F


@triton.jit
def _scatter_store(ptr, value, mask):
    """``tl.store(ptr, value, mask=mask)`` of int32 values at scattered places, compiled as one
    predicated st.global.b32 per element in the layout the values already have. Triton lays a
    store whose places are not contiguous out one element per thread, and converted the lanes'
    places and masks to that layout through shared memory at every store (sm_90, the
    histogram's listing: 4 barriers and 131 instructions per segment of 1024 lanes)."""
    if LIBDEVICE:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; mov.b32 $0, 0; }",
            "=r,l,r,r", [ptr.to(tl.int64, bitcast=True), value, mask.to(tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1)
    else:
        tl.store(ptr, value, mask=mask)


@triton.jit
def _list_lane_tokens(list_row, capacity, count_ptr, lane_bits, first_col, segments, programs_per_row, lanes,
                      WIDTH: tl.constexpr):
    """Append the tokens a program marked in a chunk of its segments to a row's list: bit i of a
    lane's ``lane_bits`` marks column first_col + i * WIDTH + lane. One reduction, one scan and one
    atomic for the whole chunk (which hands out the places: the list's order is irrelevant), then
    one masked store per segment; places at or past ``capacity`` are not written, the count goes
    on past it. Returns whether the list has room left for the program's later chunks.

    A program whose chunk marks more than twice its share of the capacity gives the list up for
    the row instead: it raises the count to at least capacity + 1 (the row then reads its
    logits; a maximum, not an add, so that the count stays within capacity + 1 + n) and lists
    nothing. Rows too flat for the list thus skip most of its stores (H200, 64 flat rows of
    151936 fp32: min-p 0.05 133.8 -> 126.4 us, top-p 0.9 255.0 -> 248.0); a peaked row's
    programs mark a few percent of their tokens, far below it."""
    lane_count = _popcount(lane_bits)
    total = tl.sum(lane_count, axis=0)
    give_up = total * programs_per_row > 2 * capacity
    room = give_up == 0
    if total > 0:
        # relaxed: the atomics only hand out places and mark the list full; a later launch reads it
        if give_up:
            tl.atomic_max(count_ptr, capacity + 1, sem="relaxed")
        else:
            base = tl.atomic_add(count_ptr, total, sem="relaxed")
            place = base + tl.cumsum(lane_count, 0) - lane_count
            i = tl.full([], 0, tl.int32)
            while i < segments:  # (a bound the interpreter cannot take as a range)
                marked = ((lane_bits >> i) & 1) != 0
                _scatter_store(list_row + place, first_col + i * WIDTH + lanes, marked & (place < capacity))
                place += marked.to(tl.int32)
                i += 1
            room = base + total <= capacity
    return room


@triton.jit
def _row_setup(row, n, temperature, top_k, top_p, min_p, filters, seed, seed_stride, offset,
               offset_stride, T_ROW: tl.constexpr, K_ROW: tl.constexpr, P_ROW: tl.constexpr,
               MINP_ROW: tl.constexpr, SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr):
    """A row's parameters, as the compaction and resolve passes need them: (1 / t, noise scale,
    the parameters are valid, k, p, min_p, seed, stream, offset)."""
    inv_t, noise_scale, t_ok = _row_temperature(temperature, row, T_ROW)
    k, p, mp, f_ok = _row_filters(row, n, top_k, top_p, min_p, filters, K_ROW, P_ROW, MINP_ROW)
    s, stream, o = _row_random(seed, seed_stride, offset, offset_stride, row, SEED_TENSOR,
                               OFFSET_TENSOR)
    return inv_t, noise_scale, t_ok & f_ok, k, p, mp, s, stream, o


@triton.jit
def _merge_row_partials(m_a, total_a, mass_a, kept_a, score_a, index_a,
                        m_b, total_b, mass_b, kept_b, score_b, index_b):
    """``tl.reduce`` combine of ``_row_partials``: the larger maximum, the three integer sums, and
    the better race winner (``_race_pick``)."""
    score, index = _race_pick(score_a, index_a, score_b, index_b)
    return tl.maximum(m_a, m_b), total_a + total_b, mass_a + mass_b, kept_a + kept_b, score, index


@triton.jit
def _add_three(a0, a1, a2, b0, b1, b2):
    """``tl.reduce`` combine of three integer sums (exact in any order)."""
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def _row_partials(part_max_ptr, part_total_ptr, part_mass_ptr, part_kept_ptr, part_score_ptr,
                  part_index_ptr, parts, live, raced):
    """The resolve pass's view of a row's per-program partials (``parts``, ``live`` of them;
    ``raced``: those whose race winners were written): (maximum, fixed-point mass, sure-kept
    mass, its min-p survivors' mass, winner score, winner index). One reduction when compiled
    (``FUSED_REDUCTIONS``). The maxima are never NaN (non-finite logits take no part)."""
    m_part = tl.load(part_max_ptr + parts, mask=live, other=float("-inf"))
    total_part = tl.load(part_total_ptr + parts, mask=live, other=0)
    mass_part = tl.load(part_mass_ptr + parts, mask=live, other=0)
    kept_part = tl.load(part_kept_ptr + parts, mask=live, other=0)
    scores = tl.load(part_score_ptr + parts, mask=raced, other=float("-inf"))
    indices = tl.load(part_index_ptr + parts, mask=raced, other=INT64_MAX)
    if FUSED_REDUCTIONS:
        return tl.reduce((m_part, total_part, mass_part, kept_part, scores, indices), 0,
                         _merge_row_partials)
    else:
        best_score, best_index = _winner(scores, indices, INT64_MAX)
        return (tl.max(m_part, axis=0), tl.sum(total_part, axis=0), tl.sum(mass_part, axis=0),
                tl.sum(kept_part, axis=0), best_score, best_index)


@triton.jit
def _choose_bins(cum, lb, ub, NB: tl.constexpr, kk, total, p, topk_on, topp_on, minp_on, m_hi):
    """The bins [lo, hi] that can hold the kept prefix's boundary, given for every bin j the count
    of tokens through it (``cum``) and bounds [lb, ub] on their mass; ``m_hi`` is the last bin
    that can hold a token min-p keeps. Tokens in bins < lo are kept (if min-p keeps them),
    tokens in bins > hi are not."""
    b = tl.arange(0, NB)
    k_bin = tl.minimum(tl.sum((cum < kk).to(tl.int32), axis=0), NB - 1)
    # mass of the top-k set: at least that of the bins before k_bin, at most that through it
    m_k_lo = tl.sum(tl.where(b == k_bin - 1, lb, 0.0), axis=0)
    m_k_hi = tl.sum(tl.where(b == k_bin, ub, 0.0), axis=0)
    t_lo = p * tl.where(topk_on, m_k_lo, total)
    t_hi = p * tl.where(topk_on, m_k_hi, total)
    p_lo = tl.minimum(tl.sum((ub < t_lo).to(tl.int32), axis=0), NB - 1)
    p_hi = tl.minimum(tl.sum((lb < t_hi).to(tl.int32), axis=0), NB - 1)
    p_lo = tl.where(topk_on, tl.minimum(p_lo, k_bin), p_lo)
    p_hi = tl.where(topk_on, tl.minimum(p_hi, k_bin), p_hi)
    both = topk_on & topp_on
    # with both filters the top-k boundary bin is needed too: top-p uses the top-k set's mass
    lo = tl.where(both, p_lo, tl.where(topk_on, k_bin, tl.where(topp_on, p_lo, NB)))
    hi = tl.where(both, k_bin, tl.where(topk_on, k_bin, tl.where(topp_on, p_hi, NB - 1)))
    cut_above = minp_on & (m_hi < lo)
    lo = tl.where(cut_above, m_hi + 1, lo)
    hi = tl.where(cut_above, m_hi, hi)
    hi = tl.where(minp_on & (cut_above == 0) & (both == 0), tl.minimum(hi, m_hi), hi)
    return lo, hi, k_bin


@triton.jit
def _plan(hist_ptr, row, total, k, p, min_p, rest_count, rest_mass, MODE: tl.constexpr,
          NUM_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr):
    """Bins [lo, hi] that can hold the boundary of the kept prefix, from the bin counts alone.

    A token in bin j has (m - y) in [j, j + 1) / BINS_PER_NAT, so its w = exp(y - m) lies in
    [exp(-(j + 1) / R), exp(-j / R)] (R = BINS_PER_NAT, widened by BIN_EDGE_SLACK bins); the last
    bin holds w in [0, exp(-(NUM_BINS - 1) / R)]. The mass of bins 0..j is then bounded below by
    max(sum of lower bounds, total - sum of upper bounds of the later bins) and above likewise.

    Counts taken from a pre-list (``bin_count_kernel``) leave ``rest_count`` tokens of the row
    uncounted, somewhere past the pre-list's bins, with the exact mass ``rest_mass``: they join
    the last bin, whose mass is then that (0 and 0 for counts of the whole row). The boundary
    then lies inside the pre-list's bins (``_pre_list_holds_prefix``), before any of them.

    Returns (lo, hi, count before lo, tokens in [lo, hi], valid tokens, top-k on, top-p on,
    min-p on). Tokens in bins < lo are kept (if min-p keeps them), tokens in bins > hi are not.
    """
    b = tl.arange(0, NUM_BINS)
    last = b == NUM_BINS - 1
    cnt = tl.load(hist_ptr + row * NUM_BINS + b) + tl.where(last, rest_count, 0)
    cum = tl.cumsum(cnt, 0)
    n_valid = tl.sum(cnt, axis=0)
    bf = b.to(tl.float32)
    lo_w = tl.where(b < NUM_BINS - 1, tl.exp(-(bf + 1.0 + BIN_EDGE_SLACK) / BINS_PER_NAT), 0.0)
    hi_w = tl.minimum(tl.exp(-(bf - BIN_EDGE_SLACK) / BINS_PER_NAT), 1.0)
    cf = (cnt - tl.where(last, rest_count, 0)).to(tl.float32)
    lo_mass = cf * lo_w + tl.where(last, rest_mass, 0.0)
    hi_mass = cf * hi_w + tl.where(last, rest_mass, 0.0)
    lb_direct = tl.cumsum(lo_mass, 0)
    ub_direct = tl.cumsum(hi_mass, 0)
    tail_lo = tl.sum(lo_mass, axis=0) - lb_direct
    tail_hi = tl.sum(hi_mass, axis=0) - ub_direct
    slack = MASS_SLACK * total
    lb = tl.maximum(lb_direct, total - tail_hi) - slack
    ub = tl.minimum(ub_direct, total - tail_lo) + slack
    kk = tl.minimum(k, n_valid.to(tl.int64))
    # an absent filter arrives as k = n, p = 1, min_p = 0 (``_row_filters``): never on
    topk_on = k < n_valid
    topp_on = p < 1.0
    minp_on = min_p > 0.0
    m_hi = tl.minimum(tl.floor(-tl.log(tl.maximum(min_p, 1.5e-38)) * BINS_PER_NAT + BIN_EDGE_SLACK),
                      NUM_BINS - 1.0).to(tl.int32)
    lo, hi, k_bin = _choose_bins(cum.to(tl.int64), lb, ub, NUM_BINS, kk, total, p, topk_on, topp_on,
                                 minp_on, m_hi)
    if MODE == MODE_TOPK:
        lo = tl.full([], 0, tl.int32)
        hi = k_bin
    count_above = tl.sum(tl.where(b < lo, cnt, 0), axis=0)
    through_hi = tl.sum(tl.where(b <= hi, cnt, 0), axis=0)
    n_range = tl.maximum(through_hi - count_above, 0)
    return lo, hi, count_above, n_range, n_valid, topk_on, topp_on, minp_on


@triton.jit
def _pre_list_holds_prefix(pre_count, capacity, listed, total, n_valid, k, p, mp,
                           PRELIST_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr):
    """Whether a row's pre-list is complete and holds the boundary of every prefix its filters
    can keep, so that the plan may count the pre-list's bins alone (``bin_count_kernel``), the
    rest of the row being one lump of known count and mass (``_plan``'s rest). ``listed`` and
    ``total`` are the pre-listed tokens' mass and the row's, as floats.

    Top-k (alone or with top-p, which then works within the top-k set) keeps at most k tokens:
    k <= the list's length. Top-p alone: the list's mass reaches p of the row's, with room for
    four times the plan's MASS_SLACK. Min-p keeps tokens less than -ln(min_p) nats below the
    maximum: its last bin at least one bin inside the list's (min_p > about exp(-9.75)), unless
    top-k and top-p are both on (top-p then needs the mass of the whole top-k set, and the plan
    keeps the top-k boundary bin: past the list when k is longer than it, which would leave the
    compaction a boundary of the whole row). The margins keep the plan's bins [lo, hi] (float
    bounds, computed in another kernel) inside the list's bins."""
    topk_on = k < n_valid
    topp_on = p < 1.0
    minp_on = mp > 0.0
    by_k = topk_on & (k <= pre_count)
    by_p = (topk_on == 0) & topp_on & (listed >= p * total + 4.0 * MASS_SLACK * total)
    m_hi = tl.floor(-tl.log(tl.maximum(mp, 1.5e-38)) * BINS_PER_NAT + BIN_EDGE_SLACK)
    by_minp = minp_on & (m_hi < PRELIST_BINS - 1.0) & ((topk_on & topp_on) == 0)
    return (pre_count <= capacity) & (by_k | by_p | by_minp)


@triton.jit
def _fine_bin(y, m, lo, hi, FINE_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr):
    """Sub-bin of a token of bins lo..hi: FINE_BINS equal parts of [lo, hi + 1) in units of
    (m - y) * BINS_PER_NAT. Non-increasing in y, like ``_bin_of``."""
    # the maximum sits between the multiply and the subtraction so that no kernel contracts them
    # into an FMA: the compaction and the resolve pass must put every token in the same sub-bin
    d = tl.maximum((m - y) * BINS_PER_NAT, 0.0)
    f = (d - lo.to(tl.float32)) * (FINE_BINS / (hi - lo + 1).to(tl.float32))
    return tl.minimum(tl.maximum(f, 0.0), FINE_BINS - 1.0).to(tl.int32)


@triton.jit
def _plan_fine(fine_counts, lo, hi, count_above, mass_above, total, kk, p, min_p, topk_on,
               topp_on, minp_on, FINE_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr):
    """``_plan`` inside bins lo..hi, over their FINE_BINS sub-bins (``fine_counts``: the row's
    sub-bin histogram), starting from the exact count and fixed-point mass of the tokens before lo.
    Sub-bins are narrow, so the direct bounds on their masses are tight. Returns the sub-bins
    [lo, hi] that can hold the boundary."""
    f = tl.arange(0, FINE_BINS)
    cum = count_above.to(tl.int64) + tl.cumsum(fine_counts, 0).to(tl.int64)
    width = (hi - lo + 1).to(tl.float32) / FINE_BINS
    edge = lo.to(tl.float32) + f.to(tl.float32) * width
    lo_w = tl.exp(-(edge + width + BIN_EDGE_SLACK) / BINS_PER_NAT)
    hi_w = tl.minimum(tl.exp(-(edge - BIN_EDGE_SLACK) / BINS_PER_NAT), 1.0)
    cf = fine_counts.to(tl.float32)
    base = mass_above.to(tl.float32) * (1.0 / FIXED_ONE)
    slack = FINE_MASS_SLACK * total
    lb = base + tl.cumsum(cf * lo_w, 0) - slack
    ub = base + tl.cumsum(cf * hi_w, 0) + slack
    d_minp = -tl.log(tl.maximum(min_p, 1.5e-38)) * BINS_PER_NAT + BIN_EDGE_SLACK
    m_hi = tl.minimum(tl.maximum(tl.floor((d_minp - lo.to(tl.float32)) / width), -1.0),
                      FINE_BINS - 1.0).to(tl.int32)
    flo, fhi, k_bin = _choose_bins(cum, lb, ub, FINE_BINS, kk, total, p, topk_on, topp_on, minp_on,
                                   m_hi)
    return flo, fhi


# ------------------------------------------------------------------------------------------
# Kernels: greedy and unfiltered sampling
# ------------------------------------------------------------------------------------------

@triton.jit
def _race_pick(score_a, index_a, score_b, index_b):
    """The better of two race entries: the higher score, then the lower index. ``combine.pick``
    without its NaN terms: race scores and row maxima are never NaN (non-finite logits take no
    part, a finite logit's y is finite: clamped to +-FLT_MAX when scaled, the noise is finite).
    Entries that tie on both are the same pair (the fillers of empty lanes and masked slots), so
    the result never depends on the order the pairs meet in."""
    take_b = (score_b > score_a) | ((score_b == score_a) & (index_b < index_a))
    return tl.where(take_b, score_b, score_a), tl.where(take_b, index_b, index_a)


@triton.jit
def _winner(score, index, none_index):
    """(the highest score, the lowest index holding it) of a race; ``none_index`` is larger than
    every real index (the interpreted form's filler; empty entries may carry it too)."""
    if FUSED_REDUCTIONS:
        return tl.reduce((score, index), 0, _race_pick)
    else:
        top = tl.max(score, axis=0)
        return top, tl.min(tl.where(score == top, index, none_index), axis=0)


@triton.jit
def _race_lanes(lane_score, lane_index, keep, score, cols):
    """One segment's step of a lane-wise race: each lane keeps its best (score, index) among the
    tokens ``keep`` allows. Segments come in increasing index order, so a strict > keeps the
    lowest index of a tie."""
    take = keep & (score > lane_score)
    return tl.where(take, score, lane_score), tl.where(take, cols.to(tl.int32), lane_index)


@triton.jit
def _race_lanes_any_order(lane_score, lane_index, keep, score, cols):
    """``_race_lanes`` for tokens that come in no order of their indices (a list's): a tie goes to
    the lower index explicitly."""
    take = keep & ((score > lane_score) | ((score == lane_score) & (cols < lane_index)))
    return tl.where(take, score, lane_score), tl.where(take, cols.to(tl.int32), lane_index)


@triton.jit
def _store_race_winner(lane_score, lane_index, n, part_score_ptr, part_index_ptr, pid):
    """The lanes meet once: the program's winner (the lowest index among equal best scores;
    (-inf, n) when no token raced) stored at ``pid``."""
    best_score, best_index = _winner(lane_score, lane_index, n)
    tl.store(part_score_ptr + pid, best_score)
    tl.store(part_index_ptr + pid, best_index.to(tl.int64))


@triton.jit
def _race_program(x_ptr, n, stride_x, part_score_ptr, part_index_ptr, programs_per_row, temperature, seed,
                  seed_stride, offset, offset_stride, plan_ptr, pid, T_ROW: tl.constexpr,
                  SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr, NOISE: tl.constexpr,
                  WIDTH: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr, SURE_ONLY: tl.constexpr,
                  NUM_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr, PREFETCH: tl.constexpr,
                  UNIT_T: tl.constexpr, part_max_ptr, MAXIMA: tl.constexpr, min_p, segment_max_ptr,
                  MIN_P: tl.constexpr, MINP_ROW: tl.constexpr, PROGRAMS_POW2: tl.constexpr):
    """Race program ``pid``: of ``race_kernel`` (whose arguments these are), and with SURE_ONLY of
    ``compact_kernel``'s race programs, where only the sure-kept tokens race (bins before the
    plan's lo that min-p keeps), and only in the rows whose plan says they are raced in place
    (too many to list); the other rows' programs read their plan and store no winner. With
    MAXIMA (round 0 of ``descent_kernel``) it also stores the maximum of the finite tokens' y at
    ``part_max_ptr + pid``. With MIN_P (``race_kernel``'s) only the tokens min-p keeps race.

    Args (beyond ``race_kernel``'s):
        plan_ptr: SURE_ONLY: int32 [rows, PLAN_SLOTS], the plan ``plan_kernel`` wrote (lo,
            whether the row races in place, min_p's and the maximum's bits); otherwise unused.
        pid: the program's index among the race programs (rows * programs_per_row of them).
        SURE_ONLY, NUM_BINS, BINS_PER_NAT: race the sure-kept tokens only, binned as in
            ``compact_kernel``.
        part_max_ptr: float32 [rows, programs_per_row]: MAXIMA: written (this program's maximum);
            MIN_P: read (``segment_max_kernel``'s maxima on this plan); otherwise unused.
        MAXIMA: store the program's maximum.
        min_p, segment_max_ptr, MIN_P, MINP_ROW, PROGRAMS_POW2: as in ``race_kernel``.
    """
    row = pid // programs_per_row
    prog = (pid % programs_per_row).to(tl.int32)  # column arithmetic in int32 (n < 2^31)
    inv_t, noise_scale, t_ok = _row_temperature(temperature, row, T_ROW)
    s, stream, o = _row_random(seed, seed_stride, offset, offset_stride, row, SEED_TENSOR, OFFSET_TENSOR)
    # each lane keeps its best (score, index) across the segments (``_race_lanes``); the lanes
    # meet once at the end (``_store_race_winner``)
    lanes = tl.arange(0, WIDTH)
    lane_score = tl.full([WIDTH], float("-inf"), tl.float32)
    lane_index = tl.full([WIDTH], n, tl.int32)
    lane_max = tl.full([WIDTH], float("-inf"), tl.float32)
    race = True
    lo = 0
    m = 0.0
    mp = 0.0
    if SURE_ONLY:
        plan_row = plan_ptr + row * PLAN_SLOTS
        race = tl.load(plan_row + PLAN_RACE_IN_PLACE) != 0
        lo = tl.load(plan_row + PLAN_LO)
        m = tl.load(plan_row + PLAN_MAX_BITS).to(tl.float32, bitcast=True)
        mp = tl.load(plan_row + PLAN_MIN_P_BITS).to(tl.float32, bitcast=True)
    if MIN_P:
        # (the first segment's maximum is loaded beside the row maximum's partials)
        top = tl.load(segment_max_ptr + pid * SEGMENTS_PER_PROGRAM)
        m = _row_max(part_max_ptr, row, programs_per_row, PROGRAMS_POW2)
        if MINP_ROW:
            mp = tl.load(min_p + row).to(tl.float32)
        else:
            mp = tl.full([], min_p, tl.float32)
        race = (mp >= 0.0) & (mp <= 1.0)  # a row's invalid min_p races nothing: its token is -1
        minp_on = mp > 0.0  # as in ``_plan``
        if race:
            # A kept token has exp(y - m) >= min_p, so y - m >= ln(min_p) up to the exp's and the
            # log's approximations (far inside MIN_P_SKIP_MARGIN): a segment whose maximum lies
            # further below is skipped unread. Most segments of a peaked row keep no token, and the
            # plain race's cost is the read and the noise (Philox per token). min_p = 0, or one
            # below MIN_P_SKIP_LEAST, skips none; a row without a finite token (m = -inf: NaN
            # gaps) skips every segment.
            floor = tl.where(mp >= MIN_P_SKIP_LEAST, tl.log(mp) - MIN_P_SKIP_MARGIN, float("-inf"))
            # Each segment's maximum is loaded while the segment before is worked on, so that
            # a segment costs no round trip of its own before its logits' (loading a program's
            # maxima 8 at a time, as a mask, was 0.3-1.5 us slower at 64 rows on an H100).
            for j in range(SEGMENTS_PER_PROGRAM):
                following = j + 1
                next_top = tl.load(segment_max_ptr + pid * SEGMENTS_PER_PROGRAM + following,
                                   mask=following < SEGMENTS_PER_PROGRAM, other=float("-inf"))
                if top - m >= floor:
                    start = (prog * SEGMENTS_PER_PROGRAM + j) * WIDTH
                    cols = start + lanes
                    in_row = cols < n
                    x, valid, y = _logits_at(x_ptr, row, stride_x, cols, in_row, inv_t, UNIT_T)
                    # the test of a kept token that every pass deciding min-p takes
                    w, w_fixed = _fixed_mass(y, m, valid)
                    valid = valid & _min_p_keeps(w, mp, minp_on)
                    if NOISE:
                        y = y + noise_scale * _noise_tile(start >> 2, s, stream, o, WIDTH // 4)
                    lane_score, lane_index = _race_lanes(lane_score, lane_index, valid, y, cols)
                top = next_top
    elif race:
        raw = _first_segment(x_ptr, row, stride_x, prog, lanes, n, SEGMENTS_PER_PROGRAM, WIDTH, PREFETCH, "")
        for j in range(SEGMENTS_PER_PROGRAM):
            start = (prog * SEGMENTS_PER_PROGRAM + j) * WIDTH
            cols, in_row, x, valid, y, raw = _segment_logits(x_ptr, row, stride_x, prog, j, lanes, n, inv_t, raw,
                                                             SEGMENTS_PER_PROGRAM, WIDTH, PREFETCH, UNIT_T, "")
            if SURE_ONLY:
                # the compaction's own test of a sure-kept token, on the same values
                w, w_fixed = _fixed_mass(y, m, valid)
                # (the plan's mp is 0 where min-p is off)
                valid = valid & (_bin_of(x, y, m, valid, NUM_BINS, BINS_PER_NAT, False) < lo)
                valid = valid & _min_p_keeps(w, mp, True)
            if MAXIMA:
                lane_max = tl.maximum(lane_max, tl.where(valid, y, float("-inf")))
            if NOISE:
                y = y + noise_scale * _noise_tile(start >> 2, s, stream, o, WIDTH // 4)
            lane_score, lane_index = _race_lanes(lane_score, lane_index, valid, y, cols)
    if MAXIMA:
        tl.store(part_max_ptr + pid, tl.max(lane_max, axis=0))
    _store_race_winner(lane_score, lane_index, n, part_score_ptr, part_index_ptr, pid)


@triton.jit(do_not_specialize=RANDOM_ARGS)
def race_kernel(x_ptr, n, stride_x, part_score_ptr, part_index_ptr, programs_per_row,
                temperature, seed, seed_stride, offset, offset_stride, min_p, part_max_ptr, segment_max_ptr,
                T_ROW: tl.constexpr, SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr,
                NOISE: tl.constexpr, WIDTH: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr,
                PREFETCH: tl.constexpr = False,
                WAIT_FOR_PRIOR: tl.constexpr = False, RELEASE_DEPENDENTS: tl.constexpr = False,
                UNIT_T: tl.constexpr = False, MIN_P: tl.constexpr = False, MINP_ROW: tl.constexpr = False,
                PROGRAMS_POW2: tl.constexpr = 1):
    """Partial race (or argmax) over the segments of one program; grid rows * programs_per_row.
    (The filtered path's race of sure-kept tokens in place is the same program, run by
    ``compact_kernel``'s race programs.) With MIN_P, sampling under min-p alone: the tokens min-p
    keeps (exp(y - y_max) >= min_p) race, the row's maximum from ``segment_max_kernel``'s pass on
    the same plan; a row's kept set depends on its maximum alone, so no histogram is needed.

    Bytes: reads the row's logits once (MIN_P: the segments that can keep a token, and 4 bytes
    per program of the row and per segment of its own); writes 12 bytes per program.

    Args:
        x_ptr: logits [rows, n] (float32, bfloat16 or float16), last dimension contiguous.
        n: tokens per row.
        stride_x: elements between rows.
        part_score_ptr, part_index_ptr: float32 / int64 partial winners [rows, programs_per_row].
        programs_per_row: programs sharing a row.
        temperature: float, or float32 pointer [rows] with T_ROW.
        seed, offset: int64 values, or int64 pointers with SEED_TENSOR / OFFSET_TENSOR.
        seed_stride, offset_stride: 1 for per-row tensors, 0 for a tensor of one element.
        T_ROW: temperature is a float32 tensor [rows].
        SEED_TENSOR, OFFSET_TENSOR: seed / offset are tensors.
        NOISE: add the race noise (False: greedy argmax).
        WIDTH: tokens per segment (a power of two >= 32; a launch choice).
        SEGMENTS_PER_PROGRAM: consecutive segments one program reads.
        PREFETCH: load each segment before working on the previous one (``_segment_logits``; a
            launch choice, as in every row pass). Not with MIN_P, which loads a segment only once
            its maximum says it can keep a token.
        WAIT_FOR_PRIOR, RELEASE_DEPENDENTS: a programmatic dependent launch of the call's previous
            pass, letting the next one start early (``start_dependent_launch``).
        UNIT_T: temperature is the scalar 1 or 0: y is the logit itself (``_logits_from``).
        min_p: MIN_P: a float in [0, 1], or a float32 pointer [rows] with MINP_ROW (a value outside
            [0, 1] or NaN leaves its row without a token: -1); otherwise unused.
        part_max_ptr, segment_max_ptr: MIN_P: float32 [rows, programs_per_row] and
            [rows, programs_per_row * SEGMENTS_PER_PROGRAM], ``segment_max_kernel``'s maxima of
            programs and of segments (SEGMENT_MAXIMA) on this launch's plan; otherwise unused.
        MIN_P, MINP_ROW: race only the tokens min-p keeps; min_p is per row.
        PROGRAMS_POW2: MIN_P: the next power of two of programs_per_row.
    """
    start_dependent_launch(WAIT_FOR_PRIOR, RELEASE_DEPENDENTS)
    pid = tl.program_id(0).to(tl.int64)
    # (no plan without SURE_ONLY: part_score_ptr stands in for the unused plan_ptr)
    _race_program(x_ptr, n, stride_x, part_score_ptr, part_index_ptr, programs_per_row, temperature, seed,
                  seed_stride, offset, offset_stride, part_score_ptr, pid, T_ROW, SEED_TENSOR, OFFSET_TENSOR,
                  NOISE, WIDTH, SEGMENTS_PER_PROGRAM, False, 1, 1.0, PREFETCH, UNIT_T, part_max_ptr, False,
                  min_p, segment_max_ptr, MIN_P, MINP_ROW, PROGRAMS_POW2)


@triton.jit
def race_combine_kernel(part_score_ptr, part_index_ptr, out_ptr, programs_per_row, temperature,
                        T_ROW: tl.constexpr, PROGRAMS_POW2: tl.constexpr, WAIT_FOR_PRIOR: tl.constexpr = False):
    """Winner of a row's partial races; -1 for a row without a finite logit or with an invalid
    temperature. Grid rows.

    Bytes: reads 12 bytes per partial; writes one int64 per row.

    Args:
        part_score_ptr, part_index_ptr: partial winners [rows, programs_per_row].
        out_ptr: int64 token ids [rows].
        programs_per_row: partials per row.
        temperature, T_ROW: as in ``race_kernel`` (only its validity is used).
        PROGRAMS_POW2: next power of two of programs_per_row.
        WAIT_FOR_PRIOR: a programmatic dependent launch of ``race_kernel`` (``start_dependent_launch``).
    """
    start_dependent_launch(WAIT_FOR_PRIOR, False)
    row = tl.program_id(0).to(tl.int64)
    q = tl.arange(0, PROGRAMS_POW2)
    live = q < programs_per_row
    score = tl.load(part_score_ptr + row * programs_per_row + q, mask=live, other=float("-inf"))
    index = tl.load(part_index_ptr + row * programs_per_row + q, mask=live, other=INT64_MAX)
    top, at = _winner(score, index, INT64_MAX)
    inv_t, noise_scale, t_ok = _row_temperature(temperature, row, T_ROW)
    tl.store(out_ptr + row, tl.where(t_ok & (top > float("-inf")), at, -1))


# ------------------------------------------------------------------------------------------
# Kernels: the filtered path
# ------------------------------------------------------------------------------------------

@triton.jit
def segment_max_kernel(x_ptr, n, stride_x, part_max_ptr, hist_ptr, fine_ptr, counter_ptr,
                       prelist_count_ptr, programs_per_row, temperature, segment_max_ptr,
                       T_ROW: tl.constexpr, WIDTH: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr,
                       NUM_BINS: tl.constexpr, FINE_BINS: tl.constexpr, PREFETCH: tl.constexpr = False,
                       RELEASE_DEPENDENTS: tl.constexpr = False, UNIT_T: tl.constexpr = False,
                       READ_POLICY: tl.constexpr = "", CLEAR: tl.constexpr = True,
                       SEGMENT_MAXIMA: tl.constexpr = False):
    """Maximum of y = x / t over the finite tokens of each program's segments; with CLEAR (the
    filtered path) the first program of a row also clears the row's histograms and list counter.
    Grid rows * programs_per_row.

    Each lane keeps its own maximum across the segments and the lanes meet once at the end: one
    reduction per program, not one per segment (a maximum is exact in any order).

    Bytes: reads the logits once (the pass that brings them into L2); writes 4 bytes per program
    (SEGMENT_MAXIMA: and per segment).

    Args:
        x_ptr, n, stride_x: logits as in ``race_kernel``.
        part_max_ptr: float32 [rows, programs_per_row] out.
        hist_ptr: int32 [rows, NUM_BINS], cleared here (CLEAR; otherwise unused, as are the next three).
        fine_ptr: int32 [rows, FINE_BINS], cleared here.
        counter_ptr: int64 [rows], cleared here.
        prelist_count_ptr: int32 [rows], the pre-list lengths of ``bin_histogram_kernel``,
            cleared here.
        programs_per_row: programs sharing a row.
        temperature, T_ROW: as in ``race_kernel``.
        segment_max_ptr: SEGMENT_MAXIMA: float32 [rows, programs_per_row * SEGMENTS_PER_PROGRAM]
            out, each segment's maximum (-inf past the row, or with no finite token); otherwise
            unused.
        WIDTH, SEGMENTS_PER_PROGRAM, PREFETCH: as in ``race_kernel``.
        NUM_BINS, FINE_BINS: bins of the histogram and sub-bins of the boundary bins.
        RELEASE_DEPENDENTS: the histogram pass, a programmatic dependent launch, may start early
            (``start_dependent_launch``).
        UNIT_T: as in ``race_kernel``.
        READ_POLICY: the L2 eviction policy of the logits' loads (``_segment_logits``; a launch
            choice: the histogram pass reads the logits again).
        CLEAR: clear the row's histograms and counters (the filtered path; not min-p's race).
        SEGMENT_MAXIMA: store each segment's maximum too (min-p's race skips the segments that
            keep no token).
    """
    start_dependent_launch(False, RELEASE_DEPENDENTS)
    pid = tl.program_id(0).to(tl.int64)
    row = pid // programs_per_row
    prog = (pid % programs_per_row).to(tl.int32)  # column arithmetic in int32 (n < 2^31)
    inv_t, noise_scale, t_ok = _row_temperature(temperature, row, T_ROW)
    if CLEAR:
        if prog == 0:
            tl.store(hist_ptr + row * NUM_BINS + tl.arange(0, NUM_BINS), tl.zeros([NUM_BINS], tl.int32))
            tl.store(fine_ptr + row * FINE_BINS + tl.arange(0, FINE_BINS),
                     tl.zeros([FINE_BINS], tl.int32))
            tl.store(counter_ptr + row, 0)
            tl.store(prelist_count_ptr + row, 0)
    lanes = tl.arange(0, WIDTH)
    lane_max = tl.full([WIDTH], float("-inf"), tl.float32)
    raw = _first_segment(x_ptr, row, stride_x, prog, lanes, n, SEGMENTS_PER_PROGRAM, WIDTH, PREFETCH, READ_POLICY)
    for j in range(SEGMENTS_PER_PROGRAM):
        cols, in_row, x, finite, y, raw = _segment_logits(x_ptr, row, stride_x, prog, j, lanes, n, inv_t, raw,
                                                          SEGMENTS_PER_PROGRAM, WIDTH, PREFETCH, UNIT_T,
                                                          READ_POLICY)
        candidates = tl.where(finite, y, float("-inf"))
        lane_max = tl.maximum(lane_max, candidates)
        if SEGMENT_MAXIMA:
            tl.store(segment_max_ptr + pid * SEGMENTS_PER_PROGRAM + j, tl.max(candidates, axis=0))
    tl.store(part_max_ptr + pid, tl.max(lane_max, axis=0))


@triton.jit
def bin_histogram_kernel(x_ptr, n, stride_x, part_max_ptr, part_total_ptr, hist_ptr,
                         part_listed_ptr, part_valid_ptr, prelist_ptr, prelist_stride, prelist_count_ptr,
                         programs_per_row, temperature,
                         T_ROW: tl.constexpr, WIDTH: tl.constexpr,
                         SEGMENTS_PER_PROGRAM: tl.constexpr, PARTS_POW2: tl.constexpr,
                         NUM_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr,
                         ALL_VALUES: tl.constexpr, PRELIST_BINS: tl.constexpr = 0,
                         MASSES: tl.constexpr = True, PREFETCH: tl.constexpr = False,
                         WAIT_FOR_PRIOR: tl.constexpr = False, RELEASE_DEPENDENTS: tl.constexpr = False,
                         UNIT_T: tl.constexpr = False, READ_POLICY: tl.constexpr = ""):
    """The fixed-point mass of each program's tokens (per-lane integer sums, one reduction per
    program) and either the bin histogram of the row (integer atomics) or the pre-list. Grid
    rows * programs_per_row.

    With PRELIST_BINS > 0 it lists the tokens of bins 0 .. PRELIST_BINS - 1 (the pre-list: their
    indices, in no particular order, as many as fit in prelist_stride; the count goes on past
    it), and instead of the bin counts it writes each program's valid tokens and the mass of
    those it marked for the list: ``bin_count_kernel`` then counts the bins from the pre-list
    where it holds the row's kept prefix, from the row where not. When a row's kept prefix ends
    inside those bins and its pre-list is complete, the compaction reads the pre-list instead of
    the row (``compact_kernel``): in peaked rows a few thousand tokens instead of the vocabulary.
    Triton's histogram was half this pass's time (H200, 64 x 151936 fp32: the launch 47.5 us
    with it, 24.5 without).

    Bytes: reads the logits once (from L2) and the per-program maxima; writes 8 bytes per
    program and either at most NUM_BINS atomic adds per program or 12 more bytes per program
    and 4 bytes per pre-listed token with one atomic add per program (per LIST_CHUNK segments)
    that has any.

    Args:
        x_ptr, n, stride_x: logits as in ``race_kernel``.
        part_max_ptr: float32 [rows, programs_per_row] from ``segment_max_kernel``.
        part_total_ptr: int64 [rows, programs_per_row] out: the sum of w * 2^40 (truncated),
            w = exp(y - m), over the program's finite tokens.
        hist_ptr: int32 [rows, NUM_BINS], accumulated (PRELIST_BINS = 0).
        part_listed_ptr: int64 [rows, programs_per_row] out (PRELIST_BINS > 0): the sum of
            w * 2^40 (truncated) over the program's tokens of the pre-list's bins.
        part_valid_ptr: int32 [rows, programs_per_row] out (PRELIST_BINS > 0): the program's
            valid tokens (finite ones; every one with ALL_VALUES).
        programs_per_row, temperature, T_ROW, WIDTH, SEGMENTS_PER_PROGRAM, PREFETCH: as above; with
            PREFETCH the first segment is loaded before the wait of WAIT_FOR_PRIOR.
        PARTS_POW2: next power of two of programs_per_row.
        NUM_BINS, BINS_PER_NAT: the bins (see ``_bin_of``).
        ALL_VALUES: count non-finite logits too (top_k orders every value).
        MASSES: sum the masses. Without it (calls that no top-p can reach and that output no
            probabilities: nothing reads a mass) the masses written are 0 and no token's weight
            is taken: an exp, a conversion and 64-bit sums fewer per token.
        prelist_ptr: int32 [rows, prelist_stride] out: the pre-list (PRELIST_BINS > 0).
        prelist_count_ptr: int32 [rows] pre-list lengths (atomic), cleared by
            ``segment_max_kernel``; may exceed prelist_stride (then the list is incomplete).
        PRELIST_BINS: list the tokens of the bins below this (0: no pre-list). A program stops
            listing once it sees the row's count pass the capacity, or once a chunk of its
            segments marks more than twice its share of it (it then gives the row's list up).
        WAIT_FOR_PRIOR, RELEASE_DEPENDENTS, UNIT_T: as in ``race_kernel``.
        READ_POLICY: the L2 eviction policy of the logits' loads, as in ``segment_max_kernel``.
    """
    pid = tl.program_id(0).to(tl.int64)
    row = pid // programs_per_row
    prog = (pid % programs_per_row).to(tl.int32)  # column arithmetic in int32 (n < 2^31)
    lanes = tl.arange(0, WIDTH)
    # The logits are no pass's output: the first segment's loads go out before the wait for the
    # segment maxima, and their latency overlaps it and the maxima's load and reduction.
    raw = _first_segment(x_ptr, row, stride_x, prog, lanes, n, SEGMENTS_PER_PROGRAM, WIDTH, PREFETCH, READ_POLICY)
    start_dependent_launch(WAIT_FOR_PRIOR, RELEASE_DEPENDENTS)
    inv_t, noise_scale, t_ok = _row_temperature(temperature, row, T_ROW)
    m = _row_max(part_max_ptr, row, programs_per_row, PARTS_POW2)
    prelist_row = prelist_ptr + row * prelist_stride
    room = tl.full([], 1, tl.int1)  # (a tensor from the start: prelist_stride may be a constant 1)
    counts = tl.zeros([NUM_BINS], tl.int32)
    lane_mass = tl.zeros([WIDTH], tl.int64)
    # The pre-list's mass is the row's less that of the tokens left off it, whose weights are
    # below exp(-PRELIST_BINS / BINS_PER_NAT) * 2^40 (< 5.0e7 with the default 10 nats):
    # UNLISTED_SEGMENTS of them fit a lane's int32 sum, one 32-bit select and add per token
    # instead of two 64-bit ones. A shorter pre-list (a module setting) sums in int64.
    UNLISTED_32: tl.constexpr = (PRELIST_BINS >= 10 * BINS_PER_NAT) and (SEGMENTS_PER_PROGRAM <= UNLISTED_SEGMENTS)
    UNLISTED_TYPE: tl.constexpr = tl.int32 if UNLISTED_32 else tl.int64
    tl.static_assert(PRELIST_BINS < NUM_BINS)
    lane_unlisted = tl.zeros([WIDTH], UNLISTED_TYPE)
    lane_valid = tl.zeros([WIDTH], tl.int32)
    lane_bits = tl.zeros([WIDTH], tl.int32)
    bit = tl.full([], 0, tl.int32)  # segment j's place in its chunk
    for j in range(SEGMENTS_PER_PROGRAM):
        cols, in_row, x, finite, y, raw = _segment_logits(x_ptr, row, stride_x, prog, j, lanes, n, inv_t, raw,
                                                          SEGMENTS_PER_PROGRAM, WIDTH, PREFETCH, UNIT_T,
                                                          READ_POLICY)
        valid = in_row if ALL_VALUES else finite
        gap = _gap(y, m, finite)
        if MASSES:
            w_fixed = _fixed_weight(gap)
            lane_mass += w_fixed
        if PRELIST_BINS == 0:
            counts += tl.histogram(_bin_of_gap(x, gap, finite, NUM_BINS, BINS_PER_NAT, ALL_VALUES), NUM_BINS,
                                   mask=valid)
        else:
            # each lane marks its pre-list tokens, one bit per segment; the chunk's tokens are
            # listed together (a block sum, scan and atomic per segment cost this pass about 20 us
            # of 57 at 64 x 151936 on the H200)
            # ``_in_first_bins`` marks no token masked off, nor a non-finite one without
            # ALL_VALUES (its gap is -inf): no test of ``valid`` per token
            marked = _in_first_bins(x, gap, PRELIST_BINS, BINS_PER_NAT, ALL_VALUES)
            if not ALL_VALUES:
                # (with ALL_VALUES every column in the row is valid: counted once, below)
                lane_valid += finite.to(tl.int32)
            lane_bits |= marked.to(tl.int32) << bit
            if MASSES:
                lane_unlisted += tl.where(marked, 0, w_fixed.to(UNLISTED_TYPE))
            if SEGMENTS_PER_PROGRAM > LIST_CHUNK:  # (else only the last chunk, after the loop)
                if (bit == LIST_CHUNK - 1) & (j < SEGMENTS_PER_PROGRAM - 1):
                    if room:
                        # past the capacity the row reads its logits: this program lists no more
                        # (the row's count has passed the capacity for good)
                        room = _list_lane_tokens(prelist_row, prelist_stride, prelist_count_ptr + row, lane_bits,
                                                 (prog * SEGMENTS_PER_PROGRAM + j - bit) * WIDTH, LIST_CHUNK,
                                                 programs_per_row, lanes, WIDTH)
                    lane_bits = tl.zeros([WIDTH], tl.int32)
                    bit = tl.full([], -1, tl.int32)
            bit += 1
    if PRELIST_BINS == 0:
        tl.store(part_total_ptr + pid, tl.sum(lane_mass, axis=0))
        tl.atomic_add(hist_ptr + row * NUM_BINS + tl.arange(0, NUM_BINS), counts, mask=counts > 0, sem="relaxed")
    else:
        lane_unlisted = lane_unlisted.to(tl.int64)
        if FUSED_REDUCTIONS:
            total, unlisted, valid = tl.reduce((lane_mass, lane_unlisted, lane_valid), 0, _add_three)
        else:
            total = tl.sum(lane_mass, axis=0)
            unlisted = tl.sum(lane_unlisted, axis=0)
            valid = tl.sum(lane_valid, axis=0)
        tl.store(part_total_ptr + pid, total)
        tl.store(part_listed_ptr + pid, total - unlisted)
        if ALL_VALUES:
            valid = tl.minimum(tl.maximum(n - prog * (SEGMENTS_PER_PROGRAM * WIDTH), 0), SEGMENTS_PER_PROGRAM * WIDTH)
        tl.store(part_valid_ptr + pid, valid)
        # the last chunk, its `bit` segments, once the masses are out (fewer registers
        # live; asking for the places before the mass reduction, to overlap the atomic's round trip
        # with it, measured the same on the H200)
        if room:
            _list_lane_tokens(prelist_row, prelist_stride, prelist_count_ptr + row, lane_bits,
                              (prog * SEGMENTS_PER_PROGRAM + SEGMENTS_PER_PROGRAM - bit) * WIDTH, bit,
                              programs_per_row, lanes, WIDTH)


@triton.jit
def bin_count_kernel(x_ptr, n, stride_x, part_max_ptr, part_total_ptr, part_listed_ptr, part_valid_ptr,
                     hist_ptr, prelist_ptr, prelist_stride, prelist_count_ptr, list_rows_ptr,
                     programs_per_row, temperature, top_k, top_p, min_p, filters,
                     T_ROW: tl.constexpr, K_ROW: tl.constexpr, P_ROW: tl.constexpr, MINP_ROW: tl.constexpr,
                     WIDTH: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr, PARTS_POW2: tl.constexpr,
                     NUM_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr, ALL_VALUES: tl.constexpr,
                     PRELIST_BINS: tl.constexpr, PREFETCH: tl.constexpr = False,
                     WAIT_FOR_PRIOR: tl.constexpr = False, RELEASE_DEPENDENTS: tl.constexpr = False,
                     UNIT_T: tl.constexpr = False):
    """The bin histogram of each row after a histogram pass that made the pre-list
    (``bin_histogram_kernel`` with PRELIST_BINS > 0): of its pre-list's tokens where the list
    holds the row's kept prefix (``_pre_list_holds_prefix``; the plan adds the rest of the row as
    one lump), of the whole row where not (a flat row, or a prefix reaching past the list). Grid
    rows * programs_per_row, the histogram pass's programs; each row's first program records
    which way its row was counted for ``plan_kernel``.

    In peaked rows the pre-list is a few percent of the row: counting it, not the row, takes
    Triton's histogram (about 30 instructions per token and thread for 64 bins) off all but
    those tokens.

    Bytes: a pre-listed row reads its pre-list and the logits it names, another row its logits
    (from L2); both read the per-program partials and write at most NUM_BINS atomic adds per
    program, and 4 bytes per row.

    Args:
        x_ptr, n, stride_x, part_max_ptr, part_total_ptr, programs_per_row, temperature, T_ROW,
        WIDTH, SEGMENTS_PER_PROGRAM, PARTS_POW2, NUM_BINS, BINS_PER_NAT, ALL_VALUES, PREFETCH,
            PRELIST_BINS: as in ``bin_histogram_kernel``.
        part_listed_ptr, part_valid_ptr, prelist_ptr, prelist_stride, prelist_count_ptr: the
            pre-list and its partials, from ``bin_histogram_kernel``.
        hist_ptr: int32 [rows, NUM_BINS], accumulated (cleared by ``segment_max_kernel``).
        list_rows_ptr: int32 [rows] out: 1 where the row's counts are its pre-list's.
        top_k, top_p, min_p, filters, K_ROW, P_ROW, MINP_ROW: as in ``compact_kernel``.
        WAIT_FOR_PRIOR, RELEASE_DEPENDENTS, UNIT_T: as in ``race_kernel``.
    """
    pid = tl.program_id(0).to(tl.int64)
    row = pid // programs_per_row
    prog = (pid % programs_per_row).to(tl.int32)  # column arithmetic in int32 (n < 2^31)
    lanes = tl.arange(0, WIDTH)
    start_dependent_launch(WAIT_FOR_PRIOR, RELEASE_DEPENDENTS)
    inv_t, noise_scale, t_ok = _row_temperature(temperature, row, T_ROW)
    k, p, mp, f_ok = _row_filters(row, n, top_k, top_p, min_p, filters, K_ROW, P_ROW, MINP_ROW)
    m = _row_max(part_max_ptr, row, programs_per_row, PARTS_POW2)
    total = _row_sum(part_total_ptr, row, programs_per_row, PARTS_POW2).to(tl.float32) * (1.0 / FIXED_ONE)
    listed = _row_sum(part_listed_ptr, row, programs_per_row, PARTS_POW2).to(tl.float32) * (1.0 / FIXED_ONE)
    n_valid = _row_sum(part_valid_ptr, row, programs_per_row, PARTS_POW2)
    pre_count = tl.load(prelist_count_ptr + row)
    from_list = _pre_list_holds_prefix(pre_count, prelist_stride, listed, total, n_valid, k, p, mp,
                                       PRELIST_BINS, BINS_PER_NAT)
    if prog == 0:
        tl.store(list_rows_ptr + row, from_list.to(tl.int32))
    counts = tl.zeros([NUM_BINS], tl.int32)
    if from_list:
        # the programs share the list's segments as the compaction does (segment j * programs +
        # prog in step j); the list holds valid tokens of bins below PRELIST_BINS only
        prelist_row = prelist_ptr + row * prelist_stride
        for j in range(SEGMENTS_PER_PROGRAM):
            g = j * programs_per_row + prog
            if g * WIDTH < pre_count:
                places = g * WIDTH + lanes
                listed_here = places < pre_count
                cols = tl.load(prelist_row + places, mask=listed_here, other=0)
                x, finite, y = _logits_at(x_ptr, row, stride_x, cols, listed_here, inv_t, UNIT_T)
                valid = listed_here if ALL_VALUES else finite
                counts += tl.histogram(_bin_of(x, y, m, finite, NUM_BINS, BINS_PER_NAT, ALL_VALUES), NUM_BINS,
                                       mask=valid)
    else:
        raw = _first_segment(x_ptr, row, stride_x, prog, lanes, n, SEGMENTS_PER_PROGRAM, WIDTH, PREFETCH, "")
        for j in range(SEGMENTS_PER_PROGRAM):
            cols, in_row, x, finite, y, raw = _segment_logits(x_ptr, row, stride_x, prog, j, lanes, n, inv_t, raw,
                                                              SEGMENTS_PER_PROGRAM, WIDTH, PREFETCH, UNIT_T, "")
            valid = in_row if ALL_VALUES else finite
            counts += tl.histogram(_bin_of(x, y, m, finite, NUM_BINS, BINS_PER_NAT, ALL_VALUES), NUM_BINS,
                                   mask=valid)
    tl.atomic_add(hist_ptr + row * NUM_BINS + tl.arange(0, NUM_BINS), counts, mask=counts > 0, sem="relaxed")


@triton.jit
def plan_kernel(part_max_ptr, part_total_ptr, hist_ptr, plan_ptr, n, programs_per_row, temperature, top_k,
                top_p, min_p, filters, part_listed_ptr, part_valid_ptr, prelist_count_ptr, list_rows_ptr,
                T_ROW: tl.constexpr, K_ROW: tl.constexpr, P_ROW: tl.constexpr, MINP_ROW: tl.constexpr,
                MODE: tl.constexpr, SURE_LIST_MAX: tl.constexpr, PARTS_POW2: tl.constexpr,
                NUM_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr, LIST_COUNTS: tl.constexpr = False,
                WAIT_FOR_PRIOR: tl.constexpr = False, RELEASE_DEPENDENTS: tl.constexpr = False):
    """A row's plan, once, for the passes after the histogram: the bins [lo, hi] that can hold
    the boundary (``_plan``), the tokens before lo and in lo..hi, the valid tokens, whether the
    sure-kept tokens race in place, and the bits of min_p (0 when off) and of the maximum. Grid
    rows; meant for one warp, where the plan's two dozen sums, maxima and scans over the bins
    stay inside the warp (each compaction program deriving it again cost them 36 barriers
    among 4 warps on sm_90).

    Bytes: reads the per-program maxima and masses and the row's histogram (with LIST_COUNTS also
    the row's counting flag, and for a list-counted row its per-program valid counts and listed
    masses and its list's length); writes PLAN_SLOTS int32 per row.

    Args:
        part_max_ptr, part_total_ptr, hist_ptr: from ``segment_max_kernel`` and
            ``bin_histogram_kernel`` (hist_ptr from ``bin_count_kernel`` with LIST_COUNTS).
        plan_ptr: int32 [rows, PLAN_SLOTS] out.
        n, programs_per_row, PARTS_POW2, NUM_BINS, BINS_PER_NAT: as in ``bin_histogram_kernel``.
        temperature, top_k, top_p, min_p, filters, T_ROW, K_ROW, P_ROW, MINP_ROW, MODE: as in
            ``compact_kernel``.
        SURE_LIST_MAX: sampling: a row whose sure-kept bins hold at most this many tokens lists
            them all for ``resolve_kernel``; a row with more races them in place.
        LIST_COUNTS: the histogram came from ``bin_count_kernel``; a row it counted from its
            pre-list (list_rows_ptr) adds the rest of the row (valid tokens from part_valid_ptr
            less the list's length from prelist_count_ptr, the row's mass less the list's from
            part_listed_ptr) to its last bin. Otherwise those four pointers are not read.
        WAIT_FOR_PRIOR, RELEASE_DEPENDENTS: as in ``race_kernel``.
    """
    start_dependent_launch(WAIT_FOR_PRIOR, RELEASE_DEPENDENTS)
    row = tl.program_id(0).to(tl.int64)
    inv_t, noise_scale, t_ok = _row_temperature(temperature, row, T_ROW)
    k, p, mp, f_ok = _row_filters(row, n, top_k, top_p, min_p, filters, K_ROW, P_ROW, MINP_ROW)
    m = _row_max(part_max_ptr, row, programs_per_row, PARTS_POW2)
    total_fixed = _row_sum(part_total_ptr, row, programs_per_row, PARTS_POW2)
    total = total_fixed.to(tl.float32) * (1.0 / FIXED_ONE)
    rest_count = tl.full([], 0, tl.int32)
    rest_mass = tl.full([], 0.0, tl.float32)
    if LIST_COUNTS:
        if tl.load(list_rows_ptr + row) != 0:
            rest_count = _row_sum(part_valid_ptr, row, programs_per_row, PARTS_POW2) - tl.load(prelist_count_ptr + row)
            listed_fixed = _row_sum(part_listed_ptr, row, programs_per_row, PARTS_POW2)
            rest_mass = (total_fixed - listed_fixed).to(tl.float32) * (1.0 / FIXED_ONE)
    lo, hi, count_above, n_range, n_valid, topk_on, topp_on, minp_on = _plan(
        hist_ptr, row, total, k, p, mp, rest_count, rest_mass, MODE, NUM_BINS, BINS_PER_NAT)
    race_in_place = t_ok & f_ok & (n_valid > 0) & (count_above > SURE_LIST_MAX)
    if MODE != MODE_SAMPLE:
        race_in_place = False
    f = tl.arange(0, PLAN_SLOTS)
    slots = tl.where(f == PLAN_LO, lo, tl.where(f == PLAN_HI, hi, tl.where(
        f == PLAN_COUNT_ABOVE, count_above, tl.where(f == PLAN_VALID, n_valid, 0))))
    slots = tl.where(f == PLAN_RACE_IN_PLACE, race_in_place.to(tl.int32), slots)
    slots = tl.where(f == PLAN_MIN_P_BITS, tl.where(minp_on, mp.to(tl.int32, bitcast=True), 0), slots)
    slots = tl.where(f == PLAN_MAX_BITS, m.to(tl.int32, bitcast=True), slots)
    slots = tl.where(f == PLAN_RANGE, n_range, slots)
    tl.store(plan_ptr + row * PLAN_SLOTS + f, slots)


@triton.jit(do_not_specialize=RANDOM_ARGS)
def compact_kernel(x_ptr, n, stride_x, fine_ptr, counter_ptr,
                   plan_ptr, list_ptr, list_stride, part_mass_ptr, part_kept_ptr, part_score_ptr,
                   part_index_ptr, prelist_ptr, prelist_stride, prelist_count_ptr, programs_per_row,
                   temperature, top_k, top_p, min_p, filters, seed, seed_stride, offset, offset_stride,
                   race_from,
                   T_ROW: tl.constexpr, K_ROW: tl.constexpr, P_ROW: tl.constexpr,
                   MINP_ROW: tl.constexpr, SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr,
                   MODE: tl.constexpr, WIDTH: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr,
                   NUM_BINS: tl.constexpr,
                   BINS_PER_NAT: tl.constexpr, FINE_BINS: tl.constexpr, FINE_ABOVE: tl.constexpr,
                   ALL_VALUES: tl.constexpr, RACE_SURE: tl.constexpr = False,
                   RACE_PROGRAMS: tl.constexpr = False, RACE_PREFETCH: tl.constexpr = False,
                   PRELIST_BINS: tl.constexpr = 0, MASSES: tl.constexpr = True, PREFETCH: tl.constexpr = False,
                   WAIT_FOR_PRIOR: tl.constexpr = False, RELEASE_DEPENDENTS: tl.constexpr = False,
                   UNIT_T: tl.constexpr = False):
    """Sure-kept tokens (bins < lo): fixed-point mass sums and, when sampling in a row whose
    plan does not race them in place (at most ``plan_kernel``'s SURE_LIST_MAX of them), their
    indices, written from the end of the row's list (``resolve_kernel`` races them, drawing noise
    for those tokens alone); a row with more has them raced in place (noise for whole segments,
    in parallel), as the row's plan tells it: inside these programs' own loops with RACE_SURE,
    else, with RACE_PROGRAMS, by race programs of this launch (``_race_program`` with SURE_ONLY).
    Boundary tokens (bins lo..hi): their indices appended to the row's list and, when there are
    more than FINE_ABOVE of them, a histogram of their sub-bins. Grid rows * programs_per_row,
    and with RACE_PROGRAMS as many race programs after those.

    A row whose bins before lo and bins lo..hi all lie below PRELIST_BINS, whose pre-list
    (``bin_histogram_kernel``) is complete and whose sure-kept tokens are not raced in place
    reads its pre-list instead of the row: every token this pass counts or lists is on it. The
    programs share the pre-list's segments (segment j * programs_per_row + prog in step j);
    the results are the same integers and the same sets as from the row.

    Bytes: reads the logits once (from L2; a pre-listed row reads its pre-list and the logits it
    names) and the row's plan; writes 4 bytes per listed token (boundary or sure-kept) and 28
    bytes per program. A race program reads its row's plan and, in a row raced in place, its
    share of the logits (from L2); it writes 12 bytes.

    Args:
        x_ptr, n, stride_x, programs_per_row: as above.
        fine_ptr: int32 [rows, FINE_BINS] sub-bin histogram of the listed tokens (atomic).
        counter_ptr: int64 [rows] list lengths (atomic; the list order is irrelevant): boundary
            tokens in the low 32 bits, sure-kept tokens (sampling) in the high 32 bits.
        plan_ptr: int32 [rows, PLAN_SLOTS], the plan ``plan_kernel`` wrote.
        list_ptr: int32 [rows, list_stride] token indices out: boundary tokens from the front,
            sure-kept tokens (sampling) from position n - 1 down.
        list_stride: list capacity per row (>= n).
        part_mass_ptr: int64 [rows, programs_per_row] fixed-point mass of the sure-kept bins.
        part_kept_ptr: int64 [rows, programs_per_row] the same, counting min-p survivors only.
        part_score_ptr, part_index_ptr: float32 / int64 [rows, programs_per_row] out with
            RACE_SURE or RACE_PROGRAMS: the winner of the in-place race ((-inf, n): none);
            unused otherwise.
        race_from: with RACE_PROGRAMS, the first race program (rows * programs_per_row): race
            program race_from + i races the segments of compaction program i.
        temperature, top_k, top_p, min_p: scalars, or per-row pointers [rows] (flags *_ROW).
        seed, seed_stride, offset, offset_stride, SEED_TENSOR, OFFSET_TENSOR: as in
            ``race_kernel``.
        filters: which filters the call uses: 1 top-k, 2 top-p, 4 min-p (a runtime value: one
            compiled kernel serves every combination).
        MODE: MODE_SAMPLE, MODE_THRESHOLD or MODE_TOPK.
        RACE_SURE: sampling: race in place here, not in race programs. The noise costs this
            pass registers (sm_90, 64 x 151936 fp32: 128 -> 154, 4 programs of 4 warps per SM
            -> 3), so it is a launch choice for grids that fit on the device at 3 programs per
            SM, where race programs would only add their own time.
        RACE_PROGRAMS: sampling on larger grids: the in-place race by programs of this launch
            apart from the compaction's, which keep their registers (the race's 56 on sm_90 are
            fewer than the compaction's): the race costs no launch of its own (2.9 us on the
            H200 at 64 rows of 151936, idle in peaked rows). RACE_PREFETCH: their PREFETCH.
        WIDTH, SEGMENTS_PER_PROGRAM, PREFETCH: as above.
        NUM_BINS, BINS_PER_NAT, ALL_VALUES: as in ``bin_histogram_kernel``.
        FINE_BINS, FINE_ABOVE: sub-bins of bins lo..hi (``_fine_bin``), counted when the list
            will be longer than FINE_ABOVE tokens.
        prelist_ptr, prelist_stride, prelist_count_ptr, PRELIST_BINS: the pre-list, as
            ``bin_histogram_kernel`` wrote it (PRELIST_BINS = 0: every row reads its logits).
        MASSES: sum the sure-kept masses (as in ``bin_histogram_kernel``; 0 without it).
        WAIT_FOR_PRIOR, RELEASE_DEPENDENTS, UNIT_T: as in ``race_kernel``.
    """
    pid = tl.program_id(0).to(tl.int64)
    if RACE_PROGRAMS:
        if pid >= race_from:
            start_dependent_launch(WAIT_FOR_PRIOR, RELEASE_DEPENDENTS)
            _race_program(x_ptr, n, stride_x, part_score_ptr, part_index_ptr, programs_per_row, temperature,
                          seed, seed_stride, offset, offset_stride, plan_ptr, pid - race_from, T_ROW,
                          SEED_TENSOR, OFFSET_TENSOR, True, WIDTH, SEGMENTS_PER_PROGRAM, True, NUM_BINS,
                          BINS_PER_NAT, RACE_PREFETCH, UNIT_T, part_score_ptr, False, 0.0, part_score_ptr,
                          False, False, 1)
            return
    row = pid // programs_per_row
    prog = (pid % programs_per_row).to(tl.int32)  # column arithmetic in int32 (n < 2^31)
    lanes = tl.arange(0, WIDTH)
    if PRELIST_BINS == 0:
        # Without a pre-list every live row is read whole: the first segment's loads go out
        # before the wait for the plan, and their latency overlaps it and the plan's loads.
        raw = _first_segment(x_ptr, row, stride_x, prog, lanes, n, SEGMENTS_PER_PROGRAM, WIDTH, PREFETCH, "")
    start_dependent_launch(WAIT_FOR_PRIOR, RELEASE_DEPENDENTS)
    inv_t, noise_scale, valid_row, k, p, mp, s, stream, o = _row_setup(
        row, n, temperature, top_k, top_p, min_p, filters, seed, seed_stride, offset,
        offset_stride, T_ROW, K_ROW, P_ROW, MINP_ROW, SEED_TENSOR, OFFSET_TENSOR)
    plan_row = plan_ptr + row * PLAN_SLOTS
    lo = tl.load(plan_row + PLAN_LO)
    hi = tl.load(plan_row + PLAN_HI)
    n_range = tl.load(plan_row + PLAN_RANGE)
    n_valid = tl.load(plan_row + PLAN_VALID)
    race_in_place = tl.load(plan_row + PLAN_RACE_IN_PLACE) != 0
    m = tl.load(plan_row + PLAN_MAX_BITS).to(tl.float32, bitcast=True)
    minp_on = mp > 0.0  # as in ``_plan``: an absent min-p arrives as 0
    live_row = valid_row & (n_valid > 0)
    from_list = live_row & False
    pre_count = 0
    if PRELIST_BINS > 0:
        pre_count = tl.load(prelist_count_ptr + row)
        from_list = (live_row & (race_in_place == 0) & (lo <= PRELIST_BINS) & (hi < PRELIST_BINS)
                     & (pre_count <= prelist_stride))
    prelist_row = prelist_ptr + row * prelist_stride
    # per-lane integer sums (exact in any order), reduced once at the end; a segment costs one
    # reduction (its listed and sure-kept counts) and, when it has tokens to list, one scan and
    # one atomic that reserves their places at both ends of the list
    lane_mass = tl.zeros([WIDTH], tl.int64)
    lane_kept = tl.zeros([WIDTH], tl.int64)
    lane_score = tl.full([WIDTH], float("-inf"), tl.float32)
    lane_index = tl.full([WIDTH], n, tl.int32)
    fine = tl.zeros([FINE_BINS], tl.int32)
    # A pre-listed row has a few segments of list for the row's many programs: a program whose
    # first share lies past the list has nothing to count, and writes its zero sums without
    # reducing its lanes (most of a peaked row's programs, at 64 rows of 151936).
    if from_list & (prog * WIDTH >= pre_count):
        tl.store(part_mass_ptr + pid, tl.zeros([], tl.int64))
        tl.store(part_kept_ptr + pid, tl.zeros([], tl.int64))
        if RACE_SURE:
            _store_race_winner(lane_score, lane_index, n, part_score_ptr, part_index_ptr, pid)
        return
    if live_row:
        if PRELIST_BINS > 0:
            # (a pre-listed row prefetches nothing of its logits: no column is below 0)
            raw = _first_segment(x_ptr, row, stride_x, prog, lanes, tl.where(from_list, 0, n),
                                 SEGMENTS_PER_PROGRAM, WIDTH, PREFETCH, "")
        for j in range(SEGMENTS_PER_PROGRAM):
            g = j * programs_per_row + prog  # the pre-list's segment (a pre-listed row)
            if (from_list == 0) | (g * WIDTH < pre_count):
                if from_list:
                    places = g * WIDTH + lanes
                    in_row = places < pre_count
                    cols = tl.load(prelist_row + places, mask=in_row, other=0)
                    x, finite, y = _logits_at(x_ptr, row, stride_x, cols, in_row, inv_t, UNIT_T)
                else:
                    cols, in_row, x, finite, y, raw = _segment_logits(x_ptr, row, stride_x, prog, j, lanes, n,
                                                                      inv_t, raw, SEGMENTS_PER_PROGRAM, WIDTH,
                                                                      PREFETCH, UNIT_T, "")
                valid = in_row if ALL_VALUES else finite
                b = _bin_of(x, y, m, finite, NUM_BINS, BINS_PER_NAT, ALL_VALUES)
                above = valid & (b < lo)
                listed = valid & (b >= lo) & (b <= hi)
                w, w_fixed = _fixed_mass(y, m, finite)
                survives = _min_p_keeps(w, mp, minp_on)
                if MASSES:
                    lane_mass += tl.where(above, w_fixed, 0)
                    lane_kept += tl.where(above & survives, w_fixed, 0)
                # both counts (each <= WIDTH < 2^16) packed in one int32: one reduction, one scan
                sure = lanes < 0
                if MODE == MODE_SAMPLE:
                    sure = above & survives & (race_in_place == 0)
                    if RACE_SURE:
                        if race_in_place:
                            start = (prog * SEGMENTS_PER_PROGRAM + j) * WIDTH
                            score = y + noise_scale * _noise_tile(start >> 2, s, stream, o, WIDTH // 4)
                            lane_score, lane_index = _race_lanes(lane_score, lane_index, above & survives,
                                                                 score, cols)
                packed = listed.to(tl.int32) + sure.to(tl.int32) * 65536
                counts = tl.sum(packed, axis=0)
                if counts > 0:
                    c_list = counts % 65536
                    c_sure = counts // 65536
                    # relaxed: the atomic only hands out places; the list is read by a later launch (an
                    # acquire-release atomic fences every segment: MEMBAR.GPU, waiting on the prefetch)
                    bases = tl.atomic_add(counter_ptr + row, (c_sure.to(tl.int64) << 32) + c_list,
                                          sem="relaxed")
                    ranks = tl.cumsum(packed, 0)
                    row_list = list_ptr + row * list_stride
                    pos = (bases & 0xFFFFFFFF) + (ranks % 65536) - 1
                    _scatter_store(row_list + pos, cols.to(tl.int32), listed)
                    if MODE == MODE_SAMPLE:
                        spos = n - (bases >> 32) - (ranks // 65536)
                        _scatter_store(row_list + spos, cols.to(tl.int32), sure)
                    if n_range > FINE_ABOVE:
                        fine += tl.histogram(_fine_bin(y, m, lo, hi, FINE_BINS, BINS_PER_NAT),
                                             FINE_BINS, mask=listed)
        if n_range > FINE_ABOVE:
            tl.atomic_add(fine_ptr + row * FINE_BINS + tl.arange(0, FINE_BINS), fine, mask=fine > 0, sem="relaxed")
    tl.store(part_mass_ptr + pid, tl.sum(lane_mass, axis=0))
    tl.store(part_kept_ptr + pid, tl.sum(lane_kept, axis=0))
    if RACE_SURE:
        _store_race_winner(lane_score, lane_index, n, part_score_ptr, part_index_ptr, pid)


# ------------------------------------------------------------------------------------------
# Resolving the boundary among the listed tokens
# ------------------------------------------------------------------------------------------

@triton.jit
def _race_entries(keep, y, idx, seed, stream, offset, noise_scale):
    """Race entries (score, index) of listed tokens (scaled logits y, int64 indices idx): y - log(E)
    for the tokens ``keep`` allows, (-inf, INT64_MAX) for the others."""
    g = tl.where(noise_scale > 0.0, _noise_at(idx, seed, stream, offset), 0.0)
    return tl.where(keep, y + g, float("-inf")), tl.where(keep, idx, INT64_MAX)


@triton.jit
def _race_listed(keep, y, idx, seed, stream, offset, noise_scale, best_score, best_index):
    """Merge the race among listed tokens ``keep`` (scaled logits y, int64 indices idx) into the
    winner so far: the highest y - log(E), the lowest index on a tie. Returns (score, index)."""
    score, index = _race_entries(keep, y, idx, seed, stream, offset, noise_scale)
    top, at = _winner(score, index, INT64_MAX)
    return _race_pick(best_score, best_index, top, at)


@triton.jit
def _top_p_target(p, m_k):
    """The integer T with (mass before a token < p * m_k) == (mass before < T) for integer
    masses: ceil(p * m_k), taken in float64. Truncating instead kept nothing at all once
    p * m_k fell under one fixed-point unit (p below about 2^-40)."""
    return tl.ceil(p.to(tl.float64) * m_k.to(tl.float64)).to(tl.int64)


@triton.jit
def _sure_block(x_ptr, row, stride_x, list_ptr, list_stride, n, start, n_sure, inv_t, seed, stream, offset,
                noise_scale, BLOCK: tl.constexpr):
    """``_race_entries`` of the sure-kept tokens start .. start + BLOCK that ``compact_kernel``
    wrote from the end of the list (position n - 1 - j for the j-th)."""
    j = start + tl.arange(0, BLOCK)
    live = j < n_sure
    idx = tl.load(list_ptr + row * list_stride + (n - 1 - j), mask=live, other=0).to(tl.int64)
    x, finite, y = _logits_at(x_ptr, row, stride_x, idx, live, inv_t)
    return _race_entries(live, y, idx, seed, stream, offset, noise_scale)


@triton.jit
def _race_sure(first_score, first_index, x_ptr, row, stride_x, list_ptr, list_stride, n, n_sure, inv_t,
               seed, stream, offset, noise_scale, best_score, best_index, BLOCK: tl.constexpr):
    """The race among the sure-kept tokens, merged into the winner so far (score, index).
    ``first_score``, ``first_index``: ``_sure_block``'s entries of the first block, which the
    caller loads before the row's partials are reduced (after them, the two dependent loads of
    the list and the logits would wait for the reduction's barriers). Later blocks meet the
    first lane by lane (``_race_pick``: the order of the meetings does not matter), and the
    lanes meet once at the end."""
    lane_score = first_score
    lane_index = first_index
    start = tl.full([], BLOCK, tl.int32)
    while start < n_sure:  # a loop bound read from memory
        score, index = _sure_block(x_ptr, row, stride_x, list_ptr, list_stride, n, start, n_sure, inv_t,
                                   seed, stream, offset, noise_scale, BLOCK)
        lane_score, lane_index = _race_pick(lane_score, lane_index, score, index)
        start += BLOCK
    top, at = _winner(lane_score, lane_index, INT64_MAX)
    return _race_pick(best_score, best_index, top, at)


@triton.jit
def _finish(keep, comp, idx, x, y, w_fixed, rank, row, best_score, best_index, kept_above,
            kept_low, lo, hi, m, seed, stream, offset, noise_scale,
            token_ptr, lo_ptr, hi_ptr, thr_ptr, max_ptr, mass_ptr, values_ptr, indices_ptr,
            k_out, MODE: tl.constexpr):
    """Outputs of a row from its listed tokens, their keep flags and composite-order ranks.
    kept_low: the lowest composite key of the kept tokens taken out of the list before."""
    if MODE == MODE_SAMPLE:
        top, at = _race_listed(keep, y, idx, seed, stream, offset, noise_scale, best_score, best_index)
        tl.store(token_ptr + row, tl.where(top > float("-inf"), at, -1))
    elif MODE == MODE_THRESHOLD:
        total_kept = kept_above + tl.sum(tl.where(keep, w_fixed, 0), axis=0)
        tl.store(lo_ptr + row, lo)
        tl.store(hi_ptr + row, hi)
        tl.store(thr_ptr + row, tl.minimum(tl.min(tl.where(keep, comp, INT64_MAX), axis=0), kept_low))
        tl.store(max_ptr + row, m)
        tl.store(mass_ptr + row, total_kept.to(tl.float32) * (1.0 / FIXED_ONE))
    else:
        tl.store(values_ptr + row * k_out + rank, x.to(values_ptr.dtype.element_ty), mask=keep)
        tl.store(indices_ptr + row * k_out + rank, idx, mask=keep)


@triton.jit
def _list_block(x_ptr, row, stride_x, list_ptr, list_stride, start, count, m, inv_t,
                SIZE: tl.constexpr, ALL_VALUES: tl.constexpr):
    """Listed tokens start .. start + SIZE: (live, index, x, key, y, w, fixed-point w). (``_refine``
    takes the same values in three steps, ``_list_indices``, ``_gather_logits`` and
    ``_listed_values``, to issue later blocks' loads ahead of their work; composed from them here,
    the one-row resolve spilled 8-16 bytes more, offline sm_90, so this form stays.)"""
    j = start + tl.arange(0, SIZE)
    live = j < count
    idx = tl.load(list_ptr + row * list_stride + j, mask=live, other=0).to(tl.int64)
    x, finite, y = _logits_at(x_ptr, row, stride_x, idx, live, inv_t)
    w, w_fixed = _fixed_mass(y, m, finite)
    return live, idx, x, _ordered_key(x), y, w, w_fixed


@triton.jit
def _list_live(start, count, SIZE: tl.constexpr):
    """Which of a row's list places start .. start + SIZE hold tokens. (Recomputed where needed
    rather than carried through a loop: a carried mask takes another layout, and converting it
    back is a trip through shared memory with a barrier.)"""
    return start + tl.arange(0, SIZE) < count


@triton.jit
def _list_indices(list_ptr, row, list_stride, start, count, SIZE: tl.constexpr):
    """The int32 token indices at a row's list places start .. start + SIZE (0 past count)."""
    return tl.load(list_ptr + row * list_stride + start + tl.arange(0, SIZE),
                   mask=_list_live(start, count, SIZE), other=0)


@triton.jit
def _gather_logits(x_ptr, row, stride_x, start, count, idx, SIZE: tl.constexpr):
    """The row's logits at the ``_list_indices`` of places start .. start + SIZE (0 past count)."""
    return tl.load(x_ptr + row * stride_x + idx, mask=_list_live(start, count, SIZE), other=0.0)


@triton.jit
def _listed_values(start, count, idx, raw, m, inv_t, SIZE: tl.constexpr):
    """``_list_block``'s values from a block's ``_list_indices`` and ``_gather_logits``."""
    live = _list_live(start, count, SIZE)
    x, finite, y = _logits_from(raw, live, inv_t)
    w, w_fixed = _fixed_mass(y, m, finite)
    return live, idx.to(tl.int64), x, _ordered_key(x), y, w, w_fixed


@triton.jit
def _resolve_short(x_ptr, row, stride_x, list_ptr, list_stride, n_list, count_above, mass_above,
                   kept_above, kept_low, best_score, best_index, m, total_fixed, inv_t, noise_scale,
                   kk, p, mp, topk_on, topp_on, minp_on, seed, stream, offset, lo, hi,
                   token_ptr, lo_ptr, hi_ptr, thr_ptr, max_ptr, mass_ptr, values_ptr, indices_ptr,
                   k_out, MODE: tl.constexpr, SIZE: tl.constexpr, SORT: tl.constexpr,
                   CHUNK: tl.constexpr, ALL_VALUES: tl.constexpr):
    """The boundary among at most SIZE listed tokens: the rank of each in the composite order and
    the fixed-point mass before it give every filter's decision exactly. Ranks come from all
    pairwise comparisons, CHUNK tokens at a time (cheap for short lists), or with SORT from a
    sort and a prefix sum."""
    live, idx, x, key, y, w, w_fixed = _list_block(x_ptr, row, stride_x, list_ptr, list_stride, 0,
                                                   n_list, m, inv_t, SIZE, ALL_VALUES)
    comp = tl.where(live, _composite(key, idx), INT64_MIN)
    if SORT:
        comp = tl.sort(comp, descending=True)
        key, idx = _split_composite(comp)
        x = _key_value(key)
        rank = tl.arange(0, SIZE)
        live = rank < n_list
        y = _scaled(x, inv_t)
        finite = live & (tl.abs(x) < float("inf"))
        w, w_fixed = _fixed_mass(y, m, finite)
        mass_before = tl.cumsum(w_fixed, 0) - w_fixed
    else:
        rank = tl.zeros([SIZE], tl.int32)
        mass_before = tl.zeros([SIZE], tl.int64)
        for c in tl.static_range(SIZE // CHUNK):
            # a chunk that starts at or past the list's end holds no live token and changes
            # nothing: skipped, a short list pays for the chunks it fills, not for the tile
            if c * CHUNK < n_list:
                c_live, c_idx, c_x, c_key, c_y, c_w, c_fixed = _list_block(
                    x_ptr, row, stride_x, list_ptr, list_stride, c * CHUNK, n_list, m, inv_t, CHUNK,
                    ALL_VALUES)
                c_comp = tl.where(c_live, _composite(c_key, c_idx), INT64_MIN)
                ahead = c_comp[None, :] > comp[:, None]  # [j, i]: chunk token i comes before token j
                rank += tl.sum(ahead.to(tl.int32), axis=1)
                mass_before += tl.sum(tl.where(ahead, c_fixed[None, :], 0), axis=1)
    pos = count_above + rank
    keep = live & ((topk_on == 0) | (pos < kk))
    m_k = tl.where(topk_on, mass_above + tl.sum(tl.where(live & (pos < kk), w_fixed, 0), axis=0),
                   total_fixed)
    target = _top_p_target(p, m_k)
    keep = keep & ((topp_on == 0) | (mass_above + mass_before < target))
    keep = keep & _min_p_keeps(w, mp, minp_on)
    _finish(keep, comp, idx, x, y, w_fixed, rank, row, best_score, best_index, kept_above,
            kept_low, lo, hi, m, seed, stream, offset, noise_scale, token_ptr, lo_ptr, hi_ptr,
            thr_ptr, max_ptr,
            mass_ptr, values_ptr, indices_ptr, k_out, MODE)


@triton.jit
def _search_keys(x_ptr, row, stride_x, list_ptr, list_stride, start, n_list, m, inv_t, tie_key,
                 USE_MASS: tl.constexpr, TIES: tl.constexpr, BLOCK: tl.constexpr,
                 ALL_VALUES: tl.constexpr):
    """Search keys and weights of a block of listed tokens. TIES=False: key = the logit's ordered
    key, all tokens take part. TIES=True: only tokens whose key is tie_key take part, with key =
    -index (so that, here too, a larger key comes first in the composite order)."""
    live, idx, x, key, y, w, w_fixed = _list_block(x_ptr, row, stride_x, list_ptr, list_stride,
                                                   start, n_list, m, inv_t, BLOCK, ALL_VALUES)
    weight = w_fixed if USE_MASS else live.to(tl.int64)
    if TIES:
        part = live & (key == tie_key)
        skey = -idx
    else:
        part = live
        skey = key.to(tl.int64)
    return part, skey, tl.where(part, weight, 0)


@triton.jit
def _search_largest(x_ptr, row, stride_x, list_ptr, list_stride, n_list, m, inv_t, base, target,
                    tie_key, USE_MASS: tl.constexpr, TIES: tl.constexpr, BLOCK: tl.constexpr,
                    SLOTS: tl.constexpr, ALL_VALUES: tl.constexpr):
    """Largest key c of a taking-part token with base + sum(weight of keys >= c) >= target, by a
    bracket search: each pass evaluates SLOTS - 1 evenly spaced thresholds inside [lo, hi) and
    shrinks the bracket to the tokens' own keys in the one sub-interval that holds the answer.
    Needs base + total weight >= target > base. Integer weights: exact in any order."""
    kmin = tl.full([], SEARCH_BIG, tl.int64)
    kmax = tl.full([], -SEARCH_BIG, tl.int64)
    start = tl.full([], 0, tl.int32)
    while start < n_list:  # a loop bound read from memory
        part, skey, weight = _search_keys(x_ptr, row, stride_x, list_ptr, list_stride, start, n_list,
                                          m, inv_t, tie_key, USE_MASS, TIES, BLOCK, ALL_VALUES)
        kmin = tl.minimum(kmin, tl.min(tl.where(part, skey, SEARCH_BIG), axis=0))
        kmax = tl.maximum(kmax, tl.max(tl.where(part, skey, -SEARCH_BIG), axis=0))
        start += BLOCK
    lo = kmin
    hi = kmax + 1
    slot = tl.arange(0, SLOTS)
    while hi - lo > 1:
        # thresholds lo + span * (q + 1) / SLOTS; the last one is hi itself
        cuts = lo + ((hi - lo) * (slot + 1).to(tl.int64)) // SLOTS
        reach = tl.zeros([SLOTS], tl.int64)
        smin = tl.zeros([SLOTS], tl.int64) + SEARCH_BIG
        smax = tl.zeros([SLOTS], tl.int64) - SEARCH_BIG
        start = tl.full([], 0, tl.int32)
        while start < n_list:  # a loop bound read from memory
            part, skey, weight = _search_keys(x_ptr, row, stride_x, list_ptr, list_stride, start,
                                              n_list, m, inv_t, tie_key, USE_MASS, TIES, BLOCK,
                                              ALL_VALUES)
            ge = part[None, :] & (skey[None, :] >= cuts[:, None])
            reach += tl.sum(tl.where(ge, weight[None, :], 0), axis=1)
            inside = part & (skey >= lo) & (skey < hi)
            sub = tl.sum(ge.to(tl.int32), axis=0)
            hit = inside[None, :] & (sub[None, :] == slot[:, None])
            smin = tl.minimum(smin, tl.min(tl.where(hit, skey[None, :], SEARCH_BIG), axis=1))
            smax = tl.maximum(smax, tl.max(tl.where(hit, skey[None, :], -SEARCH_BIG), axis=1))
            start += BLOCK
        # reach is non-increasing along the slots; the answer lies in sub-interval q*
        q_star = tl.sum((base + reach >= target).to(tl.int32), axis=0)
        lo = tl.sum(tl.where(slot == q_star, smin, 0), axis=0)
        hi = tl.sum(tl.where(slot == q_star, smax, 0), axis=0) + 1
    return lo


@triton.jit
def _threshold(x_ptr, row, stride_x, list_ptr, list_stride, n_list, m, inv_t, base, target,
               USE_MASS: tl.constexpr, BLOCK: tl.constexpr, SLOTS: tl.constexpr,
               ALL_VALUES: tl.constexpr):
    """Composite key of the first listed token (composite order) at which base + the cumulative
    count (or mass) reaches target: the listed tokens kept are those with a key >= it."""
    total = base
    start = tl.full([], 0, tl.int32)
    while start < n_list:  # a loop bound read from memory
        part, skey, weight = _search_keys(x_ptr, row, stride_x, list_ptr, list_stride, start, n_list,
                                          m, inv_t, 0, USE_MASS, False, BLOCK, ALL_VALUES)
        total += tl.sum(weight, axis=0)
        start += BLOCK
    # never reached: keep every listed token; reached before the list: keep none of them
    result = tl.where(total < target, INT64_MIN, INT64_MAX).to(tl.int64)
    if (total >= target) & (target > base):
        v = _search_largest(x_ptr, row, stride_x, list_ptr, list_stride, n_list, m, inv_t, base,
                            target, 0, USE_MASS, False, BLOCK, SLOTS, ALL_VALUES)
        above_v = base
        start = tl.full([], 0, tl.int32)
        while start < n_list:  # a loop bound read from memory
            part, skey, weight = _search_keys(x_ptr, row, stride_x, list_ptr, list_stride, start,
                                              n_list, m, inv_t, 0, USE_MASS, False, BLOCK, ALL_VALUES)
            above_v += tl.sum(tl.where(skey > v, weight, 0), axis=0)
            start += BLOCK
        neg_index = _search_largest(x_ptr, row, stride_x, list_ptr, list_stride, n_list, m, inv_t,
                                    above_v, target, v.to(tl.int32), USE_MASS, True, BLOCK, SLOTS,
                                    ALL_VALUES)
        result = _composite(v.to(tl.int32), -neg_index)
    return result


@triton.jit
def _move_to_front(list_ptr, row, list_stride, written, idx, keep):
    """Write the kept tokens of a block read from the list at positions written, written + 1, ...
    and return the new count. In place: the write position never passes the read position, and
    the barrier keeps every read of the block before the writes."""
    keep_i = keep.to(tl.int32)
    pos = written + tl.cumsum(keep_i, 0) - 1
    tl.debug_barrier()
    _scatter_store(list_ptr + row * list_stride + pos, idx.to(tl.int32), keep)
    return written + tl.sum(keep_i, axis=0)


@triton.jit
def _gather_top_k(x_ptr, row, stride_x, list_ptr, list_stride, n_list, kk, m, inv_t,
                  BLOCK: tl.constexpr, SLOTS: tl.constexpr, ALL_VALUES: tl.constexpr):
    """top_k with a list too long to sort (a huge tie group): the k-th token by ``_threshold``,
    then the k kept tokens moved to the front of the list (in place: the write position never
    passes the read position). Returns k."""
    thr = _threshold(x_ptr, row, stride_x, list_ptr, list_stride, n_list, m, inv_t,
                     tl.full([], 0, tl.int64), kk, False, BLOCK, SLOTS, ALL_VALUES)
    written = tl.full([], 0, tl.int32)
    start = tl.full([], 0, tl.int32)
    while start < n_list:  # a loop bound read from memory
        live, idx, x, key, y, w, w_fixed = _list_block(x_ptr, row, stride_x, list_ptr, list_stride,
                                                       start, n_list, m, inv_t, BLOCK, ALL_VALUES)
        keep = live & (_composite(key, idx) >= thr)
        written = _move_to_front(list_ptr, row, list_stride, written, idx, keep)
        start += BLOCK
    tl.debug_barrier()
    return written


@triton.jit
def _resolve_search(x_ptr, row, stride_x, list_ptr, list_stride, n_list, count_above, mass_above,
                    kept_above, kept_low, best_score, best_index, m, total_fixed, inv_t, noise_scale,
                    kk, p, mp, topk_on, topp_on, minp_on, seed, stream, offset, lo, hi,
                    token_ptr, lo_ptr, hi_ptr, thr_ptr, max_ptr, mass_ptr,
                    MODE: tl.constexpr, BLOCK: tl.constexpr, SLOTS: tl.constexpr,
                    ALL_VALUES: tl.constexpr):
    """The same decisions as ``_resolve_short`` for longer lists (sampling and thresholds): the
    top-k and top-p boundaries are found by ``_threshold``, then one more pass finishes."""
    thr_k = tl.full([], INT64_MIN, tl.int64)
    if topk_on:
        thr_k = _threshold(x_ptr, row, stride_x, list_ptr, list_stride, n_list, m, inv_t,
                           count_above.to(tl.int64), kk, False, BLOCK, SLOTS, ALL_VALUES)
    thr = thr_k
    if topp_on:
        m_k = total_fixed
        if topk_on:
            m_k = mass_above
            start = tl.full([], 0, tl.int32)
            while start < n_list:  # a loop bound read from memory
                live, idx, x, key, y, w, w_fixed = _list_block(x_ptr, row, stride_x, list_ptr,
                                                               list_stride, start, n_list, m, inv_t,
                                                               BLOCK, ALL_VALUES)
                m_k += tl.sum(tl.where(_composite(key, idx) >= thr_k, w_fixed, 0), axis=0)
                start += BLOCK
        target = _top_p_target(p, m_k)
        thr_p = _threshold(x_ptr, row, stride_x, list_ptr, list_stride, n_list, m, inv_t,
                           mass_above, target, True, BLOCK, SLOTS, ALL_VALUES)
        thr = tl.maximum(thr_k, thr_p)
    top = best_score
    at = best_index
    total_kept = kept_above
    low = kept_low
    start = tl.full([], 0, tl.int32)
    while start < n_list:  # a loop bound read from memory
        live, idx, x, key, y, w, w_fixed = _list_block(x_ptr, row, stride_x, list_ptr,
                                                       list_stride, start, n_list, m, inv_t,
                                                       BLOCK, ALL_VALUES)
        comp = _composite(key, idx)
        keep = live & (comp >= thr) & _min_p_keeps(w, mp, minp_on)
        if MODE == MODE_SAMPLE:
            top, at = _race_listed(keep, y, idx, seed, stream, offset, noise_scale, top, at)
        else:
            total_kept += tl.sum(tl.where(keep, w_fixed, 0), axis=0)
            low = tl.minimum(low, tl.min(tl.where(keep, comp, INT64_MAX), axis=0))
        start += BLOCK
    if MODE == MODE_SAMPLE:
        tl.store(token_ptr + row, tl.where(top > float("-inf"), at, -1))
    else:
        tl.store(lo_ptr + row, lo)
        tl.store(hi_ptr + row, hi)
        tl.store(thr_ptr + row, low)
        tl.store(max_ptr + row, m)
        tl.store(mass_ptr + row, total_kept.to(tl.float32) * (1.0 / FIXED_ONE))


@triton.jit
def _refine_block(list_ptr, row, list_stride, block, flo, fhi, lo, hi, written, count_above, mass_above,
                  kept_above, best_score, best_index, kept_low, m, noise_scale, mp, minp_on, seed, stream,
                  offset, MODE: tl.constexpr, FINE_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr):
    """One block of ``_refine``'s pass over the list (``block``: ``_list_block``'s values; flo..fhi
    the boundary's sub-bins, ``written`` the tokens moved to the front so far). Returns the
    running values after it, as ``_refine`` returns them (list length written so far first)."""
    live, idx, x, key, y, w, w_fixed = block
    f = _fine_bin(y, m, lo, hi, FINE_BINS, BINS_PER_NAT)
    sure = live & (f < flo)
    inside = live & (f >= flo) & (f <= fhi)
    survives = sure & _min_p_keeps(w, mp, minp_on)
    if FUSED_REDUCTIONS:
        sure_count, sure_mass, sure_kept = tl.reduce(
            (sure.to(tl.int32), tl.where(sure, w_fixed, 0), tl.where(survives, w_fixed, 0)), 0, _add_three)
    else:
        sure_count = tl.sum(sure.to(tl.int32), axis=0)
        sure_mass = tl.sum(tl.where(sure, w_fixed, 0), axis=0)
        sure_kept = tl.sum(tl.where(survives, w_fixed, 0), axis=0)
    count_above += sure_count
    mass_above += sure_mass
    kept_above += sure_kept
    if MODE == MODE_SAMPLE:
        best_score, best_index = _race_listed(survives, y, idx, seed, stream, offset, noise_scale,
                                              best_score, best_index)
    else:
        kept_low = tl.minimum(kept_low, tl.min(tl.where(survives, _composite(key, idx), INT64_MAX), axis=0))
    written = _move_to_front(list_ptr, row, list_stride, written, idx, inside)
    return written, count_above, mass_above, kept_above, best_score, best_index, kept_low


@triton.jit
def _refine(x_ptr, row, stride_x, list_ptr, list_stride, n_list, fine_counts, lo, hi, count_above,
            mass_above, kept_above, best_score, best_index, m, total, inv_t, noise_scale, kk, p, mp,
            topk_on, topp_on, minp_on, seed, stream, offset, MODE: tl.constexpr,
            BLOCK: tl.constexpr, FINE_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr,
            ALL_VALUES: tl.constexpr):
    """Shorten a long list with the sub-bin histogram (``fine_counts``): listed tokens in sub-bins
    before the boundary's are kept for sure (their exact mass and count join the sure-kept totals
    and, when sampling, they race here), those after it are dropped, and those in the boundary
    sub-bins are moved to the front of the list (in place: the write position never passes the
    read position).

    The first block's indices and logits are loaded before the sub-bin plan, whose scans and
    reductions then run while those loads are in flight (after them, the loads would wait for
    the plan's barriers: two more round trips on the row's path). The pass over the rest keeps
    two blocks in flight: while a block is worked on, the next one's logits and the indices of
    the one after are loaded (a block's own two dependent loads had cost two round trips each:
    on flat rows, lists of about 17700 tokens, 47 us of the 61 us one-row resolve by the stamps,
    results/h200-resolve-stamps-flat.txt). Their places lie past every place a move to the front
    writes (the write position never passes the start of the block being worked on).

    Returns (list length, count, mass and min-p mass of the sure-kept tokens, race winner so far,
    lowest composite key of the sure-kept tokens min-p keeps)."""
    first = _list_block(x_ptr, row, stride_x, list_ptr, list_stride, 0, n_list, m, inv_t, BLOCK, ALL_VALUES)
    next_idx = _list_indices(list_ptr, row, list_stride, BLOCK, n_list, BLOCK)
    next_raw = _gather_logits(x_ptr, row, stride_x, BLOCK, n_list, next_idx, BLOCK)
    after_idx = _list_indices(list_ptr, row, list_stride, 2 * BLOCK, n_list, BLOCK)
    flo, fhi = _plan_fine(fine_counts, lo, hi, count_above, mass_above, total, kk, p, mp, topk_on,
                          topp_on, minp_on, FINE_BINS, BINS_PER_NAT)
    written, count_above, mass_above, kept_above, best_score, best_index, kept_low = _refine_block(
        list_ptr, row, list_stride, first, flo, fhi, lo, hi, tl.full([], 0, tl.int32), count_above, mass_above,
        kept_above, best_score, best_index, tl.full([], INT64_MAX, tl.int64), m, noise_scale, mp, minp_on, seed,
        stream, offset, MODE, FINE_BINS, BINS_PER_NAT)
    start = tl.full([], BLOCK, tl.int32)
    while start < n_list:  # a loop bound read from memory
        # the loads of the next two blocks first, then the work on this one
        idx, raw = next_idx, next_raw
        next_raw = _gather_logits(x_ptr, row, stride_x, start + BLOCK, n_list, after_idx, BLOCK)
        next_idx = after_idx
        after_idx = _list_indices(list_ptr, row, list_stride, start + 2 * BLOCK, n_list, BLOCK)
        block = _listed_values(start, n_list, idx, raw, m, inv_t, BLOCK)
        written, count_above, mass_above, kept_above, best_score, best_index, kept_low = _refine_block(
            list_ptr, row, list_stride, block, flo, fhi, lo, hi, written, count_above, mass_above, kept_above,
            best_score, best_index, kept_low, m, noise_scale, mp, minp_on, seed, stream, offset, MODE, FINE_BINS,
            BINS_PER_NAT)
        start += BLOCK
    tl.debug_barrier()
    return written, count_above, mass_above, kept_above, best_score, best_index, kept_low


@triton.jit(do_not_specialize=RANDOM_ARGS)
def resolve_kernel(x_ptr, n, stride_x, part_max_ptr, part_total_ptr, fine_ptr, counter_ptr, plan_ptr,
                   list_ptr,
                   list_stride, part_mass_ptr, part_kept_ptr, part_score_ptr, part_index_ptr,
                   compact_programs,
                   temperature, top_k, top_p, min_p, filters, seed, seed_stride, offset, offset_stride,
                   token_ptr, lo_ptr, hi_ptr, thr_ptr, max_ptr, mass_ptr, values_ptr, indices_ptr,
                   k_out,
                   T_ROW: tl.constexpr, K_ROW: tl.constexpr, P_ROW: tl.constexpr,
                   MINP_ROW: tl.constexpr, SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr,
                   MODE: tl.constexpr,
                   PARTS_POW2: tl.constexpr, SORT_SMALL: tl.constexpr, PAIR_CHUNK: tl.constexpr,
                   SORT_LARGE: tl.constexpr,
                   SEARCH_BLOCK: tl.constexpr, SLOTS: tl.constexpr, FINE_BINS: tl.constexpr,
                   BINS_PER_NAT: tl.constexpr, ALL_VALUES: tl.constexpr, SURE_PARTIALS: tl.constexpr = True,
                   SURE_LIST: tl.constexpr = True, WAIT_FOR_PRIOR: tl.constexpr = False,
                   SORT_MID: tl.constexpr = False):
    """One program per row: when sampling, the race among the sure-kept tokens first; then the
    exact prefix boundary among the listed tokens, and the row's outputs. A list longer than
    SORT_SMALL is first shortened with the sub-bin histogram (``_refine``; not for MODE_TOPK,
    whose lists are sorted). Grid rows.

    Bytes: reads the listed indices and their logits (a sort of at most SORT_LARGE of them, or
    a few passes over a longer list), the sure-kept ones once when sampling, and the per-program
    partials; writes one token (sampling), five numbers (thresholds) or k values and indices
    (top-k) per row.

    Args:
        x_ptr, n, stride_x, part_max_ptr, part_total_ptr, fine_ptr, counter_ptr, plan_ptr, list_ptr,
        list_stride, part_mass_ptr, part_kept_ptr: as in ``plan_kernel`` and ``compact_kernel``
            (fine_ptr and the lists as the compaction left them).
        part_score_ptr, part_index_ptr: float32 / int64 [rows, compact_programs]: the partial
            winners of the in-place race of sure-kept tokens (``compact_kernel`` with RACE_SURE or
            RACE_PROGRAMS); read only in MODE_SAMPLE with SURE_PARTIALS.
        SURE_PARTIALS: those partial winners were written (False when no row can race in place:
            a scalar top_k <= SURE_LIST_MAX bounds every row's sure-kept tokens).
        SURE_LIST: the compaction may have listed a row's sure-kept tokens for this pass to race
            (MODE_SAMPLE; False when every row races them in place: nothing to load early).
        compact_programs: programs per row of ``compact_kernel`` (partials per row).
        temperature .. offset and their flags: as in ``compact_kernel``.
        token_ptr: int64 [rows] sampled tokens (MODE_SAMPLE; -1: no finite logit or an invalid
            parameter).
        lo_ptr, hi_ptr, thr_ptr, max_ptr, mass_ptr: int32, int32, int64, float32, float32 [rows]
            (MODE_THRESHOLD): sure-kept bins < lo, boundary bins lo..hi where a token is kept if
            its composite key >= thr, the maximum, and the kept mass relative to exp(max).
        values_ptr, indices_ptr: [rows, k_out] top-k values (logits dtype) and int64 indices.
        k_out: k of ``top_k`` (MODE_TOPK).
        MODE, ALL_VALUES: as above.
        PARTS_POW2: next power of two of compact_programs.
        SORT_SMALL: lists up to this long are ranked by pairwise comparisons, PAIR_CHUNK tokens at
            a time, on as many tiles of [SORT_SMALL, PAIR_CHUNK] as the list fills (lists of at
            most PAIR_CHUNK tokens, an empty one included, on one tile of [PAIR_CHUNK,
            PAIR_CHUNK]); longer ones take the sort (SORT_MID) or the bracket search.
        SORT_LARGE: MODE_TOPK sorts lists up to this long; a longer one (a huge tie group) is cut
            to its k tokens by the bracket search first (k_out <= SORT_LARGE).
        SORT_MID: sampling and thresholds: a list still longer than SORT_SMALL after the
            sub-bin refinement is sorted too when it has at most SORT_LARGE tokens (ranks and
            masses from the sort and a prefix sum, as top_k's), instead of taking the bracket
            search. The same decisions either way.
        SEARCH_BLOCK: tokens per block of the passes over a list (the sure-kept race, the sub-bin
            refinement, the bracket search).
        SLOTS: sub-intervals per pass of the bracket search.
        FINE_BINS, BINS_PER_NAT: the bins, as in ``compact_kernel``.
        WAIT_FOR_PRIOR: a programmatic dependent launch of the previous pass (``start_dependent_launch``).
    """
    start_dependent_launch(WAIT_FOR_PRIOR, False)
    row = tl.program_id(0).to(tl.int64)
    inv_t, noise_scale, valid_row, kk_raw, p, mp, s, stream, o = _row_setup(
        row, n, temperature, top_k, top_p, min_p, filters, seed, seed_stride, offset,
        offset_stride, T_ROW, K_ROW, P_ROW, MINP_ROW, SEED_TENSOR, OFFSET_TENSOR)
    # The plan and the list lengths are loaded before the partials are reduced: a load after the
    # reduction's barriers would wait for them, one more round trip on the row's path.
    lo = tl.load(plan_ptr + row * PLAN_SLOTS + PLAN_LO)
    hi = tl.load(plan_ptr + row * PLAN_SLOTS + PLAN_HI)
    count_above = tl.load(plan_ptr + row * PLAN_SLOTS + PLAN_COUNT_ABOVE)
    n_valid = tl.load(plan_ptr + row * PLAN_SLOTS + PLAN_VALID)
    counts = tl.load(counter_ptr + row)
    # the boundary bins' sub-bin histogram, for ``_refine`` (read whether or not the list is long:
    # ``segment_max_kernel`` clears it for every row in every mode, the compaction counts into it)
    fine_counts = tl.load(fine_ptr + row * FINE_BINS + tl.arange(0, FINE_BINS))
    n_sure = (counts >> 32).to(tl.int32)
    RACE_LISTED_SURE: tl.constexpr = (MODE == MODE_SAMPLE) and SURE_LIST
    if RACE_LISTED_SURE:
        # the first block of the sure-kept race, for the same reason (``_race_sure``). Its loads
        # wait for the list counter, and ptxas issues the partials' loads after them: a round trip
        # more before the reduction, which the early block repays only where a row can have listed
        # sure-kept tokens (SURE_LIST; one row of 151936: 1.0-1.5 us slower without that flag)
        sure_score, sure_index = _sure_block(x_ptr, row, stride_x, list_ptr, list_stride, n, 0, n_sure,
                                             inv_t, s, stream, o, noise_scale, SEARCH_BLOCK)
    q = tl.arange(0, PARTS_POW2)
    live = q < compact_programs
    # the partial winners of the sure-kept tokens raced in place (sampling only)
    raced = live & (MODE == MODE_SAMPLE) & SURE_PARTIALS
    m, total_fixed, mass_above, kept_above, best_score, best_index = _row_partials(
        part_max_ptr, part_total_ptr, part_mass_ptr, part_kept_ptr, part_score_ptr, part_index_ptr,
        row * compact_programs + q, live, raced)
    total = total_fixed.to(tl.float32) * (1.0 / FIXED_ONE)
    # as in ``_plan``: an absent filter arrives as k = n, p = 1, min_p = 0
    topk_on = kk_raw < n_valid
    topp_on = p < 1.0
    minp_on = mp > 0.0
    kk = tl.minimum(kk_raw, n_valid.to(tl.int64))
    n_list = (counts & 0xFFFFFFFF).to(tl.int32)
    kept_low = tl.full([], INT64_MAX, tl.int64)
    if valid_row & (n_valid > 0):
        if RACE_LISTED_SURE:
            best_score, best_index = _race_sure(sure_score, sure_index, x_ptr, row, stride_x, list_ptr,
                                                list_stride, n, n_sure, inv_t, s, stream, o, noise_scale,
                                                best_score, best_index, SEARCH_BLOCK)
        # Shorten the boundary list first (top-k: gather the k-th neighbourhood; otherwise refine
        # by sub-bins), then resolve it: ranked pairwise when short, else sorted (top-k) or searched.
        if MODE == MODE_TOPK:
            if n_list > SORT_LARGE:
                n_list = _gather_top_k(x_ptr, row, stride_x, list_ptr, list_stride, n_list, kk, m,
                                       inv_t, SEARCH_BLOCK, SLOTS, ALL_VALUES)
        else:
            if n_list > SORT_SMALL:
                n_list, count_above, mass_above, kept_above, best_score, best_index, kept_low = \
                    _refine(x_ptr, row, stride_x, list_ptr, list_stride, n_list, fine_counts, lo, hi,
                            count_above, mass_above, kept_above, best_score, best_index, m, total,
                            inv_t, noise_scale, kk, p, mp, topk_on, topp_on, minp_on, s, stream, o,
                            MODE, SEARCH_BLOCK, FINE_BINS, BINS_PER_NAT, ALL_VALUES)
        # Sampling and thresholds rank a list of at most one chunk on one chunk's tiles (the
        # ranking costs its tiles' full size whatever the list's length; the min-p boundary list
        # is often empty). top_k, whose lists are rarely that short, keeps one code path.
        ONE_CHUNK: tl.constexpr = MODE != MODE_TOPK
        if ONE_CHUNK and (n_list <= PAIR_CHUNK):
            _resolve_short(x_ptr, row, stride_x, list_ptr, list_stride, n_list, count_above,
                           mass_above, kept_above, kept_low, best_score, best_index, m, total_fixed,
                           inv_t, noise_scale, kk, p, mp, topk_on, topp_on, minp_on, s, stream,
                           o, lo, hi, token_ptr, lo_ptr, hi_ptr, thr_ptr, max_ptr, mass_ptr,
                           values_ptr, indices_ptr, k_out, MODE, PAIR_CHUNK, False, PAIR_CHUNK,
                           ALL_VALUES)
        elif n_list <= SORT_SMALL:
            _resolve_short(x_ptr, row, stride_x, list_ptr, list_stride, n_list, count_above,
                           mass_above, kept_above, kept_low, best_score, best_index, m, total_fixed,
                           inv_t, noise_scale, kk, p, mp, topk_on, topp_on, minp_on, s, stream,
                           o, lo, hi, token_ptr, lo_ptr, hi_ptr, thr_ptr, max_ptr, mass_ptr,
                           values_ptr, indices_ptr, k_out, MODE, SORT_SMALL, False, PAIR_CHUNK,
                           ALL_VALUES)
        else:
            searched = tl.full([], MODE != MODE_TOPK, tl.int1)
            if (MODE == MODE_TOPK) or SORT_MID:
                if n_list <= SORT_LARGE:  # (always for top_k: its list was cut to SORT_LARGE above)
                    _resolve_short(x_ptr, row, stride_x, list_ptr, list_stride, n_list, count_above,
                                   mass_above, kept_above, kept_low, best_score, best_index, m, total_fixed,
                                   inv_t, noise_scale, kk, p, mp, topk_on, topp_on, minp_on, s, stream,
                                   o, lo, hi, token_ptr, lo_ptr, hi_ptr, thr_ptr, max_ptr, mass_ptr,
                                   values_ptr, indices_ptr, k_out, MODE, SORT_LARGE, True, 1, ALL_VALUES)
                    searched = False
            if MODE != MODE_TOPK:
                if searched:
                    _resolve_search(x_ptr, row, stride_x, list_ptr, list_stride, n_list, count_above,
                                    mass_above, kept_above, kept_low, best_score, best_index, m,
                                    total_fixed, inv_t, noise_scale, kk, p, mp, topk_on, topp_on, minp_on,
                                    s, stream, o, lo, hi, token_ptr, lo_ptr, hi_ptr, thr_ptr, max_ptr,
                                    mass_ptr, MODE, SEARCH_BLOCK, SLOTS, ALL_VALUES)
    else:
        if MODE == MODE_SAMPLE:
            tl.store(token_ptr + row, -1)
        elif MODE == MODE_THRESHOLD:
            # nothing kept: no bin is before lo, every bin is after hi
            tl.store(lo_ptr + row, 0)
            tl.store(hi_ptr + row, -1)
            tl.store(thr_ptr + row, INT64_MAX)
            tl.store(max_ptr + row, m)
            tl.store(mass_ptr + row, 0.0)


@triton.jit
def apply_filter_kernel(x_ptr, n, stride_x, out_ptr, stride_out, lo_ptr, hi_ptr, thr_ptr, max_ptr,
                        mass_ptr, min_p, programs_per_row,
                        MINP_ROW: tl.constexpr, HAS_MINP: tl.constexpr, PROBS: tl.constexpr,
                        WIDTH: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr,
                        NUM_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr):
    """Masked logits (-inf where filtered out) or renormalised probabilities (0 where filtered
    out; NaN for a row without a finite logit). Grid rows * programs_per_row.

    Bytes: reads the logits once and writes the output once (plus 24 bytes per row).

    Args:
        x_ptr, n, stride_x: logits as in ``race_kernel``.
        out_ptr, stride_out: output [rows, n] (logits dtype, or float32 with PROBS).
        lo_ptr .. mass_ptr: the MODE_THRESHOLD outputs of ``resolve_kernel``.
        min_p, MINP_ROW: as in ``compact_kernel``.
        HAS_MINP: the call uses min-p.
        programs_per_row, WIDTH, SEGMENTS_PER_PROGRAM, NUM_BINS, BINS_PER_NAT: as above.
        PROBS: write probabilities instead of masked logits.
    """
    pid = tl.program_id(0).to(tl.int64)
    row = pid // programs_per_row
    prog = (pid % programs_per_row).to(tl.int32)  # column arithmetic in int32 (n < 2^31)
    lo = tl.load(lo_ptr + row)
    hi = tl.load(hi_ptr + row)
    thr = tl.load(thr_ptr + row)
    m = tl.load(max_ptr + row)
    mass = tl.load(mass_ptr + row)
    if HAS_MINP:
        if MINP_ROW:
            mp = tl.load(min_p + row).to(tl.float32)
        else:
            mp = tl.full([], min_p, tl.float32)
    else:
        mp = tl.full([], 0.0, tl.float32)
    lanes = tl.arange(0, WIDTH)
    for j in range(SEGMENTS_PER_PROGRAM):
        cols = (prog * SEGMENTS_PER_PROGRAM + j) * WIDTH + lanes
        in_row = cols < n
        x, finite, y = _logits_at(x_ptr, row, stride_x, cols, in_row, 1.0)
        b = _bin_of(x, y, m, finite, NUM_BINS, BINS_PER_NAT, False)
        w, w_fixed = _fixed_mass(y, m, finite)
        keep = finite & ((b < lo) | ((b <= hi) & (_composite(_ordered_key(x), cols) >= thr)))
        keep = keep & _min_p_keeps(w, mp, mp > 0.0)
        if PROBS:
            out = tl.where(keep, w / tl.where(mass > 0.0, mass, 1.0), 0.0)
            out = tl.where(mass > 0.0, out, float("nan"))
        else:
            out = tl.where(keep, x, float("-inf"))  # x is exact in float32: the cast restores it
        tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=in_row)


# ------------------------------------------------------------------------------------------
# top_k by group maxima (``_ops.sampling.top_k_lanes_rows``: top_k on CUDA from a few rows)
# ------------------------------------------------------------------------------------------
# The row's tokens fall into groups: group q of program p holds lanes q * GROUP .. (q + 1) *
# GROUP - 1 of each of the program's segments. With composite keys (distinct), every token of
# the row's top k lies in one of the k groups whose maxima are the row's k largest group maxima
# (had its group not been among them, the k groups above it would hold k tokens above it). So:
# one pass keeps each group's maximum and writes each program's k largest (a program's share of
# those k groups is among its own k best); one program per row then finds the k largest of them,
# reads those groups' tokens again (k x GROUP x segments per program) and ranks the few that can
# be among the top k. Two launches, one read of the row. Groups of several lanes keep the first
# pass's sort short: a sort of 1024 lanes took about 4100 SASS instructions per thread (offline
# sm_90, 4 warps). The finishing program bounds what it sorts (see its docstring): one
# program's sort is a chain of dependent steps, about 50 us for 2048 int64 at 8 warps.

@triton.jit
def top_k_lanes_kernel(x_ptr, n, stride_x, cand_ptr, programs_per_row, k, cand_stride,
                       WIDTH: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr, GROUP: tl.constexpr,
                       FINITE_ONLY: tl.constexpr = False, RELEASE_DEPENDENTS: tl.constexpr = False):
    """Each program's k largest group maxima (composite order), sorted, into its k candidates.
    Grid rows * programs_per_row.

    Bytes: reads the logits once; writes 8 * k bytes per program.

    Args:
        x_ptr, n, stride_x: logits [rows, n], last dimension contiguous.
        cand_ptr: int64 [rows, cand_stride] out: program p's k best group maxima (as
            composites) at [p * k, (p + 1) * k), the best first (``INT64_MIN`` for groups
            without a token); the rest of the row is the finishing program's scratch.
        programs_per_row: programs sharing a row, each with SEGMENTS_PER_PROGRAM segments.
        k: candidates per program (k <= WIDTH // GROUP).
        cand_stride: the candidates' row stride (at least programs_per_row * k).
        WIDTH: tokens per segment.
        SEGMENTS_PER_PROGRAM: segments per program.
        GROUP: lanes per group.
        FINITE_ONLY: only finite logits take part (sampling's top-k set); else every value does,
            NaN above +inf (``top_k``'s order).
        RELEASE_DEPENDENTS: ``top_k_lanes_finish_kernel`` is a programmatic dependent launch.
    """
    start_dependent_launch(False, RELEASE_DEPENDENTS)
    pid = tl.program_id(0).to(tl.int64)
    row = pid // programs_per_row
    prog = pid % programs_per_row
    lanes = tl.arange(0, WIDTH)
    best = tl.full([WIDTH], INT64_MIN, tl.int64)
    for j in range(SEGMENTS_PER_PROGRAM):
        cols = (prog * SEGMENTS_PER_PROGRAM + j) * WIDTH + lanes
        in_row = cols < n
        x = tl.load(x_ptr + row * stride_x + cols, mask=in_row, other=0.0).to(tl.float32)
        takes_part = in_row
        if FINITE_ONLY:
            takes_part = in_row & (tl.abs(x) < float("inf"))
        best = tl.maximum(best, tl.where(takes_part, _composite(_ordered_key(x), cols), INT64_MIN))
    groups = tl.sort(tl.max(tl.reshape(best, [WIDTH // GROUP, GROUP]), axis=1), descending=True)
    q = tl.arange(0, WIDTH // GROUP)
    tl.store(cand_ptr + row * cand_stride + prog * k + q, groups, mask=q < k)


@triton.jit
def _top_k_lanes_store(x_ptr, row, stride_x, values_ptr, indices_ptr, k, ranked, place):
    """The first k of ``ranked`` (composites, the best first; ``place`` its positions) as the
    row's values (as stored in the row: the key maps -0.0 to +0.0 and every NaN to one) and
    indices."""
    _, index = _split_composite(ranked)
    first = place < k
    tl.store(values_ptr + row * k + place, tl.load(x_ptr + row * stride_x + index, mask=first), mask=first)
    tl.store(indices_ptr + row * k + place, index, mask=first)


@triton.jit
def _top_k_lanes_race(ranked, place, row, k, token_ptr, inv_t, noise_scale, ok, p, mp, seed, stream, offset,
                      MASSES: tl.constexpr):
    """The race among the first k of ``ranked`` (composites of finite logits, the best first;
    ``place`` its positions) and, with MASSES, those of them top-p (on the top k's own mass)
    and min-p keep (p and min_p as ``_row_filters`` gives them: an absent filter reads 1 or 0),
    decided as the pipeline's resolve decides them (``_resolve_short``: on where p < 1 and
    min_p > 0, the same fixed-point weights summed in the composite order, the same target,
    the same w): the token
    with the highest y - log(E), the lowest index on a tie, stored at ``row`` of ``token_ptr``
    (-1 where no token races or the row's parameters are invalid)."""
    key, index = _split_composite(ranked)
    keep = (place < k) & (ranked != INT64_MIN)
    # the logit from its key: exact for finite values (-0.0 comes back as +0.0: the same y)
    y = _scaled(_key_value(key), inv_t)
    if MASSES:
        m = tl.max(tl.where(place == 0, y, float("-inf")), 0)  # the row's largest y: its best token's
        w, w_fixed = _fixed_mass(y, m, keep)
        mass_before = tl.cumsum(w_fixed, 0) - w_fixed
        target = _top_p_target(p, tl.sum(w_fixed, 0))
        topp_on = p < 1.0  # as in ``_plan``
        minp_on = mp > 0.0
        keep = keep & ((topp_on == 0) | (mass_before < target))
        keep = keep & _min_p_keeps(w, mp, minp_on)
    score, index = _race_entries(keep, y, index, seed, stream, offset, noise_scale)
    top, at = _winner(score, index, INT64_MAX)
    tl.store(token_ptr + row, tl.where((top > float("-inf")) & ok, at, -1))


@triton.jit(do_not_specialize=RANDOM_ARGS)
def top_k_lanes_finish_kernel(x_ptr, n, stride_x, cand_ptr, values_ptr, indices_ptr, programs_per_row, k,
                              cand_stride, token_ptr, temperature, top_p, min_p, filters, seed, seed_stride,
                              offset, offset_stride, WIDTH: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr,
                              GROUP: tl.constexpr, HEAD: tl.constexpr, HEADS: tl.constexpr, CANDS: tl.constexpr,
                              SURVIVORS: tl.constexpr, K_POW2: tl.constexpr, GATHER: tl.constexpr,
                              KEPT: tl.constexpr, SAMPLE: tl.constexpr = False, MASSES: tl.constexpr = False,
                              T_ROW: tl.constexpr = False, P_ROW: tl.constexpr = False,
                              MINP_ROW: tl.constexpr = False, SEED_TENSOR: tl.constexpr = False,
                              OFFSET_TENSOR: tl.constexpr = False, WAIT_FOR_PRIOR: tl.constexpr = False):
    """The top k of each row (values and indices, the composite order's first k) from the
    candidates of ``top_k_lanes_kernel``, or (SAMPLE) the token its race picks among the top k
    of the row's finite logits, with top-p and min-p inside them. Grid rows.

    Sorts stay short (a sort in one program is a chain of dependent steps: offline sm_90, two
    sorts of 2048 int64 at 8 warps ran about 100 us): the k-th largest of the programs' HEAD
    best candidates is a lower bound of the row's k-th best group, and at most k + (k // HEAD)
    * (k - HEAD) candidates reach it (a program with candidates at or above it past its head
    has its whole head there, among the k); they are sorted. The k-th best group's maximum is a
    lower bound of the row's k-th token, and the tokens of the k best groups that reach it are
    sorted when there are at most KEPT of them, else all of them are.

    Bytes: reads 8 * (programs_per_row * k) bytes of candidates and k * GROUP *
    SEGMENTS_PER_PROGRAM logits (from L2) per row, and (not SAMPLE) the k values again; writes
    k values and k int64 indices (SAMPLE: one int64 token) and at most SURVIVORS + K_POW2 +
    KEPT int64 of scratch.

    Args:
        x_ptr, n, stride_x: logits as in ``top_k_lanes_kernel``.
        cand_ptr: int64 [rows, cand_stride]: the row's programs_per_row * k candidates from
            ``top_k_lanes_kernel``, then scratch passed between the program's threads: SURVIVORS
            places, K_POW2 for the k best groups, KEPT for the tokens that reach the bound.
        values_ptr: [rows, k] out, the logits' dtype (not SAMPLE).
        indices_ptr: int64 [rows, k] out (not SAMPLE).
        programs_per_row, k: as in ``top_k_lanes_kernel``.
        cand_stride: programs_per_row * k + SURVIVORS + K_POW2 + KEPT.
        token_ptr: int64 [rows] out (SAMPLE): the token, -1 for a row without a finite logit or
            with an invalid temperature, top_p or min_p.
        temperature, top_p, min_p, filters, seed, seed_stride, offset, offset_stride: as in
            ``resolve_kernel`` (SAMPLE; top-k is the scalar k).
        WIDTH, SEGMENTS_PER_PROGRAM, GROUP: the groups, as in ``top_k_lanes_kernel``.
        HEAD: candidates per program in the bound (programs_per_row * min(HEAD, k) >= k).
        HEADS: next_pow2(programs_per_row) * HEAD.
        CANDS: next_pow2(programs_per_row * k).
        SURVIVORS: next_pow2 of the most candidates that can reach the bound (>= k).
        K_POW2: next_pow2(k).
        GATHER: next_pow2(k * GROUP * SEGMENTS_PER_PROGRAM): the tokens of the k best groups.
        KEPT: the most tokens at or above the k-th best group that are sorted alone (a power
            of two, as HEAD).
        SAMPLE: race the top k (the first launch's FINITE_ONLY) instead of writing them out.
        MASSES: top-p or min-p may be on in some row (``_top_k_lanes_race``).
        T_ROW, P_ROW, MINP_ROW, SEED_TENSOR, OFFSET_TENSOR: per-row parameter tensors.
        WAIT_FOR_PRIOR: a programmatic dependent launch of ``top_k_lanes_kernel``.
    """
    PER_GROUP: tl.constexpr = GROUP * SEGMENTS_PER_PROGRAM
    start_dependent_launch(WAIT_FOR_PRIOR, False)
    row = tl.program_id(0).to(tl.int64)
    inv_t, noise_scale, params_ok, _, p, mp, race_seed, stream, race_offset = _row_setup(
        row, n, temperature, k, top_p, min_p, filters, seed, seed_stride, offset, offset_stride, T_ROW, False,
        P_ROW, MINP_ROW, SEED_TENSOR, OFFSET_TENSOR)
    cand_row = cand_ptr + row * cand_stride
    num_cands = programs_per_row * k
    survivors_at = cand_row + num_cands
    groups_at = survivors_at + SURVIVORS
    kept_at = groups_at + K_POW2
    h = tl.arange(0, HEADS)
    head_prog = h // HEAD
    head_place = h % HEAD
    head = tl.load(cand_row + head_prog * k + head_place,
                   mask=(head_prog < programs_per_row) & (head_place < k), other=INT64_MIN)
    i = tl.arange(0, CANDS)
    cands = tl.load(cand_row + i, mask=i < num_cands, other=INT64_MIN)
    head = tl.sort(head, descending=True)
    bound = tl.max(tl.where(h == k - 1, head, INT64_MIN), 0)
    reach = (cands >= bound) & (cands != INT64_MIN)
    place = tl.cumsum(reach.to(tl.int32), 0) - 1
    tl.store(survivors_at + place, cands, mask=reach)
    tl.debug_barrier()
    s = tl.arange(0, SURVIVORS)
    best = tl.sort(tl.load(survivors_at + s, mask=s < tl.sum(reach.to(tl.int32), 0), other=INT64_MIN),
                   descending=True)
    kth_group = tl.max(tl.where(s == k - 1, best, INT64_MIN), 0)
    # the k best groups, passed between the program's threads through memory
    tl.store(groups_at + s, best, mask=s < k)
    tl.debug_barrier()
    g = tl.arange(0, GATHER)
    slot = g // PER_GROUP
    group_best = tl.load(groups_at + slot, mask=slot < k, other=INT64_MIN)
    held = group_best != INT64_MIN
    _, top_index = _split_composite(group_best)
    top_index = tl.where(held, top_index, 0)
    prog = top_index // (WIDTH * SEGMENTS_PER_PROGRAM)
    first_lane = (top_index % WIDTH) // GROUP * GROUP
    within = g % PER_GROUP
    cols = (prog * SEGMENTS_PER_PROGRAM + within // GROUP) * WIDTH + first_lane + within % GROUP
    live = held & (cols < n)
    x = tl.load(x_ptr + row * stride_x + cols, mask=live, other=0.0).to(tl.float32)
    if SAMPLE:
        live = live & (tl.abs(x) < float("inf"))
    keys = tl.where(live, _composite(_ordered_key(x), cols), INT64_MIN)
    # every token of the top k is at or above the k-th best group's maximum (k tokens are)
    reach_token = live & (keys >= kth_group)
    reached = tl.sum(reach_token.to(tl.int32), 0)
    if reached <= KEPT:
        tl.store(kept_at + tl.cumsum(reach_token.to(tl.int32), 0) - 1, keys, mask=reach_token)
        tl.debug_barrier()
        t = tl.arange(0, KEPT)
        # (each branch names its own sorted list: a name bound in both must have one shape)
        ranked_kept = tl.sort(tl.load(kept_at + t, mask=t < reached, other=INT64_MIN), descending=True)
        if SAMPLE:
            _top_k_lanes_race(ranked_kept, t, row, k, token_ptr, inv_t, noise_scale, params_ok, p, mp, race_seed,
                              stream, race_offset, MASSES)
        else:
            _top_k_lanes_store(x_ptr, row, stride_x, values_ptr, indices_ptr, k, ranked_kept, t)
    else:
        ranked_all = tl.sort(keys, descending=True)
        if SAMPLE:
            _top_k_lanes_race(ranked_all, g, row, k, token_ptr, inv_t, noise_scale, params_ok, p, mp, race_seed,
                              stream, race_offset, MASSES)
        else:
            _top_k_lanes_store(x_ptr, row, stride_x, values_ptr, indices_ptr, k, ranked_all, g)


# ------------------------------------------------------------------------------------------
# Kernels: top-p and min-p sampling by descent
# ------------------------------------------------------------------------------------------
# The filters keep a prefix K of the composite order, and the sampled token is the winner of the
# race over K. If the winner c of a race over a set S that holds K lies in K, it is also K's
# winner; if not, K lies wholly before c (a prefix that does not reach c), so S is cut to the
# tokens before c and raced again. Each step draws nothing new: the scores are the same y - log(E)
# of every token, so the descent ends at exactly the token the pipeline's race over K picks.
# By the Gumbel-max property, conditioned on the steps before, the winner of S is distributed in
# proportion to the probabilities on S, so it lands in K with probability mass(K) / mass(S) >= p
# under top-p (min-p is applied to S itself from the first step that knows the maximum). Under
# top-p 0.9 the first winner is kept nine times in ten: the call is one race over the row and one
# pass that sums the row's mass and the mass before the winner, where the pipeline makes five.
# For any p the steps are few: the mass before each new winner is about a uniform fraction of the
# mass before the last, so a row ends after about 1 + ln(1 / p) candidates (a simulation at 151936
# tokens: 3.1 on average for p = 0.1 on flat rows, 2.1 on peaked ones; 99th percentile 7). Tied
# scores are the exception: the race breaks them by index, not in the composite order, so among
# tokens whose y clamp to the same value (x / t past the float range, at temperatures below about
# 1e-30) each step takes the lowest index. Where their indices fall in no particular order of
# their logits that is again a random candidate (a simulation of 10^4 tied tokens: 1.1 steps on
# average under top-p 0.9, 1.7 under 0.5), but where the indices run against the logits' order
# the descent takes a step per token past the kept prefix; the token is still the pipeline's.
#
# Launches: round 0 (the race over every finite token and the maxima), rounds 1 .. R (each
# program replays the decisions from the partials of the rounds before it, and a row still
# undecided sums the mass before its candidate and races the tokens before it), then one program
# per row that replays every round and, for the rare row still undecided, goes on alone.
#
# S need not be the row: any prefix of the composite order that holds K will do. The filtered
# path's histogram pass lists the tokens within PRELIST_BINS / BINS_PER_NAT nats of the maximum,
# such a prefix wherever its mass reaches top-p's target (the test the count pass makes), so after
# the segment maxima and that pass (which also sums the row's mass) a row can descend in its list:
# each round then reads a few thousand listed tokens where the row has 151936 (``descent_kernel``'s
# LISTED). Tokens of a list come in no order of their indices, so its races break ties by index
# explicitly (``_race_lanes_any_order``).


@triton.jit
def _merge_descent(before_a, total_a, score_a, index_a, before_b, total_b, score_b, index_b):
    """``tl.reduce`` combine of a descent round's lanes: two integer sums (exact in any order) and
    the better race entry (``_race_pick``)."""
    score, index = _race_pick(score_a, index_a, score_b, index_b)
    return before_a + before_b, total_a + total_b, score, index


@triton.jit
def _descent_candidate(x_ptr, row, stride_x, c, live, m, inv_t, p, mp, UNIT_T: tl.constexpr):
    """Candidate token c of a row (``live``: c is a real token; raced tokens are finite): its
    logit's ordered key, its weight w = exp(y - m) (``_fixed_mass``'s), and whether it is kept
    without a mass (top-p off in the row and min-p keeps it)."""
    x, finite, y = _logits_at(x_ptr, row, stride_x, c, live, inv_t, UNIT_T)
    w, w_fixed = _fixed_mass(y, m, finite)
    return _ordered_key(x), w, live & (p >= 1.0) & _min_p_keeps(w, mp, True)


@triton.jit
def _descent_accepts(before, total, w, p, mp):
    """Whether a candidate is kept: the mass before it under top-p's target (``_top_p_target``:
    the resolve pass's test) unless top-p is off (p = 1), and min-p's test on its weight (mp = 0:
    off; every weight is >= 0)."""
    return ((p >= 1.0) | (before < _top_p_target(p, total))) & _min_p_keeps(w, mp, True)


@triton.jit
def _descent_next(before, total, best_score, best_index, token, c, key_c, w_c, x_ptr, row, stride_x, m, inv_t, p,
                  mp, UNIT_T: tl.constexpr):
    """One step of a row's descent after a pass for candidate c (``before``: the mass before it;
    ``best_score``, ``best_index``: the race among the tokens before it that may win): keep c
    (``_descent_accepts``), or take the race's winner as the next candidate, kept at once where
    ``_descent_candidate`` says so. Returns (decided, token, c, key_c, w_c).

    A rejected candidate has K's first token before it, so the race had an entry; the test keeps
    a fault from looping forever: the row then ends with -1."""
    kept = _descent_accepts(before, total, w_c, p, mp)
    token = tl.where(kept, c, token)
    decided = kept
    if kept == 0:
        raced = best_score > float("-inf")
        c = tl.where(raced, best_index, 0)
        key_c, w_c, now = _descent_candidate(x_ptr, row, stride_x, c, raced, m, inv_t, p, mp, UNIT_T)
        token = tl.where(now, c, token)
        decided = now | (raced == 0)
    return decided, token, c, key_c, w_c


@triton.jit
def _descent_round(before_ptr, score_ptr, index_ptr, parts, live, total, token, c, key_c, w_c, x_ptr, row, stride_x,
                   m, inv_t, p, mp, TOP_P: tl.constexpr, UNIT_T: tl.constexpr, CACHE: tl.constexpr):
    """A round's step (``_descent_next``) from its partials: the masses before the candidate at
    ``before_ptr`` (read only with TOP_P) and the race winners at ``score_ptr`` and ``index_ptr``,
    of the row's ``parts`` where ``live``; ``CACHE``: the loads' cache modifier (".cg" for
    partials of the same launch, written past this SM's L1)."""
    before = tl.zeros([], tl.int64)
    if TOP_P:
        before = tl.sum(tl.load(before_ptr + parts, mask=live, other=0, cache_modifier=CACHE), axis=0)
    best_score, best_index = _winner(
        tl.load(score_ptr + parts, mask=live, other=float("-inf"), cache_modifier=CACHE),
        tl.load(index_ptr + parts, mask=live, other=INT64_MAX, cache_modifier=CACHE), INT64_MAX)
    return _descent_next(before, total, best_score, best_index, token, c, key_c, w_c, x_ptr, row, stride_x, m, inv_t,
                         p, mp, UNIT_T)


@triton.jit
def _descent_replay(x_ptr, row, stride_x, part_max_ptr, part_total_ptr, part_before_ptr, part_score_ptr,
                    part_index_ptr, programs_per_row, slot_stride, valid, inv_t, p, mp, racing_programs,
                    parts_per_row, ROUNDS_DONE: tl.constexpr, TOP_P: tl.constexpr, PARTS_POW2: tl.constexpr,
                    MAXIMA_POW2: tl.constexpr, UNIT_T: tl.constexpr, CACHE: tl.constexpr):
    """A row's descent from the partials of round 0 and of rounds 1 .. ROUNDS_DONE, as every
    program of every later launch sees it (the same loads and reductions: the same decisions):
    (maximum, row mass, decided, token, candidate, its key, its weight). Each round's step is
    ``_descent_round``'s. A row is decided when it is invalid or has no finite logit (token -1)
    or when a candidate was kept; a round writes partials only for rows it found undecided, and
    only those are read. Without TOP_P no round wrote masses, and none are read (the row mass
    and the masses before are 0; p is 1). The races and masses before are read from the row's
    first ``racing_programs`` programs (a row that descends in its list: those with a share of
    it), the maxima and row masses from all ``parts_per_row`` partials of theirs (MAXIMA_POW2 >=
    parts_per_row). CACHE: the cache modifier of round 0's winners (".cg" where round 0 ran in
    the same launch)."""
    q = tl.arange(0, PARTS_POW2)
    live = q < racing_programs
    parts = row * programs_per_row + q
    q_all = tl.arange(0, MAXIMA_POW2)
    every = q_all < parts_per_row
    every_part = row * parts_per_row + q_all
    m = tl.max(tl.load(part_max_ptr + every_part, mask=every, other=float("-inf")), axis=0)
    score, c = _winner(tl.load(part_score_ptr + parts, mask=live, other=float("-inf"), cache_modifier=CACHE),
                       tl.load(part_index_ptr + parts, mask=live, other=INT64_MAX, cache_modifier=CACHE), INT64_MAX)
    decided = (valid == 0) | (score == float("-inf"))
    token = tl.full([], -1, tl.int64)
    c = tl.where(decided, 0, c)
    key_c, w_c, now = _descent_candidate(x_ptr, row, stride_x, c, decided == 0, m, inv_t, p, mp, UNIT_T)
    token = tl.where(now, c, token)
    decided = decided | now
    total = tl.zeros([], tl.int64)
    if TOP_P and ROUNDS_DONE >= 1:
        total = tl.sum(tl.load(part_total_ptr + every_part, mask=every & (decided == 0), other=0), axis=0)
    for j in tl.static_range(1, ROUNDS_DONE + 1):
        if decided == 0:  # (a decided row's later rounds wrote nothing)
            decided, token, c, key_c, w_c = _descent_round(
                part_before_ptr + (j - 1) * slot_stride, part_score_ptr + j * slot_stride,
                part_index_ptr + j * slot_stride, parts, live, total, token, c, key_c, w_c, x_ptr, row, stride_x, m,
                inv_t, p, mp, TOP_P, UNIT_T, "")
    return m, total, decided, token, c, key_c, w_c


@triton.jit
def _descent_segment(x_ptr, row, stride_x, n, start, list_segment, from_list, list_row, list_count,
                     LISTED: tl.constexpr, WIDTH: tl.constexpr):
    """A segment of a descent's pass: (columns, which lanes hold a token, loaded logits) of the
    row's columns from ``start``, or with LISTED in a row whose ``from_list`` is true, of its
    pre-list's segment ``list_segment``."""
    lanes = tl.arange(0, WIDTH)
    cols = start + lanes
    live = cols < n
    if LISTED:
        if from_list:
            places = list_segment * WIDTH + lanes
            live = places < list_count
            cols = tl.load(list_row + places, mask=live, other=0)
    return cols, live, tl.load(x_ptr + row * stride_x + cols, mask=live, other=0.0)


@triton.jit
def _listed_pass_noise(cols, start, from_list, s, stream, o, WIDTH: tl.constexpr):
    """The race noise of a listed descent's pass segment: each token's own (``_noise_at``) in a
    row that descends in its list, the row's tile from column ``start`` in one that does not."""
    if from_list:
        noise = _noise_at(cols.to(tl.int64), s, stream, o)
    else:
        noise = _noise_tile(start >> 2, s, stream, o, WIDTH // 4)
    return noise


@triton.jit
def _descent_pass(x_ptr, row, stride_x, n, first_segment, segments, c, key_c, m, inv_t, mp, noise_scale,
                  s, stream, o, from_list, list_row, list_count, list_step,
                  TOTAL: tl.constexpr, TOP_P: tl.constexpr, MIN_P: tl.constexpr,
                  LISTED: tl.constexpr, WIDTH: tl.constexpr, UNIT_T: tl.constexpr,
                  held_cols, held_raw, held_live, held_score, HELD: tl.constexpr):
    """One candidate's pass over ``segments`` segments of a row from ``first_segment``: with
    TOP_P (top-p may be on) the fixed-point mass of the finite tokens before c in the composite
    order and, with TOTAL, the row's mass (else both 0: min-p alone needs neither), and the race
    among the tokens before c that min-p keeps (MIN_P: min-p may be on).
    The noise is drawn only for segments that hold such a token: after a first winner of high
    probability, few do. Returns (mass before, row mass, winner score, winner index).

    With LISTED, a row whose ``from_list`` is true is passed over in its pre-list instead
    (``list_row``, ``list_count`` tokens): the segments are the list's, first_segment,
    first_segment + list_step, ..., and each token's noise is drawn for its own index. The list
    holds a prefix of the composite order that holds K, so every candidate and every token
    before it is on it. With HELD, the list's first segment of the program is ``held_cols``,
    ``held_raw`` (loaded logits) and ``held_live`` (``_held_share``), not loaded again, and its
    race scores are ``held_score`` (``_held_scores``), not drawn again."""
    lanes = tl.arange(0, WIDTH)
    lane_before = tl.zeros([WIDTH], tl.int64)
    lane_total = tl.zeros([WIDTH], tl.int64)
    lane_score = tl.full([WIDTH], float("-inf"), tl.float32)
    lane_index = tl.full([WIDTH], n, tl.int32)
    j = tl.full([], 0, tl.int32)
    while j < segments:  # (a bound the interpreter cannot take as a range)
        start = (first_segment + j) * WIDTH
        if HELD:
            if from_list & (j == 0):
                cols, live, raw = held_cols, held_live, held_raw
            else:
                cols, live, raw = _descent_segment(x_ptr, row, stride_x, n, start, first_segment + j * list_step,
                                                   from_list, list_row, list_count, LISTED, WIDTH)
        else:
            cols, live, raw = _descent_segment(x_ptr, row, stride_x, n, start, first_segment + j * list_step,
                                               from_list, list_row, list_count, LISTED, WIDTH)
        x, finite, y = _logits_from(raw, live, inv_t, UNIT_T)
        if MIN_P:
            w, w_fixed = _fixed_mass(y, m, finite)
        else:
            w_fixed = _fixed_weight(_gap(y, m, finite))
        key = _ordered_key(x)
        before = finite & ((key > key_c) | ((key == key_c) & (cols < c)))
        if TOP_P:
            lane_before += tl.where(before, w_fixed, 0)
            if TOTAL:
                lane_total += w_fixed
        racing = before
        if MIN_P:
            racing = racing & _min_p_keeps(w, mp, True)  # (mp = 0: off)
        if tl.max(racing.to(tl.int32), axis=0) > 0:
            if LISTED:
                if HELD:
                    if from_list & (j == 0):
                        score = held_score
                    else:
                        score = y + noise_scale * _listed_pass_noise(cols, start, from_list, s, stream, o, WIDTH)
                else:
                    score = y + noise_scale * _listed_pass_noise(cols, start, from_list, s, stream, o, WIDTH)
                lane_score, lane_index = _race_lanes_any_order(lane_score, lane_index, racing, score, cols)
            else:
                score = y + noise_scale * _noise_tile(start >> 2, s, stream, o, WIDTH // 4)
                lane_score, lane_index = _race_lanes(lane_score, lane_index, racing, score, cols)
        j += 1
    if FUSED_REDUCTIONS:
        before_sum, total_sum, best_score, best_index = tl.reduce(
            (lane_before, lane_total, lane_score, lane_index), 0, _merge_descent)
    else:
        best_score, best_index = _winner(lane_score, lane_index, n)
        before_sum = tl.sum(lane_before, axis=0)
        total_sum = tl.sum(lane_total, axis=0)
    return before_sum, total_sum, best_score, best_index.to(tl.int64)


@triton.jit
def _descent_lists(row, n, top_p, min_p, filters, part_total_ptr, part_listed_ptr, part_valid_ptr, list_count,
                   capacity, programs_per_row, P_ROW: tl.constexpr, MINP_ROW: tl.constexpr, PARTS_POW2: tl.constexpr,
                   PRELIST_BINS: tl.constexpr, BINS_PER_NAT: tl.constexpr):
    """Whether a row descends in its pre-list: the list is complete and holds K
    (``_pre_list_holds_prefix``, the test by which the pipeline's count pass reads the list),
    from the histogram pass's partials: the same loads and reductions in every program of the
    row, so the same answer."""
    k, p, mp, f_ok = _row_filters(row, n, 0, top_p, min_p, filters, False, P_ROW, MINP_ROW)
    total = _row_sum(part_total_ptr, row, programs_per_row, PARTS_POW2).to(tl.float32) * (1.0 / FIXED_ONE)
    listed = _row_sum(part_listed_ptr, row, programs_per_row, PARTS_POW2).to(tl.float32) * (1.0 / FIXED_ONE)
    n_valid = _row_sum(part_valid_ptr, row, programs_per_row, PARTS_POW2)
    return _pre_list_holds_prefix(list_count, capacity, listed, total, n_valid, k, p, mp, PRELIST_BINS,
                                  BINS_PER_NAT)


@triton.jit
def _descent_list_race(x_ptr, row, stride_x, n, part_score_ptr, part_index_ptr, pid, temperature, seed,
                       seed_stride, offset, offset_stride, list_row, list_count, list_segments, prog,
                       programs_per_row, T_ROW: tl.constexpr, SEED_TENSOR: tl.constexpr,
                       OFFSET_TENSOR: tl.constexpr, WIDTH: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr,
                       UNIT_T: tl.constexpr, held_cols, held_raw, held_live, held_score, HELD: tl.constexpr):
    """Round 0 of a row that descends in its pre-list: the race among the list's finite tokens
    in the program's share of the list's segments (j * programs_per_row + prog in step j), each
    token's noise drawn for its own index; the winner stored at ``pid`` ((-inf, n) for a
    program with no share). HELD: the first segment is held, its scores too (``_descent_pass``)."""
    inv_t, noise_scale, t_ok = _row_temperature(temperature, row, T_ROW)
    s, stream, o = _row_random(seed, seed_stride, offset, offset_stride, row, SEED_TENSOR, OFFSET_TENSOR)
    lanes = tl.arange(0, WIDTH)
    lane_score = tl.full([WIDTH], float("-inf"), tl.float32)
    lane_index = tl.full([WIDTH], n, tl.int32)
    for j in range(SEGMENTS_PER_PROGRAM):
        g = j * programs_per_row + prog
        if g < list_segments:
            if HELD:
                if j == 0:
                    cols, live, raw = held_cols, held_live, held_raw
                    x, finite, y = _logits_from(raw, live, inv_t, UNIT_T)
                    score = held_score
                else:
                    cols, live, raw = _descent_segment(x_ptr, row, stride_x, n, 0, g, True, list_row, list_count,
                                                       True, WIDTH)
                    x, finite, y = _logits_from(raw, live, inv_t, UNIT_T)
                    score = y + noise_scale * _noise_at(cols.to(tl.int64), s, stream, o)
            else:
                cols, live, raw = _descent_segment(x_ptr, row, stride_x, n, 0, g, True, list_row, list_count, True,
                                                   WIDTH)
                x, finite, y = _logits_from(raw, live, inv_t, UNIT_T)
                score = y + noise_scale * _noise_at(cols.to(tl.int64), s, stream, o)
            lane_score, lane_index = _race_lanes_any_order(lane_score, lane_index, finite, score, cols)
    _store_race_winner(lane_score, lane_index, n, part_score_ptr, part_index_ptr, pid)


@triton.jit
def _descent_share(prog, n, from_list, list_segments, programs_per_row, WIDTH: tl.constexpr,
                   SEGMENTS_PER_PROGRAM: tl.constexpr):
    """(first segment, segments) of a program's share in a round: SEGMENTS_PER_PROGRAM
    consecutive segments of the row, or of a row that descends in its list, the list's segments
    prog, prog + programs_per_row, ... (``_descent_pass``' list_step)."""
    first = prog * SEGMENTS_PER_PROGRAM
    segments = tl.minimum(SEGMENTS_PER_PROGRAM, tl.cdiv(n, WIDTH) - first)
    if from_list:
        first = prog
        segments = tl.maximum(tl.cdiv(list_segments - prog, programs_per_row), 0)
    return first, segments


@triton.jit
def _held_share(x_ptr, row, stride_x, list_row, list_count, capacity, prog, WIDTH: tl.constexpr,
                HOLD: tl.constexpr):
    """With HOLD, a listed row's program's first segment of its list (segment ``prog``: its first
    in round 0 and in every pass, ``_descent_share``): (token indices, loaded logits, which lanes
    are on the list); else unused scalars. The loads wait only for the list's count, not for the
    row's test of its list (``_descent_lists``, a reduction of three loads of partials), so that
    both are in flight at once: the caller turns the lanes off in a row that does not descend in
    its list. A list whose count passed its capacity may have places never written (a program
    that gave it up, ``_list_lane_tokens``): such a row loads nothing."""
    if HOLD:
        places = prog * WIDTH + tl.arange(0, WIDTH)
        live = places < tl.where(list_count <= capacity, list_count, 0)
        cols = tl.load(list_row + places, mask=live, other=0)
        raw = tl.load(x_ptr + row * stride_x + cols, mask=live, other=0.0)
    else:
        cols = tl.zeros([], tl.int32)
        raw = tl.zeros([], tl.float32)
        live = tl.zeros([], tl.int1)
    return cols, raw, live


@triton.jit
def _held_scores(held_cols, held_raw, held_live, temperature, seed, seed_stride, offset, offset_stride, row,
                 T_ROW: tl.constexpr, SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr, UNIT_T: tl.constexpr,
                 HOLD: tl.constexpr):
    """With HOLD, the race scores y + noise of the held segment's tokens (``_held_share``), drawn
    once: round 0 races them, and each later pass races those before its candidate with the same
    scores, so the noise (Philox and two logarithms a token) is not drawn again in every round.
    Every program draws them, also where its row does not descend in its list and its lanes are
    off (flat rows: about 2% of their call on an H100): drawing them only under the row's test,
    or in round 0's race, spilled the loop's launch past its register cap. Else an unused
    scalar."""
    if HOLD:
        inv_t, noise_scale, t_ok = _row_temperature(temperature, row, T_ROW)
        s, stream, o = _row_random(seed, seed_stride, offset, offset_stride, row, SEED_TENSOR, OFFSET_TENSOR)
        x, finite, y = _logits_from(held_raw, held_live, inv_t, UNIT_T)
        score = y + noise_scale * _noise_at(held_cols.to(tl.int64), s, stream, o)
    else:
        score = tl.zeros([], tl.float32)
    return score


@triton.jit
def _descent_loop(x_ptr, row, stride_x, n, pid, prog, part_max_ptr, part_total_ptr, part_before_ptr, part_score_ptr,
                  part_index_ptr, token_ptr, counter_ptr, programs_per_row, slot_stride, parts_per_row,
                  racing_programs, valid, inv_t, noise_scale, p, mp, s, stream, o, from_list, list_row, list_count,
                  list_segments, TOP_P: tl.constexpr, MIN_P: tl.constexpr, LISTED: tl.constexpr, WIDTH: tl.constexpr,
                  SEGMENTS_PER_PROGRAM: tl.constexpr, PARTS_POW2: tl.constexpr, MAXIMA_POW2: tl.constexpr,
                  UNIT_T: tl.constexpr, RACED_HERE: tl.constexpr, held_cols, held_raw, held_live,
                  held_score, HELD: tl.constexpr):
    """Every round after round 0 in one launch: the row's racing programs pass over their shares
    for the candidate, write their partials, meet on the row's arrival counter (``arrive``,
    ``wait_for_arrivals``: the count reaches racing_programs times the rounds done) and read
    each other's (past L1), so that each takes the same decision: keep the candidate, or take
    the race's winner as the next. A row undecided after many rounds keeps all its programs on
    it, where the launches' form leaves it to one. The partials of two rounds alternate in slots
    0 and 1 (scores and indices in 1 and 2, after round 0's): a program writes round k + 2's only
    after every program has arrived at round k + 1, so after it read round k's. Program 0
    writes the token. RACED_HERE: round 0 ran in this launch (``descent_kernel``'s LOOP_RACES),
    its racing programs counted once on the counter already, and its winners are read past L1.
    HELD: the program's first segment of the list is held from round 0 (``_held_share``)."""
    m, total, decided, token, c, key_c, w_c = _descent_replay(
        x_ptr, row, stride_x, part_max_ptr, part_total_ptr, part_before_ptr, part_score_ptr, part_index_ptr,
        programs_per_row, slot_stride, valid, inv_t, p, mp, racing_programs, parts_per_row, 0, TOP_P, PARTS_POW2,
        MAXIMA_POW2, UNIT_T, ".cg" if RACED_HERE else "")
    if LISTED and TOP_P:
        total = _row_sum(part_total_ptr, row, parts_per_row, MAXIMA_POW2)  # (the histogram pass's)
    first, segments = _descent_share(prog, n, from_list, list_segments, programs_per_row, WIDTH, SEGMENTS_PER_PROGRAM)
    q = tl.arange(0, PARTS_POW2)
    racing = q < racing_programs
    parts = row * programs_per_row + q
    rounds = tl.zeros([], tl.int32)
    while decided == 0:
        before, row_mass, best_score, best_index = _descent_pass(
            x_ptr, row, stride_x, n, first, segments, c, key_c, m, inv_t, mp, noise_scale, s, stream, o,
            from_list, list_row, list_count, programs_per_row, not LISTED, TOP_P, MIN_P, LISTED, WIDTH, UNIT_T,
            held_cols, held_raw, held_live, held_score, HELD)
        slot = (rounds % 2) * slot_stride
        if TOP_P:
            tl.store(part_before_ptr + slot + pid, before)
            if not LISTED:
                if rounds == 0:
                    tl.store(part_total_ptr + pid, row_mass)
        tl.store(part_score_ptr + slot_stride + slot + pid, best_score)
        tl.store(part_index_ptr + slot_stride + slot + pid, best_index)
        arrived = arrive(counter_ptr, row)
        wait_for_arrivals(counter_ptr, row, arrived, racing_programs * (rounds + 1 + RACED_HERE))
        if TOP_P:
            if not LISTED:
                if rounds == 0:
                    total = tl.sum(tl.load(part_total_ptr + parts, mask=racing, other=0, cache_modifier=".cg"),
                                   axis=0)
        decided, token, c, key_c, w_c = _descent_round(
            part_before_ptr + slot, part_score_ptr + slot_stride + slot, part_index_ptr + slot_stride + slot, parts,
            racing, total, token, c, key_c, w_c, x_ptr, row, stride_x, m, inv_t, p, mp, TOP_P, UNIT_T, ".cg")
        rounds += 1
    if prog == 0:
        tl.store(token_ptr + row, token)


@triton.jit(do_not_specialize=RANDOM_ARGS)
def descent_kernel(x_ptr, n, stride_x, part_max_ptr, part_total_ptr, part_before_ptr, part_score_ptr,
                   part_index_ptr, token_ptr, programs_per_row, slot_stride, parts_per_row,
                   temperature, top_p, min_p, filters, seed, seed_stride, offset, offset_stride,
                   prelist_ptr, prelist_stride, prelist_count_ptr, part_listed_ptr, part_valid_ptr, list_rows_ptr,
                   counter_ptr, ROUND: tl.constexpr, FINAL: tl.constexpr,
                   T_ROW: tl.constexpr, P_ROW: tl.constexpr, MINP_ROW: tl.constexpr,
                   SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr, TOP_P: tl.constexpr,
                   MIN_P: tl.constexpr, WIDTH: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr,
                   PARTS_POW2: tl.constexpr, MAXIMA_POW2: tl.constexpr, LISTED: tl.constexpr = False,
                   PRELIST_BINS: tl.constexpr = 0,
                   BINS_PER_NAT: tl.constexpr = 4.0, FINISH_WIDTH: tl.constexpr = 0, LOOP: tl.constexpr = False,
                   LOOP_RACES: tl.constexpr = False, LOOP_HOLDS: tl.constexpr = False,
                   PREFETCH: tl.constexpr = False, WAIT_FOR_PRIOR: tl.constexpr = False,
                   RELEASE_DEPENDENTS: tl.constexpr = False, UNIT_T: tl.constexpr = False):
    """Sampling under top-p and min-p (no top-k) by descent (see the section's comment): round
    0, a round 1 .. R, or with FINAL the row's token.

    Grid rows * programs_per_row (FINAL: rows). Round 0 races every finite token of the
    program's segments and takes their maximum; round r >= 1 replays the rounds before it
    (``_descent_replay``) and, for an undecided row, passes over the program's segments for its
    candidate (``_descent_pass``; round 1 also sums the row's mass); FINAL replays every round,
    and a row still undecided is finished by its one program, a pass over the whole row per
    candidate, until one is kept (each has probability >= p under top-p; the descent ends, as
    every step leaves K inside a shorter prefix).

    With LISTED the launches follow ``segment_max_kernel`` and ``bin_histogram_kernel`` (with its
    pre-list and masses): the maxima and the row masses are theirs (``parts_per_row`` partials
    per row, from their grid), and round 0 takes no maximum and round 1 sums no mass. The rounds
    may run fewer programs per row than those passes (a launch choice). A row whose pre-list
    holds the prefix K
    (``_pre_list_holds_prefix``, decided by round 0 and kept in list_rows_ptr) races its list,
    not its row, in round 0, and every later pass of the row goes over the list: its
    ``PRELIST_BINS / BINS_PER_NAT`` nats below the maximum are a prefix of the composite order
    that holds K, so S = the list is a start as good as the row (at 151936 tokens of standard
    deviation 4, about 5000 tokens instead of the row). The list's segments are shared among
    the row's programs in turn (segment j * programs_per_row + prog in step j), as the
    pipeline's passes share them; the programs with no share write no partials, are not read,
    and after round 0 return at once. The other rows race and pass over their rows as without
    it.

    Bytes: round 0 reads the row once; a round reads the row again (from L2, right after round 0)
    for undecided rows only, and every launch reads the partials of the rounds before it (20
    bytes a program and round, 12 without TOP_P; and one logit per candidate); FINAL writes one
    int64 per row. With LISTED a listed row reads its list (4 bytes a token) and the logits it
    names instead of its row, and round 0 reads 24 bytes of partials per program and writes 4
    bytes per row. With LOOP each round after round 0 reads the row (or list) share again and
    the row's partials (20 bytes a program), and makes two atomics per program on the counter
    (and one per poll while it waits); with LOOP_RACES round 0 adds one arrival per racing
    program, and with LOOP_HOLDS a program's first list segment is read once, not in each round
    (also in a row whose list is complete but which does not descend in it: at most 8 bytes a
    token of the segment).

    Args:
        x_ptr, n, stride_x: logits [rows, n], last dimension contiguous.
        part_max_ptr: float32 [rows * programs_per_row]: round 0's maxima of y (with LISTED,
            ``segment_max_kernel``'s).
        part_total_ptr: int64 [rows * programs_per_row]: round 1's row masses (fixed point;
            written and read only with TOP_P, as part_before_ptr; with LISTED
            ``bin_histogram_kernel``'s, only read).
        part_before_ptr: int64 [R, rows * programs_per_row]: round r's masses before its
            candidate (slot r - 1).
        part_score_ptr, part_index_ptr: float32 / int64 [R + 1, rows * programs_per_row]: round
            r's race winners (round 0: every token; then the tokens before the candidate).
        token_ptr: int64 [rows] out (FINAL): the sampled token; -1 for a row with an invalid
            parameter or no finite logit.
        programs_per_row: programs sharing a row in rounds 0 .. R.
        slot_stride: rows * programs_per_row (one round's partials).
        parts_per_row: the maxima's and row masses' partials per row: programs_per_row, or with
            LISTED those of the histogram pass's grid (a launch choice of their own).
        temperature, top_p, min_p, filters, seed, seed_stride, offset, offset_stride, T_ROW, P_ROW,
            MINP_ROW, SEED_TENSOR, OFFSET_TENSOR: as in ``compact_kernel`` (no top-k: filters
            has no bit 1).
        prelist_ptr, prelist_stride, prelist_count_ptr, part_listed_ptr, part_valid_ptr,
            PRELIST_BINS, BINS_PER_NAT: with LISTED, the pre-list and its partials as
            ``bin_histogram_kernel`` wrote them; otherwise unused.
        list_rows_ptr: int32 [rows]: with LISTED, written by round 0 (1 where the row descends in
            its list) and read by the later launches; otherwise unused.
        counter_ptr: int64 [rows]: with LOOP, the rows' arrival counters (cleared by round 0, or
            with LISTED by ``segment_max_kernel``); otherwise unused.
        ROUND: this launch's round (0 .. R), or with FINAL the rounds before it (R).
        FINAL: the row's token (grid rows).
        TOP_P: top-p may be on in some row (else the masses are left out: min-p alone keeps a
            candidate on its weight).
        MIN_P: min-p may be on in some row (else its tests and float weights are left out).
        WIDTH, SEGMENTS_PER_PROGRAM: the segments of each program (a launch choice).
        PARTS_POW2: next power of two of programs_per_row; MAXIMA_POW2 of parts_per_row.
        LISTED: start from the pre-list where it holds K (above).
        FINISH_WIDTH: with FINAL, the finishing program's segment (0: WIDTH).
        LOOP: round 0 of a call whose rounds after it run in one launch (it clears the counters),
            or with ROUND 1 that launch (``_descent_loop``; grid rows * programs_per_row, no FINAL).
        LOOP_RACES: with LOOP, ROUND 1 and LISTED, that launch runs round 0 too: each program
            races its share, the row's racing programs meet on its counter, then the loop; one
            launch boundary fewer, each row waiting on its own programs only.
        LOOP_HOLDS: with LOOP_RACES, a listed row's program holds its first segment of the list
            (token indices and logits) and their race scores from round 0 through the loop's
            passes instead of loading and drawing them again in each (``_held_share``,
            ``_held_scores``).
        PREFETCH: round 0 loads each segment before working on the previous one.
        WAIT_FOR_PRIOR, RELEASE_DEPENDENTS: programmatic dependent launches (``race_kernel``).
        UNIT_T: temperature is the scalar 1 or 0 (``_logits_from``).
    """
    start_dependent_launch(WAIT_FOR_PRIOR, RELEASE_DEPENDENTS)
    pid = tl.program_id(0).to(tl.int64)
    if FINAL:
        row = pid
        prog = tl.zeros([], tl.int32)
    else:
        row = pid // programs_per_row
        prog = (pid % programs_per_row).to(tl.int32)  # column arithmetic in int32 (n < 2^31)
    list_row = prelist_ptr + row * prelist_stride
    list_count = tl.zeros([], tl.int32)
    from_list = tl.zeros([], tl.int1)
    RACES: tl.constexpr = (ROUND == 0) or LOOP_RACES  # (this launch runs round 0)
    if LISTED:
        list_count = tl.load(prelist_count_ptr + row)
        if not RACES:
            from_list = tl.load(list_rows_ptr + row) != 0
    list_segments = tl.cdiv(list_count, WIDTH)
    held_cols, held_raw, held_live = _held_share(x_ptr, row, stride_x, list_row, list_count, prelist_stride, prog,
                                                 WIDTH, LOOP_HOLDS)
    if RACES:
        if LOOP and not LISTED:
            # (the loop's arrival counter; with LISTED the segment maxima cleared it)
            if prog == 0:
                tl.store(counter_ptr + row, 0)
        if LISTED:
            from_list = _descent_lists(row, n, top_p, min_p, filters, part_total_ptr, part_listed_ptr, part_valid_ptr,
                                       list_count, prelist_stride, parts_per_row, P_ROW, MINP_ROW, MAXIMA_POW2,
                                       PRELIST_BINS, BINS_PER_NAT)
            if prog == 0:
                tl.store(list_rows_ptr + row, from_list.to(tl.int32))
    held_live = held_live & from_list
    held_score = _held_scores(held_cols, held_raw, held_live, temperature, seed, seed_stride, offset, offset_stride,
                              row, T_ROW, SEED_TENSOR, OFFSET_TENSOR, UNIT_T, LOOP_HOLDS)
    if RACES:
        if from_list:
            if prog < list_segments:
                _descent_list_race(x_ptr, row, stride_x, n, part_score_ptr, part_index_ptr, pid, temperature, seed,
                                   seed_stride, offset, offset_stride, list_row, list_count, list_segments, prog,
                                   programs_per_row, T_ROW, SEED_TENSOR, OFFSET_TENSOR, WIDTH,
                                   SEGMENTS_PER_PROGRAM, UNIT_T, held_cols, held_raw, held_live, held_score,
                                   LOOP_HOLDS)
        else:
            # (no plan: part_score_ptr stands in for the race program's unused plan_ptr)
            _race_program(x_ptr, n, stride_x, part_score_ptr, part_index_ptr, programs_per_row, temperature, seed,
                          seed_stride, offset, offset_stride, part_score_ptr, pid, T_ROW, SEED_TENSOR,
                          OFFSET_TENSOR, True, WIDTH, SEGMENTS_PER_PROGRAM, False, 1, 1.0, PREFETCH, UNIT_T,
                          part_max_ptr, not LISTED, 0.0, part_max_ptr, False, False, 1)
    # a listed row's partials come from its programs with a share of the list (the others, most
    # of a peaked row's, write none and return at once in the rounds after the first)
    racing_programs = tl.where(from_list, tl.minimum(list_segments, programs_per_row), programs_per_row)
    if ROUND > 0:
        if not FINAL:
            # (in the loop a listed row's program 0 stays, to write the token of a row without a list)
            if from_list & (prog >= list_segments) & ((prog > 0) | (not LOOP)):
                return
        inv_t, noise_scale, valid, k, p, mp, s, stream, o = _row_setup(
            row, n, temperature, 0, top_p, min_p, filters, seed, seed_stride, offset, offset_stride,
            T_ROW, False, P_ROW, MINP_ROW, SEED_TENSOR, OFFSET_TENSOR)
        if LOOP_RACES:
            # round 0 of this launch: the row's racing programs meet before reading its winners
            if prog < racing_programs:
                arrived = arrive(counter_ptr, row)
                wait_for_arrivals(counter_ptr, row, arrived, racing_programs)
        if LOOP:
            _descent_loop(x_ptr, row, stride_x, n, pid, prog, part_max_ptr, part_total_ptr, part_before_ptr,
                          part_score_ptr, part_index_ptr, token_ptr, counter_ptr, programs_per_row, slot_stride,
                          parts_per_row, racing_programs, valid, inv_t, noise_scale, p, mp, s, stream, o, from_list,
                          list_row, list_count, list_segments, TOP_P, MIN_P, LISTED, WIDTH, SEGMENTS_PER_PROGRAM,
                          PARTS_POW2, MAXIMA_POW2, UNIT_T, LOOP_RACES, held_cols, held_raw, held_live, held_score,
                          LOOP_HOLDS)
        elif FINAL:
            m, total, decided, token, c, key_c, w_c = _descent_replay(
                x_ptr, row, stride_x, part_max_ptr, part_total_ptr, part_before_ptr, part_score_ptr,
                part_index_ptr, programs_per_row, slot_stride, valid, inv_t, p, mp, racing_programs, parts_per_row,
                ROUND, TOP_P, PARTS_POW2, MAXIMA_POW2, UNIT_T, "")
            # (the finishing program's passes go over the row, or the list, in segments of their own
            # width: the sums are exact and the race's noise is each token's, in any segments)
            FINISH: tl.constexpr = FINISH_WIDTH if FINISH_WIDTH > 0 else WIDTH
            segments = tl.where(from_list, tl.cdiv(list_count, FINISH), tl.cdiv(n, FINISH))
            while decided == 0:
                before, unused, best_score, best_index = _descent_pass(
                    x_ptr, row, stride_x, n, 0, segments, c, key_c, m, inv_t, mp, noise_scale, s, stream, o,
                    from_list, list_row, list_count, 1, False, TOP_P, MIN_P, LISTED, FINISH, UNIT_T, held_cols,
                    held_raw, held_live, held_score, False)
                decided, token, c, key_c, w_c = _descent_next(before, total, best_score, best_index, token, c,
                                                              key_c, w_c, x_ptr, row, stride_x, m, inv_t, p, mp,
                                                              UNIT_T)
            tl.store(token_ptr + row, token)
        else:
            m, total, decided, token, c, key_c, w_c = _descent_replay(
                x_ptr, row, stride_x, part_max_ptr, part_total_ptr, part_before_ptr, part_score_ptr,
                part_index_ptr, programs_per_row, slot_stride, valid, inv_t, p, mp, racing_programs, parts_per_row,
                ROUND - 1, TOP_P, PARTS_POW2, MAXIMA_POW2, UNIT_T, "")
            if decided == 0:
                first, segments = _descent_share(prog, n, from_list, list_segments, programs_per_row, WIDTH,
                                                 SEGMENTS_PER_PROGRAM)
                before, row_mass, best_score, best_index = _descent_pass(
                    x_ptr, row, stride_x, n, first, segments, c, key_c, m, inv_t, mp, noise_scale, s, stream, o,
                    from_list, list_row, list_count, programs_per_row, (ROUND == 1) and not LISTED, TOP_P, MIN_P,
                    LISTED, WIDTH, UNIT_T, held_cols, held_raw, held_live, held_score, False)
                slot = ROUND * slot_stride + pid
                if TOP_P:
                    tl.store(part_before_ptr + slot - slot_stride, before)
                    if (ROUND == 1) and not LISTED:
                        tl.store(part_total_ptr + pid, row_mass)
                tl.store(part_score_ptr + slot, best_score)
                tl.store(part_index_ptr + slot, best_index)
