"""Sampling, top-k and the sampling filters: launch plans, launchers, torch.library ops.

The launchers take validated, normalised arguments (``treefold.functional.sampling`` does the
checking): logits as ``[rows, n]`` with a contiguous last dimension; every parameter either a
Python scalar or a contiguous device tensor (``[rows]``, or one element for seed and offset);
no Python value is ever read back from the device, so every launcher is CUDA-graph safe.

Launch choices (programs per row, segment width, warps, list sizes) never change a result:
partial results are exact (maxima, races, integer counts, fixed-point masses), and the lists of
tokens are sorted, searched or raced, never read in arrival order.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Union

import torch

from .. import backend, order
from ..kernels import sampling as kernels
from ..reference import sampling as reference
from .launch import (Launcher, PreparedPipeline, check_max_registers, dependent_launch, int_type_key,
                     register_cap)

#: Longest row the kernels take.
MAX_ROW = 1 << 20
#: Histogram bins of the filtered path, and their width (bins per nat of log-probability: the
#: bins reach 16 nats below the maximum, the last one holding everything further); the sub-bins
#: that split the boundary bins of a long boundary list. Triton's histogram costs about
#: (bins / 32) * log2(bins) instructions per token and thread, so bins are counted sparingly.
#: On the H200 (``benchmarks/probe_sampling_bins.py``, CUDA graphs, 151936 logits) 64 bins of a
#: quarter nat beat 128 in 9 of 12 cases (top-k 50 at 64 rows 112.2 -> 104.9 us, min-p
#: 133.8 -> 129.7, top-p 202.5 -> 200.5; the other 3, at batch 1, at most 0.6 us slower); wider
#: bins lost on flat rows (32 of half a nat: top-p 332 -> 442 us), where the boundary bins then
#: hold many tokens. Rows keeping tokens more than 16 nats below their maximum (top-p near 1, tiny
#: min-p) put them in the last bin: still exact, their speed not measured.
NUM_BINS = 64
#: A power of two: the histogram's pre-list marks a token by comparing its gap to the maximum
#: with -PRELIST_BINS / BINS_PER_NAT, the same decision as its bin only when scaling is exact.
BINS_PER_NAT = 4.0
FINE_BINS = 64
#: ``resolve_kernel`` ranks boundary lists up to this long by pairwise comparisons (PAIR_CHUNK
#: tokens at a time); a longer one is first cut down with the sub-bins, and what is still longer (a
#: huge tie group) takes the bracket search. The ranking used to cost its full [PAIRWISE_MAX,
#: PAIR_CHUNK] tiles whatever the list's length (SM clock stamps in the one resolve program, one
#: row of 151936 fp32 on the H200: 6.1 us of a 13.7 us resolve under top-p 0.9, 6.2 us for min-p's
#: empty list); it now skips the chunks past the list's end, which took 1.1-2.6 us off top_k(50)
#: and 16-bit top-p calls (results/h200-ab-resolve-tiers.txt; ranking lists of at most two chunks
#: on [2 * PAIR_CHUNK, PAIR_CHUNK] tiles as well was faster at one row and slower at 64 rows, 51.9
#: -> 53.2 us for top_k(50), so it was left out). The measurements that set the limits below were
#: taken before the skip; with it, 128 for fp32 and 64 for 16-bit logits lost again
#: (results/h200-ab-pairwise-limits.txt). H200, CUDA graph, L2 flushed, 151936 fp32 logits, the
#: same tokens (results/h200-probe-pairwise.txt), 128 -> 64: one row top-p 0.9 29.1 -> 25.5 us,
#: min-p 0.05 23.1 -> 19.7, top-k 50 18.6 -> 17.1, top-k 50 + top-p 23.1 -> 19.6; 64 rows top-p
#: 108.1 -> 104.2, min-p 104.5 -> 100.8, top-k 50 + top-p 97.1 -> 94.2, flat rows equal or faster.
#: 32 was faster still for top-p and min-p but 37-65 us slower for top-k 50 + top-p (lists of about
#: 45 tokens then take the bracket search); chunks of 16 gained nothing. ``top_k`` keeps 128
#: (PAIRWISE_MAX_TOP_K): at 64 it sorted more lists, 64 rows top_k(50) 89.4 -> 101.3 us. So do
#: 16-bit logits (PAIRWISE_MAX_16BIT; only fp32 was measured at 64): their values tie in groups the
#: sub-bins cannot split, and a group longer than the limit takes the bracket search (one row of
#: 151936 bf16 of standard deviation 4, top-p 0.9, 24 inputs interpreted on the CPU: 3 refined to
#: 83-115 tokens; one such row took 83 us on the H200 at 64). fp32 rows refine to 4-31 tokens
#: (peaked) or to hundreds (flat). That was measured before SORT_MID_LISTS: lists past the limit
#: are now sorted, not searched, so 64 for 16-bit logits may no longer lose; not yet measured.
#: Sampling and thresholds rank a list of at most PAIR_CHUNK tokens (an empty one included) on one
#: [PAIR_CHUNK, PAIR_CHUNK] tile (results/h200-ab-lean-histogram.txt, with the histogram's leaner
#: loop: one row top-p 0.9 24.3 -> 22.5 us, min-p 0.05 17.7 -> 16.4; resolve at 64 rows 12.9 ->
#: 11.7 us).
PAIRWISE_MAX = 64
PAIRWISE_MAX_TOP_K = 128
PAIRWISE_MAX_16BIT = 128
PAIR_CHUNK = 32
#: Sampling and thresholds: lists longer than the pairwise limit after the sub-bin refinement are
#: sorted (``resolve_kernel``'s SORT_MID) when they have at most SORT_MAX tokens, instead of
#: taking the bracket search. Flat rows refine to hundreds of tokens (181-575 for one row of
#: 151936 of standard deviation 2 under top-p 0.9, interpreted on the CPU) and take the search.
SORT_MID_LISTS = True
#: ``top_k`` sorts lists up to this long; the largest k the kernels serve (larger k: a stable
#: torch.sort).
SORT_MAX = 1024
TOP_K_KERNEL_MAX = SORT_MAX
#: Bracket search: tokens per block and sub-intervals per pass.
SEARCH_BLOCK = 1024
SEARCH_SLOTS = 16
#: Programs per SM aimed at by the filtered path's row passes (4, 8, 16, 32 measured on the H200
#: at 1 and 64 rows of 151936): best at 16. Re-measured with the pre-list and the count pass
#: (results/h200-ab-programs-per-sm.txt, 64 rows fp32): 8 per SM about 1 us faster on peaked rows,
#: 7-17 us slower on flat ones; 6 (one wave of the histogram pass) and 4 slower everywhere. In the
#: listed descent, whose rounds take a plan of their own, 15 and 22 per row at 64 rows tie the
#: default's 30 within 0.7 us (results/h100-probe-listed-plan.txt). (The unfiltered race:
#: RACE_PROGRAMS_PER_SM.)
FILTER_PROGRAMS_PER_SM = 16
#: L2 eviction policies of the filtered path's two reads of the logits: the segment maxima's (from
#: HBM) and the histogram pass's (the same bytes again, from L2). "" (the default policy),
#: "evict_last" or "evict_first" (launch choices: the bits do not depend on them). H100, CUDA graph,
#: L2 flushed, 151936 logits (results/h100-probe-read-policy.txt): the histogram pass's read marked
#: evict-first was faster in every case, 64 rows fp32 top-p 0.9 70.9 -> 67.0 us, min-p 0.05 57.4 ->
#: 57.1, top-k 50 55.2 -> 54.6, flat top-p 239.0 -> 232.4, bf16 top-p 61.5 -> 59.6, 16 rows top-p
#: 39.6 -> 37.3; the first read marked evict-last lost 3 us under min-p and top-k at 64 rows.
FILTER_FIRST_READ_POLICY = ""
FILTER_SECOND_READ_POLICY = "evict_first"
#: The unfiltered race (greedy argmax, or plain sampling with the race noise; ``race_plan``):
#: programs per SM, and whether it prefetches. H200, CUDA graph, 64 rows of 151936, two runs
#: (results/h200-probe-race-launch.txt, -2.txt; 4 to 32 per SM, segments of 512 to 4096 tokens, 4
#: to 16 warps, prefetch on and off), kernel time after do_bench's flush unless said:
#: - float32 greedy, a plain read: 8 per SM with prefetch (RACE_PROGRAMS_PER_SM_FLOAT32_GREEDY),
#:   16.4 us; 24 and 32 per SM were 0.3-0.4 us faster after this flush (16.0-16.1) and 0.6-0.9 us
#:   slower after one that leaves the L2 clean (13.7-13.8 against 12.9-13.1); 16 per SM 17.5-17.7.
#:   A read of these logits costs that much after do_bench's flush, whose dirty lines the 39 MB
#:   read evicts and writes back: treefold's argmax took 17.4-17.5 us, torch.amax 23.7-23.9.
#: - with the noise (Philox per token: compute-bound), 16 per SM: float32 29.4 -> 27.4-27.7 us.
#: - 16-bit logits, greedy or not, at 16 per SM without prefetch (``race_plan``): a segment is one
#:   16-byte load per thread, and 16 programs per SM keep as many bytes in flight as a prefetch
#:   would, without its registers. bf16 sampling 30.8 (8 per SM) and 28.1-28.3 (16 with prefetch)
#:   -> 26.8-26.9 us; greedy 11.2 (8 per SM) and 11.3-11.7 (16 with prefetch) -> 10.6-10.7, where
#:   12 per SM with prefetch read 10.4 in both runs (12 without prefetch was not measured; one
#:   rule for both kinds of race was kept).
#: One row (149 programs of one segment) moves little under any of them: greedy 3.2-3.4 us at the
#: default width, 2.9-3.7 across every variant.
RACE_PROGRAMS_PER_SM = 16
#: float32 greedy's exception to RACE_PROGRAMS_PER_SM (see there).
RACE_PROGRAMS_PER_SM_FLOAT32_GREEDY = 8
#: Segment width: next_pow2(n) clamped to [MIN_WIDTH, MAX_WIDTH]. At least one element per lane
#: of a warp (no replicated elements), at most 8 per thread of 4 warps.
MIN_WIDTH = 32
MAX_WIDTH = 1024
#: Sampling: a row whose sure-kept bins hold at most this many tokens (the histogram tells, and
#: the plan pass decides, before the compaction pass) lists them all for the one program per row
#: of the resolve pass, which draws noise for those tokens alone; a row with more has every
#: segment race its own sure-kept tokens in place (noise for the whole segment, in parallel; by
#: the compaction launch's race programs, ``compact_kernel``'s RACE_PROGRAMS). Measured when
#: that race lived in the compaction pass (H200, 64 rows of 151936 fp32, CUDA graph, L2
#: flushed, one run): top-p 0.9 202.6 us (all raced in place: 216.4), min-p 0.05 134.1
#: (128.8), and rows kept whole (flat logits, p = 1 as a tensor) 150.9 us where listing them all
#: took 494: the resolve pass races about 0.5 tokens per ns per row.
SURE_LIST_MAX = 8192
#: The same limit on grids where the compaction races in place itself (``race_in_compaction``:
#: at most COMPACT_RACE_PROGRAMS_PER_SM programs per SM, e.g. one row of 151936) and reads no
#: pre-list: there the in-place race is spread over all the row's programs at once, in a pass
#: that reads the logits anyway, so every row races in place and the resolve pass only merges
#: the winners. H200, CUDA graph, L2 flushed, one row of 151936, the same tokens
#: (results/h200-probe-resolve-one-row.txt), 8192 -> 0: fp32 top-p 0.9 25.5 -> 24.5 us, min-p
#: 0.05 19.5 -> 18.0, bf16 top-p 83.4 -> 83.7 (an input whose tie group took the bracket
#: search at the pairwise limit of 64, see PAIRWISE_MAX_16BIT); top-k 50 and 64 rows do not race
#: in the compaction: unchanged.
SURE_LIST_MAX_IN_COMPACTION = 0
#: Sampling: the compaction pass races sure-kept tokens in place itself (``compact_kernel``'s
#: RACE_SURE) when its grid has at most this many programs per SM, the most its registers allow
#: with that race in it (154 on sm_90): all programs are then resident at once either way, and
#: race programs would only add their own (one row of 151936 takes 149 programs). Larger grids
#: keep the race in race programs of their own in the same launch (RACE_PROGRAMS): without it
#: in their loops the compaction's programs held 4 per SM (128 registers) instead of 3. Those
#: took a launch of their own (``race_kernel``) until the chain probe showed it adding 2.9 us
#: to 64 rows of peaked logits, where no row races in place
#: (results/h200-sampling-chain.txt). Offline (sm_90, 64 rows of 151936, the pre-list on) the
#: kernel now takes 144 registers with the race programs' path in it and 145 with the race in
#: its loops (112 with neither): 3 per SM either way, the race programs doubling the grid. They
#: are still the faster launch (H100, CUDA graph, L2 flushed, 64 rows, the same tokens,
#: results/h100-probe-compact-race.txt; race programs / in the loops): fp32 top-p 0.9 71.0 /
#: 71.8 us, min-p 0.05 61.0 / 61.4, bf16 top-p 61.8 / 64.2, flat min-p 116.0 / 117.3; only flat
#: top-p gains from the loops (238.8 / 236.6).
COMPACT_RACE_PROGRAMS_PER_SM = 3
#: Registers per thread the histogram pass may take (Triton's ``maxnreg``): sm_90 holds 8 of its
#: 4-warp programs per SM at 64, and its fp32 form with masses wants 66 uncapped (7 per SM: the
#: 1920 programs of 64 rows of 151936 fill 2.08 waves; at 8 per SM, 1.82). At 64 it keeps every
#: value in a register while a program lists its tokens once, after its last segment (offline
#: sm_90, 64 rows: no stack, the same 832 instructions); programs of LIST_CHUNK segments and more
#: also list inside their loop, and spill under the cap (8 to 208 bytes of stack offline): they
#: are not capped.
HISTOGRAM_MAX_REGISTERS = 64
#: Warps of a compaction program with segments of 1024 tokens on a grid the device holds at 2
#: programs per SM (sm_90: 80 registers, 102 with the race in place; the row passes take 4).
#: H200, CUDA graph, L2 flushed, one process each (results/h200-probe-sampling-compact.txt): one
#: row of 151936 fp32, 149 programs: top-k 50 + top-p 32.3 -> 29.8 us, top_k(50) 20.6 -> 19.5,
#: top-p 37.5 -> 37.0; at 64 rows (1920 programs) 8 warps lost 1-26 us everywhere, so 4 stay.
COMPACT_WARPS_ONE_WAVE = 8
#: The histogram pass lists the tokens of its first PRELIST_BINS bins (within PRELIST_BINS /
#: BINS_PER_NAT = 10 nats of the row's maximum), up to a capacity of PRELIST_FRACTION of the row;
#: a row whose kept prefix ends inside those bins, with its pre-list complete, has the
#: compaction read the pre-list instead of the row. Logits of standard deviation 4 over 151936
#: tokens (the benchmark's peaked rows) put about 5000 tokens within 10 nats of the maximum, and
#: the boundaries of top-p 0.9 about 7 nats, min-p 0.05 3 nats and top-k 50 about 3 nats below it.
#: Each lane marks its tokens segment by segment and a program lists them once (H200, 64 rows of
#: 151936 fp32: the histogram launch 36.5 us without the pre-list, 47.1 with it; listing once
#: per segment had cost 57.7). The compaction's reading of the pre-list wins that back in every
#: filter whose boundary lies near the maximum, at 64 rows fp32: top-p 0.9 158.9 -> 117.5 us
#: when it came (listing per segment; results/h200-probe-sampling-prelist.txt), and with the
#: listing once per program min-p 0.05 100.7 -> 85.6, top-k 50 95.9 -> 81.0, top_k(50) 89.2 ->
#: 82.3 (bf16 alike; results/h200-ab-prelist-always.txt). Rows too flat for the list (a
#: quarter of the row within 10 nats) pay for it: min-p 115.6 -> 133.8 us at 64 flat rows,
#: 126.4 once a program that marks more than twice its share gives the list up (top-p 0.9
#: there 255.0 -> 248.0 with it; results/h200-ab-prelist-give-up.txt). So every filtered call
#: on a grid of more than PRELIST_MIN_PROGRAMS_PER_SM programs per SM makes the pre-list (4 rows
#: of 151936 and more on the H200; at one row, 149 programs, it lost 1-3 us), unless no filter
#: can end a row's kept prefix inside it. Its buffer is rows x n * PRELIST_FRACTION int32.
#: Such calls count no bins in the histogram pass: ``bin_count_kernel`` counts them after it,
#: from the pre-list of a row whose list holds its kept prefix (the rest of the row one lump of
#: known count and exact mass), from the row otherwise. H200, 64 rows of 151936, CUDA graph, L2
#: flushed, tokens equal (results/h200-ab-counts-from-list.txt): histogram 47.6 -> 28.1 us, the
#: count pass 7.4, the plan 12.7 -> 2.3 (its wait shorter); fp32 top-p 0.9 93.9 -> 81.4 us, min-p
#: 0.05 86.0 -> 73.9, top-k 50 81.3 -> 68.7, top_k(50) 82.3 -> 74.3, bf16 alike; flat rows, which
#: the count pass reads again, 12 us slower (top-p 248.3 -> 260.4, min-p 126.0 -> 138.4).
PRELIST_BINS = 40
PRELIST_FRACTION = 0.25
PRELIST_MIN_PROGRAMS_PER_SM = 4
#: Each pass after a call's first is a programmatic dependent launch (sm_90): its programs start
#: while the previous pass finishes, and wait for its writes before reading anything. H200, CUDA
#: graph, L2 flushed, 151936 fp32 logits (results/h200-probe-sampling-pdl.txt): one row, every
#: filter 0.7-2.2 us faster (top-k 50 21.1 -> 19.0, top-p 34.9 -> 34.1, greedy 8.4 -> 7.7); 64
#: rows top-p 117.4 -> 114.8, greedy 20.7 -> 20.0. A program that starts early waits in place:
#: the previous pass's programs have all started by then, so it never holds a place they need.
DEPENDENT_LAUNCH = True
#: Warps of the one-program-per-row resolve pass when sampling. At one row its time is a chain
#: of dependent loads and block-wide reductions on one SM. H200, CUDA graph, L2 flushed, 151936
#: fp32 logits, the same tokens (results/h200-probe-resolve-launch.txt), 16 warps against 8: one
#: row top-p 0.9 33.4 -> 30.6 us, min-p 27.1 -> 24.5, top-k 50 + top-p 26.3 -> 24.0, top-k 50
#: 18.5 -> 18.4; 64 rows top-p 109.5 -> 108.6, min-p 107.7 -> 105.3. 4 warps spill (57.1 us).
#: Again on an H100 on today's kernels (results/h100-probe-resolve-launch-warps.txt; 16 -> 8
#: warps, where the kernel holds 244 registers and no stack against 128 and 96 bytes): calls
#: without top-p 0.4-0.8 us faster at 8 (min-p one row 15.2 -> 14.4, 64 rows 61.3 -> 60.8),
#: top-k 50 + top-p 18.6 -> 20.5 and 64-row top-p 71.5 -> 73.2 slower: 16 stays.
RESOLVE_WARPS = 16
#: The same for ``top_k`` and the masks (their resolve sorts or searches): not measured at 16.
RESOLVE_WARPS_TOP_K_AND_MASKS = 8
#: Whether the row passes load each segment before working on the previous one (None: when a
#: program reads more than one segment). On the H200, in a CUDA graph with L2 flushed, 151936
#: logits: at 64 rows (5-9 segments per program) fp32 greedy 23.4 -> 20.8 us, top-k 50
#: 114 -> 108, top-p 0.9 223 -> 203, min-p 150 -> 135 (bf16: 1-7%); at one row (one segment per
#: program) it only adds a masked load: 0-1.3 us slower. (The unfiltered race on 16-bit logits
#: never prefetches: RACE_PROGRAMS_PER_SM.)
PREFETCH = None

Scalar = Union[int, float]

_RACE = Launcher(kernels.race_kernel)
_RACE_COMBINE = Launcher(kernels.race_combine_kernel)
_SEGMENT_MAX = Launcher(kernels.segment_max_kernel)
_HISTOGRAM = Launcher(kernels.bin_histogram_kernel)
_COUNT = Launcher(kernels.bin_count_kernel)
_PLAN = Launcher(kernels.plan_kernel)
_COMPACT = Launcher(kernels.compact_kernel)
_RESOLVE = Launcher(kernels.resolve_kernel)
_APPLY = Launcher(kernels.apply_filter_kernel)
_TOP_K_LANES = Launcher(kernels.top_k_lanes_kernel)
_TOP_K_LANES_FINISH = Launcher(kernels.top_k_lanes_finish_kernel)
_DESCENT = Launcher(kernels.descent_kernel)


@dataclass(frozen=True)
class Plan:
    """How a [rows, n] call is cut into programs (launch choices only)."""
    width: int
    segments_per_program: int
    programs_per_row: int
    parts_pow2: int
    num_warps: int
    prefetch: bool


@functools.lru_cache(maxsize=64)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


@functools.lru_cache(maxsize=512, typed=True)  # 2.0 is not 2: each is checked
def plan(rows: int, n: int, device: torch.device, programs_per_row: Optional[int] = None,
         programs_per_sm: Optional[int] = None, prefetch: Optional[bool] = None) -> Plan:
    """Segments of ``width`` tokens, ``segments_per_program`` of them per program. The programs
    per row are given, or aimed at ``programs_per_sm`` (default FILTER_PROGRAMS_PER_SM) per SM.
    ``prefetch``: the row passes load each segment before working on the previous one (default:
    PREFETCH's rule)."""
    width = min(max(order.next_pow2(n), MIN_WIDTH), MAX_WIDTH)
    segments = order.cdiv(n, width)
    if programs_per_row is None:
        per_sm = FILTER_PROGRAMS_PER_SM if programs_per_sm is None else programs_per_sm
        programs_per_row = order.cdiv(per_sm * _sm_count(device), max(rows, 1))
    programs_per_row = max(1, min(segments, programs_per_row))
    spp = order.cdiv(segments, programs_per_row)
    programs_per_row = order.cdiv(segments, spp)
    if prefetch is None:
        prefetch = spp > 1 if PREFETCH is None else PREFETCH
    return Plan(width, spp, programs_per_row, order.next_pow2(programs_per_row),
                max(1, min(4, width // 256)), bool(prefetch))


def race_plan(rows: int, n: int, dtype: torch.dtype, device: torch.device, greedy: bool,
              programs_per_row: Optional[int] = None, prefetch: Optional[bool] = None) -> Plan:
    """``plan`` of the unfiltered race (``greedy``: no noise) by RACE_PROGRAMS_PER_SM's rule:
    RACE_PROGRAMS_PER_SM programs per SM (RACE_PROGRAMS_PER_SM_FLOAT32_GREEDY for float32 greedy),
    and no prefetch for 16-bit logits. ``programs_per_row`` and ``prefetch``, when given, are used
    as ``plan`` uses them."""
    float32 = dtype == torch.float32
    per_sm = RACE_PROGRAMS_PER_SM_FLOAT32_GREEDY if greedy and float32 else RACE_PROGRAMS_PER_SM
    if prefetch is None and not float32:
        prefetch = False
    return plan(rows, n, device, programs_per_row, per_sm, prefetch)


def _prelist_bins(top_k, top_p, min_p, programs: int, sms: int) -> int:
    """The histogram's pre-list bins for a call (0: none), by PRELIST_BINS' rule. A filter given
    as a per-row tensor may end some row's prefix in the pre-list; scalar ones that keep every
    token (no top_k, top_p None or >= 1, min_p None or 0) cannot."""
    def keeps_all(value, whole):
        return value is None or (not isinstance(value, torch.Tensor) and whole(value))

    if top_k is None and keeps_all(top_p, lambda p: p >= 1.0) and keeps_all(min_p, lambda q: q <= 0.0):
        return 0
    return PRELIST_BINS if programs > PRELIST_MIN_PROGRAMS_PER_SM * sms else 0


def _needs_masses(mode: int, top_p) -> bool:
    """Whether a call's passes must sum probability masses: the mask functions (their kept mass
    renormalises probabilities) and calls where top-p can be on in some row (a per-row tensor, or
    a scalar below 1). Sampling under top-k and min-p alone, and ``top_k``, decide on counts and
    on each token's own weight: their histogram and compaction take no fixed-point weights."""
    if mode == kernels.MODE_THRESHOLD.value:
        return True
    return isinstance(top_p, torch.Tensor) or (top_p is not None and top_p < 1.0)


def _chained(dev: torch.device) -> tuple:
    """Launch options of a call's passes by DEPENDENT_LAUNCH: (options of the first pass, of a
    pass between two others, of the last)."""
    if not (DEPENDENT_LAUNCH and dependent_launch(dev.type, dev.index)):
        return {}, {}, {}
    return (dict(RELEASE_DEPENDENTS=True), dict(WAIT_FOR_PRIOR=True, RELEASE_DEPENDENTS=True, launch_pdl=True),
            dict(WAIT_FOR_PRIOR=True, launch_pdl=True))


def _prefetch(g: Plan, asked: Optional[bool], chained: dict, loads_before_wait: bool) -> bool:
    """PREFETCH of a pass after the first: what the caller ``asked`` for (a launch choice under
    study), else the plan's, or True when the pass is a dependent launch (``chained`` from
    ``_chained``) whose kernel loads its first segment of logits before it waits for the
    previous pass (``loads_before_wait``): that load then overlaps the wait, whatever the
    segments per program."""
    if asked is not None:
        return asked
    return g.prefetch or ("WAIT_FOR_PRIOR" in chained and loads_before_wait)


def _compact_warps(g: Plan, programs: int, sms: int) -> int:
    """Warps of a compaction program: the row passes' warps, or COMPACT_WARPS_ONE_WAVE for
    segments of 1024 tokens when the grid fits on the device at 2 programs per SM."""
    if programs <= 2 * sms:
        return max(g.num_warps, min(COMPACT_WARPS_ONE_WAVE, g.width // 128))
    return g.num_warps


def _param(value) -> tuple:
    """(kernel argument, is a per-row tensor)."""
    if isinstance(value, torch.Tensor):
        return value, True
    return (0 if value is None else value), False


def _random(value) -> tuple:
    """(kernel argument, stride, is a tensor) for seed and offset."""
    if isinstance(value, torch.Tensor):
        return value, (0 if value.numel() == 1 else 1), True
    return int(value), 0, False


def _common(x: torch.Tensor, temperature, top_k, top_p, min_p, seed, offset) -> dict:
    t, t_row = _param(temperature)
    k, k_row = _param(top_k)
    p, p_row = _param(top_p)
    mp, mp_row = _param(min_p)
    s, s_stride, s_tensor = _random(seed)
    o, o_stride, o_tensor = _random(offset)
    filters = (top_k is not None) * 1 + (top_p is not None) * 2 + (min_p is not None) * 4
    # (flags_without_k: for the kernels that take top-k as a launch constant or not at all)
    flags_without_k = dict(T_ROW=t_row, P_ROW=p_row, MINP_ROW=mp_row, SEED_TENSOR=s_tensor, OFFSET_TENSOR=o_tensor)
    return dict(args=(t, k, p, mp, filters, s, s_stride, o, o_stride), unit_t=_unit_temperature(temperature),
                flags=dict(K_ROW=k_row, **flags_without_k), flags_without_k=flags_without_k)


def _unit_temperature(temperature) -> bool:
    """Whether the logits are used unscaled: a scalar temperature of 1, or 0 (greedy). The row
    passes then skip the scaling and its clamp (the kernels' UNIT_T)."""
    return not isinstance(temperature, torch.Tensor) and temperature in (0.0, 1.0)


class _Run:
    """How one call's launches go: each at once, or, for the first eager call of its kind
    (``prepare``), each at once and kept as a ``PreparedLaunch`` with the names of its slots:
    the tensors of ``slots`` (name -> tensor) it reads or writes, and the integer arguments
    named in ``scalars`` ("seed", "offset": values that change from call to call)."""

    def __init__(self, prepare: bool = False, slots: Optional[dict] = None, scalars: tuple = ()):
        self.prepare = prepare
        self.slots = slots or {}
        self.scalars = scalars
        self.launches = []

    def __call__(self, launcher: Launcher, grid, *args, **kwargs):
        if not self.prepare:
            launcher(grid, *args, **kwargs)
            return
        names = tuple(name for name, t in self.slots.items() if any(a is t for a in args))
        scalars = tuple(name for name in self.scalars if launcher.takes(name))
        prepared = launcher.prepare(grid, args, kwargs, tuple(self.slots[name] for name in names), scalars)
        self.launches.append((prepared, names, scalars))

    def buffer(self, name: str, shape, dtype: torch.dtype, device) -> torch.Tensor:
        """A per-call buffer, named as a slot of the prepared launches."""
        t = torch.empty(shape, dtype=dtype, device=device)
        if self.prepare:
            self.slots[name] = t
        return t


@dataclass(frozen=True)
class _FirstPasses:
    """What the filtered path's first two passes write (``_maxima_and_histogram``), for the
    passes after them: ``segment_max_kernel``'s maxima and the counters it clears, and
    ``bin_histogram_kernel``'s masses and bin counts or pre-list (their docstrings give each)."""
    part_max: torch.Tensor
    part_total: torch.Tensor
    hist: torch.Tensor
    fine: torch.Tensor
    counter: torch.Tensor
    part_listed: torch.Tensor
    part_valid: torch.Tensor
    prelist: torch.Tensor
    prelist_count: torch.Tensor
    prelist_stride: int

    @staticmethod
    def allocate(run: _Run, rows: int, parts: int, listing: bool, n: int, dev) -> "_FirstPasses":
        """The buffers of a call of ``rows`` rows of ``n`` with ``parts`` programs in all, with a
        pre-list (``listing``: PRELIST_FRACTION of the row) or not (then a single element for it
        and for each listing partial)."""
        prelist_stride = max(1, int(n * PRELIST_FRACTION)) if listing else 1
        return _FirstPasses(
            run.buffer("part_max", parts, torch.float32, dev), run.buffer("part_total", parts, torch.int64, dev),
            run.buffer("hist", (rows, NUM_BINS), torch.int32, dev),
            run.buffer("fine", (rows, FINE_BINS), torch.int32, dev),
            run.buffer("counter", rows, torch.int64, dev),
            run.buffer("part_listed", parts if listing else 1, torch.int64, dev),
            run.buffer("part_valid", parts if listing else 1, torch.int32, dev),
            run.buffer("prelist", (rows, prelist_stride), torch.int32, dev),
            run.buffer("prelist_count", rows, torch.int32, dev), prelist_stride)


def _maxima_and_histogram(run: _Run, x: torch.Tensor, g: Plan, c: dict, b: _FirstPasses, prelist_bins: int,
                          masses: bool, all_values: bool, prefetch: Optional[bool], first: dict,
                          middle: dict) -> None:
    """The filtered path's first two passes over the row: the segment maxima, then the masses
    and the bin histogram or the pre-list, into ``b`` (``c`` from ``_common``; ``first`` and
    ``middle`` from ``_chained``)."""
    rows, n = x.shape
    grid = (rows * g.programs_per_row,)
    t = c["args"][0]
    t_row = c["flags"]["T_ROW"]
    run(_SEGMENT_MAX,
        grid, x, n, x.stride(0), b.part_max, b.hist, b.fine, b.counter, b.prelist_count, g.programs_per_row, t,
        b.part_max, T_ROW=t_row, WIDTH=g.width, SEGMENTS_PER_PROGRAM=g.segments_per_program,
        NUM_BINS=NUM_BINS, FINE_BINS=FINE_BINS, PREFETCH=g.prefetch, UNIT_T=c["unit_t"],
        READ_POLICY=FILTER_FIRST_READ_POLICY, num_warps=g.num_warps, **first)
    run(_HISTOGRAM,
        grid, x, n, x.stride(0), b.part_max, b.part_total, b.hist, b.part_listed, b.part_valid, b.prelist,
        b.prelist_stride, b.prelist_count, g.programs_per_row, t,
        T_ROW=t_row, WIDTH=g.width, SEGMENTS_PER_PROGRAM=g.segments_per_program,
        PARTS_POW2=g.parts_pow2, NUM_BINS=NUM_BINS,
        BINS_PER_NAT=BINS_PER_NAT, ALL_VALUES=all_values, PRELIST_BINS=prelist_bins, MASSES=masses,
        PREFETCH=_prefetch(g, prefetch, middle, True), UNIT_T=c["unit_t"],
        READ_POLICY=FILTER_SECOND_READ_POLICY, num_warps=g.num_warps,
        **register_cap(HISTOGRAM_MAX_REGISTERS if g.segments_per_program < kernels.LIST_CHUNK.value else None),
        **middle)


def _pipeline(x: torch.Tensor, mode, temperature, top_k, top_p, min_p, seed, offset, *,
              all_values: bool, outputs: dict, k_out: int, programs_per_row: Optional[int],
              prefetch: Optional[bool] = None, run: Optional[_Run] = None):
    """segment max -> histogram (-> bin counts, with a pre-list) -> plan -> compaction -> resolve
    (the filtered path)."""
    rows, n = x.shape
    dev = x.device
    run = run or _Run()
    g = plan(rows, n, dev, programs_per_row, None, prefetch)
    c = _common(x, temperature, top_k, top_p, min_p, seed, offset)
    t, k, p, mp, filters, s, s_stride, o, o_stride = c["args"]
    flags = c["flags"]
    grid = (rows * g.programs_per_row,)
    prelist_bins = _prelist_bins(top_k, top_p, min_p, grid[0], _sm_count(dev))
    b = _FirstPasses.allocate(run, rows, grid[0], prelist_bins > 0, n, dev)
    part_max, part_total, hist, fine, counter = b.part_max, b.part_total, b.hist, b.fine, b.counter
    prelist, prelist_stride, prelist_count = b.prelist, b.prelist_stride, b.prelist_count
    part_listed, part_valid = b.part_listed, b.part_valid
    plan_rows = run.buffer("plan", (rows, kernels.PLAN_SLOTS.value), torch.int32, dev)
    boundary = run.buffer("boundary", (rows, n), torch.int32, dev)
    part_mass = run.buffer("part_mass", grid[0], torch.int64, dev)
    part_kept = run.buffer("part_kept", grid[0], torch.int64, dev)
    part_score = run.buffer("part_score", grid[0], torch.float32, dev)
    part_index = run.buffer("part_index", grid[0], torch.int64, dev)
    list_rows = run.buffer("list_rows", rows if prelist_bins else 1, torch.int32, dev)
    first, middle, last = _chained(dev)
    # Masses are read only by top-p and by the mask functions' outputs (``_needs_masses``).
    masses = _needs_masses(mode, top_p)
    pairwise_max = (PAIRWISE_MAX_TOP_K if mode == kernels.MODE_TOPK.value
                    else PAIRWISE_MAX if x.dtype == torch.float32 else PAIRWISE_MAX_16BIT)
    _maxima_and_histogram(run, x, g, c, b, prelist_bins, masses, all_values, prefetch, first, middle)
    if prelist_bins:
        # the bins counted from the pre-list where it holds the kept prefix, from the row elsewhere
        run(_COUNT,
            grid, x, n, x.stride(0), part_max, part_total, part_listed, part_valid, hist, prelist,
            prelist_stride, prelist_count, list_rows, g.programs_per_row, t, k, p, mp, filters,
            T_ROW=flags["T_ROW"], K_ROW=flags["K_ROW"], P_ROW=flags["P_ROW"], MINP_ROW=flags["MINP_ROW"],
            WIDTH=g.width, SEGMENTS_PER_PROGRAM=g.segments_per_program, PARTS_POW2=g.parts_pow2,
            NUM_BINS=NUM_BINS, BINS_PER_NAT=BINS_PER_NAT, ALL_VALUES=all_values, PRELIST_BINS=prelist_bins,
            PREFETCH=g.prefetch, UNIT_T=c["unit_t"], num_warps=g.num_warps, **middle)
    # Sampling: rows with more sure-kept tokens than the resolve pass races cheaply race them in
    # place, in the compaction pass or in a race launch after it. A scalar top_k <= SURE_LIST_MAX
    # leaves at most k tokens before the boundary bins in every row: nothing to race there.
    sure_race = mode == kernels.MODE_SAMPLE.value and not (
        isinstance(top_k, int) and top_k <= SURE_LIST_MAX)
    race_in_compaction = sure_race and (
        rows * g.programs_per_row <= COMPACT_RACE_PROGRAMS_PER_SM * _sm_count(dev))
    # (a compaction that reads the pre-list instead of the row would read the row again to race)
    sure_list_max = SURE_LIST_MAX_IN_COMPACTION if race_in_compaction and not prelist_bins else SURE_LIST_MAX
    run(_PLAN,
        (rows,), part_max, part_total, hist, plan_rows, n, g.programs_per_row, t, k, p, mp, filters,
        part_listed, part_valid, prelist_count, list_rows,
        T_ROW=flags["T_ROW"], K_ROW=flags["K_ROW"], P_ROW=flags["P_ROW"], MINP_ROW=flags["MINP_ROW"], MODE=mode,
        SURE_LIST_MAX=sure_list_max, PARTS_POW2=g.parts_pow2, NUM_BINS=NUM_BINS, BINS_PER_NAT=BINS_PER_NAT,
        LIST_COUNTS=bool(prelist_bins), num_warps=1, **middle)
    # the in-place race of sure-kept tokens: inside the compaction's programs on grids the device
    # holds at once, else by race programs after them in the same launch (rows not raced in
    # place: their race programs read the plan and store no winner)
    race_programs = sure_race and not race_in_compaction
    run(_COMPACT,
        (grid[0] * (2 if race_programs else 1),), x, n, x.stride(0), fine, counter, plan_rows, boundary, n,
        part_mass, part_kept, part_score, part_index, prelist, prelist_stride, prelist_count,
        g.programs_per_row, t, k, p, mp, filters,
        s, s_stride, o, o_stride, grid[0], **flags, MODE=mode, WIDTH=g.width,
        SEGMENTS_PER_PROGRAM=g.segments_per_program, NUM_BINS=NUM_BINS,
        BINS_PER_NAT=BINS_PER_NAT, FINE_BINS=FINE_BINS, FINE_ABOVE=pairwise_max, ALL_VALUES=all_values,
        RACE_SURE=race_in_compaction, RACE_PROGRAMS=race_programs, RACE_PREFETCH=g.prefetch,
        PRELIST_BINS=prelist_bins, MASSES=masses,
        PREFETCH=_prefetch(g, prefetch, middle, not prelist_bins), UNIT_T=c["unit_t"],
        num_warps=_compact_warps(g, grid[0], _sm_count(dev)),
        **middle)
    spare = counter  # pointer arguments a mode does not use
    run(_RESOLVE,
        (rows,), x, n, x.stride(0), part_max, part_total, fine, counter, plan_rows, boundary, n,
        part_mass, part_kept, part_score, part_index, g.programs_per_row, t, k, p, mp, filters,
        s, s_stride, o, o_stride, outputs.get("token", spare), outputs.get("lo", spare), outputs.get("hi", spare),
        outputs.get("thr", spare), outputs.get("max", spare), outputs.get("mass", spare),
        outputs.get("values", spare), outputs.get("indices", spare), k_out,
        **flags, MODE=mode, PARTS_POW2=g.parts_pow2, SORT_SMALL=pairwise_max,
        PAIR_CHUNK=min(PAIR_CHUNK, pairwise_max), SORT_LARGE=SORT_MAX,
        SEARCH_BLOCK=SEARCH_BLOCK, SLOTS=SEARCH_SLOTS, FINE_BINS=FINE_BINS,
        BINS_PER_NAT=BINS_PER_NAT, ALL_VALUES=all_values, SURE_PARTIALS=sure_race,
        SURE_LIST=sure_list_max > 0, SORT_MID=SORT_MID_LISTS,
        num_warps=RESOLVE_WARPS if mode == kernels.MODE_SAMPLE.value else RESOLVE_WARPS_TOP_K_AND_MASKS,
        **last)
    return g


def _check_rows(fn: str, x: torch.Tensor) -> None:
    """The layout every launch here reads: rows [rows, n] at x.stride(0) apart, each contiguous
    (the public functions copy other layouts first)."""
    if x.dim() != 2 or (x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError(f"{fn}: x must be [rows, n] with contiguous rows, got shape {tuple(x.shape)} "
                         f"and strides {x.stride()}")


def sample_rows(x: torch.Tensor, temperature, top_k=None, top_p=None, min_p=None, seed=0,
                offset=0, *, programs_per_row: Optional[int] = None, prefetch: Optional[bool] = None,
                prepare_key=None) -> torch.Tensor:
    """Token ids [rows] (int64) of logits [rows, n] with the Triton kernels (``programs_per_row``
    and ``prefetch``: launch choices, see ``plan``). ``prepare_key``: keep this call's launches
    as a ``PreparedPipeline`` under this key (``_sample_prepared``)."""
    _check_rows("sample_rows", x)
    rows, n = x.shape
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    greedy = _scalar_greedy(temperature)
    run, seed, offset = _sample_run(prepare_key, x, out, temperature, top_k, top_p, min_p, seed, offset)
    if not _one_race(temperature, top_k, top_p, min_p):
        _pipeline(x, kernels.MODE_SAMPLE.value, temperature, top_k, top_p, min_p, seed, offset,
                  all_values=False, outputs={"token": out}, k_out=0,
                  programs_per_row=programs_per_row, prefetch=prefetch, run=run)
    else:
        # no filter, or greedy with scalar filters (they never remove the top token): one race
        g = race_plan(rows, n, x.dtype, x.device, greedy, programs_per_row, prefetch)
        first, _, last = _chained(x.device)
        _race_and_combine(run, x, g, out, temperature, seed, offset, first, last, prefetch=g.prefetch)
    _keep_prepared(prepare_key, run, (("token", (rows,), torch.int64),))
    return out


def _race_and_combine(run: _Run, x: torch.Tensor, g: Plan, out: torch.Tensor, temperature, seed, offset,
                      race_options: dict, combine_options: dict, *, prefetch: bool, min_p=None,
                      maxima: tuple = ()) -> None:
    """The race over each row's segments on plan ``g`` (``race_kernel``), then its combine into the
    tokens ``out`` (``race_combine_kernel``), with their launch options (``_chained``'s). No noise
    under a scalar temperature of 0. With ``min_p``, only the tokens min-p keeps race: ``maxima``
    holds ``segment_max_kernel``'s maxima of programs and of segments on the same plan."""
    rows, n = x.shape
    t, t_row = _param(temperature)
    s, s_stride, s_tensor = _random(seed)
    o, o_stride, o_tensor = _random(offset)
    grid = rows * g.programs_per_row
    part_score = run.buffer("part_score", grid, torch.float32, x.device)
    part_index = run.buffer("part_index", grid, torch.int64, x.device)
    if min_p is None:  # (min_p and the maxima are read only with MIN_P)
        mp, part_max, segment_max, by_min_p = 0.0, part_score, part_score, {}
    else:
        mp, mp_row = _param(min_p)
        part_max, segment_max = maxima
        by_min_p = dict(MIN_P=True, MINP_ROW=mp_row, PROGRAMS_POW2=g.parts_pow2)
    run(_RACE,
        (grid,), x, n, x.stride(0), part_score, part_index, g.programs_per_row, t, s, s_stride, o,
        o_stride, mp, part_max, segment_max, T_ROW=t_row, SEED_TENSOR=s_tensor, OFFSET_TENSOR=o_tensor,
        NOISE=not _scalar_greedy(temperature), WIDTH=g.width, SEGMENTS_PER_PROGRAM=g.segments_per_program,
        PREFETCH=prefetch, UNIT_T=_unit_temperature(temperature), num_warps=g.num_warps, **by_min_p,
        **race_options)
    run(_RACE_COMBINE,
        (rows,), part_score, part_index, out, g.programs_per_row, t, T_ROW=t_row,
        PROGRAMS_POW2=g.parts_pow2, num_warps=1, **combine_options)


#: ``sample_kernel_rows`` serves sampling under min-p alone by ``sample_min_p_rows`` (the same
#: tokens as the pipeline's, in three launches instead of six).
MIN_P_RACE_SAMPLES = True


def sample_min_p_rows(x: torch.Tensor, temperature, min_p, seed=0, offset=0, *,
                      programs_per_row: Optional[int] = None, prefetch: Optional[bool] = None,
                      prepare_key=None) -> torch.Tensor:
    """Token ids [rows] (int64) of logits [rows, n] under min-p alone, by one race over the tokens
    it keeps: the maxima of programs and of segments (``segment_max_kernel``), then the race
    (``race_kernel`` with MIN_P) on the same plan, reading only the segments whose maximum can
    keep a token, then the race's combine. Min-p keeps the tokens with exp(y - y_max) >= min_p,
    which depend on the row's maximum alone, so the pipeline's histogram, plan, compaction and
    resolve have nothing to decide; the race takes the pipeline's test of a kept token and its
    noise, so the token is the pipeline's (``sample_rows``). ``programs_per_row`` and
    ``prefetch`` (the maxima's pass; the race loads a segment only once its maximum says so):
    launch choices (``race_plan``); ``prepare_key`` as in ``sample_rows``."""
    _check_rows("sample_min_p_rows", x)
    rows, n = x.shape
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    run, seed, offset = _sample_run(prepare_key, x, out, temperature, None, None, min_p, seed, offset)
    g = race_plan(rows, n, x.dtype, x.device, False, programs_per_row, prefetch)
    t, t_row = _param(temperature)
    grid = rows * g.programs_per_row
    part_max = run.buffer("part_max", grid, torch.float32, x.device)
    segment_max = run.buffer("segment_max", grid * g.segments_per_program, torch.float32, x.device)
    first, middle, last = _chained(x.device)
    # (no histogram follows: the maxima's pass clears nothing, its buffers stand in for them)
    run(_SEGMENT_MAX,
        (grid,), x, n, x.stride(0), part_max, part_max, part_max, part_max, part_max, g.programs_per_row, t,
        segment_max, T_ROW=t_row, WIDTH=g.width, SEGMENTS_PER_PROGRAM=g.segments_per_program,
        NUM_BINS=NUM_BINS, FINE_BINS=FINE_BINS, PREFETCH=g.prefetch, UNIT_T=_unit_temperature(temperature),
        READ_POLICY=FILTER_FIRST_READ_POLICY, CLEAR=False, SEGMENT_MAXIMA=True, num_warps=g.num_warps, **first)
    _race_and_combine(run, x, g, out, temperature, seed, offset, middle, last, prefetch=False, min_p=min_p,
                      maxima=(part_max, segment_max))
    _keep_prepared(prepare_key, run, (("token", (rows,), torch.int64),))
    return out


def _min_p_race_serves(temperature, top_k, top_p, min_p) -> bool:
    """Whether ``sample_min_p_rows`` serves a call for ``sample``: min-p without top-k or top-p,
    a call ``sample_rows`` would not serve with one race."""
    return (top_k is None and top_p is None and min_p is not None
            and not _one_race(temperature, top_k, top_p, min_p))


def _scalar_greedy(temperature) -> bool:
    """A scalar temperature of 0: greedy in every row, drawing nothing."""
    return not isinstance(temperature, torch.Tensor) and temperature == 0.0


def _one_race(temperature, top_k, top_p, min_p) -> bool:
    """Whether ``sample_rows`` serves the call with one race over the whole row: no filter, or
    greedy with scalar filters only (they never remove the top token)."""
    if all(v is None for v in (top_k, top_p, min_p)):
        return True
    return _scalar_greedy(temperature) and not any(isinstance(v, torch.Tensor) for v in (top_k, top_p, min_p))


def _sample_run(prepare_key, x: torch.Tensor, out: torch.Tensor, temperature, top_k, top_p, min_p, seed,
                offset) -> tuple:
    """(how a sampling call's launches go, the seed and offset they take). Prepared
    (``prepare_key`` given): the logits, the token and the tensor parameters are slots, and seed
    and offset, where they are ints, the integers that change from call to call; else each
    launch at once. A scalar greedy call draws nothing: its launches take seed and offset 0 (its
    kind leaves them out, ``_sample_key``, so a prepared one has no slot for them)."""
    greedy = _scalar_greedy(temperature)
    if greedy:
        seed, offset = 0, 0
    if prepare_key is None:
        return _Run(), seed, offset
    slots = dict(x=x, token=out, **_tensor_params(temperature, top_k, top_p, min_p, seed, offset))
    ints = () if greedy else tuple(
        name for name, v in (("seed", seed), ("offset", offset)) if not isinstance(v, torch.Tensor))
    return _Run(True, slots, ints), seed, offset


def _keep_prepared(prepare_key, run: _Run, outputs: tuple) -> None:
    """Keep a first eager call's launches as a ``PreparedPipeline`` under ``prepare_key`` when
    every one was prepared (the plan's buffers go to the workspace, the call's tensors stay slots)."""
    if run.prepare and run.launches and all(prepared is not None for prepared, _, _ in run.launches):
        buffers = {name: t for name, t in run.slots.items() if name not in _CALL_TENSORS}
        if len(_PREPARED) >= _MAX_PREPARED:
            _PREPARED.clear()
        _PREPARED[prepare_key] = PreparedPipeline(tuple(run.launches), buffers, outputs)


# ---- prepared eager calls ---------------------------------------------------------------------
# An eager sample(), top_k() or mask call on CUDA keeps its launches, prepared
# (``launch.PreparedLaunch``), per kind of call: the logits' shape, strides, dtype and device, the
# values of the scalar parameters, and which parameters are tensors (with their shapes and
# dtypes). The same kind of call again allocates its outputs and one workspace and launches them,
# with sample's integers seed and offset (which change from call to call) in their slots.

_PREPARED: dict = {}
_MAX_PREPARED = 256
#: Slots that are the call's own tensors (the rest are the plan's buffers, in the workspace).
_CALL_TENSORS = ("x", "token", "values", "indices", "out", "temperature", "top_k", "top_p", "min_p", "seed",
                 "offset")


def _tensor_params(temperature, top_k, top_p, min_p, seed, offset) -> dict:
    """The parameters given as tensors, by slot name."""
    named = (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("min_p", min_p),
             ("seed", seed), ("offset", offset))
    return {name: v for name, v in named if isinstance(v, torch.Tensor)}


def _sample_key(x: torch.Tensor, temperature, top_k, top_p, min_p, seed, offset):
    """The kind of a call: scalar parameters by value, tensors by shape and dtype, integer seed
    and offset by their type alone (``launch.int_type_key``: the kernels do not specialise on
    their values, ``kernels.sampling.RANDOM_ARGS``, and the values fill slots of the prepared
    launches, so an offset counting decode steps stays one kind; greedy calls read neither);
    None when two parameters are
    one tensor (slots are filled by identity, so such a call is not prepared). Module settings
    (SURE_LIST_MAX, the programs per SM, ...) are not in the key: prepared calls keep the plan
    they were made with, so code that changes a setting clears ``_PREPARED``."""
    key = [x.shape, x.stride(), x.dtype, x.get_device()]
    tensors = []
    greedy = _scalar_greedy(temperature)
    for i, v in enumerate((temperature, top_k, top_p, min_p, seed, offset)):
        if greedy and i >= 4:
            key.append(None)  # greedy draws no random numbers: seed and offset are never read
        elif isinstance(v, torch.Tensor):
            if any(v is u for u in tensors):
                return None
            tensors.append(v)
            key.append((v.shape, v.dtype))
        elif i >= 4:
            key.append(int_type_key(v))
        else:
            key.append((v.__class__, v))
    return tuple(key)


def top_k_rows(x: torch.Tensor, k: int, *, programs_per_row: Optional[int] = None,
               prefetch: Optional[bool] = None, prepare_key=None):
    """(values, indices) of the k largest of each row of x [rows, n], k <= TOP_K_KERNEL_MAX.
    ``prepare_key``: keep this call's launches as a ``PreparedPipeline`` under this key."""
    _check_rows("top_k_rows", x)
    rows, n = x.shape
    values = torch.empty((rows, k), dtype=x.dtype, device=x.device)
    indices = torch.empty((rows, k), dtype=torch.int64, device=x.device)
    if rows:
        run = _Run(True, dict(x=x, values=values, indices=indices)) if prepare_key is not None else _Run()
        _pipeline(x, kernels.MODE_TOPK.value, 1.0, k, None, None, 0, 0, all_values=True,
                  outputs={"values": values, "indices": indices}, k_out=k,
                  programs_per_row=programs_per_row, prefetch=prefetch, run=run)
        _keep_prepared(prepare_key, run, (("values", (rows, k), x.dtype), ("indices", (rows, k), torch.int64)))
    return values, indices


#: ``top_k_lanes_rows`` serves k up to this. Its first launch writes each program's k best
#: group maxima, at most TOP_K_LANES_CANDIDATES per row (programs per row are cut to fit). A
#: group is TOP_K_LANES_GROUP lanes (fewer where a segment has fewer than k groups of them).
TOP_K_LANES_MAX = 64
TOP_K_LANES_CANDIDATES = 2048
TOP_K_LANES_GROUP = 8
#: The finishing program's bound is the k-th best of each program's TOP_K_LANES_HEAD best
#: candidates (more where the programs have fewer than k between them): at most k + (k // HEAD)
#: * (k - HEAD) candidates reach it and are sorted (152 for k = 50). A power of two.
TOP_K_LANES_HEAD = 16
#: The tokens at or above the k-th best group's maximum are sorted alone when there are at most
#: this many (about k in logits of models; the rest of the gathered tokens otherwise). A power
#: of two.
TOP_K_LANES_KEPT = 128
#: Warps of ``top_k_lanes_finish_kernel``'s one program per row.
TOP_K_LANES_FINISH_WARPS = 8
#: Whether the finishing launch is a programmatic dependent launch of the first (sm_90).
TOP_K_LANES_DEPENDENT_LAUNCH = True
#: ``top_k`` on CUDA takes ``top_k_lanes_rows`` (k <= TOP_K_LANES_MAX) from this many rows of
#: 4-byte logits, and from TOP_K_LANES_MIN_ROWS_16BIT rows of 2-byte ones; ``top_k_rows`` below.
#: On the H200, 151936 logits, k = 50, kernel time, top_k_rows -> top_k_lanes_rows: float32 1
#: row 10.2 -> 18.3 us, 2 rows 11.0 -> 18.9, 4 18.9 -> 19.4, 8 20.8 -> 20.0, 64 47.4 -> 38.6;
#: bfloat16 1 row 9.9 -> 14.9, 2 10.5 -> 15.2, 4 18.2 -> 15.6, 64 38.0 -> 27.7. (Under the
#: interpreter the pipeline, whose sorts are short, serves every call.)
TOP_K_LANES_MIN_ROWS = 8
TOP_K_LANES_MIN_ROWS_16BIT = 4
#: ... and while the finish gathers at most this many tokens per row (k x group x segments per
#: program; the plan gives programs more segments as rows grow): 2000 for k = 50 at 8-72 rows
#: of 151936 (measured to 64). Beyond it the finish's fallback sort of every gathered token grows with
#: them, and ``top_k_rows`` serves.
TOP_K_LANES_MAX_GATHER = 2048
#: The most tokens per row (a power of two) that the finishing program may sort, whatever the
#: launch choice: its sorts are unrolled into straight-line code, and the compile time grows
#: with them. Offline (sm_90, Triton 3.6, 64 x 151936, k = 50): 2048 tokens (the H200's default
#: plan) compile in about 9 s, 4096 (k = 64) in about 13 s; 65536 (one program per row) gave
#: 20 MB of PTX that ptxas had not finished after 10 minutes and 6.6 GB of memory.
TOP_K_LANES_MAX_SORT = 4096
#: ``sample`` on CUDA under a scalar top_k (with or without top-p and min-p, which then act inside
#: the top k) takes ``sample_top_k_lanes_rows`` from this many rows of 4-byte logits, and from
#: SAMPLE_TOP_K_LANES_MIN_ROWS_16BIT rows of 2-byte ones, within the limits of ``top_k`` by group
#: maxima (k <= TOP_K_LANES_MAX, TOP_K_LANES_MAX_GATHER); ``sample_rows`` below. The same tokens
#: either way, so a request's token does not depend on its batch's choice.
SAMPLE_TOP_K_LANES_MIN_ROWS = 8
SAMPLE_TOP_K_LANES_MIN_ROWS_16BIT = 4


def top_k_lanes_rows(x: torch.Tensor, k: int, *, programs_per_row: Optional[int] = None, prepare_key=None):
    """(values, indices) of the k largest of each row of x [rows, n] in the composite order, as
    ``top_k_rows`` gives them, in two launches (``kernels.top_k_lanes_kernel``, then
    ``top_k_lanes_finish_kernel``): one read of the row keeps each group's maximum and each
    program's k best groups, then one program per row finds the row's k best groups and sorts
    the tokens of theirs that can be among the top k. For k <= TOP_K_LANES_MAX, and for
    ``programs_per_row`` (default: ``plan``'s) that gather at most TOP_K_LANES_MAX_SORT tokens a
    row (ValueError otherwise). ``prepare_key``: keep this call's launches as a
    ``PreparedPipeline`` under this key."""
    _check_lanes("top_k_lanes_rows", x, k)
    rows, _ = x.shape
    values = torch.empty((rows, k), dtype=x.dtype, device=x.device)
    indices = torch.empty((rows, k), dtype=torch.int64, device=x.device)
    if rows == 0:
        return values, indices
    run = _Run(True, dict(x=x, values=values, indices=indices)) if prepare_key is not None else _Run()
    _top_k_lanes_launches(x, k, programs_per_row, run, values, indices)
    _keep_prepared(prepare_key, run, (("values", (rows, k), x.dtype), ("indices", (rows, k), torch.int64)))
    return values, indices


def sample_top_k_lanes_rows(x: torch.Tensor, temperature, top_k: int, top_p=None, min_p=None, seed=0, offset=0,
                            *, programs_per_row: Optional[int] = None, prepare_key=None) -> torch.Tensor:
    """Token ids [rows] (int64) of logits x [rows, n] sampled under top-k (then top-p and min-p
    inside the top k): the tokens ``sample_rows(x, temperature, top_k, top_p, min_p, seed,
    offset)`` gives, in the two launches of ``top_k_lanes_rows`` (the first over finite logits
    only, the second deciding the filters over the row's top k as the pipeline's resolve does
    and racing them instead of writing them out). ``top_k`` an int up to TOP_K_LANES_MAX and
    the row length, ``programs_per_row`` as ``top_k_lanes_rows`` takes it; the rest as
    ``sample_rows`` takes them. ``sample`` takes it on CUDA where
    SAMPLE_TOP_K_LANES_MIN_ROWS' rule says (``sample_kernel_rows``).
    ``prepare_key``: keep this call's launches as a ``PreparedPipeline`` under this key."""
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"sample_top_k_lanes_rows: top_k must be an int, got {type(top_k).__name__}")
    _check_lanes("sample_top_k_lanes_rows", x, top_k)
    rows, _ = x.shape
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    run, seed, offset = _sample_run(prepare_key, x, out, temperature, None, top_p, min_p, seed, offset)
    c = _common(x, temperature, top_k, top_p, min_p, seed, offset)
    t, _, p, mp, filters, s, s_stride, o, o_stride = c["args"]
    flags = c["flags_without_k"]
    _top_k_lanes_launches(x, top_k, programs_per_row, run, out, out, race=(
        out, (t, p, mp, filters, s, s_stride, o, o_stride),
        dict(MASSES=top_p is not None or min_p is not None, **flags)))
    _keep_prepared(prepare_key, run, (("token", (rows,), torch.int64),))
    return out


def _lanes_problem(x: torch.Tensor, k: int) -> Optional[str]:
    """What keeps top_k by group maxima from serving x [rows, n] and k (None: nothing): its
    limits are 1 <= k <= TOP_K_LANES_MAX, k <= n, contiguous rows."""
    if not 1 <= k <= TOP_K_LANES_MAX:
        return f"k must be from 1 to {TOP_K_LANES_MAX}, got {k}"
    if k > x.shape[1]:
        return f"k={k} is more than the row length {x.shape[1]}"
    if x.shape[1] > 1 and x.stride(1) != 1:
        return f"x must have its last dimension contiguous, got strides {x.stride()}"
    return None


def _check_lanes(fn: str, x: torch.Tensor, k: int) -> None:
    problem = _lanes_problem(x, k)
    if problem is not None:
        raise ValueError(f"{fn}: {problem}")


def _top_k_lanes_plan(rows: int, n: int, k: int, device: torch.device, programs_per_row: Optional[int] = None):
    """(plan, lanes per group) of top_k by group maxima: the plan's programs per row cut to at
    most TOP_K_LANES_CANDIDATES candidates per row."""
    k_pow2 = order.next_pow2(k)
    g = plan(rows, n, device, programs_per_row)
    most = TOP_K_LANES_CANDIDATES // k_pow2
    if g.programs_per_row > most:
        g = plan(rows, n, device, most)
    return g, max(1, min(TOP_K_LANES_GROUP, g.width // k_pow2))


def _top_k_lanes_gather(rows: int, n: int, k: int, device: torch.device) -> int:
    """The tokens the finishing program gathers per row: those of the k best groups."""
    g, group = _top_k_lanes_plan(rows, n, k, device)
    return k * group * g.segments_per_program


#: The finishing kernel's race arguments where it races nothing (``top_k``): temperature 1, top_p
#: 1, min_p 0, no filter, seed 0 (stride 0), offset 0 (stride 0).
_NO_RACE = (1.0, 1.0, 0.0, 0, 0, 0, 0, 0)


def _top_k_lanes_launches(x: torch.Tensor, k: int, programs_per_row: Optional[int], run: _Run,
                          values: torch.Tensor, indices: torch.Tensor, race: Optional[tuple] = None) -> None:
    """The two launches of top_k by group maxima for x [rows, n] (rows > 0), writing ``values``
    and ``indices``, or with ``race`` = (token, the finishing kernel's (temperature, top_p, min_p,
    filters, seed, seed stride, offset, offset stride), its MASSES and per-row flags) the
    sampled token instead (the first launch then over finite logits only)."""
    rows, n = x.shape
    k_pow2 = order.next_pow2(k)
    g, group = _top_k_lanes_plan(rows, n, k, x.device, programs_per_row)
    if g.width < k:  # (segments of at least min(n, MAX_WIDTH) tokens: never with k <= 64)
        raise ValueError(f"top_k by group maxima: k={k} is more than the {g.width} lanes of a program")
    ppr = g.programs_per_row
    gather = order.next_pow2(k * group * g.segments_per_program)
    if gather > TOP_K_LANES_MAX_SORT:
        raise ValueError(f"top_k by group maxima: {ppr} programs per row of {n} logits gather "
                         f"{k * group * g.segments_per_program} tokens a row for k={k}, more than the "
                         f"{TOP_K_LANES_MAX_SORT} the finishing program sorts; give more programs_per_row")
    head = min(k_pow2, max(TOP_K_LANES_HEAD, order.next_pow2(order.cdiv(k, ppr))))
    survivors = order.next_pow2(k if head >= k else k + (k // head) * (k - head))
    cand_stride = ppr * k + survivors + k_pow2 + TOP_K_LANES_KEPT
    cand = run.buffer("cand", (rows, cand_stride), torch.int64, x.device)
    first, _, last = _chained(x.device) if TOP_K_LANES_DEPENDENT_LAUNCH else ({}, {}, {})
    token, race_args, race_flags = (indices, _NO_RACE, {}) if race is None else race
    if race is not None:
        race_flags = dict(SAMPLE=True, **race_flags)
    run(_TOP_K_LANES, (rows * ppr,), x, n, x.stride(0), cand, ppr, k, cand_stride,
        WIDTH=g.width, SEGMENTS_PER_PROGRAM=g.segments_per_program, GROUP=group,
        FINITE_ONLY=race is not None, num_warps=g.num_warps, **first)
    run(_TOP_K_LANES_FINISH, (rows,), x, n, x.stride(0), cand, values, indices, ppr, k, cand_stride, token,
        *race_args,
        WIDTH=g.width, SEGMENTS_PER_PROGRAM=g.segments_per_program, GROUP=group,
        HEAD=head, HEADS=order.next_pow2(ppr) * head, CANDS=order.next_pow2(ppr * k), SURVIVORS=survivors,
        K_POW2=k_pow2, GATHER=gather, KEPT=TOP_K_LANES_KEPT,
        num_warps=TOP_K_LANES_FINISH_WARPS, **race_flags, **last)


#: ``sample_descent_rows``: launches of rounds after round 0, before the one program per row that
#: finishes a row still undecided. Under top-p each round decides a row with probability >= p.
DESCENT_ROUNDS = 2
#: Whether ``sample`` on CUDA takes the descent where ``_descent_serves`` says (the tokens are the
#: same either way; off, the pipeline serves every call).
DESCENT_SAMPLES = True
#: The descent serves sampling under top-p (a scalar of at least DESCENT_MIN_TOP_P, min-p off)
#: without top-k, up to this many rows. Top-p 0.9 at 151936 logits, kernel us, pipeline ->
#: descent, on an H100 (benchmarks/results/h100-probe-sampling-descent-rows.txt): float32 1 row
#: 17.8 -> 14.3, 4 rows 26.7 -> 18.8, 16 rows 36.2 -> 34.7, 32 rows 56.5 -> 52.0; bfloat16 1 row
#: 21.8 -> 13.5, 16 rows 37.9 -> 33.4; flat rows (2 N(0, 1)) 1 row 67.8 -> 14.3, 16 rows 109.4 ->
#: 37.0, 32 rows 160.0 -> 144.9 but 320 us at one of three draws; on the H200
#: (h200-probe-sampling-descent-quick.txt) 64 rows lose: float32 60.7 -> 85.4, bfloat16 56.2 ->
#: 77.2 (each row's rounds pass over the whole row, and past a wave of programs the extra passes
#: cost more than the pipeline's few narrow ones). Min-p alone stays on the pipeline: its one
#: race over the kept tokens costs less than the descent's rounds (float32 1 row 11.0 -> 12.4,
#: 64 rows 49.4 -> 50.2, bfloat16 64 rows 37.3 -> 48.9 on the H200).
DESCENT_MAX_ROWS = 16
#: ``sample_descent_rows`` starts from the pre-list (its ``listed``) from this many rows, and
#: ``sample`` sends such calls to it (with DESCENT_LISTED_SAMPLES; the filters as for the descent
#: over the row). After the segment maxima and the histogram pass, a peaked row descends in its
#: list of a few thousand tokens instead of the row; a row too flat for the list descends in its
#: row, where the pipeline would count, compact and resolve hundreds of boundary tokens. H100,
#: 64 rows of 151936, top-p 0.9, CUDA graph, L2 flushed, tokens equal, kernel us, pipeline ->
#: descent from the list with the rounds on 8 programs per row (DESCENT_LISTED_PROGRAMS_PER_ROW)
#: (results/h100-probe-listed-descent-2.txt): float32 peaked 67.2 -> 66.6, bfloat16 peaked 59.2
#: -> 53.0, float32 flat 234.7 -> 186.8; with min-p it loses (peaked, top-p 0.9 + min-p 0.05:
#: 61.4 -> 69.1), so min-p stays on the pipeline. With the rounds in one launch (DESCENT_LOOP)
#: the listed descent also serves from 17 rows on the H200 (results/h200-probe-descent-forms.txt;
#: kernel us, pipeline -> listed loop): 24 rows float32 42.8 -> 37.1, bfloat16 44.2 -> 34.4, flat
#: 127.7 -> 126.8; 32 rows 51.7 -> 46.4, 49.9 -> 40.4, flat 156.0 -> 158.7; at 16 the descent
#: over the row keeps its rows (flat 36.6 against the list's 82.0, peaked 34.7 against 31.5).
DESCENT_LISTED_MIN_ROWS = 17
DESCENT_LISTED_SAMPLES = True
#: The listed descent's rounds run this many programs per row (0: the histogram pass's). A peaked
#: row's list of a few thousand tokens is a few segments, one per program, and the rest of the
#: row's programs only read its flag and return; on the histogram's grid (30 programs per row at
#: 64 rows) those idle programs cost the peaked rows 1.4 us (float32 68.0 against 66.6 at 8;
#: bfloat16 56.3 against 53.0), but a flat row's rounds pass over the row, which 8 programs do
#: slower than 30 (float32 flat 148.1 against 186.8, still ahead of the pipeline's 234.7).
DESCENT_LISTED_PROGRAMS_PER_ROW = 8
#: A row takes about 1 + ln(1 / p) candidates (the mass before each winner is a uniform fraction
#: of the mass before the last; fewer when the top token is heavy), and those after the last
#: round cost a pass by the row's one finishing program each: below this p, and for per-row
#: top-p tensors, whose p the host cannot see, ``sample_rows`` serves.
DESCENT_MIN_TOP_P = 0.5
#: Warps of the descent's finishing program per row: a row still undecided after the rounds is
#: passed over whole by that one program, once per candidate.
DESCENT_FINISH_WARPS = 16
#: Tokens of each of that program's steps over the row (or the list): one program's pass is a
#: chain of segments, one after another, and at the rounds' 1024 a flat row of 151936 takes 149
#: per candidate. H100, 64 flat rows (2 N(0, 1)) of 151936 fp32, top-p 0.9, CUDA graph, L2
#: flushed, the same tokens (results/h100-probe-descent-finish-width.txt): the draw of offset 0,
#: whose undecided rows reach this program, 475.1 us at 1024, 398.4 at 2048, 402.1 at 4096 (the
#: pipeline 236.9: a pass of one program over a flat row races every token, its noise included,
#: on one SM); the draws that end in the rounds (offsets 3, 4: 189-192), peaked rows and 16 rows
#: the same at every width. 4096 spills (128 registers and 16 bytes of stack, offline), 2048 not.
DESCENT_FINISH_WIDTH = 2048
#: ``sample_descent_rows``' launch choice ``loop``: every round after round 0 in one launch, the
#: programs of a row meeting on an arrival counter between rounds (``kernels._descent_loop``),
#: instead of DESCENT_ROUNDS launches and the one finishing program per row. By default (with
#: DESCENT_LOOP) it takes the listed descent, and the descent over the row where the launch's
#: programs all fit the device at once (DESCENT_LOOP_PROGRAMS_PER_SM per SM): past that, the
#: later rows' programs wait for a whole descent of the earlier rows to end before they start.
#: H200, 151936 logits, top-p 0.9, kernel us, launches -> loop (results/h200-probe-descent-loop.txt,
#: h200-probe-descent-forms.txt): over the row, float32 1 row 13.8 -> 9.9, bfloat16 12.9 -> 9.7,
#: flat 13.8 -> 9.9; 2 rows 15.3 -> 11.6; 4 rows (596 programs) 18.1 -> 17.9; 8 rows 24.5 -> 26.7;
#: 16 rows 34.7 -> 49.5; from the pre-list at 64 rows, float32 59.0 -> 54.6 (the pipeline 60.5),
#: bfloat16 50.3 -> 45.9 (56.9), flat 246.5 -> 176.1 (225.4): a row undecided after the rounds
#: keeps its 8 programs instead of one.
DESCENT_LOOP = True
#: The loop launch's programs that fit an SM at once: 168 registers per thread at 4 warps (offline,
#: sm_90) leave room for 3 (65536 registers per SM).
DESCENT_LOOP_PROGRAMS_PER_SM = 3
#: ``sample_descent_rows``' launch choice ``race_in_loop``: the listed descent's loop launch runs
#: round 0 as well (``descent_kernel``'s LOOP_RACES): each program races its share of the list
#: (or of a row without one), the row's racing programs meet on its arrival counter, and the
#: loop follows. The call is then three launches, and a row waits on its own programs instead of
#: on every program of round 0's launch. H100, 151936 logits, top-p 0.9, CUDA graph after the L2
#: flush, graph / kernel us, round 0 in a launch of its own -> in the loop's
#: (results/h100-probe-descent-race-in-loop.txt): 64 rows float32 65.7 / 62.5 -> 63.4 / 60.3,
#: bfloat16 53.0 / 49.3 -> 50.9 / 47.3, flat 189.8 / 186.6 -> 186.1 / 183.1; 24 rows float32
#: 43.1 / 39.7 -> 40.1 / 36.6; 32 rows 55.3 / 51.5 -> 53.5 / 50.1.
DESCENT_LOOP_RACES = True
#: ``sample_descent_rows``' launch choice ``hold_share`` (with ``race_in_loop``): each program of
#: a listed row holds its first segment of the list (token indices and logits) from round 0
#: through the loop's passes, where a pass would load the list's indices and then the logits they
#: name again (``descent_kernel``'s LOOP_HOLDS). At 64 rows of 151936 a peaked row's list is about
#: six segments, one per program, so its passes load nothing but the partials and the candidate.
#: The same run, graph / kernel us, round 0 in the loop -> held (registers capped at 168; at 128,
#: four programs per SM, it gains less: 62.3 / 59.1 at 64 rows float32): 64 rows float32 63.4 /
#: 60.3 -> 59.9 / 56.7, bfloat16 50.9 / 47.3 -> 48.2 / 44.9, flat 186.1 / 183.1 -> 181.1 / 178.1,
#: standard deviation 3 (lists of about 20000 tokens) 124.8 / 121.2 -> 113.7 / 110.7 (the
#: pipeline 124.3 / 121.0); 24 rows float32 40.1 / 36.6 -> 37.4 / 33.9, bfloat16 37.4 / 33.7 ->
#: 34.7 / 31.0, flat 126.0 / 123.0 -> 121.5 / 119.1; 32 rows float32 53.5 / 50.1 -> 50.8 / 47.2,
#: flat 150.3 / 147.1 -> 147.0 / 144.2.
DESCENT_LOOP_HOLDS = True
#: Registers per thread the loop's launch may take with ``hold_share`` (Triton's ``maxnreg``): the
#: held segment takes it from 168 to 233 (offline, sm_90), 2 programs of 4 warps per SM instead of
#: 3; capped at 168 it spills 8 bytes.
DESCENT_LOOP_HOLD_MAX_REGISTERS = 168


def sample_descent_rows(x: torch.Tensor, temperature, top_p=None, min_p=None, seed=0, offset=0, *,
                        rounds: Optional[int] = None, programs_per_row: Optional[int] = None,
                        prefetch: Optional[bool] = None, listed: Optional[bool] = None,
                        descent_programs_per_row: Optional[int] = None, finish_width: Optional[int] = None,
                        loop: Optional[bool] = None, race_in_loop: Optional[bool] = None,
                        hold_share: Optional[bool] = None, max_registers: Optional[int] = None,
                        prepare_key=None) -> torch.Tensor:
    """Token ids [rows] (int64) of logits x [rows, n] sampled under top-p and min-p (no top-k):
    the tokens ``sample_rows(x, temperature, None, top_p, min_p, seed, offset)`` gives, by
    descent (``kernels.descent_kernel``): a race over the row, then ``rounds`` (default
    DESCENT_ROUNDS) rounds that keep the winner or race the tokens before it, then one program per
    row for the rows still undecided. With ``listed`` (default: from DESCENT_LISTED_MIN_ROWS rows)
    the filtered path's segment maxima and histogram pass (its pre-list and masses) come first, and
    a row whose pre-list holds its kept prefix descends in the list instead of the row.
    ``programs_per_row`` and ``prefetch``: launch choices (see ``race_plan``, and ``plan`` with
    ``listed``); with ``listed``, ``descent_programs_per_row`` (default DESCENT_LISTED_PROGRAMS_PER_ROW;
    0: the histogram pass's) are the rounds' programs per row, a launch choice of their own.
    ``finish_width``: the finishing program's segment (default DESCENT_FINISH_WIDTH; 0: the
    rounds'). ``loop`` (default: DESCENT_LOOP's rule): the rounds after round 0 in one launch
    instead (``rounds`` and ``finish_width`` then unused; the programs of a row wait for one
    another, so all must fit at once, and Triton's interpreter, running them one after another,
    allows one per row). ``race_in_loop`` (default DESCENT_LOOP_RACES; with ``listed`` and the
    loop only): round 0 in the loop's launch too; ``hold_share`` (default DESCENT_LOOP_HOLDS; with
    ``race_in_loop`` only): a listed row's programs hold their first segment of the list through it.
    ``max_registers``: a cap on the loop launch's registers per thread (with the loop only;
    default: with ``hold_share`` DESCENT_LOOP_HOLD_MAX_REGISTERS, else none).
    ``prepare_key``: keep this call's launches as a ``PreparedPipeline`` under this key."""
    _check_rows("sample_descent_rows", x)
    rounds = DESCENT_ROUNDS if rounds is None else rounds
    if not 1 <= rounds <= 8:
        raise ValueError(f"sample_descent_rows: rounds must be from 1 to 8, got {rounds}")
    finish_width = DESCENT_FINISH_WIDTH if finish_width is None else finish_width
    if finish_width < 0 or finish_width & (finish_width - 1):
        raise ValueError(f"sample_descent_rows: finish_width must be 0 or a power of two, got {finish_width}")
    if _one_race(temperature, None, top_p, min_p):
        # (no filter, or greedy under scalar filters: the pipeline's one race, whose token under an
        # invalid scalar filter is the argmax, where the descent's rows would end with -1)
        return sample_rows(x, temperature, None, top_p, min_p, seed, offset, prepare_key=prepare_key)
    rows, n = x.shape
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    dev = x.device
    listed = rows >= DESCENT_LISTED_MIN_ROWS if listed is None else listed
    run, seed, offset = _sample_run(prepare_key, x, out, temperature, None, top_p, min_p, seed, offset)
    if listed:
        g_rows = plan(rows, n, dev, programs_per_row, None, prefetch)
        per_row = DESCENT_LISTED_PROGRAMS_PER_ROW if descent_programs_per_row is None else descent_programs_per_row
        g = plan(rows, n, dev, per_row, None, False) if per_row else g_rows
    else:
        g = g_rows = race_plan(rows, n, x.dtype, dev, False, programs_per_row, prefetch)
    loop = _descent_loops(loop, rows, g, listed, dev)
    if race_in_loop and not (loop and listed):
        raise ValueError("sample_descent_rows: race_in_loop=True needs the listed descent's loop "
                         f"(listed={listed}, loop={loop})")
    race_in_loop = DESCENT_LOOP_RACES and loop and listed if race_in_loop is None else race_in_loop
    if hold_share and not race_in_loop:
        raise ValueError("sample_descent_rows: hold_share=True needs round 0 in the loop (race_in_loop)")
    hold_share = DESCENT_LOOP_HOLDS and race_in_loop if hold_share is None else hold_share
    check_max_registers("sample_descent_rows", max_registers)
    if max_registers is not None and not loop:
        raise ValueError(f"sample_descent_rows: max_registers caps the loop's launch; got {max_registers} "
                         "without the loop")
    if max_registers is None and hold_share:
        max_registers = DESCENT_LOOP_HOLD_MAX_REGISTERS
    c = _common(x, temperature, None, top_p, min_p, seed, offset)
    t, _, p, mp, filters, s, s_stride, o, o_stride = c["args"]
    flags = c["flags_without_k"]
    grid = rows * g.programs_per_row
    slots = max(rounds, 2) if loop else rounds  # (the loop alternates two slots of partials)
    parts = rows * g_rows.programs_per_row  # (the maxima's and masses' partials)
    part_before = run.buffer("descent_before", slots * grid, torch.int64, dev)
    part_score = run.buffer("descent_score", (slots + 1) * grid, torch.float32, dev)
    part_index = run.buffer("descent_index", (slots + 1) * grid, torch.int64, dev)
    first, middle, last = _chained(dev)
    if listed:
        b = _FirstPasses.allocate(run, rows, parts, True, n, dev)
        part_max, part_total, counter = b.part_max, b.part_total, b.counter
        prelist, prelist_stride, prelist_count = b.prelist, b.prelist_stride, b.prelist_count
        part_listed, part_valid = b.part_listed, b.part_valid
        list_rows = run.buffer("list_rows", rows, torch.int32, dev)
        # (the histogram's bins and the compaction's counters are cleared by the maxima pass and
        # not read here)
        _maxima_and_histogram(run, x, g_rows, c, b, PRELIST_BINS, top_p is not None, False, prefetch, first, middle)
    else:
        part_max = run.buffer("part_max", parts, torch.float32, dev)
        part_total = run.buffer("part_total", parts, torch.int64, dev)
        # (the pre-list's pointers, which the kernel does not read without LISTED: no allocations)
        prelist_stride = 1
        prelist = prelist_count = part_listed = part_valid = list_rows = counter = part_total
        if loop:
            counter = run.buffer("counter", rows, torch.int64, dev)  # (cleared by round 0)
    for r in ((1,) if race_in_loop else (0, 1)) if loop else range(rounds + 2):
        final = r == rounds + 1 and not loop
        run(_DESCENT,
            (rows if final else grid,), x, n, x.stride(0), part_max, part_total, part_before, part_score,
            part_index, out, g.programs_per_row, grid, g_rows.programs_per_row, t, p, mp, filters, s, s_stride, o,
            o_stride,
            prelist, prelist_stride, prelist_count, part_listed, part_valid, list_rows, counter,
            ROUND=rounds if final else r, LOOP=loop, LOOP_RACES=race_in_loop, LOOP_HOLDS=hold_share,
            FINAL=final, **flags, TOP_P=top_p is not None, MIN_P=min_p is not None,
            WIDTH=g.width,
            SEGMENTS_PER_PROGRAM=g.segments_per_program, PARTS_POW2=g.parts_pow2, MAXIMA_POW2=g_rows.parts_pow2,
            LISTED=listed, PRELIST_BINS=PRELIST_BINS if listed else 0, BINS_PER_NAT=BINS_PER_NAT,
            FINISH_WIDTH=finish_width if final else 0, PREFETCH=g.prefetch and r == 0 and not listed,
            UNIT_T=c["unit_t"], num_warps=DESCENT_FINISH_WARPS if final else g.num_warps,
            **register_cap(max_registers if loop and r == 1 else None),
            **(last if final or (loop and r == 1) else middle if r > 0 or listed else first))
    _keep_prepared(prepare_key, run, (("token", (rows,), torch.int64),))
    return out


def _descent_loops(loop: Optional[bool], rows: int, g: Plan, listed: bool, dev: torch.device) -> bool:
    """Whether ``sample_descent_rows`` runs its rounds after round 0 in one launch on plan ``g``:
    as asked (``loop``), or by DESCENT_LOOP's rule. A row's programs wait for one another there,
    so all of them must be resident at once; programs start in order of their index, so a row
    gets there if it has no more programs than fit the device at once: at least 8 // num_warps
    per SM, as a thread holds at most 255 registers and an SM 65536 (Triton's interpreter runs
    programs one after another: one). Asked for a loop a row cannot hold: ``ValueError``."""
    at_once = 1 if backend.INTERPRETED else _sm_count(dev) * max(1, 8 // g.num_warps)
    if loop is None:
        fits = rows * g.programs_per_row <= DESCENT_LOOP_PROGRAMS_PER_SM * _sm_count(dev)
        return DESCENT_LOOP and (listed or fits) and g.programs_per_row <= at_once
    if loop and g.programs_per_row > at_once:
        raise ValueError(f"sample_descent_rows: loop=True with {g.programs_per_row} programs per row, which must "
                         f"run at once: at most {at_once} here"
                         + (" (Triton's interpreter runs programs one after another)" if backend.INTERPRETED else ""))
    return loop


def _descent_serves(x: torch.Tensor, temperature, top_k, top_p, min_p) -> bool:
    """Whether ``sample_descent_rows`` serves a call for ``sample`` (see DESCENT_MAX_ROWS,
    DESCENT_LISTED_MIN_ROWS and DESCENT_MIN_TOP_P): on CUDA, at most DESCENT_MAX_ROWS rows (over
    the row) or, with DESCENT_LISTED_SAMPLES, at least DESCENT_LISTED_MIN_ROWS (from the pre-list),
    no top-k, no min-p, top-p a scalar of at least DESCENT_MIN_TOP_P, and a call ``sample_rows``
    would not serve with one race."""
    rows = x.shape[0]
    return (x.is_cuda and (rows <= DESCENT_MAX_ROWS or (DESCENT_LISTED_SAMPLES and rows >= DESCENT_LISTED_MIN_ROWS))
            and top_k is None and min_p is None
            and top_p is not None and not isinstance(top_p, torch.Tensor) and top_p >= DESCENT_MIN_TOP_P
            and not _one_race(temperature, top_k, top_p, min_p))


def _lanes_serve(x: torch.Tensor, k: int, least: int, least_16bit: int) -> bool:
    """Whether the two launches by group maxima serve x [rows, n] and k on CUDA: from ``least``
    rows of 4-byte logits (``least_16bit`` of 2-byte ones), within their limits."""
    rows, n = x.shape
    return (x.is_cuda and rows >= (least if x.element_size() >= 4 else least_16bit)
            and _lanes_problem(x, k) is None and _top_k_lanes_gather(rows, n, k, x.device) <= TOP_K_LANES_MAX_GATHER)


def top_k_kernel_rows(x: torch.Tensor, k: int, prepare_key=None):
    """``top_k_lanes_rows`` where TOP_K_LANES_MIN_ROWS' rule takes it, else ``top_k_rows``: the
    same values and indices, by the faster launches (k <= TOP_K_KERNEL_MAX)."""
    if _lanes_serve(x, k, TOP_K_LANES_MIN_ROWS, TOP_K_LANES_MIN_ROWS_16BIT):
        return top_k_lanes_rows(x, k, prepare_key=prepare_key)
    return top_k_rows(x, k, prepare_key=prepare_key)


def sample_kernel_rows(x: torch.Tensor, temperature, top_k=None, top_p=None, min_p=None, seed=0, offset=0,
                       prepare_key=None) -> torch.Tensor:
    """``sample_top_k_lanes_rows`` where SAMPLE_TOP_K_LANES_MIN_ROWS' rule takes it (a scalar
    top_k, a call ``sample_rows`` would not serve with one race), ``sample_descent_rows`` where
    DESCENT_SAMPLES and ``_descent_serves`` say, ``sample_min_p_rows`` for min-p alone (with
    MIN_P_RACE_SAMPLES), else ``sample_rows``: the same tokens, by the faster launches."""
    if (top_k.__class__ is int and not _one_race(temperature, top_k, top_p, min_p)
            and _lanes_serve(x, top_k, SAMPLE_TOP_K_LANES_MIN_ROWS, SAMPLE_TOP_K_LANES_MIN_ROWS_16BIT)):
        return sample_top_k_lanes_rows(x, temperature, top_k, top_p, min_p, seed, offset, prepare_key=prepare_key)
    if DESCENT_SAMPLES and _descent_serves(x, temperature, top_k, top_p, min_p):
        return sample_descent_rows(x, temperature, top_p, min_p, seed, offset, prepare_key=prepare_key)
    if MIN_P_RACE_SAMPLES and _min_p_race_serves(temperature, top_k, top_p, min_p):
        return sample_min_p_rows(x, temperature, min_p, seed, offset, prepare_key=prepare_key)
    return sample_rows(x, temperature, top_k, top_p, min_p, seed, offset, prepare_key=prepare_key)


def filter_rows(x: torch.Tensor, top_k=None, top_p=None, min_p=None, probs: bool = False, *,
                programs_per_row: Optional[int] = None, prefetch: Optional[bool] = None,
                prepare_key=None) -> torch.Tensor:
    """Masked logits or renormalised probabilities of x [rows, n] (filters as in sample).
    ``prepare_key``: keep this call's launches as a ``PreparedPipeline`` under this key."""
    _check_rows("filter_rows", x)
    rows, n = x.shape
    out = torch.empty((rows, n), dtype=torch.float32 if probs else x.dtype, device=x.device)
    if rows == 0:
        return out
    dev = x.device
    run = _Run()
    if prepare_key is not None:
        run = _Run(True, dict(x=x, out=out, **_tensor_params(1.0, top_k, top_p, min_p, 0, 0)))
    # each row's thresholds, from the resolve pass to the masking one
    outputs = {name: run.buffer(name, rows, dtype, dev) for name, dtype in (
        ("lo", torch.int32), ("hi", torch.int32), ("thr", torch.int64), ("max", torch.float32),
        ("mass", torch.float32))}
    g = _pipeline(x, kernels.MODE_THRESHOLD.value, 1.0, top_k, top_p, min_p, 0, 0,
                  all_values=False, outputs=outputs, k_out=0, programs_per_row=programs_per_row,
                  prefetch=prefetch, run=run)
    mp, mp_row = _param(min_p)
    run(_APPLY,
        (rows * g.programs_per_row,), x, n, x.stride(0), out, out.stride(0), outputs["lo"],
        outputs["hi"], outputs["thr"], outputs["max"], outputs["mass"], mp, g.programs_per_row,
        MINP_ROW=mp_row,
        HAS_MINP=min_p is not None, PROBS=probs, WIDTH=g.width,
        SEGMENTS_PER_PROGRAM=g.segments_per_program, NUM_BINS=NUM_BINS,
        BINS_PER_NAT=BINS_PER_NAT, num_warps=g.num_warps)
    _keep_prepared(prepare_key, run, (("out", (rows, n), out.dtype),))
    return out


# ---- torch.library ops (for torch.compile; eager calls skip the dispatcher) -----------------

def _unpack(value_tensor: Optional[torch.Tensor], value: Scalar, present: bool):
    if not present:
        return None
    return value_tensor if value_tensor is not None else value


@torch.library.custom_op("treefold::sample", mutates_args=())
def _sample_op(logits: torch.Tensor, temperature: Optional[torch.Tensor], temperature_value: float,
               top_k: Optional[torch.Tensor], top_k_value: int, has_top_k: bool,
               top_p: Optional[torch.Tensor], top_p_value: float, has_top_p: bool,
               min_p: Optional[torch.Tensor], min_p_value: float, has_min_p: bool,
               seed: Optional[torch.Tensor], seed_value: int,
               offset: Optional[torch.Tensor], offset_value: int) -> torch.Tensor:
    args = (temperature if temperature is not None else temperature_value,
            _unpack(top_k, top_k_value, has_top_k), _unpack(top_p, top_p_value, has_top_p),
            _unpack(min_p, min_p_value, has_min_p),
            seed if seed is not None else seed_value, offset if offset is not None else offset_value)
    if backend.use_kernel(logits):
        return sample_kernel_rows(logits, *args)
    return reference.sample(logits, *args)


@_sample_op.register_fake
def _(logits, temperature, temperature_value, top_k, top_k_value, has_top_k, top_p, top_p_value,
      has_top_p, min_p, min_p_value, has_min_p, seed, seed_value, offset, offset_value):
    return logits.new_empty(logits.shape[:1], dtype=torch.int64)


@torch.library.custom_op("treefold::top_k", mutates_args=())
def _top_k_op(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if backend.use_kernel(x) and k <= TOP_K_KERNEL_MAX:
        return top_k_kernel_rows(x, k)
    return reference.top_k(x, k)


@_top_k_op.register_fake
def _(x, k):
    return x.new_empty((x.shape[0], k)), x.new_empty((x.shape[0], k), dtype=torch.int64)


@torch.library.custom_op("treefold::sampling_filter", mutates_args=())
def _filter_op(x: torch.Tensor, top_k: Optional[torch.Tensor], top_k_value: int, has_top_k: bool,
               top_p: Optional[torch.Tensor], top_p_value: float, has_top_p: bool,
               min_p: Optional[torch.Tensor], min_p_value: float, has_min_p: bool,
               probs: bool) -> torch.Tensor:
    args = (_unpack(top_k, top_k_value, has_top_k), _unpack(top_p, top_p_value, has_top_p),
            _unpack(min_p, min_p_value, has_min_p))
    if backend.use_kernel(x):
        return filter_rows(x, *args, probs=probs)
    return reference.filter_mask(x, *args, probs=probs)


@_filter_op.register_fake
def _(x, top_k, top_k_value, has_top_k, top_p, top_p_value, has_top_p, min_p, min_p_value,
      has_min_p, probs):
    return x.new_empty(x.shape, dtype=torch.float32 if probs else x.dtype)


# ---- entry points for the public functions --------------------------------------------------

def _direct() -> bool:
    """An eager call: skip the dispatcher (saves host time per call)."""
    return not torch.compiler.is_compiling()


def _split(v, kind):
    """(tensor or None, scalar value, present) for an op argument."""
    if isinstance(v, torch.Tensor):
        return v, kind(0), True
    return None, kind(0 if v is None else v), v is not None


def _through_prepared(key, x: torch.Tensor, tensors: dict, ints: dict, launch):
    """An eager CUDA call of kind ``key``: through its prepared launches (``PreparedPipeline``,
    given the call's tensors and integers by slot name) when there are and they accept it, else
    ``launch(prepare_key)``, the ordinary launches, which keep theirs under ``key`` the first
    time (a None key: not prepared)."""
    prepared = _PREPARED.get(key) if key is not None else None
    if prepared is not None:
        out = prepared(x, tensors, ints)
        if out is not None:
            return out
        key = None
    return launch(key)


def _sample_prepared(x: torch.Tensor, temperature, top_k, top_p, min_p, seed, offset) -> torch.Tensor:
    """``sample_rows`` of an eager CUDA call, through ``_through_prepared``."""
    return _through_prepared(
        _sample_key(x, temperature, top_k, top_p, min_p, seed, offset), x,
        _tensor_params(temperature, top_k, top_p, min_p, seed, offset), {"seed": seed, "offset": offset},
        lambda key: sample_kernel_rows(x, temperature, top_k, top_p, min_p, seed, offset, prepare_key=key))


def sample(x: torch.Tensor, temperature, top_k, top_p, min_p, seed, offset) -> torch.Tensor:
    """Token ids of x [rows, n] (validated, normalised by the caller)."""
    if _direct():
        if x.is_cuda:
            return _sample_prepared(x, temperature, top_k, top_p, min_p, seed, offset)
        if backend.use_kernel(x):
            return sample_rows(x, temperature, top_k, top_p, min_p, seed, offset)
        return reference.sample(x, temperature, top_k, top_p, min_p, seed, offset)
    t, tv, _ = _split(temperature, float)
    k, kv, hk = _split(top_k, int)
    p, pv, hp = _split(top_p, float)
    mp, mpv, hm = _split(min_p, float)
    s, sv, _ = _split(seed, int)
    o, ov, _ = _split(offset, int)
    return _sample_op(x, t, tv, k, kv, hk, p, pv, hp, mp, mpv, hm, s, sv, o, ov)


def top_k(x: torch.Tensor, k: int):
    """(values, indices) of x [rows, n] (validated by the caller). An eager CUDA call goes
    through the prepared launches of its kind (shape, strides, dtype, device, k) when there are,
    else launches as usual, preparing them the first time."""
    if _direct():
        if x.is_cuda and k <= TOP_K_KERNEL_MAX:
            return _through_prepared(("top_k", x.shape, x.stride(), x.dtype, x.get_device(), k), x, {}, {},
                                     lambda key: top_k_kernel_rows(x, k, prepare_key=key))
        if backend.use_kernel(x) and k <= TOP_K_KERNEL_MAX:
            return top_k_kernel_rows(x, k)
        return reference.top_k(x, k)
    return _top_k_op(x, k)


def _filter_key(x: torch.Tensor, top_k, top_p, min_p, probs: bool):
    """The kind of a mask call: ``_sample_key``'s of a call with the same filters (at temperature
    1, which is what the masks' passes take), and ``probs``; None when two filters are one tensor."""
    key = _sample_key(x, 1.0, top_k, top_p, min_p, 0, 0)
    return None if key is None else ("mask", probs) + key


def sampling_filter(x: torch.Tensor, top_k, top_p, min_p, probs: bool) -> torch.Tensor:
    """Masked logits or probabilities of x [rows, n] (validated by the caller). An eager CUDA
    call goes through the prepared launches of its kind (``_filter_key``) when there are, else
    launches as usual, preparing them the first time."""
    if _direct():
        if x.is_cuda:
            return _through_prepared(_filter_key(x, top_k, top_p, min_p, probs), x,
                                     _tensor_params(1.0, top_k, top_p, min_p, 0, 0), {},
                                     lambda key: filter_rows(x, top_k, top_p, min_p, probs=probs, prepare_key=key))
        if backend.use_kernel(x):
            return filter_rows(x, top_k, top_p, min_p, probs=probs)
        return reference.filter_mask(x, top_k, top_p, min_p, probs=probs)
    k, kv, hk = _split(top_k, int)
    p, pv, hp = _split(top_p, float)
    mp, mpv, hm = _split(min_p, float)
    return _filter_op(x, k, kv, hk, p, pv, hp, mp, mpv, hm, probs)
