"""RMSNorm and LayerNorm: launch heuristics, launchers, torch.library custom ops, autograd.

Four layers, kept apart:

1. launch heuristics (``row_layout``, ``forward_config``, ``backward_config``), cached per shape;
2. launchers that turn tensors viewed as rows into kernel launches (``launch_*``);
3. implementations (``*_impl``) that allocate outputs and pick the kernel or the reference
   (``treefold.backend``); the eager functions call these directly when no gradient is needed;
4. the ``treefold::`` custom ops with fake implementations and autograd formulas, used when a
   gradient is needed or under ``torch.compile``.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch
from torch import Tensor

from .. import backend, order
from .. import _checks
from .._checks import as_rows
from ..kernels.norms import column_tree_sum_kernel, norm_backward_kernel, norm_forward_kernel
from ..reference import norms as ref
from .launch import (Launcher, PreparedPipeline, check_eviction_policy, check_max_registers, checked_runs,
                     dependent_launch, register_cap, tree_exchanges, warp_runs)

#: Longest row the kernels hold on chip (the whole row lives in registers).
MAX_ROW_LENGTH = 65536

#: Elements one forward program holds at most (rows are packed into a program up to this):
#: RMSNorm and LayerNorm. On the H200, RMSNorm's 1024-element rows ran best four to a program
#: (tiles of 4096; eight to a program lost a quarter of the bandwidth). LayerNorm's run best a
#: warp each in programs of two (tiles of 2048, 32 elements per thread), as Inductor runs them
#: (a warp per program): 65536 x 1024 bf16 66.8 us -> 65.6 by the kernel's duration after the
#: flush against eight rows of eight warps, one row of one warp 65.6, bits equal, three
#: interleaved rounds (``results/h200-probe-one-warp-rows.txt``). Measured at 1024 only: rows of
#: 2048 now take one program of 2 warps, shorter rows 2 warps for several.
_FORWARD_TILE = {True: 4096, False: 2048}
#: LayerNorm rows of 4096: one row per program, 4 warps (32 elements per thread); rows of 8192 get
#: the same 4 warps from the wide-row rule below. On the H200, three interleaved rounds
#: (``benchmarks/probe_minimal.py``): 8192 x 4096 bf16 82.1% of the roof against 73.3% for two rows
#: of 8 warps; 16384 x 8192 90.3% against 83.3% for 8 warps. (One row of 4096 in a CUDA graph ran
#: 0.02-0.06 us faster with 8 warps, ``h200-probe-decode-norms.txt``: within the spread of rounds,
#: against the 9 points that 4 warps gave at full size.)
_LAYER_NORM_ROW = 4096
_LAYER_NORM_WARPS = 4
#: Elements per thread: 32 (four 16-byte bfloat16 loads) beat 16 and 8 at most bfloat16 shapes
#: measured on the H200 (rows of 1024 to 16384, forward and backward; float32 was flat).
_ELEMENTS_PER_THREAD = 32
#: The exception: an RMSNorm program holding one row of 4096 takes 16 per thread (8 warps):
#: 32768 x 4096 bf16 at 95.3% of the roof against 94.3% with 4 warps, three interleaved rounds
#: (``benchmarks/probe_norm_forward.py``).
_RMS_ROW_4096_ELEMENTS_PER_THREAD = 16
#: ... and so do RMSNorm programs of several rows of 1024 without a residual (four rows, 8 warps,
#: two warps per row with ``_segment_runs``): 65536 x 1024 bf16 92.2-93.0% of the roof against
#: 90.3-90.9% with 4 warps (one warp per row) and 89.7-90.8% before runs, three interleaved rounds
#: (``benchmarks/results/h200-probe-segment-runs-rows.txt``; 2 rows of 2 warps: 92.1-92.7%).
_RMS_ROWS_1024_ELEMENTS_PER_THREAD = 16
#: ... unless it adds a residual (it then stores h as well): 4 warps, 32768 x 4096 bf16 95.6-96.0%
#: of the roof against 95.1-95.4% with 8, one row of 4096 in a CUDA graph 1.94-1.98 us against
#: 2.00 (``benchmarks/results/h200-probe-decode-norms.txt``; measured in bfloat16, applied to
#: every dtype, and to ``fused_add_rms_norm_``, which launches the same kernel).
_RMS_RESIDUAL_ROW_4096_WARPS = 4
#: Forward rows of this block or wider take 64 per thread: RMSNorm 4096 x 16384 bf16 ran at
#: 81.5% of the roof with 8 warps against 65.8% with 16 (and 63-73% with the row shared by
#: programs of 4096 or 8192 elements, ``segments_per_program``: a launch choice for study);
#: RMSNorm rows of 8192 with 4 warps rather than 8: 16384 x 8192 94.9% against 94.2-94.7%, 64 x 8192
#: in a CUDA graph 2.51 us against 2.64 (``h200-probe-decode-norms.txt``); LayerNorm's rows of 8192
#: had 4 warps already.
_WIDE_ROW = 8192
_WIDE_ROW_ELEMENTS_PER_THREAD = 64
#: RMSNorm rows whose on-chip block is ``_READ_TWICE_ROW_BYTES`` are read a second time after their
#: reduction rather than held (``read_twice``), by one warp per ``_READ_TWICE_BYTES_PER_WARP`` of
#: the block (two 16-byte vectors per thread: 32 registers, four programs of 16 warps per SM; at
#: most ``_READ_TWICE_MAX_WARPS`` where read_twice is asked of longer rows), the first read kept in L2
#: (``_READ_TWICE_READ_POLICY``) for the second (evict-first). Inductor builds torch.compile's
#: RMSNorm at these shapes the same way (blocks of 2048 or 4096 with 16 warps, the first read
#: evict-last, ``results/inductor-norms/``), and it beat the held rows. H200, bits equal, three
#: interleaved rounds (``results/h200-probe-read-twice-warps.txt``): 16384 x 8192 bf16 95.2-95.6%
#: of the roof -> 97.6-98.2% (16 warps; 95.3% without evict-last), 32768 x 4096 bf16 95.4-95.9 ->
#: 97.6-98.1 (8 warps), 8192 x 4096 bf16 83.2-84.4 -> 84.7-86.3, 8192 x 4096 float32 89.4-90.0 ->
#: 93.0-93.5 (16 warps). Blocks of 32 KiB keep the row held: 4096 x 16384 read twice by 32 warps
#: 85.0% against 90.1-90.6 held by 8.
_READ_TWICE_ROW_BYTES = (8192, 16384)
_READ_TWICE_BYTES_PER_WARP = 1024
_READ_TWICE_MAX_WARPS = 16
_READ_TWICE_READ_POLICY = "evict_last"
#: With a residual the row read again is h, read back from its own store (kept in L2), by one warp
#: per ``_READ_TWICE_RESIDUAL_BYTES_PER_WARP``. H200, bits equal, three interleaved rounds
#: (``results/h200-probe-read-twice-residual.txt``): 32768 x 4096 bf16 95.2-95.4% -> 96.8% at 4
#: warps (95.1 at 8, 96.0-96.3 at 16), 8192 x 4096 90.0 -> 90.1-90.4; 16384 x 8192 keeps its held
#: row (97.1-97.2 against 94.2-96.2 read twice at 4-16 warps).
_READ_TWICE_RESIDUAL_ROW_BYTES = (8192,)
_READ_TWICE_RESIDUAL_BYTES_PER_WARP = 2048
#: Launches of fewer rows hold them: in decode batches (one wave of programs, bound by latency)
#: the second read's trip to L2 is on the critical path. In CUDA graphs, three rounds
#: (``results/h200-probe-read-twice-rows.txt``): 64 x 8192 bf16 2.28-2.48 us held against 2.66-2.77
#: read twice, 1 x 4096 1.74-1.86 against 2.01-2.07, 64 x 4096 float32 2.38-2.40 against 2.68-2.72.
#: Flushed, 512 x 8192, 1024 x 8192 and 2048 x 4096 were 0.1-1.2 us faster held (7-14 us calls,
#: where one launch ordered first in a round also read up to 2 us slower); 8192 x 4096 is the
#: fewest rows measured to gain from the second read.
_READ_TWICE_MIN_ROWS = 8192
#: Rows read twice store y with the L2 evict-first policy: 4096 x 16384 bf16 83.3-84.1% ->
#: 84.8-85.4% of the roof on the H200, in two runs of three interleaved rounds each. The rows held
#: on chip lost with it (RMSNorm 16384 x 8192 94.4% -> 93.5%, 32768 x 4096 96.5% -> 95.1%, with a
#: residual 95.4% -> 94.2%; ``benchmarks/results/h200-probe-store-hints.txt``).
_READ_TWICE_STORE_POLICY = "evict_first"
#: LayerNorm backward: its two row sums as one tree over a pair of rows for rows of at most this
#: many elements (on-chip block). Direct calls, bf16, three interleaved rounds
#: (``benchmarks/probe_layer_norm_backward.py``): 32768 x 4096 66.7% of the roof paired against
#: 63.7%, 8192 x 4096 54.1 vs 53.2; but 16384 x 8192 73.2 vs 77.1, so wider rows keep two trees.
_PAIRED_SUMS_MAX_BLOCK = 4096
#: LayerNorm backward rows whose block is this many elements (2049 to 4096, 16-bit) hold dy and x
#: as loaded through the row's sums and widen them again after (``hold_16bit``): offline sm_90,
#: 155 -> 128 registers at 8 warps (two programs per SM instead of one); on the H200, 32768 x 4096
#: bf16 66.6-67.0% -> 77.7-78.5% of the roof, three interleaved rounds. Measured at 4096 only; the
#: same choice lost elsewhere: LayerNorm 16384 x 8192 77.1% -> 68.1%, RMSNorm 16384 x 8192
#: 88.2% -> 83.0%, RMSNorm 32768 x 4096 even (``benchmarks/results/h200-probe-norm-backward-hold.txt``).
_BACKWARD_HOLD_16BIT_LAYER_NORM_BLOCK = 4096
#: Unroll factor of the backward kernel's row loop (a launch choice; the rows fold in order).
BACKWARD_UNROLL = 1
#: The backward kernel pipelines its row loop in this many stages for rows whose on-chip block
#: holds this many elements (N from 2049 to 8192: the lengths measured), with this many elements
#: per thread and at most this many warps (``backward_config``).
_BACKWARD_PIPELINED_ROWS = (4096, 8192)
_BACKWARD_STAGES = 3
_BACKWARD_PIPELINED_ELEMENTS_PER_THREAD = 16
_BACKWARD_PIPELINED_MAX_WARPS = 8
#: The column tree reads at most this many float32 partials per program, with _COLUMN_WARPS warps.
#: On the H200 (kernel time, partials in L2 as the backward kernel leaves them; three rounds,
#: ``benchmarks/probe_column_sum.py``): 256 x 4096 2.42 us with 8192 at 4 warps, 2.12 with 4096 at
#: 2; 132 x 8192 2.60 -> 2.39; LayerNorm's two sets 3.62 -> 3.22. Fewer columns or warps were slower.
_COLUMN_TILE = 4096
_COLUMN_WARPS = 2


# --------------------------------------------------------------------------------------------
# 1. launch heuristics
# --------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def row_layout(n: int, dtype: torch.dtype) -> dict:
    """The on-chip block for a row of ``n`` whose statistics group by ``dtype``'s vectors.

    LANES = C(N), GROUP = G(N, dtype), SEGMENTS = S(N) padded to a power of two, with their log2s:
    all from the treefold order. ``dtype`` is the dtype of the row being normalised (x, or h).
    """
    lanes = order.lanes(n)
    group = order.group(n, dtype)
    segments = order.next_pow2(order.num_segments(n))
    return dict(LANES=lanes, LOG2_LANES=order.log2(lanes), GROUP=group, LOG2_GROUP=order.log2(group),
                SEGMENTS=segments, LOG2_SEGMENTS=order.log2(segments))


def row_block(n: int) -> int:
    """Elements of the on-chip block holding one row: C(N) x S(N) padded to a power of two."""
    return order.lanes(n) * order.next_pow2(order.num_segments(n))


def _warps_for(elements: int, per_thread: int = _ELEMENTS_PER_THREAD) -> int:
    return max(1, min(32, elements // (32 * per_thread)))


@functools.lru_cache(maxsize=4096)
def forward_config(n: int, is_rms: bool = True, has_residual: bool = False) -> tuple[int, int]:
    """(rows per program, num_warps) of the forward launch that holds whole rows (the rows read
    twice take one warp per ``_READ_TWICE_BYTES_PER_WARP`` instead). A launch choice: never
    changes bits."""
    block = row_block(n)
    if block >= _WIDE_ROW:
        return 1, _warps_for(block, _WIDE_ROW_ELEMENTS_PER_THREAD)
    if not is_rms and block == _LAYER_NORM_ROW:
        return 1, _LAYER_NORM_WARPS
    rows = max(1, min(64, _FORWARD_TILE[bool(is_rms)] // block))
    if is_rms and not has_residual and rows > 1 and block == 1024:
        return rows, _warps_for(rows * block, _RMS_ROWS_1024_ELEMENTS_PER_THREAD)
    if is_rms and rows == 1 and block == 4096:
        return 1, _RMS_RESIDUAL_ROW_4096_WARPS if has_residual else _warps_for(block, _RMS_ROW_4096_ELEMENTS_PER_THREAD)
    return rows, _warps_for(rows * block)


@functools.lru_cache(maxsize=4096)
def backward_config(m: int, n: int) -> tuple[int, int, int]:
    """(rows per block, num_warps, num_stages) for the backward kernel.

    The rows per block fix the weight-gradient order, so they come from the shape alone
    (``treefold.reference.norms.weight_grad_rows_per_block``). Rows of 2049 to 8192 elements (a
    block of 4096 or 8192) run the row loop software-pipelined in 3 stages (the next rows' dy and
    x are copied into shared memory while a row is worked on) with 16 elements per thread up to
    8 warps. On the H200 (bf16, three interleaved rounds, ``benchmarks/probe_stages.py``):
    RMSNorm 32768 x 4096 89.8% of the roof (88.9% loading one row ahead in registers, 72.9% with
    neither), 16384 x 8192 88.4% (85.1%), LayerNorm 16384 x 8192 76.5% (63.8%), 32768 x 4096
    60.7% (61.3%); 2 stages and 16 warps were slower everywhere. Shorter and wider rows keep 32
    elements per thread and a plain loop (not measured pipelined). ``prefetch`` (the row ahead
    held in registers, off by default) stays a launch choice of the launchers.
    """
    block = row_block(n)
    rows_per_block = ref.weight_grad_rows_per_block(m, n)
    if _BACKWARD_PIPELINED_ROWS[0] <= block <= _BACKWARD_PIPELINED_ROWS[1]:
        warps = min(_BACKWARD_PIPELINED_MAX_WARPS, _warps_for(block, _BACKWARD_PIPELINED_ELEMENTS_PER_THREAD))
        return rows_per_block, warps, _BACKWARD_STAGES
    return rows_per_block, _warps_for(block), 1


# --------------------------------------------------------------------------------------------
# 2. launchers (tensors are [rows, n] views with a contiguous last dimension)
# --------------------------------------------------------------------------------------------

_forward_kernel = Launcher(norm_forward_kernel)
_backward_kernel = Launcher(norm_backward_kernel)
_column_sum_kernel = Launcher(column_tree_sum_kernel)


def _check_hold_16bit(hold_16bit: Optional[bool], dtype: torch.dtype) -> None:
    """``hold_16bit`` (forward or backward) holds 16-bit rows only."""
    if hold_16bit and dtype.itemsize != 2:
        raise ValueError(f"norm: hold_16bit=True holds 16-bit rows, got {dtype}")


@functools.lru_cache(maxsize=4096, typed=True)  # 2.0 is not 2: each is checked
def _forward_plan(n: int, dtype: torch.dtype, is_rms: bool, has_residual: bool, has_weight: bool,
                  has_bias: bool, has_offset: bool, round_normalised: bool, store_stats: bool,
                  rows_per_program: Optional[int], num_warps: Optional[int],
                  segments_per_program: Optional[int] = None, read_policy: Optional[str] = None,
                  fused_squares: Optional[bool] = None,
                  read_twice: Optional[bool] = None,
                  hold_16bit: Optional[bool] = None, store_hint: Optional[str] = None,
                  max_registers: Optional[int] = None, runs: Optional[int] = None,
                  few_rows: bool = False, h_store_hint: Optional[str] = None,
                  loads_vectors: bool = False, tree_exchange: Optional[bool] = None) -> tuple[int, int, dict]:
    """(rows per program, programs per row, the kernel's constexprs and options) for one kind of
    forward launch. ``segments_per_program`` (a power of two) shares each row among programs
    holding that many segments each (0: whole rows); it excludes ``rows_per_program``.
    ``read_policy``: the eviction policy of the row reads ("", "evict_first", or "evict_last" for
    the first read of a row read twice; None: ``_READ_TWICE_READ_POLICY`` for rows read twice
    without a residual, "" otherwise).
    ``fused_squares``: False keeps every product rounded on its own where ``_fuses_squares`` would
    contract the squares (the bits are the same either way); True only where it would (float16).
    ``read_twice``: each row read again after its reduction (LayerNorm: after each of its two;
    with a residual, h read back from its store) instead of held through it. Default
    (``_reads_twice``): RMSNorm rows of ``_READ_TWICE_ROW_BYTES`` (``_READ_TWICE_RESIDUAL_ROW_BYTES``
    with a residual) in launches of ``_READ_TWICE_MIN_ROWS`` rows or more, with one warp per
    ``_READ_TWICE_BYTES_PER_WARP`` (``_READ_TWICE_RESIDUAL_BYTES_PER_WARP``) of the row's block
    unless ``num_warps`` is given. LayerNorm holds its rows by default: read again it lost 5-38
    points of the roof on the H200 (``results/h200-probe-read-twice-layernorm.txt``).
    ``few_rows``: the launch has fewer than ``_READ_TWICE_MIN_ROWS`` rows.
    ``h_store_hint``: a row read twice with a residual reads h back: the eviction policy of h's
    store ("", "evict_first" or "evict_last"; None: ``_READ_TWICE_READ_POLICY``).
    ``hold_16bit``: a 16-bit row is held as loaded through the reductions and widened to float32
    again where it is used, instead of held as float32 (default: off; on the H200 it was slower at
    every shape measured, 84.6% -> 67.8% of the roof at 4096 x 16384 and 0.3-9 points elsewhere,
    ``benchmarks/results/h200-probe-hold-16bit.txt``).
    ``store_hint``: the eviction policy of the stores of y and of a held row's h ("" or
    "evict_first"; default: ``_READ_TWICE_STORE_POLICY`` for rows read twice, none otherwise).
    ``max_registers``: a cap on the registers per thread (Triton's ``maxnreg``; its spills lost
    7-16 points at 4096 x 16384 on the H200, ``benchmarks/results/h200-probe-max-registers.txt``).
    ``runs``: each segment of the block cut into this many runs of lanes (a power of two dividing
    C(N) / G(N, dtype); ``combine.run_tree_sum``): with runs of 32 vectors, Triton gives the warps
    to the segments (default: ``_segment_runs``).
    ``loads_vectors``: the launch's rows are loaded 16 bytes at a time (``_loads_vectors``): the
    trees of whole rows then meet their levels between warps in one exchange each
    (``launch.tree_exchanges``; the same bits) unless ``tree_exchange`` is False (every level its
    own exchange, as the interpreter and unaligned rows have them)."""
    default_rows, default_warps = forward_config(n, is_rms, has_residual)
    layout = row_layout(n, dtype)
    segments = order.num_segments(n)
    held = segments_per_program or 0
    if held:
        default_warps = _warps_for(held * layout["LANES"])
        if rows_per_program not in (None, 1):
            raise ValueError(f"norm: rows_per_program={rows_per_program} with segments_per_program={held}: "
                             f"programs that share a row hold one row")
        if held & (held - 1) or held < 1:
            raise ValueError(f"norm: segments_per_program must be a power of two >= 1, got {held}")
        held = min(held, layout["SEGMENTS"])
        if order.cdiv(segments, held) > 1 and backend.INTERPRETED:
            raise ValueError(f"norm: segments_per_program={held} shares rows of {segments} segments among "
                             f"programs that must run at once, which Triton's interpreter does not do")
    if read_twice is None:
        read_twice = not few_rows and _reads_twice(n, dtype, is_rms, has_residual, bool(segments_per_program),
                                                   rows_per_program, hold_16bit)
    reads_h = bool(read_twice) and has_residual  # the row read again is h, read back from its store
    if read_policy is None:
        read_policy = _READ_TWICE_READ_POLICY if read_twice and not reads_h else ""
    check_eviction_policy("norm", "read_policy", read_policy, keep=bool(read_twice) and not reads_h)
    if h_store_hint is None:
        h_store_hint = _READ_TWICE_READ_POLICY if reads_h else ""
    check_eviction_policy("norm", "h_store_hint", h_store_hint, keep=True)
    if h_store_hint and not reads_h:
        raise ValueError(f"norm: h_store_hint={h_store_hint!r} is for rows read twice with a residual (their h is "
                         f"read back); this launch {'has no residual' if not has_residual else 'holds its rows'}")
    check_eviction_policy("norm", "store_hint", store_hint)
    check_max_registers("norm", max_registers)
    if fused_squares and not _fuses_squares(is_rms, dtype):
        raise ValueError(f"norm: fused_squares=True needs RMSNorm of a float16 row (squares exact in float32), "
                         f"got {'RMSNorm' if is_rms else 'LayerNorm'} of {dtype}")
    _check_hold_16bit(hold_16bit, dtype)
    if hold_16bit and read_twice:
        raise ValueError("norm: hold_16bit=True holds the row that read_twice=True reads again: choose one")
    rows = 1 if held else (rows_per_program or default_rows)
    if not held and rows != default_rows:
        default_warps = _warps_for(rows * layout["LANES"] * layout["SEGMENTS"])
    if read_twice and not held and rows == 1:
        per_warp = _READ_TWICE_RESIDUAL_BYTES_PER_WARP if has_residual else _READ_TWICE_BYTES_PER_WARP
        default_warps = min(_READ_TWICE_MAX_WARPS, max(1, row_block(n) * dtype.itemsize // per_warp))
    if store_hint is None:
        store_hint = _READ_TWICE_STORE_POLICY if read_twice else ""
    runs = checked_runs("norm", _segment_runs(n, dtype, 1 if held else rows) if runs is None else runs,
                        layout["LANES"], layout["GROUP"])
    num_warps = num_warps or default_warps
    exchanges = None
    if loads_vectors and not held and tree_exchange is not False:
        exchanges = tree_exchanges(rows, layout["SEGMENTS"], runs, layout["LANES"], layout["GROUP"],
                                   16 // dtype.itemsize, num_warps)
    fuses = _fuses_squares(is_rms, dtype) if fused_squares is None else bool(fused_squares)
    return rows, order.cdiv(segments, held) if held else 1, dict(
        IS_RMS=is_rms, HAS_RESIDUAL=has_residual, HAS_WEIGHT=has_weight, HAS_BIAS=has_bias,
        HAS_OFFSET=has_offset, ROUND_NORMALISED=round_normalised, STORE_STATS=store_stats,
        ROWS=rows, **layout, SHARED_ROW=bool(held), HELD=held or 1,
        READ_POLICY=read_policy, READ_TWICE=bool(read_twice), HOLD_16BIT=bool(hold_16bit),
        **({"STORE_POLICY": store_hint} if store_hint else {}),
        # (h's store: its own policy where it is read back; "" without a residual, no h)
        H_STORE_POLICY=h_store_hint if reads_h else store_hint if has_residual else "",
        **_runs_constexprs(runs), EXCHANGES=exchanges, N_POW2=_means_by_product(n, fuses),
        num_warps=num_warps, **register_cap(max_registers), enable_fp_fusion=fuses)


def _means_by_product(n: int, fuses: bool) -> bool:
    """The kernels' N_POW2: a row's means taken as products by 1/N (``kernels.norms._over_n``, the
    same bits as the division) where N is a power of two and the kernel's products are not fused
    into FMAs (a fused mean + eps would round once where the order rounds twice)."""
    return n > 0 and n & (n - 1) == 0 and not fuses


def _n_float(n: int, plan: dict) -> float:
    """The kernels' ``n_float`` argument: N, or 1/N (exact) with N_POW2."""
    return 1.0 / n if plan["N_POW2"] else float(n)


def _reads_twice(n: int, dtype: torch.dtype, is_rms: bool, has_residual: bool, shared_row: bool,
                 rows_per_program: Optional[int], hold_16bit: Optional[bool]) -> bool:
    """Whether a forward launch reads its rows twice by default: RMSNorm, one whole row per program,
    a block of ``_READ_TWICE_ROW_BYTES``, or ``_READ_TWICE_RESIDUAL_ROW_BYTES`` with a residual
    (see there)."""
    return (is_rms and not shared_row and not hold_16bit
            and forward_config(n, is_rms, has_residual)[0] == 1 and rows_per_program in (None, 1)
            and row_block(n) * dtype.itemsize in (_READ_TWICE_RESIDUAL_ROW_BYTES if has_residual
                                                  else _READ_TWICE_ROW_BYTES))


def _segment_runs(n: int, dtype: torch.dtype, rows: int = 1) -> int:
    """Runs per segment of the norm kernels' blocks (``combine.run_tree_sum``): rows of more than one
    segment, and programs of more than one row, cut each segment into runs of one 16-byte vector
    per lane of a warp (32 x GROUP lanes), so that Triton gives the warps to the segments (to the
    rows first: a row of one segment then sits on its own warps); one row of one segment keeps
    one run.

    Measured on the H200, bf16, three interleaved rounds, bits equal
    (``benchmarks/results/h200-probe-segment-runs.txt``): RMSNorm 4096 x 16384 85.2-85.6% of the
    roof -> 90.2% (the row held at 8 warps; 85.9-86.6% still reading it twice), with a residual
    92.1-92.6 -> 94.2-94.6, 16384 x 8192 94.4-95.0 -> 95.0-95.4; LayerNorm 16384 x 8192 89.5-90.1 ->
    91.9-92.2, 4096 x 16384 54.3 -> 76.6; the backward at 16384 x 8192: RMSNorm 87.9-88.0 -> 88.5-88.6,
    LayerNorm 76.5-77.0 -> 82.2-82.5. Offline sm_90 at 4096 x 16384: the sum's shuffles 27 -> 8 and
    its shared-memory stores 19 -> 6. One row of one segment (32768 x 4096) even: 96.3-96.8 against
    96.2-96.7, so it keeps the kernel it had. Several rows of 1024 per program
    (``h200-probe-segment-runs-rows.txt``): LayerNorm 65536 x 1024 34.9-35.1% -> 90.1-90.6% (eight
    rows of 8 warps: one warp per row instead of every row over all eight), RMSNorm 89.7-90.8 ->
    90.3-90.9 (92.2-93.0 with ``_RMS_ROWS_1024_ELEMENTS_PER_THREAD``), with a residual 93.8-94.4 ->
    94.1-94.5. The backward holds one row at a time: ``rows`` 1."""
    if order.num_segments(n) == 1 and rows == 1:
        return 1
    layout = row_layout(n, dtype)
    return warp_runs(layout["LANES"], layout["GROUP"])


def _runs_constexprs(runs: int) -> dict:
    """The kernels' RUNS and LOG2_RUNS."""
    return {"RUNS": runs, "LOG2_RUNS": order.log2(runs)}


def _fuses_squares(is_rms: bool, dtype: torch.dtype) -> bool:
    """Whether an RMSNorm forward launch may contract products into FMAs: when the normalised row
    is float16. Its only product that meets an addition is a square inside the sum of squares, and
    the square of a float16 is exact in float32 (an 11-bit significand gives at most 22 bits, and
    the smallest square, 2^-48, is a normal float32), so fma(a, a, s) rounds once, as
    round(a * a) + s does: the same bits, with fewer instructions (offline sm_90 SASS at
    N = 16384: 792 against 824). bfloat16 is not exact so: its exponent range is float32's, and
    the squares of values below about 2^-63 fall among float32's subnormals, where the separate
    product rounds and the FMA does not. The other products (v * rstd, times the weight) meet no
    addition. LayerNorm squares centred float32 values, which are not exact, so it never
    contracts."""
    return is_rms and dtype == torch.float16


def _dense(v: Optional[Tensor]) -> Optional[Tensor]:
    """A weight or bias as the kernels read it: element i at address + i (a strided or expanded
    vector is copied; a contiguous one, the usual case, is returned as is)."""
    return v if v is None or v.is_contiguous() else v.contiguous()


def _loads_vectors(n: int, strides: tuple, rows: tuple, vectors: tuple) -> bool:
    """Whether a launch over these row tensors (None where absent; ``strides`` their row strides)
    and per-column vectors loads its rows 16 bytes at a time, as Triton compiles it when every
    address, N and each row stride is a multiple of 16, with every row tensor of one element size:
    where the rows' trees may take the exchange between warps (``launch.tree_exchanges``). Every
    address and integer OR-ed into one test."""
    size = rows[0].dtype.itemsize
    bits = n
    for stride in strides:
        bits |= stride
    for t in rows:
        if t is not None:
            if t.dtype.itemsize != size:
                return False
            bits |= t.data_ptr()
    for t in vectors:
        if t is not None:
            bits |= t.data_ptr()
    return bits & 15 == 0


def launch_forward(x2: Tensor, res2: Optional[Tensor], w: Optional[Tensor], b: Optional[Tensor],
                   y2: Tensor, h2: Optional[Tensor], mean: Optional[Tensor], rstd: Optional[Tensor], *,
                   eps: float, offset: float, is_rms: bool, round_normalised: bool,
                   rows_per_program: Optional[int] = None, num_warps: Optional[int] = None,
                   segments_per_program: Optional[int] = None, read_policy: Optional[str] = None,
                   fused_squares: Optional[bool] = None, read_twice: Optional[bool] = None,
                   hold_16bit: Optional[bool] = None, store_hint: Optional[str] = None,
                   max_registers: Optional[int] = None, runs: Optional[int] = None,
                   h_store_hint: Optional[str] = None, tree_exchange: Optional[bool] = None,
                   enable_pdl: bool = False, prepare_key=None) -> None:
    """One launch of ``norm_forward_kernel`` over all rows of ``x2``.

    ``enable_pdl``: a programmatic dependent launch where the device takes one
    (``launch.dependent_launch``: sm_90 and later, a Triton that builds it), an ordinary launch
    elsewhere; the same bits either way.

    ``rows_per_program``, ``num_warps``, ``segments_per_program``, ``read_policy``,
    ``fused_squares``, ``read_twice``, ``hold_16bit``, ``store_hint``, ``max_registers``,
    ``runs``, ``h_store_hint`` and ``tree_exchange``
    override the heuristic (``_forward_plan``; the bits do not change).
    ``prepare_key``: keep the prepared launch under this key in ``_PREPARED`` (the slots are
    x, residual, weight, bias, y, h, mean, rstd, those given, in that order); launches whose
    programs share rows are not prepared (their counters are new for every call).
    """
    m, n = x2.shape
    w, b = _dense(w), _dense(b)
    kind = (n, x2.dtype if res2 is None else res2.dtype, is_rms, res2 is not None, w is not None, b is not None,
            offset != 0.0, round_normalised, rstd is not None, rows_per_program, num_warps, segments_per_program,
            read_policy, fused_squares, read_twice, hold_16bit, store_hint, max_registers, runs,
            m < _READ_TWICE_MIN_ROWS, h_store_hint)
    strides = (x2.stride(0), 0 if res2 is None else res2.stride(0), y2.stride(0), 0 if h2 is None else h2.stride(0))
    rows, programs_per_row, plan = _forward_plan(*kind, True, tree_exchange)
    # (the addresses are read only where the plan has an exchange to lose)
    if plan["EXCHANGES"] is not None and not _loads_vectors(n, strides, (x2, res2, y2, h2), (w, b)):
        rows, programs_per_row, plan = _forward_plan(*kind, False, tree_exchange)
    grid = ((m + rows - 1) // rows * programs_per_row,)
    segments = order.num_segments(n)
    if plan["SHARED_ROW"]:
        part = torch.empty((2 if not is_rms else 1) * m * segments, dtype=torch.float32, device=x2.device)
        arrivals = torch.zeros(m, dtype=torch.int32, device=x2.device)
        prepare_key = None
    else:
        part = arrivals = y2
    args = (x2, x2 if res2 is None else res2, x2 if w is None else w, x2 if b is None else b,
            y2, x2 if h2 is None else h2, y2 if mean is None else mean, y2 if rstd is None else rstd, part, arrivals,
            m, n, _n_float(n, plan), eps, offset, segments, programs_per_row, *strides)
    if enable_pdl and dependent_launch(x2.device.type, x2.device.index):
        plan = dict(plan, WAIT_FOR_PRIOR=True, launch_pdl=True)
    if prepare_key is None:
        _forward_kernel(grid, *args, **plan)
        return
    slots = tuple(t for t in (x2, res2, w, b, y2, h2, mean, rstd) if t is not None)
    prepared = _forward_kernel.prepare(grid, args, plan, slots)
    if prepared is not None:
        if len(_PREPARED) >= _MAX_PREPARED:
            _PREPARED.clear()
        _PREPARED[prepare_key] = (prepared, None if y2.dtype == x2.dtype else y2.dtype)


@functools.lru_cache(maxsize=4096, typed=True)  # 2.0 is not 2: each is checked
def _backward_plan(m: int, n: int, dtype: torch.dtype, is_rms: bool, has_dh_out: bool, has_weight: bool,
                   has_offset: bool, round_normalised: bool, store_dres: bool, weight_grad: bool,
                   bias_grad: bool, rows_per_block: int, num_warps: Optional[int],
                   num_stages: Optional[int], unroll: Optional[int] = None,
                   prefetch: Optional[bool] = None, paired_sums: Optional[bool] = None,
                   hold_16bit: Optional[bool] = None, max_registers: Optional[int] = None,
                   runs: Optional[int] = None, loads_vectors: bool = False,
                   tree_exchange: Optional[bool] = None, release_dependents: bool = False) -> dict:
    """The kernel's constexprs and options for one kind of backward launch (``max_registers``: a
    cap on the registers per thread, Triton's ``maxnreg``; at 16384 x 8192 on the H200 its spills
    took RMSNorm from 88% to 52% of the roof and LayerNorm from 78% to 19%; ``runs``: as the
    forward pass's, ``launch.checked_runs``; ``loads_vectors`` and ``tree_exchange``: as the
    forward pass's, for the row sums' trees, except that paired sums take the exchange only when
    ``tree_exchange`` is True)."""
    if paired_sums and is_rms:
        raise ValueError("norm: paired_sums=True pairs LayerNorm's two row sums; RMSNorm's backward has one")
    check_max_registers("norm", max_registers)
    _check_hold_16bit(hold_16bit, dtype)
    if hold_16bit is None:
        hold_16bit = (not is_rms and dtype.itemsize == 2
                      and row_block(n) == _BACKWARD_HOLD_16BIT_LAYER_NORM_BLOCK)
    _, default_warps, default_stages = backward_config(m, n)
    layout = row_layout(n, dtype)
    runs = checked_runs("norm", _segment_runs(n, dtype) if runs is None else runs, layout["LANES"], layout["GROUP"])
    # a row loaded ahead in registers takes the place of the pipeline unless both are asked for
    stages = num_stages or (1 if prefetch else default_stages)
    num_warps = num_warps or default_warps
    paired = (not is_rms and row_block(n) <= _PAIRED_SUMS_MAX_BLOCK) if paired_sums is None else bool(paired_sums)
    exchanges = None
    if loads_vectors and (tree_exchange or (tree_exchange is None and not paired)):
        # one row at a time (LayerNorm's paired sums stack their two rows in registers). Not by
        # default for paired sums: LayerNorm 8192 x 4096 (paired, 16-bit rows held) ran 71.0 us
        # with the exchange against 67.9 level by level on the H200, where unpaired rows gained
        # (16384 x 8192: 223.8 -> 220.7; results/h200-probe-tree-exchange-2.txt)
        exchanges = tree_exchanges(1, layout["SEGMENTS"], runs, layout["LANES"], layout["GROUP"],
                                   16 // dtype.itemsize, num_warps)
    return dict(
        IS_RMS=is_rms, HAS_DH_OUT=has_dh_out, HAS_WEIGHT=has_weight, HAS_OFFSET=has_offset,
        ROUND_NORMALISED=round_normalised, STORE_DRES=store_dres, WEIGHT_GRAD=weight_grad,
        BIAS_GRAD=bias_grad,
        # a power of two (every block of rows of at most WIDE_ROW) as a constant: LayerNorm
        # 8192 x 4096 ran 66.4 us with it on the H200, 68.6-68.9 with the bound at run time.
        # Other counts (ceil(M / 132) for wider rows) stay at run time, or each M would compile a
        # kernel; the interpreter takes every count as a constant (see the kernel's BLOCK_ROWS)
        BLOCK_ROWS=rows_per_block if backend.INTERPRETED or order.next_pow2(rows_per_block) == rows_per_block else 0,
        RELEASE_DEPENDENTS=release_dependents,
        **layout, **_runs_constexprs(runs), UNROLL=unroll or BACKWARD_UNROLL,
        PREFETCH=bool(prefetch), STAGES=stages,
        PAIRED_SUMS=paired, HOLD_16BIT=bool(hold_16bit), EXCHANGES=exchanges,
        N_POW2=_means_by_product(n, False), num_warps=num_warps, enable_fp_fusion=False, num_stages=stages,
        **register_cap(max_registers))


def launch_backward(dy2: Tensor, dh2: Optional[Tensor], x2: Tensor, w: Optional[Tensor],
                    mean: Optional[Tensor], rstd: Tensor, dx2: Tensor, dres2: Optional[Tensor],
                    dw_part: Optional[Tensor], db_part: Optional[Tensor], *, offset: float, is_rms: bool,
                    round_normalised: bool, rows_per_block: int,
                    num_warps: Optional[int] = None, num_stages: Optional[int] = None,
                    unroll: Optional[int] = None, prefetch: Optional[bool] = None,
                    paired_sums: Optional[bool] = None, hold_16bit: Optional[bool] = None,
                    max_registers: Optional[int] = None, runs: Optional[int] = None,
                    tree_exchange: Optional[bool] = None, launches: Optional[list] = None) -> None:
    """One launch of ``norm_backward_kernel``: ceil(M / rows_per_block) programs (``launches``:
    append it there, to be prepared, instead of launching it).

    ``rows_per_block`` fixes the weight-gradient order: callers pass
    ``backward_config(m, n)[0]`` unless they mean to compute a different order. ``num_warps``,
    ``num_stages`` (the row loop's pipelining depth, the kernel's STAGES), ``unroll``, ``prefetch``
    and ``paired_sums`` (LayerNorm's two row sums as one tree; default for rows of at most
    ``_PAIRED_SUMS_MAX_BLOCK``) override
    ``backward_config`` (the bits do not change); ``hold_16bit`` holds a row's 16-bit dy and x
    through its sums and widens them again after (default: LayerNorm rows of
    ``_BACKWARD_HOLD_16BIT_LAYER_NORM_BLOCK``); ``tree_exchange``: as ``launch_forward``'s.
    """
    m, n = x2.shape
    w = _dense(w)
    kind = (m, n, x2.dtype, is_rms, dh2 is not None, w is not None, offset != 0.0, round_normalised,
            dres2 is not None, dw_part is not None, db_part is not None, rows_per_block, num_warps, num_stages,
            unroll, prefetch, paired_sums, hold_16bit, max_registers, runs)
    # the column sums that follow a launch with partials start as its dependent launch
    release = (dw_part is not None or db_part is not None) and dependent_launch(x2.device.type, x2.device.index)
    plan = _backward_plan(*kind, True, tree_exchange, release)
    row_tensors = (dy2, dh2, x2, dx2, dres2)
    if plan["EXCHANGES"] is not None and not _loads_vectors(
            n, tuple(0 if t is None else t.stride(0) for t in row_tensors), row_tensors, (w, dw_part, db_part)):
        plan = _backward_plan(*kind, False, tree_exchange, release)
    args = (dy2, dy2 if dh2 is None else dh2, x2, x2 if w is None else w,
            rstd if mean is None else mean, rstd, dx2, dx2 if dres2 is None else dres2,
            rstd if dw_part is None else dw_part, rstd if db_part is None else db_part,
            m, rows_per_block, n, _n_float(n, plan), offset,
            dy2.stride(0), 0 if dh2 is None else dh2.stride(0), x2.stride(0), dx2.stride(0),
            0 if dres2 is None else dres2.stride(0))
    _run(_backward_kernel, ((m + rows_per_block - 1) // rows_per_block,), args, plan, launches)


@functools.lru_cache(maxsize=4096)
def _column_sum_plan(parts: int, n: int, dependent: bool) -> tuple[int, dict]:
    padded = order.next_pow2(parts)
    if padded > order.MAX_LANES:
        raise ValueError(f"launch_column_sum: {parts} partial rows exceed one tree of {order.MAX_LANES}")
    block_n = min(order.next_pow2(n), max(16, _COLUMN_TILE // padded))
    return order.cdiv(n, block_n), dict(PARTS=padded, LOG2_PARTS=order.log2(padded), BLOCK_N=block_n,
                                        num_warps=_COLUMN_WARPS,
                                        enable_fp_fusion=False,
                                        **(dict(WAIT_FOR_PRIOR=True, launch_pdl=True) if dependent else {}))


def launch_column_sum(sums: list, launches: Optional[list] = None) -> None:
    """``out[j] = treefold sum over i of parts[i, j]`` for each ``(parts, out)`` of ``sums`` (one or
    two, contiguous float32 parts of one shape), in one launch (``launches``: append it there, to be
    prepared, instead of launching it). On sm_90 it is a programmatic dependent launch: it waits
    for the backward launch before it (whose RELEASE_DEPENDENTS lets it start its programs early),
    or for any launch before it, whose writes are then visible as usual."""
    (parts, out), *second = sums
    parts2, out2 = second[0] if second else (parts, out)
    p, n = parts.shape
    programs, plan = _column_sum_plan(p, n, dependent_launch(parts.device.type, parts.device.index))
    _run(_column_sum_kernel, (programs, len(sums)), (parts, out, parts2, out2, p, n), plan, launches)


def _run(launcher: Launcher, grid: tuple, args: tuple, kwargs: dict, launches: Optional[list]) -> None:
    """Launch now, or append ``(launcher, grid, args, kwargs)`` to ``launches`` for ``_prepare``."""
    if launches is None:
        launcher(grid, *args, **kwargs)
    else:
        launches.append((launcher, grid, args, kwargs))


# --------------------------------------------------------------------------------------------
# 3. implementations: allocate, then kernel or reference
# --------------------------------------------------------------------------------------------

def _rows(t: Tensor) -> Tensor:
    """``t`` as ``[rows, n]`` with a contiguous last dimension; 2-D inputs pass through untouched
    (a view costs microseconds of host time per call, which tiny decode-time calls notice)."""
    if t.dim() == 2 and (t.stride(1) == 1 or t.shape[1] <= 1):
        return t
    return as_rows(t)


def _empty_stats(x: Tensor) -> Tensor:
    return torch.full(x.shape[:-1], float("nan"), dtype=torch.float32, device=x.device)


def rms_norm_impl(x: Tensor, weight: Optional[Tensor], residual: Optional[Tensor], eps: float,
                  offset: float, casting: str, out_dtype: torch.dtype, store_stats: bool = True,
                  **launch) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """``(y, h, rstd)`` of RMSNorm over the last dim (h None without a residual, rstd None
    without ``store_stats``). Arguments are already validated; ``launch`` overrides the config."""
    if not backend.use_kernel(x):
        y, h, rstd = ref.rms_norm(x, weight, eps, residual, offset, casting, out_dtype)
        return y, h, (rstd if store_stats else None)
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    h = None if residual is None else torch.empty(x.shape, dtype=residual.dtype, device=x.device)
    if x.numel() == 0:
        return y, h, (_empty_stats(x) if store_stats else None)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device) if store_stats else None
    launch_forward(_rows(x), None if residual is None else _rows(residual), weight, None,
                   _rows(y), None if h is None else _rows(h), None, None if rstd is None else rstd.view(-1),
                   eps=eps, offset=offset, is_rms=True, round_normalised=casting == "llama", **launch)
    return y, h, rstd


# ---- prepared eager launches ------------------------------------------------------------------
# An eager rms_norm or layer_norm call (not compiling) that was validated and launched once keeps a
# prepared launch (``launch.PreparedLaunch``) per kind of call: the shapes, strides, dtypes and
# devices of its tensors, the values of its other arguments, and whether it needs a gradient (then
# the launch also writes the statistics the backward pass reads, and the call goes through the
# eager autograd Functions below). The same kind of call again skips validation (every check
# depends on those alone) and only allocates and launches. The eager backward passes keep theirs
# too (``rms_norm_backward_eager``, ``layer_norm_backward_eager``): a ``launch.PreparedPipeline`` of
# the backward kernel and the weight gradients' column sums, keyed by ("backward", ...).

_PREPARED: dict = {}
_MAX_PREPARED = 1024


_PLAIN_TENSORS = (Tensor, torch.nn.Parameter)
_NUMBERS = (float, int)


def _prepared_key(is_rms, x, residual, weight, bias, eps, offset, casting, out_dtype, normalized_shape,
                  stats=False):
    """The key of a kind of call, or None for arguments this path leaves to the full one. Every
    value in it is of exactly the type the full path accepts, so a key that compares equal was
    validated: numbers are plain floats or ints (an int and the float it equals key alike, and the
    kernel takes either as that float), ``casting`` a str, ``out_dtype`` None or a dtype,
    ``normalized_shape`` an int or a tuple of ints, tensors plain tensors or parameters
    (subclasses take the full path); ``stats``: the call needs a gradient. Built as one tuple:
    this is most of a repeated call's Python."""
    if (eps.__class__ not in _NUMBERS or offset.__class__ not in _NUMBERS or casting.__class__ is not str
            or x.__class__ is not Tensor or not (out_dtype is None or out_dtype.__class__ is torch.dtype)):
        return None
    if normalized_shape is not None and normalized_shape.__class__ is not int and not (
            normalized_shape.__class__ in (tuple, torch.Size) and all(d.__class__ is int for d in normalized_shape)):
        return None
    for t in (residual, weight, bias):
        if t is not None and t.__class__ not in _PLAIN_TENSORS:
            return None
    return (is_rms, x.shape, x.stride(), x.dtype, x.get_device(), eps, offset, casting, out_dtype, normalized_shape,
            None if residual is None else (residual.shape, residual.stride(), residual.dtype, residual.get_device()),
            None if weight is None else (weight.shape, weight.stride(), weight.dtype, weight.get_device()),
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device()), stats)


def norm_prepared(is_rms, x, residual, weight, bias, eps, offset=0.0, casting="", out_dtype=None,
                  normalized_shape=None):
    """``y`` (``(y, h)`` with a residual) of an eager norm call through its prepared launch (and,
    when it needs a gradient, the eager autograd Function), or None when none was prepared for
    this kind of call (the caller takes the full path)."""
    if torch.compiler.is_compiling():
        # (first: traced, eps may be a symbolic float, whose class the key cannot read)
        return None
    try:
        grad = torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)
                                            or (residual is not None and residual.requires_grad)
                                            or (bias is not None and bias.requires_grad))
        key = _prepared_key(is_rms, x, residual, weight, bias, eps, offset, casting, out_dtype, normalized_shape,
                            grad)
    except AttributeError:  # a weight, residual or bias that is no tensor: the full path's checks name it
        return None
    entry = _PREPARED.get(key) if key is not None else None
    if entry is None:
        return None
    if grad:
        # (the key holds plain tensors only: what ``eager_autograd`` asks)
        if is_rms:
            return RmsNormFunction.apply(x, weight, residual, eps, offset, casting, None, entry, None)
        return LayerNormFunction.apply(x, weight, bias, eps, entry, None)
    # (each case its own call, not ``_launch_prepared``'s: this is the whole Python of a repeated
    # decode-time call, and the general form cost it 0.3-0.5 us, benchmarks/probe_prepared_host.py)
    prepared, y_dtype = entry
    # Key equality means x and the residual are contiguous (the prepared call's were), so
    # empty_like is too; without a dtype argument (None: y takes x's dtype) it is the cheapest
    # allocation from Python.
    y = torch.empty_like(x) if y_dtype is None else torch.empty_like(x, dtype=y_dtype)
    if residual is None:
        if bias is None:
            done = prepared(x, y) if weight is None else prepared(x, weight, y)
        else:
            done = prepared(x, bias, y) if weight is None else prepared(x, weight, bias, y)
        return y if done else None
    h = torch.empty_like(residual)
    done = prepared(x, residual, y, h) if weight is None else prepared(x, residual, weight, y, h)
    return (y, h) if done else None


def _launch_prepared(entry, is_rms, x, residual, weight, bias):
    """``(y, h, mean, rstd)`` (h None without a residual, mean None for RMSNorm) through the
    prepared launch ``entry`` of a call that needs a gradient, or None when it declines (an
    address off the 16-byte grid, profiler hooks)."""
    prepared, y_dtype = entry
    y = torch.empty_like(x) if y_dtype is None else torch.empty_like(x, dtype=y_dtype)
    h = None if residual is None else torch.empty_like(residual)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    mean = None if is_rms else torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    tensors = [t for t in (x, residual, weight, bias, y, h, mean, rstd) if t is not None]
    return (y, h, mean, rstd) if prepared(*tensors) else None


def norm_prepare_key(is_rms, x, residual, weight, bias, eps, offset, casting, out_dtype, normalized_shape,
                     stats):
    """The key under which a validated first call of its kind keeps its prepared launch, or None
    where this path does not apply: a non-CUDA or empty tensor, non-contiguous tensors, a tensor
    passed twice (slots are filled by identity), arguments the key does not take."""
    key = _prepared_key(is_rms, x, residual, weight, bias, eps, offset, casting, out_dtype, normalized_shape,
                        stats)
    tensors = [t for t in (x, residual, weight, bias) if t is not None]
    if (key is None or not x.is_cuda or x.numel() == 0 or not all(t.is_contiguous() for t in tensors)
            or len({id(t) for t in tensors}) != len(tensors)):
        return None
    return key


def norm_prepare(is_rms, x, residual, weight, bias, eps, offset, casting, out_dtype, normalized_shape,
                 y_dtype):
    """The first eager call of its kind, validated, no gradient: launch it through
    ``Launcher.prepare`` and keep the prepared launch. Returns what ``norm_prepared`` returns, or
    None where this path does not apply (the caller launches as usual)."""
    key = norm_prepare_key(is_rms, x, residual, weight, bias, eps, offset, casting, out_dtype, normalized_shape,
                           False)
    if key is None:
        return None
    y = torch.empty(x.shape, dtype=y_dtype, device=x.device)
    h = None if residual is None else torch.empty(x.shape, dtype=residual.dtype, device=x.device)
    launch_forward(_rows(x), None if residual is None else _rows(residual), weight, bias, _rows(y),
                   None if h is None else _rows(h), None, None, eps=float(eps), offset=float(offset),
                   is_rms=is_rms, round_normalised=is_rms and casting == "llama", prepare_key=key)
    return y if h is None else (y, h)


def _overlap(a: Tensor, b: Tensor) -> Optional[str]:
    """None where two tensors share no byte of memory, else how they meet: "share memory", or,
    where their memory ranges intersect but their strides keep the test from telling whether an
    element is shared, that. Exact for tensors whose rows (of the last dimension) are each one
    contiguous range under one row stride (two column ranges of one buffer, say)."""
    if a.numel() == 0 or b.numel() == 0:
        return None

    def span(t: Tensor) -> tuple[int, int]:
        extent = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride())) + 1
        return t.data_ptr(), t.data_ptr() + extent * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    if not (a0 < b1 and b0 < a1):
        return None
    rows_a, rows_b = _row_layout(a), _row_layout(b)
    if rows_a is None or rows_b is None:
        return ("have memory ranges that intersect, with strides too irregular to tell whether they "
                "share memory (pass separate buffers, or rows evenly strided)")
    return "share memory" if _rows_meet(rows_a, rows_b) else None


def _may_overlap_itself(t: Tensor) -> bool:
    """Whether two elements of t may share memory: False where, with its dimensions of more than
    one entry taken by increasing stride, each stride steps past everything the smaller ones span
    (the usual layouts: contiguous, transposed, sliced); True otherwise (stride 0, an expanded
    tensor; strides that interleave, which may or may not meet)."""
    span = 1  # elements the dimensions taken so far reach, from the first
    for stride, extent in sorted((s, e) for e, s in zip(t.shape, t.stride()) if e > 1):
        if stride < span:
            return True
        span += (extent - 1) * stride
    return False


def _row_layout(t: Tensor) -> Optional[tuple[int, int, int, int]]:
    """(first byte, rows, row stride in bytes, bytes of a row) of t seen as rows of its last
    dimension, or None where a row is not one contiguous range or the rows not one stride apart
    (read from the shape and strides: no view is made, this is on an eager call's path)."""
    if not _checks.last_dim_contiguous(t):
        return None
    rows, stride = _checks.row_stride(t)
    if stride is None:
        return None
    size = t.element_size()
    return t.data_ptr(), rows, stride * size, (t.shape[-1] if t.ndim else 1) * size


def _rows_meet(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    """Whether row i of a ([start + i * stride, + length) in bytes) meets row j of b for some i, j."""
    (a0, rows_a, stride_a, length_a), (b0, rows_b, stride_b, length_b) = a, b
    if rows_a == 1:
        stride_a = stride_b
    if rows_b == 1:
        stride_b = stride_a
    if stride_a == stride_b and stride_a > 0:
        # rows i and j meet iff a0 - b0 - length_b < (j - i) * stride < a0 - b0 + length_a, with
        # j - i from -(rows_a - 1) to rows_b - 1: is there such a whole number?
        lo, hi, s = a0 - b0 - length_b, a0 - b0 + length_a, stride_a
        first, last = max(lo // s + 1, 1 - rows_a), min(-(-hi // s) - 1, rows_b - 1)
        return first <= last
    # Other strides (rare: the spans intersect already): every row of a against the rows of b.
    # Rows of b start in increasing order and have one length, so their ends are in order too:
    # a row of a meets b iff the last row of b starting before it ends reaches past its start.
    starts_a = a0 + torch.arange(rows_a, dtype=torch.int64, device="cpu") * stride_a
    starts_b = b0 + torch.arange(rows_b, dtype=torch.int64, device="cpu") * stride_b
    last = torch.searchsorted(starts_b, starts_a + length_a) - 1
    return bool(((last >= 0) & (starts_b[last.clamp(min=0)] + length_b > starts_a)).any())


def fused_add_rms_norm_impl(x: Tensor, residual: Tensor, weight: Optional[Tensor], eps: float,
                            **launch) -> None:
    """In place: ``residual = x + residual`` (residual's dtype), then ``x = rms_norm(residual) * w``
    with the "llama" casting, written in x's dtype. Raises ValueError if x and residual overlap,
    or if the weight shares memory with either."""
    overlap = _overlap(x, residual)
    if overlap is not None:
        raise ValueError(f"fused_add_rms_norm_: x and residual {overlap}; both are written in place, so they "
                         f"must not share any")
    # A weight inside x or the residual would be read by some programs after others have written
    # their rows over it: rows that depend on the launch (and, on a GPU, on timing).
    for name, t in (("x", x), ("residual", residual)) if weight is not None else ():
        overlap = _overlap(weight, t)
        if overlap is not None:
            raise ValueError(f"fused_add_rms_norm_: weight and {name} {overlap}; {name} is written in place, "
                             f"so the weight must not share its memory")
    if x.numel() == 0:
        return
    for name, t in (("x", x), ("residual", residual)):
        if not t.is_contiguous() and _may_overlap_itself(t):  # (a contiguous tensor cannot)
            raise ValueError(f"fused_add_rms_norm_: {name} may have elements that share memory (shape "
                             f"{tuple(t.shape)}, strides {t.stride()}: expanded, or strides that interleave, "
                             f"which are refused whether or not they meet); it is written in place")
    x2, r2 = _rows(x), _rows(residual)
    if not backend.use_kernel(x):
        y, h, _ = ref.rms_norm(x, weight, eps, residual, 0.0, "llama", x.dtype)
        residual.copy_(h)
        x.copy_(y)
        return
    # Each program reads its rows whole before writing them, so the outputs may be the inputs.
    launch_forward(x2, r2, weight, None, x2, r2, None, None, eps=eps, offset=0.0, is_rms=True,
                   round_normalised=True, **launch)
    # as_rows copies rows that cannot be viewed evenly strided; write such copies back.
    if x2.data_ptr() != x.data_ptr():
        x.copy_(x2.view(x.shape))
    if r2.data_ptr() != residual.data_ptr():
        residual.copy_(r2.view(residual.shape))


def rms_norm_backward_impl(dy: Tensor, dh_out: Optional[Tensor], normed: Tensor, weight: Optional[Tensor],
                           rstd: Tensor, offset: float, casting: str, x_dtype: torch.dtype,
                           residual_dtype: Optional[torch.dtype], weight_grad: bool, prepare_key=None,
                           **launch) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """``(dx, dres, dw)``: dres only when ``residual_dtype`` differs from ``x_dtype`` (otherwise
    dx is the residual's gradient too); dw only with a weight and ``weight_grad``.
    ``prepare_key``: keep the launches prepared under this key (``rms_norm_backward_eager``)."""
    separate_dres = residual_dtype is not None and residual_dtype != x_dtype
    if not backend.use_kernel(dy):
        dx, dres, dw = ref.rms_norm_backward(
            dy, normed, weight, rstd, offset=offset, casting=casting, dh_out=dh_out, x_dtype=x_dtype,
            residual_dtype=residual_dtype if separate_dres else None, weight_grad=weight_grad)
        return dx, dres, dw
    shape, device = normed.shape, normed.device
    n = shape[-1]
    m = math.prod(shape[:-1])
    dx = torch.empty(shape, dtype=x_dtype, device=device)
    dres = torch.empty(shape, dtype=residual_dtype, device=device) if separate_dres else None
    want_dw = weight is not None and weight_grad
    if dy.numel() == 0:
        dw = torch.zeros(n, dtype=weight.dtype, device=device) if want_dw else None
        return dx, dres, dw
    rows_per_block = launch.pop("rows_per_block", None) or backward_config(m, n)[0]
    programs = order.cdiv(m, rows_per_block)
    dw_part = torch.empty((programs, n), dtype=torch.float32, device=device) if want_dw else None
    dw = torch.empty(n, dtype=weight.dtype, device=device) if want_dw else None
    dy2, dh2, normed2, rstd1 = _rows(dy), None if dh_out is None else _rows(dh_out), _rows(normed), rstd.reshape(-1)
    dx2, dres2 = _rows(dx), None if dres is None else _rows(dres)
    launches = None if prepare_key is None else []
    launch_backward(dy2, dh2, normed2, weight, None, rstd1, dx2, dres2, dw_part, None, offset=offset, is_rms=True,
                    round_normalised=casting == "llama", rows_per_block=rows_per_block, launches=launches, **launch)
    if want_dw:
        launch_column_sum([(dw_part, dw)], launches)
    if launches is not None:
        _prepare(prepare_key, launches,
                 dict(x=dy2, dx=dx2, dres=dres2, dw=dw, dw_part=dw_part, dh=dh2, saved=normed2, weight=weight,
                      rstd=rstd1),
                 (("dx", shape, x_dtype), ("dres", shape, residual_dtype),
                  ("dw", (n,), None if dw is None else dw.dtype)))
    return dx, dres, dw


def _prepare(key, launches: list, slots: dict, outputs: tuple) -> None:
    """Launch ``launches`` (``_run``'s) in order through ``Launcher.prepare`` and keep them under
    ``key`` as one ``PreparedPipeline`` when every one of them was prepared. ``slots``: the
    tensors they take by name, "x" first (None: absent), each the very tensor in their arguments;
    ``outputs``: (name, shape, dtype) of those a call allocates, in the order it returns them
    (absent ones are left out); every other slot that the launches write (a name ending in
    "_part") lies in the call's workspace, the rest are the caller's."""
    slots = {name: t for name, t in slots.items() if t is not None}
    names, tensors = tuple(slots), tuple(slots.values())
    prepared = [launcher.prepare(grid, args, kwargs, tensors) for launcher, grid, args, kwargs in launches]
    if any(p is None for p in prepared):
        return
    if len(_PREPARED) >= _MAX_PREPARED:
        _PREPARED.clear()
    _PREPARED[key] = PreparedPipeline(tuple((p, names, ()) for p in prepared),
                                      {name: t for name, t in slots.items() if name.endswith("_part")},
                                      tuple(o for o in outputs if o[0] in slots))


def _backward_key(is_rms: bool, dy: Tensor, saved: tuple, *options) -> tuple:
    """The key of a kind of eager backward call: dy's and each saved tensor's shape, strides and
    dtype (None where absent), the device, and the call's other arguments."""
    return ("backward", is_rms, dy.shape, dy.stride(), dy.dtype, dy.get_device(),
            *(None if t is None else (t.shape, t.stride(), t.dtype) for t in saved), *options)


def _backward_through(key: tuple, dy: Tensor, saved: dict, first: bool, second: bool, run):
    """An eager CUDA backward of the kind ``key``: through its prepared launches when there are,
    given dy and the ``saved`` tensors by slot name (None: absent); else ``run(prepare_key)``,
    which launches as usual and prepares under ``prepare_key`` when not None: on a first call
    whose tensors are non-empty, contiguous and distinct (slots are filled by identity).
    Returns (dx, then the two optional gradients, ``first`` and ``second``, None where absent)."""
    entry = _PREPARED.get(key)
    if entry is not None:
        out = entry(dy, saved, {})
        if out is not None:
            outs = out if isinstance(out, tuple) else (out,)  # dx, then those allocated
            return outs[0], outs[1] if first else None, outs[-1] if second else None
        return run(None)
    present = [dy, *(t for t in saved.values() if t is not None)]
    preparable = (dy.numel() > 0 and all(t.is_contiguous() for t in present)
                  and len({id(t) for t in present}) == len(present))
    return run(key if preparable else None)


def rms_norm_backward_eager(dy: Tensor, dh_out: Optional[Tensor], normed: Tensor, weight: Optional[Tensor],
                            rstd: Tensor, offset: float, casting: str, x_dtype: torch.dtype,
                            residual_dtype: Optional[torch.dtype], weight_grad: bool):
    """``rms_norm_backward_impl``'s result for an eager CUDA call: through the prepared launches
    of this kind of call when there are; else launched as usual, preparing them when its tensors
    are distinct and contiguous."""
    key = _backward_key(True, dy, (dh_out, normed, weight, rstd), offset, casting, x_dtype, residual_dtype,
                        weight_grad)
    return _backward_through(
        key, dy, {"dh": dh_out, "saved": normed, "weight": weight, "rstd": rstd},
        residual_dtype is not None and residual_dtype != x_dtype, weight is not None and weight_grad,
        lambda prepare_key: rms_norm_backward_impl(dy, dh_out, normed, weight, rstd, offset, casting, x_dtype,
                                                   residual_dtype, weight_grad, prepare_key=prepare_key))


def layer_norm_impl(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
                    store_stats: bool = True, **launch) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """``(y, mean, rstd)`` of LayerNorm over the last dim (stats None without ``store_stats``)."""
    if not backend.use_kernel(x):
        y, mean, rstd = ref.layer_norm(x, weight, bias, eps)
        return (y, mean, rstd) if store_stats else (y, None, None)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return (y, _empty_stats(x), _empty_stats(x)) if store_stats else (y, None, None)
    mean = rstd = None
    if store_stats:
        mean = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    launch_forward(_rows(x), None, weight, bias, _rows(y), None,
                   None if mean is None else mean.view(-1), None if rstd is None else rstd.view(-1),
                   eps=eps, offset=0.0, is_rms=False, round_normalised=False, **launch)
    return y, mean, rstd


def layer_norm_backward_impl(dy: Tensor, x: Tensor, weight: Optional[Tensor], mean: Tensor, rstd: Tensor,
                             weight_grad: bool, bias_dtype: Optional[torch.dtype], prepare_key=None,
                             **launch) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """``(dx, dw, db)``: dw with a weight and ``weight_grad``; db when ``bias_dtype`` is given.
    ``prepare_key``: keep the launches prepared under this key (``layer_norm_backward_eager``)."""
    if not backend.use_kernel(dy):
        return ref.layer_norm_backward(dy, x, weight, mean, rstd, weight_grad=weight_grad, bias_dtype=bias_dtype)
    shape, device = x.shape, x.device
    n = shape[-1]
    m = math.prod(shape[:-1])
    dx = torch.empty(shape, dtype=x.dtype, device=device)
    want_dw = weight is not None and weight_grad
    if dy.numel() == 0:
        dw = torch.zeros(n, dtype=weight.dtype, device=device) if want_dw else None
        db = None if bias_dtype is None else torch.zeros(n, dtype=bias_dtype, device=device)
        return dx, dw, db
    rows_per_block = launch.pop("rows_per_block", None) or backward_config(m, n)[0]
    programs = order.cdiv(m, rows_per_block)
    dw_part = torch.empty((programs, n), dtype=torch.float32, device=device) if want_dw else None
    db_part = torch.empty((programs, n), dtype=torch.float32, device=device) if bias_dtype is not None else None
    dw = torch.empty(n, dtype=weight.dtype, device=device) if want_dw else None
    db = None if bias_dtype is None else torch.empty(n, dtype=bias_dtype, device=device)
    dy2, x2, dx2, mean1, rstd1 = _rows(dy), _rows(x), _rows(dx), mean.reshape(-1), rstd.reshape(-1)
    launches = None if prepare_key is None else []
    launch_backward(dy2, None, x2, weight, mean1, rstd1, dx2, None, dw_part, db_part, offset=0.0, is_rms=False,
                    round_normalised=False, rows_per_block=rows_per_block, launches=launches, **launch)
    sums = [(part, out) for part, out in ((dw_part, dw), (db_part, db)) if part is not None]
    if sums:
        launch_column_sum(sums, launches)
    if launches is not None:
        _prepare(prepare_key, launches,
                 dict(x=dy2, dx=dx2, dw=dw, db=db, dw_part=dw_part, db_part=db_part, saved=x2, weight=weight,
                      mean=mean1, rstd=rstd1),
                 (("dx", shape, x.dtype), ("dw", (n,), None if dw is None else dw.dtype), ("db", (n,), bias_dtype)))
    return dx, dw, db


def layer_norm_backward_eager(dy: Tensor, x: Tensor, weight: Optional[Tensor], mean: Tensor, rstd: Tensor,
                              weight_grad: bool, bias_dtype: Optional[torch.dtype]):
    """``layer_norm_backward_impl``'s result for an eager CUDA call, as ``rms_norm_backward_eager``
    gives RMSNorm's."""
    key = _backward_key(False, dy, (x, weight, mean, rstd), weight_grad, bias_dtype)
    return _backward_through(
        key, dy, {"saved": x, "weight": weight, "mean": mean, "rstd": rstd},
        weight is not None and weight_grad, bias_dtype is not None,
        lambda prepare_key: layer_norm_backward_impl(dy, x, weight, mean, rstd, weight_grad, bias_dtype,
                                                     prepare_key=prepare_key))


# --------------------------------------------------------------------------------------------
# 4. custom ops (namespace treefold), fake implementations, autograd
# --------------------------------------------------------------------------------------------

def _placeholder(like: Tensor) -> Tensor:
    # Custom ops return tensors, never None: an empty tensor stands for "absent".
    return like.new_empty(0)


@torch.library.custom_op("treefold::rms_norm", mutates_args=())
def rms_norm_op(x: Tensor, weight: Optional[Tensor], residual: Optional[Tensor], eps: float, offset: float,
                casting: str, out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """RMSNorm; returns (y, h or an empty tensor, rstd)."""
    y, h, rstd = rms_norm_impl(x, weight, residual, eps, offset, casting, out_dtype)
    return y, (_placeholder(x) if h is None else h), rstd


@rms_norm_op.register_fake
def _rms_norm_fake(x, weight, residual, eps, offset, casting, out_dtype):
    h = _placeholder(x) if residual is None else residual.new_empty(x.shape)
    return x.new_empty(x.shape, dtype=out_dtype), h, x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("treefold::rms_norm_backward", mutates_args=())
def rms_norm_backward_op(dy: Tensor, dh_out: Optional[Tensor], normed: Tensor, weight: Optional[Tensor],
                         rstd: Tensor, offset: float, casting: str, x_dtype: torch.dtype,
                         residual_dtype: Optional[torch.dtype], weight_grad: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of RMSNorm; returns (dx, dres or empty, dw or empty)."""
    dx, dres, dw = rms_norm_backward_impl(dy, dh_out, normed, weight, rstd, offset, casting, x_dtype,
                                          residual_dtype, weight_grad)
    return dx, (_placeholder(dx) if dres is None else dres), (_placeholder(dx) if dw is None else dw)


@rms_norm_backward_op.register_fake
def _rms_norm_backward_fake(dy, dh_out, normed, weight, rstd, offset, casting, x_dtype, residual_dtype,
                            weight_grad):
    dx = normed.new_empty(normed.shape, dtype=x_dtype)
    separate = residual_dtype is not None and residual_dtype != x_dtype
    dres = normed.new_empty(normed.shape, dtype=residual_dtype) if separate else _placeholder(dx)
    dw = weight.new_empty(weight.shape) if (weight is not None and weight_grad) else _placeholder(dx)
    return dx, dres, dw


def _rms_norm_setup(ctx, inputs, output):
    x, weight, residual, eps, offset, casting, out_dtype = inputs
    _, h, rstd = output
    ctx.save_for_backward(x if residual is None else h, weight, rstd)
    ctx.has_residual = residual is not None
    ctx.x_dtype = x.dtype
    ctx.residual_dtype = None if residual is None else residual.dtype
    ctx.offset = offset
    ctx.casting = casting
    ctx.eps = eps


def _rms_norm_backward_torch(ctx, dy, dh_out, weight_grad):
    """``rms_norm_backward_impl``'s formulas as torch operations in float32 (rstd recomputed from
    the normalised row, so that its dependence on x is differentiated too), rounded as the kernels
    round; the bits may differ from theirs in the last place."""
    normed, weight, _ = ctx.saved_tensors
    n = normed.shape[-1]
    v = normed.float()
    rstd = torch.rsqrt((v * v).mean(-1, keepdim=True) + ctx.eps)
    normalised = v * rstd
    g = dy.float()
    if weight is not None:
        g = g * (weight.float() + ctx.offset)
    dx = (g - normalised * ((g * normalised).sum(-1, keepdim=True) / n)) * rstd
    if dh_out is not None:
        dx = dx + dh_out.float()
    dw = None
    if weight is not None and weight_grad:
        kept = normalised.to(normed.dtype).float() if ctx.casting == "llama" else normalised
        dw = (dy.float() * kept).reshape(-1, n).sum(0).to(weight.dtype)
    dres = None if ctx.residual_dtype is None else dx.to(ctx.residual_dtype)
    return dx.to(ctx.x_dtype), dres, dw


def _plain_eager(*tensors: Optional[Tensor]) -> bool:
    """Whether a backward formula may call the implementation directly: eager plain tensors or
    parameters, no graph being traced (torch.compile's fake and functional tensors are subclasses) and no
    gradient of the gradient being recorded. Skipping the dispatcher saves host time per call."""
    return not torch.is_grad_enabled() and eager_autograd(*tensors)


def _rms_norm_backward(ctx, dy, dh, drstd):
    normed, weight, rstd = ctx.saved_tensors
    need_x, need_w, need_res = ctx.needs_input_grad[:3]
    dh_out = dh if ctx.has_residual else None
    if backend.recording_backward():
        dx, dres, dw = _rms_norm_backward_torch(ctx, dy, dh_out, bool(need_w))
    elif _plain_eager(dy, dh_out, normed, weight, rstd):
        backward = rms_norm_backward_eager if dy.is_cuda else rms_norm_backward_impl
        dx, dres, dw = backward(dy, dh_out, normed, weight, rstd, ctx.offset, ctx.casting, ctx.x_dtype,
                                ctx.residual_dtype, bool(need_w))
    else:
        dx, dres, dw = torch.ops.treefold.rms_norm_backward(
            dy, dh_out, normed, weight, rstd, ctx.offset, ctx.casting, ctx.x_dtype, ctx.residual_dtype,
            bool(need_w))
    if not ctx.has_residual:
        dres = None
    elif ctx.residual_dtype == ctx.x_dtype:
        dres = dx  # h = x + residual passes one gradient to both
    return (dx if need_x else None, dw if need_w else None, dres if need_res else None,
            None, None, None, None)


rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


@torch.library.custom_op("treefold::fused_add_rms_norm_", mutates_args=("x", "residual"))
def fused_add_rms_norm_op(x: Tensor, residual: Tensor, weight: Optional[Tensor], eps: float) -> None:
    """In place: residual += x; x = rms_norm(residual) * weight ("llama" casting)."""
    fused_add_rms_norm_impl(x, residual, weight, eps)


@fused_add_rms_norm_op.register_fake
def _fused_add_rms_norm_fake(x, residual, weight, eps):
    return None


@torch.library.custom_op("treefold::layer_norm", mutates_args=())
def layer_norm_op(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm over the last dim; returns (y, mean, rstd)."""
    return layer_norm_impl(x, weight, bias, eps)


@layer_norm_op.register_fake
def _layer_norm_fake(x, weight, bias, eps):
    stats = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return x.new_empty(x.shape), stats, stats.new_empty(stats.shape)


@torch.library.custom_op("treefold::layer_norm_backward", mutates_args=())
def layer_norm_backward_op(dy: Tensor, x: Tensor, weight: Optional[Tensor], mean: Tensor, rstd: Tensor,
                           weight_grad: bool, bias_dtype: Optional[torch.dtype]) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of LayerNorm; returns (dx, dw or empty, db or empty)."""
    dx, dw, db = layer_norm_backward_impl(dy, x, weight, mean, rstd, weight_grad, bias_dtype)
    return dx, (_placeholder(dx) if dw is None else dw), (_placeholder(dx) if db is None else db)


@layer_norm_backward_op.register_fake
def _layer_norm_backward_fake(dy, x, weight, mean, rstd, weight_grad, bias_dtype):
    dw = weight.new_empty(weight.shape) if (weight is not None and weight_grad) else _placeholder(x)
    db = x.new_empty(x.shape[-1:], dtype=bias_dtype) if bias_dtype is not None else _placeholder(x)
    return x.new_empty(x.shape), dw, db


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.eps = eps


def _layer_norm_backward_torch(ctx, dy, weight_grad, bias_dtype):
    """``layer_norm_backward_impl``'s formulas as torch operations in float32, the statistics
    recomputed from x (see ``_rms_norm_backward_torch``)."""
    x, weight, _, _ = ctx.saved_tensors
    n = x.shape[-1]
    v = x.float()
    d = v - v.mean(-1, keepdim=True)
    rstd = torch.rsqrt((d * d).mean(-1, keepdim=True) + ctx.eps)
    normalised = d * rstd
    g = dy.float() * weight.float() if weight is not None else dy.float()
    dx = (g - g.mean(-1, keepdim=True) - normalised * (g * normalised).mean(-1, keepdim=True)) * rstd
    dw = (dy.float() * normalised).reshape(-1, n).sum(0).to(weight.dtype) if weight is not None and weight_grad else None
    db = None if bias_dtype is None else dy.float().reshape(-1, n).sum(0).to(bias_dtype)
    return dx.to(x.dtype), dw, db


def _layer_norm_backward(ctx, dy, dmean, drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    bias_dtype = ctx.bias_dtype if need_b else None
    if backend.recording_backward():
        dx, dw, db = _layer_norm_backward_torch(ctx, dy, bool(need_w), bias_dtype)
    elif _plain_eager(dy, x, weight, mean, rstd):
        backward = layer_norm_backward_eager if dy.is_cuda else layer_norm_backward_impl
        dx, dw, db = backward(dy, x, weight, mean, rstd, bool(need_w), bias_dtype)
    else:
        dx, dw, db = torch.ops.treefold.layer_norm_backward(dy, x, weight, mean, rstd, bool(need_w), bias_dtype)
    return dx if need_x else None, dw if need_w else None, db if need_b else None, None


layer_norm_op.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup)


# ---- eager autograd: the same implementation and formulas, without the dispatcher ------------
# A registered op's autograd path costs tens of microseconds of host time per call (the dispatcher,
# the op's autograd wrapper), more than the kernels of many training-sized calls take: eager calls
# that need a gradient go through these plain autograd Functions instead. They save what the ops'
# setup_context saves and call the same backward formulas; torch.compile keeps the ops.

def eager_autograd(*tensors: Optional[Tensor]) -> bool:
    """Whether a call that needs a gradient may take the eager Functions: not compiling, and every
    tensor a plain tensor or parameter (subclasses take the registered ops)."""
    if torch.compiler.is_compiling():
        return False
    return all(t is None or t.__class__ in _PLAIN_TENSORS for t in tensors)


class RmsNormFunction(torch.autograd.Function):
    """RMSNorm with autograd; returns y, or (y, h) with a residual. ``prepared``: the prepared
    launch of this kind of call (``norm_prepared``; ``out_dtype`` may then be None, the entry
    knows y's dtype); ``prepare_key``: keep one under this key (``norm_prepare_key``)."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps, offset, casting, out_dtype, prepared, prepare_key):
        out = None if prepared is None else _launch_prepared(prepared, True, x, residual, weight, None)
        if out is not None:
            y, h, _, rstd = out
        else:
            if out_dtype is None:
                out_dtype = x.dtype if prepared[1] is None else prepared[1]
            y, h, rstd = rms_norm_impl(x, weight, residual, float(eps), float(offset), casting, out_dtype,
                                       prepare_key=prepare_key)
        _rms_norm_setup(ctx, (x, weight, residual, eps, offset, casting, out_dtype), (y, h, rstd))
        return y if h is None else (y, h)

    @staticmethod
    def backward(ctx, dy, dh=None):
        return _rms_norm_backward(ctx, dy, dh, None) + (None, None)


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm over the last dim with autograd; returns y. ``prepared``, ``prepare_key``: as
    ``RmsNormFunction``'s."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, prepared, prepare_key):
        out = None if prepared is None else _launch_prepared(prepared, False, x, None, weight, bias)
        if out is not None:
            y, _, mean, rstd = out
        else:
            y, mean, rstd = layer_norm_impl(x, weight, bias, float(eps), prepare_key=prepare_key)
        _layer_norm_setup(ctx, (x, weight, bias, eps), (y, mean, rstd))
        return y

    @staticmethod
    def backward(ctx, dy):
        return _layer_norm_backward(ctx, dy, None, None) + (None, None)
