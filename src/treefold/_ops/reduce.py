"""Sums, means, norms and extremes over rows: launch plans, torch.library ops, autograd.

Everything here works on 2-D ``[rows, n]`` tensors whose last dimension is contiguous (the
public functions in ``treefold.functional.reductions`` reshape to that; a whole tensor is one
row). Sums follow the treefold order level by level (``treefold.kernels.reduce``): a level
whose row has at most ``order.MAX_LANES`` segments, and whose segments fit in one program,
finishes in that program (one launch for a row of up to 16384 float32 values); other levels
write segment partials for the next. A whole tensor of more than one segment takes two launches
up to 2^34 elements: tree nodes (``SumTuning.node_stride``), then one finishing program,
launched as a programmatic dependent launch on sm_90. The launch
choices below never change an operation or an operand, so they never change the bits.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

import torch

from .. import backend, order
from ..kernels import reduce as kernels
from ..reference import reductions as reference
from .launch import Launcher, PreparedPipeline, checked_runs, dependent_launch as _dependent_launch, warp_runs

_segment_sum = Launcher(kernels.segment_sum_kernel)
_segment_extreme = Launcher(kernels.segment_extreme_kernel)

# ---- launch heuristics (launch choices only: the bits never depend on them) ------------------
#: A level finishes in one program when next_pow2(S) * C is at most this many values.
FINISH_ELEMENTS = 16384
#: Short rows: rows per finishing program aim at this many elements per program.
FINISH_PROGRAM_ELEMENTS = 4096
#: Non-finishing levels: elements per program aimed at.
LEVEL_PROGRAM_ELEMENTS = 4096
#: Bytes per thread the warp count aims at (1 to 32 warps), counted in the wider of the input
#: and the accumulator (float64 pairs: 16 bytes). 512: one warp per 4096-lane float32 segment,
#: whose group tree then needs no shared memory; the H200 probe (benchmarks/results/
#: h200-probe-group.txt) found one warp best for rows of 4096 and 8192.
BYTES_PER_THREAD = 512
#: Triton's interpreter pays milliseconds per program and per call, whatever its size: on the CPU
#: programs take many more elements (bits unchanged).
INTERPRETED_PROGRAM_ELEMENTS = 1 << 18
#: Extremes: at most this many tiles of LANES elements per segment of the first level, fewer
#: while the grid would have fewer than EXTREME_PROGRAMS programs; and the widest tile. On the
#: H200 (benchmarks/results/h200-reductions.txt, h200-probe-flush.txt): 2048 lanes and 4 warps
#: reached 98% of the roof for argmax of 2^28 and 52% for max of 8192 rows of 4096 (torch 87%,
#: 49%); in a CUDA graph, argmax of 64 x 151936 took 10.3 us with 8 tiles per segment (12.5 us
#: with 2 or 4, 17.7 us with 1) and of 1 x 151936 3.5 us with 1 tile (4.3 us with 4).
EXTREME_TILES = 32
EXTREME_LANES = 2048
EXTREME_PROGRAMS = 1024
#: Extremes: widest tile of the program that merges the partials of a row.
EXTREME_MERGE_LANES = 4096
#: Extremes: register bytes per lane and tile in flight the warp count is sized by (the running
#: value and tile number besides the loads; one warp per 1024 lanes spilled on sm_90).
EXTREME_BYTES_PER_LANE = 16
#: Whole-tensor sums: the first level computes nodes of the next level's tree, one program per
#: node, about this many programs in all (rows x runs x node stride), and
NODE_PROGRAMS = 2048
#: at least this many segments per node (else segment results, as for rows), at most this many.
NODE_MIN_SEGMENTS = 4
NODE_MAX_SEGMENTS = 256
#: Triton's largest block (elements).
MAX_BLOCK_ELEMENTS = 1 << 20
#: The accurate sum adds inside 16-byte groups with TwoSum too (every add error-free), so that
#: cancellation inside a group (1e8, x, -1e8) keeps x. Off: the groups are added in plain
#: float64, exact only while a group spans less than 2^27 for float32: at 2^28 float32 on the
#: H200 the accurate sum then took 0.99x-1.02x the float32 sum's time, against 1.06x with TwoSum
#: groups (benchmarks/results/h200-reductions-sweep.txt).
ACCURATE_EXACT_GROUPS = True

SUM_KINDS = ("sum", "sum_accurate", "mean", "mean_accurate", "norm1", "norm2")
INT_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class SumTuning:
    """Launch choices for the sums (``None``: the heuristic's choice); none changes the bits.

    segments_per_program: segments one program of a non-finishing first level reduces.
    rows_per_program: rows one finishing first-level program reduces (short rows).
    num_warps: warps of the first level's programs.
    evict_first: load the input with the evict-first cache policy.
    finish_elements: largest next_pow2(S) * C (float32 values) finished in one program.
    fuse_finish: finish in one program when the row fits (else one level per launch).
    node_stride: first level computes nodes of the next level's tree (``segment_sum_kernel``'s
        NODE_SEGMENTS): the node stride P (power of two; 0 turns it off). With it
        ``segments_per_program`` is the segments one loop step loads.
    dependent_launch: launch the finishing level as a programmatic dependent launch (sm_90+),
        so it starts while the first level drains.
    runs: the first level's segments held as this many runs of lanes each (``kernels.reduce``'s
        RUNS; a power of two; 1: none). Default: ``_runs``.
    """
    segments_per_program: Optional[int] = None
    rows_per_program: Optional[int] = None
    num_warps: Optional[int] = None
    evict_first: Optional[bool] = None
    finish_elements: Optional[int] = None
    fuse_finish: bool = True
    node_stride: Optional[int] = None
    dependent_launch: Optional[bool] = None
    runs: Optional[int] = None


@dataclass(frozen=True)
class ExtremeTuning:
    """Launch choices for max / min / argmax / argmin (``None``: heuristic). Every choice gives
    the same pair (``kernels.reduce.pick`` is a total-order selection).

    lanes: tile width of the first level. tiles: tiles per first-level segment.
    num_warps: warps of the first level. loads_in_flight: 1, 2 or 4 tiles loaded at once.
    """
    lanes: Optional[int] = None
    tiles: Optional[int] = None
    num_warps: Optional[int] = None
    loads_in_flight: Optional[int] = None


_DEFAULT_SUM = SumTuning()
_DEFAULT_EXTREME = ExtremeTuning()


def _pow2(name: str, value: int, allowed=None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ValueError(f"tuning: {name} must be a power of two >= 1, got {value!r}")
    if allowed is not None and value not in allowed:
        raise ValueError(f"tuning: {name} must be one of {allowed}, got {value!r}")
    return value


_DEPENDENT = {"launch_pdl": True}


def _warps_for(block_bytes: int) -> int:
    return max(1, min(32, order.next_pow2(block_bytes // (32 * BYTES_PER_THREAD))))


# ---- sums -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SumLevel:
    """One launch of ``segment_sum_kernel``."""
    n: int
    lanes: int
    group: int
    segments: int
    segments_per_program: int
    rows_per_program: int
    programs_per_row: int
    grid: int
    finish: bool
    even: bool
    num_warps: int
    evict_first: bool
    node_segments: int = 1
    node_stride: int = 1
    wait_for_prior: bool = False
    release_dependents: bool = False
    runs: int = 1


def _runs(lanes: int, group: int, block: int, partial_bytes: int) -> int:
    """Runs per segment of a level (``kernels.reduce.segment_sum_kernel``'s RUNS): a block of more
    than one segment or row cuts each into runs of 32 vectors (32 x GROUP lanes), so that Triton
    gives the warps to the segments or rows and a segment's tree stays inside its warps, as the
    norms' blocks do (``treefold._ops.norms._segment_runs``); one segment keeps one run, and so do
    the accurate sum's float64 pairs, whose tree is taken over the whole segment.

    On the H200 (``benchmarks/results/h200-probe-reduce-runs.txt``, three interleaved rounds, bits
    equal): 4096 x 16384 bf16 row sums (four segments per program) 74-75% of the roof -> 77-79%,
    row norms 74-75 -> 78-79; 32768 x 1024 bf16 (four rows per program) even, 69-73%. Rows of 4096
    take one row of one segment per program on the GPU, so no runs; given 4-16 rows per program
    with runs they ran as fast as one row without (67-70% bf16, 78-81% float32). Offline sm_90, the
    interpreter's plan of that shape (64 rows per program, 32 warps) fell from 2712 instructions
    and 496 bytes of stack to 784 and none."""
    if block == 1 or partial_bytes == 16:
        return 1
    return warp_runs(lanes, group)


def _finish_values(tuning: SumTuning, interpreted: bool) -> int:
    """The largest next_pow2(S) * C one finishing program reduces."""
    if tuning.finish_elements is not None:
        return tuning.finish_elements
    return max(FINISH_ELEMENTS, INTERPRETED_PROGRAM_ELEMENTS if interpreted else 0)


def _finishes(n: int, tuning: SumTuning, interpreted: bool) -> bool:
    """Whether one program reduces a whole row of n (all its segments, then their tree)."""
    segments = order.num_segments(n)
    fits = (segments <= order.MAX_LANES
            and order.next_pow2(segments) * order.lanes(n) <= _finish_values(tuning, interpreted))
    return segments == 1 or (fits and tuning.fuse_finish)


def _node_level(n: int, rows: int, dtype: torch.dtype, partial_bytes: int, tuning: SumTuning,
                interpreted: bool) -> Optional[SumLevel]:
    """The first level as tree nodes (see ``SumTuning.node_stride``), or None when it does not
    apply: a row one program finishes (unless a node stride is asked for), a next level that one
    program does not finish, or fewer than NODE_MIN_SEGMENTS segments per node (2 when asked)."""
    lanes, segments = order.lanes(n), order.num_segments(n)
    if segments == 1 or (tuning.node_stride is None and _finishes(n, tuning, interpreted)):
        return None
    if tuning.node_stride is not None:
        if tuning.node_stride == 0:
            return None
        stride = _pow2("node_stride", tuning.node_stride)
    elif interpreted:
        return None
    else:
        # About NODE_PROGRAMS programs over the whole grid (2048 measured best on the H200 at
        # 2^26 and 2^28), NODE_MIN_SEGMENTS segments or more per node.
        stride = order.next_pow2(max(1, NODE_PROGRAMS // max(1, rows * order.num_segments(segments))))
    run = order.lanes(segments)  # C' of the next level
    runs = order.num_segments(segments)
    stride = min(stride, run)
    if tuning.node_stride is None:
        # a node's results are kept in a [steps, segments per step] array updated by selects:
        # at most NODE_MAX_SEGMENTS of them (above 2^32 elements the grid grows instead)
        stride = max(stride, run // NODE_MAX_SEGMENTS)
    node_segments = run // stride
    if node_segments < (2 if tuning.node_stride is not None else NODE_MIN_SEGMENTS):
        return None
    if runs > order.MAX_LANES or order.next_pow2(runs) * stride > _finish_values(tuning, interpreted):
        return None
    spp = _pow2("segments_per_program", tuning.segments_per_program) if tuning.segments_per_program else 1
    spp = min(spp, node_segments, MAX_BLOCK_ELEMENTS // lanes)
    # Warps by the bytes an element occupies in registers: the input's, or one float64 word for
    # the accurate sum (sized when its groups were added in plain float64, where the second word
    # starts as -0.0 and folds away inside them: 2 warps per segment measured 1.7% behind the
    # float32 sum on the H200, 4 warps 5%; with TwoSum groups, ACCURATE_EXACT_GROUPS, the second
    # word is carried and the sizing is to be measured again).
    item = max(order.itemsize(dtype), partial_bytes // 2 if partial_bytes == 16 else partial_bytes)
    warps = _pow2("num_warps", tuning.num_warps) if tuning.num_warps is not None else _warps_for(spp * lanes * item)
    return SumLevel(
        n=n, lanes=lanes, group=order.group(n, dtype), segments=segments, segments_per_program=spp,
        rows_per_program=1, programs_per_row=runs * stride, grid=rows * runs * stride, finish=False,
        even=n == runs * run * lanes, num_warps=warps, evict_first=bool(tuning.evict_first),
        node_segments=node_segments, node_stride=stride)


@functools.lru_cache(maxsize=256, typed=True)  # 2.0 is not 2: each is checked
def plan_sum(n: int, rows: int, dtype: torch.dtype, partial_bytes: int,
             tuning: SumTuning = _DEFAULT_SUM, interpreted: bool = False,
             dependent_launch: bool = False) -> tuple:
    """The launches of a sum over ``rows`` rows of ``n`` elements of ``dtype`` (n, rows >= 1).

    ``partial_bytes``: bytes per partial read by the later levels (4 float32, 8 int64,
    16 float64 pairs). ``interpreted``: plan for Triton's interpreter (larger programs).
    ``dependent_launch``: the device supports programmatic dependent launch.
    """
    node = _node_level(n, rows, dtype, partial_bytes, tuning, interpreted)
    if node is not None:
        runs = order.num_segments(node.segments)
        spp = order.next_pow2(runs)
        pdl = dependent_launch and (tuning.dependent_launch is None or tuning.dependent_launch)
        finish = SumLevel(
            n=runs * node.node_stride, lanes=node.node_stride, group=1, segments=runs, segments_per_program=spp,
            rows_per_program=1, programs_per_row=1, grid=rows, finish=True, even=spp == runs,
            num_warps=_warps_for(spp * node.node_stride * partial_bytes), evict_first=False,
            wait_for_prior=pdl)
        return (dataclasses.replace(node, release_dependents=pdl), finish)
    levels = []
    cur, cur_dtype, first = n, dtype, True
    big = INTERPRETED_PROGRAM_ELEMENTS if interpreted else 0
    finish_program = max(FINISH_PROGRAM_ELEMENTS, big)
    level_program = max(LEVEL_PROGRAM_ELEMENTS, big)
    while True:
        lanes, segments = order.lanes(cur), order.num_segments(cur)
        spp_all = order.next_pow2(segments)
        finish = _finishes(cur, tuning, interpreted)
        if finish:
            spp = spp_all
            if first and tuning.rows_per_program is not None:
                rpp = _pow2("rows_per_program", tuning.rows_per_program)
            else:
                rpp = max(1, min(order.next_pow2(rows), finish_program // (spp * lanes)))
            programs_per_row = 1
            even = cur == spp * lanes and rows % rpp == 0
        else:
            if first and tuning.segments_per_program is not None:
                spp = _pow2("segments_per_program", tuning.segments_per_program)
            else:
                spp = max(1, level_program // lanes)
            spp = min(spp, spp_all)
            rpp = 1
            programs_per_row = order.cdiv(segments, spp)
            even = cur % lanes == 0 and segments % spp == 0
        item = max(order.itemsize(cur_dtype), partial_bytes) if first else partial_bytes
        if first and tuning.num_warps is not None:
            warps = _pow2("num_warps", tuning.num_warps)
        else:
            warps = _warps_for(rpp * spp * lanes * item)
        if first and tuning.evict_first is not None:
            evict = bool(tuning.evict_first)
        else:
            # Rows finished in one launch are read once and never again: evict-first measured
            # 70% of the roof against 63% at 8192 x 4096 bf16 on the H200.
            evict = first and finish and not interpreted

        group = order.group(cur, cur_dtype if first else None)
        if first and tuning.runs is not None:
            runs = checked_runs("tuning", tuning.runs, lanes, group)
        else:
            runs = _runs(lanes, group, rpp * spp, partial_bytes)
        levels.append(SumLevel(
            n=cur, lanes=lanes, group=group,
            segments=segments, segments_per_program=spp, rows_per_program=rpp,
            programs_per_row=programs_per_row, grid=order.cdiv(rows, rpp) * programs_per_row,
            finish=finish, even=even, num_warps=warps, evict_first=evict, runs=runs))
        if finish:
            return tuple(levels)
        cur, first = segments, False


def _check_rows(fn: str, x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"{fn}: x must be 2-D [rows, n], got shape {tuple(x.shape)}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"{fn}: x must have a contiguous last dimension, got strides {tuple(x.stride())}")


def tree_sum_rows(x: torch.Tensor, square: bool = False, *, absolute: bool = False,
                  accurate: bool = False, exact_groups: Optional[bool] = None, final: str = "none",
                  out_dtype: Optional[torch.dtype] = None,
                  tuning: SumTuning = _DEFAULT_SUM, prepare: Optional["Preparation"] = None) -> torch.Tensor:
    """Sum of each row of ``x`` ([rows, n], last dim contiguous) in the treefold order.

    Runs the Triton kernel (compiled or interpreted); the caller decides that it should.

    Args:
        x: float (float32, bfloat16, float16) or integer (int32, int64) rows.
        square / absolute: sum x*x (rounded in float32) or |x| instead of x.
        accurate: float64 double-double pairs, rounded once to float32 (float inputs).
        exact_groups: with ``accurate``, TwoSum inside the 16-byte groups too (default
            ``ACCURATE_EXACT_GROUPS``); else plain float64 adds there.
        final: "none", "mean" (divide by n in float64, round once) or "sqrt".
        out_dtype: result dtype (default float32 for floats, int64 for integers).
        tuning: launch choices (never the bits).
        prepare: keep this call's launches as a prepared eager call (``Preparation``).

    Returns a ``[rows]`` tensor.
    """
    _check_rows("tree_sum_rows", x)
    if final not in ("none", "mean", "sqrt"):
        raise ValueError(f"tree_sum_rows: final must be 'none', 'mean' or 'sqrt', got {final!r}")
    rows, n = x.shape
    integer = x.dtype in INT_DTYPES
    if out_dtype is None:
        out_dtype = torch.int64 if integer else torch.float32
    if rows == 0 or n == 0:
        fill = float("nan") if final == "mean" else 0
        return torch.full((rows,), fill, dtype=out_dtype, device=x.device)
    if integer:
        acc, partial_bytes, partial_dtype = kernels.ACC_INT64.value, 8, torch.int64
    elif accurate:
        acc, partial_bytes, partial_dtype = kernels.ACC_DOUBLE_DOUBLE.value, 16, torch.float64
    else:
        acc, partial_bytes, partial_dtype = kernels.ACC_FP32.value, 4, torch.float32
    double_double = acc == kernels.ACC_DOUBLE_DOUBLE.value
    transform = (kernels.TRANSFORM_SQUARE if square else
                 kernels.TRANSFORM_ABS if absolute else kernels.TRANSFORM_NONE).value
    final_code = {"none": kernels.FINAL_NONE, "mean": kernels.FINAL_MEAN,
                  "sqrt": kernels.FINAL_SQRT}[final].value
    exact = ACCURATE_EXACT_GROUPS if exact_groups is None else bool(exact_groups)
    levels = plan_sum(n, rows, x.dtype, partial_bytes, tuning, not x.is_cuda,
                      _dependent_launch(x.device.type, x.device.index))
    launches, buffers = [], []
    cur, cur_lo, stride = x, x, x.stride(0)
    for i, lv in enumerate(levels):
        if lv.finish:
            out = torch.empty(rows, dtype=out_dtype, device=x.device)
            out_lo, out_stride = out, 1
        else:
            width = lv.programs_per_row if lv.node_segments > 1 else lv.segments
            out = torch.empty((rows, width), dtype=partial_dtype, device=x.device)
            out_lo = torch.empty_like(out) if double_double else out
            out_stride = width
        buffers += [out] + ([out_lo] if out_lo is not out else [])
        launches.append(((lv.grid,), (cur, cur_lo, out, out_lo, lv.n, rows, stride, out_stride, lv.segments,
                                      lv.programs_per_row, n), dict(
            LANES=lv.lanes, LOG2_LANES=order.log2(lv.lanes), GROUP=lv.group,
            LOG2_GROUP=order.log2(lv.group), SEGMENTS_PER_PROGRAM=lv.segments_per_program,
            LOG2_SEGMENTS_PER_PROGRAM=order.log2(lv.segments_per_program),
            ROWS_PER_PROGRAM=lv.rows_per_program, ACCUMULATE=acc,
            TRANSFORM=transform if i == 0 else kernels.TRANSFORM_NONE.value,
            # constexprs a level does not use are pinned, so they do not multiply the compiles
            PAIR_INPUT=i > 0 and double_double, EXACT_GROUPS=exact or not double_double,
            FINISH=lv.finish, FINAL=final_code if lv.finish else kernels.FINAL_NONE.value,
            INTERPRETED=backend.INTERPRETED, EVEN=lv.even,
            EVICT_FIRST=lv.evict_first, NODE_SEGMENTS=lv.node_segments,
            LOG2_NODE_SEGMENTS=order.log2(lv.node_segments), NODE_STRIDE=lv.node_stride,
            WAIT_FOR_PRIOR=lv.wait_for_prior, RELEASE_DEPENDENTS=lv.release_dependents,
            RUNS=lv.runs, LOG2_RUNS=order.log2(lv.runs), num_warps=lv.num_warps, enable_fp_fusion=False,
            **_DEPENDENT if lv.wait_for_prior else {})))
        cur, cur_lo, stride = out, out_lo, out_stride
    # the finishing level's output (the result) is the last buffer allocated
    _launch(_segment_sum, launches, x, [cur] + buffers[:-1], prepare)
    return cur


# ---- extremes -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExtremeLevel:
    """One launch of ``segment_extreme_kernel``."""
    n: int
    lanes: int
    tiles: int
    segments: int
    rows_per_program: int
    grid: int
    finish: bool
    num_warps: int
    loads_in_flight: int


@functools.lru_cache(maxsize=256, typed=True)  # 2.0 is not 2: each is checked
def plan_extreme(n: int, rows: int, tuning: ExtremeTuning = _DEFAULT_EXTREME,
                 interpreted: bool = False) -> tuple:
    """The launches of a max / min over ``rows`` rows of ``n`` elements (n, rows >= 1);
    ``interpreted``: for Triton's interpreter (larger programs)."""
    default_lanes = EXTREME_MERGE_LANES if interpreted else EXTREME_LANES
    max_lanes = _pow2("lanes", tuning.lanes) if tuning.lanes is not None else default_lanes
    if interpreted:
        default_tiles = INTERPRETED_PROGRAM_ELEMENTS // default_lanes
    else:
        # Enough programs to fill the GPU (a few rows of a vocabulary split into many segments),
        # at most EXTREME_TILES tiles per segment.
        wanted = order.cdiv(rows * n, min(order.next_pow2(n), max_lanes) * EXTREME_PROGRAMS)
        default_tiles = min(EXTREME_TILES, order.next_pow2(wanted))
    tiles = tuning.tiles if tuning.tiles is not None else default_tiles
    if isinstance(tiles, bool) or not isinstance(tiles, int) or tiles < 1:
        raise ValueError(f"tuning: tiles must be an int >= 1, got {tiles!r}")
    lif = (_pow2("loads_in_flight", tuning.loads_in_flight, (1, 2, 4))
           if tuning.loads_in_flight is not None else 2)
    if tuning.num_warps is not None:
        _pow2("num_warps", tuning.num_warps)
    lanes = min(order.next_pow2(n), max_lanes)
    segments = order.cdiv(n, lanes * tiles)
    if segments == 1:
        # TILES is a compile-time loop bound: rounding it up to a power of two bounds the number
        # of compiled variants (the extra tiles are masked).
        tiles = order.next_pow2(order.cdiv(n, lanes))
        per_program = INTERPRETED_PROGRAM_ELEMENTS if interpreted else FINISH_PROGRAM_ELEMENTS
        rpp = max(1, min(order.next_pow2(rows), per_program // (lanes * tiles)))
        warps = tuning.num_warps or _warps_for(rpp * lanes * EXTREME_BYTES_PER_LANE * lif)
        return (ExtremeLevel(n, lanes, tiles, 1, rpp, order.cdiv(rows, rpp), True, warps, lif),)
    warps = tuning.num_warps or _warps_for(lanes * EXTREME_BYTES_PER_LANE * lif)
    first = ExtremeLevel(n, lanes, tiles, segments, 1, rows * segments, False, warps, lif)
    merge_lanes = min(order.next_pow2(segments), EXTREME_MERGE_LANES)
    second = ExtremeLevel(segments, merge_lanes, order.next_pow2(order.cdiv(segments, merge_lanes)), 1, 1,
                          rows, True,
                          _warps_for(merge_lanes * 12), 1)
    return first, second


def _worst(dtype: torch.dtype, is_max: bool):
    if dtype.is_floating_point:
        return float("-inf") if is_max else float("inf")
    info = torch.iinfo(dtype)
    return info.min if is_max else info.max


def extreme_rows(x: torch.Tensor, is_max: bool, *, absolute: bool = False,
                 tuning: ExtremeTuning = _DEFAULT_EXTREME,
                 prepare: Optional["Preparation"] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, index) of the max (``is_max``) or min of each row of ``x`` ([rows, n], n >= 1).

    NaN wins (the first NaN), ties go to the lowest index. Values keep x's dtype, indices are
    int64. With ``absolute`` |x| is compared (and returned). Runs the Triton kernel.
    ``prepare``: keep this call's launches as a prepared eager call (``Preparation``; its
    ``result`` 0 keeps the values, 1 the indices).
    """
    _check_rows("extreme_rows", x)
    rows, n = x.shape
    if n == 0:
        raise ValueError(f"extreme_rows: cannot reduce rows of length 0 (x has shape {tuple(x.shape)})")
    values = torch.empty(rows, dtype=x.dtype, device=x.device)
    indices = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return values, indices
    partial_dtype = torch.float32 if x.dtype.is_floating_point else x.dtype
    launches, partials = [], []
    cur, cur_index, stride = x, x, x.stride(0)
    for i, lv in enumerate(plan_extreme(n, rows, tuning, not x.is_cuda)):
        if lv.finish:
            out_v, out_i, out_stride = values, indices, 1
        else:
            out_v = torch.empty((rows, lv.segments), dtype=partial_dtype, device=x.device)
            out_i = torch.empty((rows, lv.segments), dtype=torch.int64, device=x.device)
            out_stride = lv.segments
            partials += [out_v, out_i]
        launches.append(((lv.grid,), (cur, cur_index, x, out_v, out_i, lv.n, rows, stride, x.stride(0), out_stride,
                                      lv.segments), dict(
            LANES=lv.lanes, LOG2_LANES=order.log2(lv.lanes), TILES=lv.tiles,
            ROWS_PER_PROGRAM=lv.rows_per_program,
            IS_MAX=is_max, ABSOLUTE=absolute,
            WORST=0.0 if absolute and is_max else _worst(cur.dtype, is_max),
            INDEXED_INPUT=i > 0, FINISH=lv.finish, LOADS_IN_FLIGHT=lv.loads_in_flight,
            INTERPRETED=backend.INTERPRETED, num_warps=lv.num_warps)))
        cur, cur_index, stride = out_v, out_i, out_stride
    outputs = [values, indices]
    if prepare is not None:
        outputs.insert(0, outputs.pop(prepare.result))  # the call's result first
    _launch(_segment_extreme, launches, x, outputs + partials, prepare)
    return values, indices


# ---- prepared eager calls ---------------------------------------------------------------------

@dataclass(frozen=True)
class Preparation:
    """What an eager call that is to be prepared passes down: the key its prepared launches are
    kept under (``prepared_key``), the shape and dtype of the public function's result, and for
    a max / min which of (values, indices) that result is."""
    key: tuple
    shape: tuple
    dtype: torch.dtype
    result: int = 0


def _launch(launcher: Launcher, launches: list, x: torch.Tensor, buffers: list,
            prepare: Optional[Preparation]) -> None:
    """Run a call's launches in order (``(grid, args, kwargs)`` each; ``buffers`` every tensor
    they write, the call's result first). With ``prepare`` (contiguous CUDA ``x``, the result of
    the dtype the public function returns) also keep them as a ``PreparedPipeline``: a repeated
    call allocates the result in the public shape and dtype, and the rest (partials; the values
    of an argmax, the indices of a max) in its workspace."""
    if prepare is None:
        for grid, args, kwargs in launches:
            launcher(grid, *args, **kwargs)
        return
    slots = [x] + buffers
    names = ("x", "out") + tuple(f"part{i}" for i in range(1, len(buffers)))
    prepared = [launcher.prepare(grid, args, kwargs, slots) for grid, args, kwargs in launches]
    if prepared and all(p is not None for p in prepared):
        if len(_PREPARED) >= _MAX_PREPARED:
            _PREPARED.clear()
        _PREPARED[prepare.key] = PreparedPipeline(
            tuple((p, names, ()) for p in prepared), dict(zip(names[2:], buffers[1:])),
            (("out", prepare.shape, prepare.dtype),))


#: Prepared eager calls (``PreparedPipeline``) by ``prepared_key``: a repeated call allocates
#: its result and one workspace, and launches (host time of argmax over 1 x 151936 had been
#: 75 us a call against torch's 12, of which the launches themselves are 6 us each).
_PREPARED: dict = {}
_MAX_PREPARED = 1024
#: Types of the option in a key (``accurate``, ``ord``): a call of another type never validated.
_OPTION_TYPES = (type(None), bool, int, float)


def prepared_key(fn: str, x, dim, keepdim, dtype, option=None) -> Optional[tuple]:
    """The key of an eager call of the public reduction ``fn`` whose prepared launches may
    answer it, or None where they may not: traced or compiled code, a tensor subclass or a
    non-CUDA tensor, a call that needs a gradient, or arguments of types the public function
    does not take (such calls are validated and fail on the ordinary path). Every value in the
    key is of exactly the type a validated call has (``dim`` None or int, ``keepdim`` bool,
    ``dtype`` None or a dtype, the option's type is in the key), so a key equal to that of an
    earlier call is of a call that validates alike."""
    if torch.compiler.is_compiling():
        return None
    if (x.__class__ is not torch.Tensor or not x.is_cuda or keepdim.__class__ is not bool
            or not (dim is None or dim.__class__ is int) or not (dtype is None or dtype.__class__ is torch.dtype)
            or option.__class__ not in _OPTION_TYPES or (x.requires_grad and torch.is_grad_enabled())):
        return None
    return (fn, x.shape, x.stride(), x.dtype, x.get_device(), dim, keepdim, dtype, option.__class__, option)


def prepared_call(key: Optional[tuple], x: torch.Tensor) -> tuple[bool, Optional[torch.Tensor]]:
    """(whether this kind of call was prepared, its result or None): the result through the
    prepared launches kept under ``key``; None when there are none or they declined."""
    entry = _PREPARED.get(key) if key is not None else None
    if entry is None:
        return False, None
    return True, entry(x, {}, {})


# ---- the registered ops: kernel or reference, by device ------------------------------------

def _sum_rows_impl(x: torch.Tensor, kind: str, out_dtype: torch.dtype,
                   prepare: Optional[Preparation] = None) -> torch.Tensor:
    if not backend.use_kernel(x):
        return reference.sum_rows(x, kind, out_dtype, exact_groups=ACCURATE_EXACT_GROUPS)
    if kind in ("sum", "sum_accurate"):
        return tree_sum_rows(x, accurate=kind == "sum_accurate", out_dtype=out_dtype, prepare=prepare)
    if kind in ("mean", "mean_accurate"):
        return tree_sum_rows(x, accurate=kind == "mean_accurate", final="mean", out_dtype=out_dtype,
                             prepare=prepare)
    if kind == "norm2":
        return tree_sum_rows(x, square=True, final="sqrt", out_dtype=out_dtype, prepare=prepare)
    if kind == "norm1":
        return tree_sum_rows(x, absolute=True, out_dtype=out_dtype, prepare=prepare)
    raise ValueError(f"sum_rows: unknown kind {kind!r}, expected one of {SUM_KINDS}")


def _extreme_rows_impl(x: torch.Tensor, is_max: bool, absolute: bool):
    if not backend.use_kernel(x):
        return reference.extreme_rows(x, is_max, absolute)
    return extreme_rows(x, is_max, absolute=absolute)


@torch.library.custom_op("treefold::sum_rows", mutates_args=())
def _sum_rows_op(x: torch.Tensor, kind: str, out_dtype: torch.dtype) -> torch.Tensor:
    return _sum_rows_impl(x, kind, out_dtype)


@_sum_rows_op.register_fake
def _(x, kind, out_dtype):
    return x.new_empty((x.shape[0],), dtype=out_dtype)


@torch.library.custom_op("treefold::extreme_rows", mutates_args=())
def _extreme_rows_op(x: torch.Tensor, is_max: bool, absolute: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _extreme_rows_impl(x, is_max, absolute)


@_extreme_rows_op.register_fake
def _(x, is_max, absolute):
    return x.new_empty((x.shape[0],)), x.new_empty((x.shape[0],), dtype=torch.int64)


def _sum_rows_setup(ctx, inputs, output):
    x, kind, out_dtype = inputs
    ctx.kind, ctx.shape, ctx.x_dtype = kind, x.shape, x.dtype
    if kind in ("norm1", "norm2"):
        ctx.save_for_backward(x, output)


def _sum_rows_grad(ctx, grad):
    # d sum / dx = 1, d mean / dx = 1/n, d ||x||_2 / dx = x / ||x|| (0 where the norm is 0, as
    # torch does), d ||x||_1 / dx = sign(x).
    g = grad.float()[:, None]
    if ctx.kind in ("sum", "sum_accurate"):
        dx = g.expand(ctx.shape)
    elif ctx.kind in ("mean", "mean_accurate"):
        dx = (g / ctx.shape[1]).expand(ctx.shape)
    else:
        x, out = ctx.saved_tensors
        if ctx.kind == "norm2":
            out = out.float()[:, None]
            dx = x.float() * torch.where(out != 0, g / torch.where(out != 0, out, 1.0), 0.0)
        else:
            dx = torch.sign(x.float()) * g
    return dx.to(ctx.x_dtype), None, None


def _extreme_rows_setup(ctx, inputs, output):
    x, is_max, absolute = inputs
    ctx.absolute = absolute
    ctx.save_for_backward(x, output[1])


def _extreme_rows_grad(ctx, grad_values, grad_indices):
    # The gradient reaches the chosen element only (the lowest index among equal values).
    x, indices = ctx.saved_tensors
    g = grad_values.to(x.dtype)[:, None]
    if ctx.absolute:
        g = g * torch.sign(x.gather(1, indices[:, None]))
    dx = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    return dx.scatter_(1, indices[:, None], g), None, None


_sum_rows_op.register_autograd(_sum_rows_grad, setup_context=_sum_rows_setup)
_extreme_rows_op.register_autograd(_extreme_rows_grad, setup_context=_extreme_rows_setup)


# ---- entry points for the public functions --------------------------------------------------

def _direct(x: torch.Tensor) -> bool:
    """An eager call that needs no graph: skip the dispatcher (saves host time per call)."""
    return (type(x) is torch.Tensor and not (x.requires_grad and torch.is_grad_enabled())
            and not torch.compiler.is_compiling())


def _preparable(x: torch.Tensor, prepare: Optional[Preparation]) -> Optional[Preparation]:
    """``prepare`` where this eager call's launches can be kept (CUDA rows that are the caller's
    contiguous tensor, whose address a prepared call passes), else None."""
    return prepare if prepare is not None and x.is_cuda and x.is_contiguous() else None


def sum_rows(x: torch.Tensor, kind: str, out_dtype: torch.dtype,
             prepare: Optional[Preparation] = None) -> torch.Tensor:
    """``kind`` ("sum", "sum_accurate", "mean", "mean_accurate", "norm1", "norm2") of each row
    of ``x`` ([rows, n], validated by the caller), as ``out_dtype``. ``prepare``: an eager
    call of a contiguous CUDA tensor (``x`` a view of it) keeps its launches for the next call
    of its kind (``Preparation``)."""
    if _direct(x):
        return _sum_rows_impl(x, kind, out_dtype, _preparable(x, prepare))
    return _sum_rows_op(x, kind, out_dtype)


def extremes(x: torch.Tensor, is_max: bool, absolute: bool = False,
             prepare: Optional[Preparation] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the max or min of each row of ``x`` ([rows, n >= 1], validated).
    ``prepare``: as in ``sum_rows``."""
    if _direct(x):
        prepare = _preparable(x, prepare)
        if prepare is not None:
            return extreme_rows(x, is_max, absolute=absolute, prepare=prepare)
        return _extreme_rows_impl(x, is_max, absolute)
    return _extreme_rows_op(x, is_max, absolute)
