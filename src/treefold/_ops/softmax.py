"""Softmax, log_softmax, logsumexp and cross-entropy: launch heuristics, torch.library ops, autograd.

Cross-entropy runs the logsumexp launches (the same plans) with its targets: the forward writes
each row's loss beside its M' and log Z, the backward takes dx from those (``_Targets``).

Four launch strategies realise the one treefold order of ``treefold.kernels.softmax``, so they
give the same bits as one another for every row, batch size and launch parameter:

- ``"warp"``: whole rows held in registers, one warp per program (no barriers), several rows
  per program for short rows;
- ``"block"``: a whole row held in the registers of one program of several warps;
- ``"online"``: one program streams a row twice (segment partials, then outputs), for rows
  too long for registers; the second read is meant to hit L2. The (max, sum) state of every
  segment is kept and the states meet once in the order's tree at the end: a running merge
  per block would make the result depend on the block size;
- ``"split"``: several programs per row write segment partials to a small buffer, then a
  second launch merges them (every program of a row merges the same partials the same way)
  and writes its share of the outputs; for a few long rows (decode batches of a vocabulary).
- ``"cooperative"``: several programs per row, each holding its share of the row in registers,
  write their segment partials, wait on a per-row arrival counter until the whole row's are
  written, merge them as "split" does and write their outputs from the values they hold: one
  launch and one read of the row, for rows too long for one program (compiled only: Triton's
  interpreter runs programs one after another, so there it runs with one program per row).

``"auto"`` picks one from the row length, the batch size and the number of SMs (the choices
measured fastest on the H200). The choice and its parameters are cached per (op, row length,
rows, dtype, device) in a plain dictionary, and kernels launch through ``Launcher`` (the compiled
kernel cached per specialisation), so an eager call does little Python work. An eager call that
needs no graph skips the torch.library dispatcher; one that needs a gradient goes through a plain
``torch.autograd.Function``; ``torch.compile`` sees the registered ops. An eager forward
call keeps its prepared launches per (op, shape, strides, dtype, device) and, when it comes
again, only allocates its output and buffers and launches (``launch.PreparedLaunch``).
"""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from typing import Optional

import torch

from .. import backend, order
from . import reduce as _reduce
from .._checks import as_rows
from ..kernels import softmax as kernels
from .launch import (Launcher, check_eviction_policy, check_max_registers, dependent_launch as _dependent_launch,
                     launch_hooks_active, register_cap)
from ..reference import softmax as reference

STRATEGIES = ("warp", "block", "online", "split", "cooperative")

#: Longest row: up to MAX_LANES^2 elements the S segment results meet in one tree (``treefold.order``).
MAX_ROW = order.MAX_LANES ** 2

# ---- launch heuristics (launch choices only: the bits never depend on them) ------------------
# "Held" elements: a row's padded tile (next_pow2(S) * C elements), doubled for the backward
# passes of softmax / log_softmax, which hold y and dy.
#: "auto" uses one warp per program (several short rows each) up to this many held elements,
WARP_ELEMENTS = 1024
#: and one program per row with the row in registers up to this many (forward; the backward,
#: which reads two tensors per element, measured best in registers up to 2 x 32768).
REGISTER_ELEMENTS = 16384
REGISTER_ELEMENTS_BACKWARD = 65536
#: The largest tile a register strategy accepts when asked for explicitly.
REGISTER_ELEMENTS_LIMIT = 65536
#: "warp": held elements one program aims at (rows per program = this / tile).
WARP_PROGRAM_ELEMENTS = 1024
#: "block": held elements per thread the warp count aims at (then clamped to 4..16 warps);
#: logsumexp, which only reads, aims at fewer per thread (more warps: more loads in flight).
BLOCK_ELEMENTS_PER_THREAD = 32
BLOCK_ELEMENTS_PER_THREAD_LOGSUMEXP = 16
#: "block", forward softmax / log_softmax: rows per program up to this many held elements
#: (8192 x 4096 bf16 on the H200, three interleaved rounds: 2 rows of 8 warps 85.2%, 1 row of
#: 4 warps 83.0%; programs of 8192 elements also ran 32768 x 8192 at 98%).
BLOCK_PROGRAM_ELEMENTS = 8192
#: Rows that do not fit in registers: "split" while rows * this <= number of SMs (decode batches:
#: its second read hits L2, and it measured faster than "cooperative" at 1 and 64 rows of
#: 151936, with the input in L2 and from HBM: 6.4 against 9.4 us and 20.3 against 22.9 us after
#: a flush that leaves clean lines, benchmarks/results/h200-probe-decode-flush.txt); else
#: softmax and log_softmax rows of up to ONLINE_ELEMENTS stream "online" (the second read hits
#: L2 while the rows in flight fit there: 4096 x 32768 bf16 on the H200, three interleaved
#: rounds, online 81.0% of the roof against 76.8% for "cooperative"); else
#: "cooperative" (one read; 256 x 131072: 59.2% against 46.8-47.6% online at 4-8 warps), else
#: "online".
SPLIT_ROWS_PER_SM = 2
ONLINE_ELEMENTS = 32768
#: "split": total programs aimed at, per SM (64 x 151936 bf16 ran best at one segment per program).
SPLIT_PROGRAMS_PER_SM = 32
#: "cooperative": held elements per program (forward; the backward holds y and dy, so half as
#: many of each) and warps (best of 2-16 warps and 4096-32768 elements at 4096 x 32768 and
#: 256 x 131072 bf16 on the H200). A row's programs must all fit on the device at once, so a row
#: never gets more programs than there are SMs (the segments per program grow instead, up to the
#: register limit; beyond it "online" or "split" take the row).
COOPERATIVE_ELEMENTS = 8192
COOPERATIVE_WARPS = 4
#: "online" / "split": held elements per streamed block, and warps. The softmax and log_softmax
#: forward stream with 4 warps (4096 x 32768: blocks of 8192 and 4 warps 81.0%, 8 warps 78.1%,
#: 16 warps 59.2%, blocks of 4096 53.8-67.3%); the other online launches keep the 8 warps they
#: were measured with (the softmax backward at 4096 x 32768: 60.9% with 8, 59.2% with 4).
ONLINE_BLOCK_ELEMENTS = 8192
ONLINE_WARPS = 8
ONLINE_WARPS_SOFTMAX_FORWARD = 4
SPLIT_BLOCK_ELEMENTS = 4096
SPLIT_WARPS = 4
#: "online" / "split": pipelining depth of the streaming loops (``Tuning.stages``). Staging the
#: next blocks through shared memory lost where "online" is the default (4096 x 32768: 2-4
#: stages 60-71% against 81% for 1) and made no difference at 32768 x 8192 (blocks of 8192);
#: at 256 x 131072 it lifted "online" from 47.6% to 55.5% (8 warps, 4 stages), still below the
#: default there ("cooperative", 59.2%). So the loops issue each block's loads when they reach it.
STREAM_STAGES = 1
#: The backward launches that hold y and dy through the row sum ("warp", "block", "cooperative")
#: hold 16-bit ones as loaded and widen them again for dx (``Tuning.hold_16bit``): on the H200,
#: three interleaved rounds, 4096 x 32768 bf16 (block, 16 warps) 85.7% -> 98.6% of the roof
#: (128 registers with 104 bytes of stack -> 128 and none), cooperative 80.6% -> 88.0%,
#: 8192 x 4096 89.1% -> 90.0% (``benchmarks/results/h200-probe-hold-16bit.txt``; against Liger,
#: ``h200-probe-softmax-backward.txt``). The forward holds x as float32: holding 16 bits there lost
#: 0-6 points at every shape measured, its peak of registers being the exp tile, not the input.
HOLD_16BIT_BACKWARD = True
#: The forward "online" launch stores its outputs with the L2 evict-first policy, so that they do
#: not push out the rows still waiting for their second read (read first with evict-last). On the
#: H200 at 4096 x 32768 bf16: DRAM bytes read 302 -> 279 MB (the input once is 268 MB), softmax
#: 81.2% -> 83.8% of the roof (the same direction in three runs), log_softmax 84.4% -> 88.6%.
#: Launches that read once gained nothing from it (``benchmarks/results/h200-probe-store-hints.txt``).
ONLINE_STORE_POLICY = "evict_first"

_OPS = {"softmax": kernels.SOFTMAX.value, "log_softmax": kernels.LOG_SOFTMAX.value,
        "logsumexp": kernels.LOGSUMEXP.value}
_SOFTMAX, _LOG_SOFTMAX, _LOGSUMEXP = _OPS["softmax"], _OPS["log_softmax"], _OPS["logsumexp"]


@dataclass(frozen=True)
class Tuning:
    """Launch parameters for study (``None``: the heuristic's choice). Powers of two, except
    ``hints`` (eviction policies on the two reads of "online" / "split") and ``dependent_launch``
    (True / False: "split" launches FINISH as a programmatic dependent launch, where the device
    has it, or not; None: when PARTIALS fits in one wave) and ``stages`` (>= 1: the pipelining
    depth of the streaming loops of "online" and "split", ``kernels.softmax_kernel``'s STAGES) and
    ``hold_16bit`` (True: "warp", "block" and "cooperative" hold 16-bit inputs as loaded through
    the row's merge and widen them again for the outputs, ``kernels.softmax_kernel``'s
    HOLD_16BIT; refused for 32-bit inputs; None: the backward passes do, ``HOLD_16BIT_BACKWARD``)
    and ``store_hint`` (the eviction policy of the output stores, ``kernels.softmax_kernel``'s
    STORE_POLICY: "evict_first" or "" (none); None: "evict_first" for the forward "online"
    launch, ``ONLINE_STORE_POLICY``, none elsewhere) and ``max_registers`` (a cap on the registers
    per thread, Triton's ``maxnreg``: more programs per SM, at the price of spills past it; on the
    H200 the spills cost more than the programs gained, 14 points at 4096 x 32768, everywhere but
    "cooperative" at 256 x 131072 with 80 registers, +0.8 points,
    ``benchmarks/results/h200-probe-max-registers.txt``)."""
    num_warps: Optional[int] = None
    rows_per_program: Optional[int] = None
    seg_block: Optional[int] = None
    segments_per_program: Optional[int] = None
    inner: Optional[int] = None
    hints: Optional[bool] = None
    dependent_launch: Optional[bool] = None
    stages: Optional[int] = None
    hold_16bit: Optional[bool] = None
    store_hint: Optional[str] = None
    max_registers: Optional[int] = None


_DEFAULT_TUNING = Tuning()


@dataclass(frozen=True)
class _Phase:
    """One kernel launch: its grid and its constexpr keywords (with and without temperature)."""
    grid: tuple
    programs_per_row: int
    num_warps: int
    constexprs: tuple  # (name, value) pairs, HAS_TEMPERATURE=False
    kwargs: dict = field(compare=False, repr=False, default_factory=dict)
    kwargs_temperature: dict = field(compare=False, repr=False, default_factory=dict)


def _phase(grid: int, programs_per_row: int, num_warps: int, constexprs: dict, options: dict,
           launch_pdl: bool = False) -> _Phase:
    """One launch: its constexprs, and ``options`` (launch options besides the warps, such as the
    register cap of ``Tuning.max_registers``)."""
    launch = dict(constexprs, num_warps=num_warps, enable_fp_fusion=False, **options,
                  **({"launch_pdl": True} if launch_pdl else {}))
    return _Phase((grid,), programs_per_row, num_warps, tuple(constexprs.items()), launch,
                  dict(launch, HAS_TEMPERATURE=True))


@dataclass(frozen=True)
class Plan:
    """What one call launches: the strategy, its parameters and the kernel launches in order."""
    strategy: str
    num_warps: int
    rows_per_program: int
    seg_block: int
    segments_per_program: int
    inner: int
    hints: bool
    num_segments: int
    phases: tuple
    partials: str = ""  # "" (none), "p" (backward: one float32 per segment) or "pq" (forward)

    @property
    def arrivals(self) -> bool:
        """Whether the launch needs a zeroed int32 arrival counter per row ("cooperative")."""
        return self.strategy == "cooperative"


def _pow2(fn: str, name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ValueError(f"{fn}: {name} must be a power of two >= 1, got {value!r}")
    return value


@functools.lru_cache(maxsize=64)
def _sm_count(device_type: str, index: Optional[int]) -> int:
    if device_type == "cuda":
        return torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device()
                                                ).multi_processor_count
    return 4  # the interpreter: fewer, larger programs run faster


def _tile_elements(n: int) -> int:
    return order.next_pow2(order.num_segments(n)) * order.lanes(n)


def _held_factor(op: int, backward: bool) -> int:
    return 2 if backward and op != _OPS["logsumexp"] else 1


def _cooperative_segments(n: int, factor: int, sms: int, wanted: Optional[int]) -> int:
    """Segments per program of "cooperative" (``wanted``, or the heuristic's): at least enough
    that a row needs no more programs than ``sms``; 0 when that share exceeds the register limit."""
    lanes, segments = order.lanes(n), order.num_segments(n)
    spp = wanted or max(1, COOPERATIVE_ELEMENTS // (lanes * factor))
    spp = min(max(spp, order.next_pow2(order.cdiv(segments, sms))), order.next_pow2(segments))
    return spp if spp * lanes * factor <= REGISTER_ELEMENTS_LIMIT else 0


def _auto_strategy(op: int, backward: bool, n: int, rows: int, sms: int, concurrent: bool) -> str:
    factor = _held_factor(op, backward)
    held = _tile_elements(n) * factor
    if held <= WARP_ELEMENTS:
        return "warp"
    if held <= (REGISTER_ELEMENTS_BACKWARD if backward else REGISTER_ELEMENTS):
        return "block"
    if rows * SPLIT_ROWS_PER_SM <= sms:
        return "split"
    if not backward and op != _LOGSUMEXP and held <= ONLINE_ELEMENTS:
        return "online"
    if not (op == _LOGSUMEXP and backward) and concurrent and _cooperative_segments(n, factor, sms, None):
        return "cooperative"
    return "online"


@functools.lru_cache(maxsize=4096, typed=True)  # 2.0 is not 2: each is checked
def plan(op: int, backward: bool, n: int, rows: int, sms: int, item_size: int = 2, strategy: str = "auto",
         tuning: Tuning = _DEFAULT_TUNING, fn: str = "softmax", dependent_launch: bool = False,
         concurrent: bool = True) -> Plan:
    """The launches for ``rows`` rows of ``n`` elements of ``item_size`` bytes (cached).

    ``dependent_launch``: the device supports programmatic dependent launch; "split" then
    launches its FINISH phase as one when its PARTIALS phase fits in one wave of programs
    (``Tuning.dependent_launch`` True or False decides instead). ``concurrent``: the programs of
    a launch run at the same time, as compiled kernels' do (Triton's interpreter runs them one
    after another, so "cooperative" then gets one program per row or is refused)."""
    if strategy == "auto":
        strategy = _auto_strategy(op, backward, n, rows, sms, concurrent)
    elif strategy not in STRATEGIES:
        raise ValueError(f"{fn}: strategy={strategy!r} is not one of {', '.join(('auto',) + STRATEGIES)}")
    lanes, segments = order.lanes(n), order.num_segments(n)
    seg_pow2 = order.next_pow2(segments)
    tile = seg_pow2 * lanes
    for name in ("num_warps", "rows_per_program", "seg_block", "segments_per_program", "inner"):
        if getattr(tuning, name) is not None:
            _pow2(fn, name, getattr(tuning, name))
    lse = op == _OPS["logsumexp"]
    group = order.group(n, item_size)
    # A block's contiguous axis: a warp's 32 lanes times one 16-byte vector (= one group) each.
    inner = min(lanes, max(group, tuning.inner or group * 32))
    outer = lanes // inner
    check_max_registers(fn, tuning.max_registers)
    check_eviction_policy(fn, "store_hint", tuning.store_hint)
    common = dict(OP=op, BACKWARD=backward, HAS_TEMPERATURE=False, LANES=lanes, INNER=inner,
                  OUTER=outer, LOG2_OUTER=order.log2(outer), GROUP=group, LOG2_GROUP=order.log2(group),
                  LOG2_INNER_GROUPS=order.log2(inner // group),
                  SEG_POW2=seg_pow2, LOG2_SEG_POW2=order.log2(seg_pow2),
                  **({"STORE_POLICY": tuning.store_hint} if tuning.store_hint else {}))
    options = register_cap(tuning.max_registers)
    online_store_policy = (ONLINE_STORE_POLICY if tuning.store_hint is None and not backward and not lse
                           else tuning.store_hint or "")
    hints = True if tuning.hints is None else bool(tuning.hints)
    if tuning.stages is not None and (isinstance(tuning.stages, bool) or not isinstance(tuning.stages, int)
                                      or tuning.stages < 1):
        raise ValueError(f"{fn}: stages must be an int >= 1, got {tuning.stages!r}")
    stages = tuning.stages or STREAM_STAGES
    if tuning.hold_16bit and item_size != 2:
        raise ValueError(f"{fn}: hold_16bit=True holds 16-bit inputs, got {item_size}-byte elements")
    if tuning.hold_16bit is None:
        hold = HOLD_16BIT_BACKWARD and backward and item_size == 2
    else:
        hold = bool(tuning.hold_16bit)
    first_policy, second_policy = ("evict_last", "evict_first") if hints else ("", "")

    factor = _held_factor(op, backward)
    if strategy in ("warp", "block"):
        if tile > REGISTER_ELEMENTS_LIMIT:
            raise ValueError(f"{fn}: strategy={strategy!r} holds whole rows in registers; a row of {n} elements "
                             f"needs a tile of {tile} > {REGISTER_ELEMENTS_LIMIT}; use 'online' or 'split'")
        if strategy == "warp":
            num_warps = tuning.num_warps or 1
            rpp = tuning.rows_per_program or max(1, min(WARP_PROGRAM_ELEMENTS // (tile * factor),
                                                        order.next_pow2(rows)))
        else:
            per_thread = BLOCK_ELEMENTS_PER_THREAD_LOGSUMEXP if lse and not backward else BLOCK_ELEMENTS_PER_THREAD
            rpp = tuning.rows_per_program or (1 if lse or backward else max(1, min(
                BLOCK_PROGRAM_ELEMENTS // tile, order.next_pow2(rows))))
            num_warps = tuning.num_warps or max(4, min(16, rpp * tile * factor // (32 * per_thread)))
        phase = _phase(order.cdiv(rows, rpp), 1, num_warps, dict(
            common, PHASE=kernels.WHOLE_ROWS.value, IN_REGISTERS=True, ROWS_PER_PROGRAM=rpp,
            SEG_BLOCK=1, SEGMENTS_PER_PROGRAM=1, ONLINE_BLOCKS=1, FIRST_READ_POLICY="", SECOND_READ_POLICY="",
            **({"HOLD_16BIT": True} if hold else {})), options)
        return Plan(strategy, num_warps, rpp, 1, 1, inner, False, segments, (phase,))

    if strategy == "online":
        num_warps = tuning.num_warps or (ONLINE_WARPS if lse or backward else ONLINE_WARPS_SOFTMAX_FORWARD)
        seg_block = min(tuning.seg_block or max(1, ONLINE_BLOCK_ELEMENTS // (lanes * factor)), seg_pow2)
        phase = _phase(rows, 1, num_warps, dict(
            common, PHASE=kernels.WHOLE_ROWS.value, IN_REGISTERS=False, ROWS_PER_PROGRAM=1,
            SEG_BLOCK=seg_block, SEGMENTS_PER_PROGRAM=seg_block, ONLINE_BLOCKS=order.cdiv(segments, seg_block),
            FIRST_READ_POLICY=first_policy, SECOND_READ_POLICY=second_policy, STAGES=stages,
            **({"STORE_POLICY": online_store_policy} if online_store_policy else {})), options)
        return Plan(strategy, num_warps, 1, seg_block, seg_block, inner, hints, segments, (phase,))

    if strategy == "cooperative" and lse and backward:
        strategy = "split"  # elementwise from the saved lse: both launch the same single pass
    if strategy == "cooperative":
        wanted = tuning.segments_per_program
        if wanted is None and not concurrent and not lse:
            wanted = seg_pow2  # programs that run one after another cannot wait for one another
        spp = _cooperative_segments(n, factor, sms, wanted)
        if not spp:
            raise ValueError(f"{fn}: strategy='cooperative' needs a row of {n} elements held by at most {sms} "
                             f"programs of at most {REGISTER_ELEMENTS_LIMIT} elements; use 'online' or 'split'")
        programs_per_row = order.cdiv(segments, spp)
        if programs_per_row > 1 and not concurrent and not lse:  # logsumexp waits for no one
            raise ValueError(f"{fn}: strategy='cooperative' with {programs_per_row} programs per row needs them "
                             f"to run at once, which Triton's interpreter does not do; give "
                             f"segments_per_program >= {seg_pow2}")
        num_warps = tuning.num_warps or COOPERATIVE_WARPS
        phase = _phase(rows * programs_per_row, programs_per_row, num_warps, dict(
            common, PHASE=kernels.COOPERATIVE.value, IN_REGISTERS=False, ROWS_PER_PROGRAM=1, SEG_BLOCK=spp,
            SEGMENTS_PER_PROGRAM=spp, ONLINE_BLOCKS=1, FIRST_READ_POLICY="", SECOND_READ_POLICY="",
            **({"HOLD_16BIT": True} if hold else {})), options)
        return Plan(strategy, num_warps, 1, spp, spp, inner, False, segments, (phase,),
                    "p" if backward else "pq")

    # split
    num_warps = tuning.num_warps or SPLIT_WARPS
    if tuning.segments_per_program is not None:
        spp = tuning.segments_per_program
    else:
        spp = order.next_pow2(order.cdiv(rows * segments, SPLIT_PROGRAMS_PER_SM * sms))
    spp = min(spp, seg_pow2)
    seg_block = min(tuning.seg_block or max(1, SPLIT_BLOCK_ELEMENTS // (lanes * factor)), spp)
    programs_per_row = order.cdiv(segments, spp)
    split = dict(common, IN_REGISTERS=False, ROWS_PER_PROGRAM=1, SEG_BLOCK=seg_block, SEGMENTS_PER_PROGRAM=spp,
                 ONLINE_BLOCKS=1,
                 FIRST_READ_POLICY=first_policy, SECOND_READ_POLICY=second_policy, STAGES=stages)
    phases = []
    partials = ""
    # A dependent FINISH helped only while PARTIALS fits in one wave (its programs then wait on
    # idle SMs): 1 x 151936 bf16 3.9 -> 3.6 us forward, 4.6 -> 3.8 us backward in a CUDA graph on
    # the H200; at 64 rows it lost 0.3-1.3 us (benchmarks/results/h200-probe-split-pdl.txt).
    one_wave = rows * programs_per_row <= sms
    pdl = (dependent_launch and not (lse and backward)
           and (tuning.dependent_launch if tuning.dependent_launch is not None else one_wave))
    if not (lse and backward):  # the logsumexp backward needs no partials
        partials = "p" if backward else "pq"
        phases.append(_phase(rows * programs_per_row, programs_per_row, num_warps,
                             dict(split, PHASE=kernels.PARTIALS.value, **({"RELEASE_DEPENDENTS": True} if pdl else {})),
                             options))
    finish_programs = 1 if (lse and not backward) else programs_per_row
    phases.append(_phase(rows * finish_programs, finish_programs, num_warps,
                         dict(split, PHASE=kernels.FINISH.value, **({"WAIT_FOR_PRIOR": True} if pdl else {})), options,
                         launch_pdl=pdl))
    return Plan(strategy, num_warps, 1, seg_block, spp, inner, hints, segments, tuple(phases), partials)


_KERNEL = Launcher(kernels.softmax_kernel)


def _launch(plan_: Plan, src, grad, dst, row, rows: int, n: int, stride_src: int, stride_grad: int,
            stride_dst: int, inv_temperature: float, prepare_key=None, targets: Optional["_Targets"] = None) -> None:
    """Launch the plan's phases. ``prepare_key``: a call of contiguous rows keeps its prepared
    launches under this key (``_PreparedCall``; ``_prepared_call``, ``_prepared_backward``);
    ``src``, ``grad``, ``dst`` and ``row`` must then be distinct tensors or the same object.
    ``targets``: the logsumexp launches of cross-entropy (never prepared)."""
    if plan_.partials:
        part_p = src.new_empty((rows, plan_.num_segments), dtype=torch.float32)
        part_q = torch.empty_like(part_p) if plan_.partials == "pq" else part_p
    else:
        part_p = part_q = src
    arrivals = torch.zeros(rows, dtype=torch.int32, device=src.device) if plan_.arrivals else src
    with_temperature = inv_temperature != 1.0
    segments = plan_.num_segments
    # the tensors a prepared call replaces: its inputs and output (``_io_tensors``), then the
    # per-call buffers
    slots = _io_tensors(src, grad, dst, row)
    slots += (part_p, part_q) if plan_.partials == "pq" else (part_p,) if plan_.partials else ()
    slots += (arrivals,) if plan_.arrivals else ()
    launches = []
    if targets is None:
        target_args = (src, src, src, 0, 0.0)
    else:
        target_args = (targets.target, targets.loss if targets.loss is not None else src,
                       targets.row_sum if targets.row_sum is not None else src, targets.ignore_index,
                       targets.smoothing)
    for phase in plan_.phases:
        args = (src, grad, dst, row, part_p, part_q, arrivals, rows, n, segments, phase.programs_per_row,
                stride_src, stride_grad, stride_dst, inv_temperature) + target_args
        kwargs = phase.kwargs_temperature if with_temperature else phase.kwargs
        if targets is not None:
            kwargs = dict(kwargs, TARGETS=True, SMOOTHING=targets.smoothing != 0.0,
                          **({"OP": _LOGSUMEXP, "FUSED": True} if targets.fused else {}),
                          **({"RESUME": True} if targets.resume else {}))
        if prepare_key is not None:
            launches.append(_KERNEL.prepare(phase.grid, args, kwargs, slots))  # launches, then prepares
        else:
            _KERNEL(phase.grid, *args, **kwargs)
    if launches and all(launch is not None for launch in launches):
        if len(_PREPARED) >= _MAX_PREPARED:
            _PREPARED.clear()
        _PREPARED[prepare_key] = _PreparedCall(tuple(launches), plan_.partials, plan_.arrivals, rows, segments)


def _io_tensors(src, grad, dst, row) -> tuple:
    """The distinct tensors among a launch's (src, grad, dst, row), in that order: (x, out) for a
    forward call (``grad`` and ``row`` are ``src``), (y, dy, dx) for the softmax backward,
    (x, dy, dx, lse) for the logsumexp backward. A prepared call takes them in this order."""
    out = (src,)
    for t in (grad, dst, row):
        if all(t is not u for u in out):
            out += (t,)
    return out


class _PreparedCall:
    """The prepared launches of one kind of eager call, in order. ``call(*io)`` takes the call's
    inputs and output in ``_io_tensors`` order, allocates what the plan needs anew (partials;
    zeroed arrival counters for "cooperative"), then launches each with the new tensors'
    addresses. Returns False, having launched nothing, when a tensor is not 16-byte aligned as
    the kernels were compiled for, or a profiler's launch hooks are installed (the ordinary path
    then answers)."""

    __slots__ = ("launches", "partials", "arrivals", "rows", "segments")

    def __init__(self, launches, partials: str, arrivals: bool, rows: int, segments: int):
        self.launches, self.partials, self.arrivals = launches, partials, arrivals
        self.rows, self.segments = rows, segments

    def __call__(self, *io: torch.Tensor) -> bool:
        tensors = io
        x = io[0]
        if self.partials:
            # one allocation; each partials array starts on a 16-byte boundary, as the kernels
            # were compiled for (a misaligned slot would make its launch decline)
            size = self.rows * self.segments
            stride = -(-size // 4) * 4
            part = torch.empty(len(self.partials) * stride, dtype=torch.float32, device=x.device)
            tensors += tuple(part[i * stride:i * stride + size] for i in range(len(self.partials)))
        if self.arrivals:
            tensors += (torch.zeros(self.rows, dtype=torch.int32, device=x.device),)
        # every launch must run or none: check what would make one decline before the first
        if launch_hooks_active() or any(t.data_ptr() % 16 for t in tensors):
            return False
        for launch in self.launches:
            launch(*tensors)
        return True


_PLANS: dict = {}
_FN_NAMES = {value: name for name, value in _OPS.items()}


def _plan_for(op: int, backward: bool, n: int, rows: int, t: torch.Tensor, strategy: str = "auto",
              tuning: Tuning = _DEFAULT_TUNING) -> Plan:
    """``plan`` for tensor ``t``, through a dictionary keyed by plain values (an eager call costs one
    lookup; the device's SM count and the dataclass hash are only computed on a miss)."""
    key = (op, backward, n, rows, t.dtype, t.get_device(), strategy, None if tuning is _DEFAULT_TUNING else tuning)
    found = _PLANS.get(key)
    if found is None:
        found = plan(op, backward, n, rows, _sm_count(t.device.type, t.device.index), t.element_size(), strategy,
                     tuning, _FN_NAMES[op], _dependent_launch(t.device.type, t.device.index),
                     not backend.INTERPRETED)
        if len(_PLANS) > 4096:
            _PLANS.clear()
        _PLANS[key] = found
    return found


def _rows(t: torch.Tensor, n: int):
    """(rows of ``t``, their stride): ``t`` itself when contiguous (the kernel needs only its
    address), else a [rows, n] view when the rows are evenly strided with a contiguous last dim,
    else a contiguous copy."""
    if t.is_contiguous():
        return t, n
    rows = as_rows(t)
    return rows, rows.stride(0)


#: Prepared eager calls (``_PreparedCall``): forward calls keyed by (op, shape, strides, dtype,
#: device), backward calls by ("backward", op, shapes, strides, dtypes, device, temperature)
#: (``_prepared_call``, ``_prepared_backward``): a repeated call allocates its output (and the
#: plan's buffers) and launches.
_PREPARED: dict = {}
_MAX_PREPARED = 1024


@functools.lru_cache(maxsize=256)
def _float32_inverse(temperature: float) -> float:
    """float32(1 / temperature): what the kernel multiplies by (callers pass 1.0 itself through)."""
    return struct.unpack("f", struct.pack("f", 1.0 / temperature))[0]


# ---- launchers (kernel only; the tensors' last dim is the reduced one) ----------------------

def _new_output(shape, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """Every output buffer of the launchers (uninitialised; the kernels write every element)."""
    if shape is like.shape or shape == like.shape:  # empty_like is the cheaper call on the host
        return torch.empty_like(like, dtype=dtype, memory_format=torch.contiguous_format)
    return like.new_empty(shape, dtype=dtype)


def softmax_forward(x: torch.Tensor, *, log: bool = False, temperature: float = 1.0,
                    out_dtype: Optional[torch.dtype] = None, strategy: str = "auto",
                    tuning: Tuning = _DEFAULT_TUNING, prepare_key=None) -> torch.Tensor:
    """softmax (or log_softmax) over the last dim of ``x`` through the Triton kernel
    (``prepare_key``: see ``_launch``)."""
    shape = x.shape
    out = _new_output(shape, out_dtype or x.dtype, x)
    n = shape[-1] if shape else 1
    numel = out.numel()
    if n == 0 or numel == 0:
        return out
    x2, x_stride = (x, n) if x.is_contiguous() else _rows(x, n)
    rows = numel // n
    p = _plan_for(_LOG_SOFTMAX if log else _SOFTMAX, False, n, rows, x, strategy, tuning)
    _launch(p, x2, x2, out, x2, rows, n, x_stride, x_stride, n,
            1.0 if temperature == 1.0 else _float32_inverse(float(temperature)), prepare_key)
    return out


def logsumexp_forward(x: torch.Tensor, *, strategy: str = "auto", tuning: Tuning = _DEFAULT_TUNING,
                      prepare_key=None) -> torch.Tensor:
    """logsumexp over the last dim of ``x`` through the Triton kernel; shape ``x.shape[:-1]``
    (``prepare_key``: see ``_launch``)."""
    out = _new_output(x.shape[:-1], x.dtype, x)
    n = x.shape[-1]
    rows = out.numel()
    if rows == 0:
        return out
    if n == 0:
        return out.fill_(float("-inf"))
    x2, x_stride = (x, n) if x.is_contiguous() else _rows(x, n)
    p = _plan_for(_LOGSUMEXP, False, n, rows, x, strategy, tuning)
    _launch(p, x2, x2, out, x2, rows, n, x_stride, x_stride, 1, 1.0, prepare_key)
    return out


def softmax_backward(grad: torch.Tensor, y: torch.Tensor, *, log: bool = False, temperature: float = 1.0,
                     x_dtype: Optional[torch.dtype] = None, strategy: str = "auto",
                     tuning: Tuning = _DEFAULT_TUNING, prepare_key=None) -> torch.Tensor:
    """dx of softmax (or log_softmax) from dy = ``grad`` and the forward output ``y``
    (``prepare_key``: see ``_launch``)."""
    shape = y.shape
    dx = _new_output(shape, x_dtype or y.dtype, y)
    n = shape[-1] if shape else 1
    numel = dx.numel()
    if n == 0 or numel == 0:
        return dx
    y2, y_stride = (y, n) if y.is_contiguous() else _rows(y, n)
    g2, g_stride = (grad, n) if grad.is_contiguous() else _rows(grad, n)
    rows = numel // n
    p = _plan_for(_LOG_SOFTMAX if log else _SOFTMAX, True, n, rows, y, strategy, tuning)
    _launch(p, y2, g2, dx, y2, rows, n, y_stride, g_stride, n,
            1.0 if temperature == 1.0 else _float32_inverse(float(temperature)), prepare_key)
    return dx


def logsumexp_backward(grad: torch.Tensor, x: torch.Tensor, lse: torch.Tensor, *, strategy: str = "auto",
                       tuning: Tuning = _DEFAULT_TUNING) -> torch.Tensor:
    """dx of logsumexp: ``grad`` and ``lse`` have shape ``x.shape[:-1]``."""
    dx = _new_output(x.shape, x.dtype, x)
    n = x.shape[-1]
    numel = dx.numel()
    if n == 0 or numel == 0:
        return dx
    x2, x_stride = (x, n) if x.is_contiguous() else _rows(x, n)
    rows = numel // n
    g1 = grad.reshape(rows).contiguous()
    l1 = lse.reshape(rows).contiguous()
    p = _plan_for(_LOGSUMEXP, True, n, rows, x, strategy, tuning)
    _launch(p, x2, g1, dx, l1, rows, n, x_stride, 1, n, 1.0)
    return dx


@dataclass(frozen=True)
class _Targets:
    """The cross-entropy arguments of a logsumexp launch (``kernels.softmax_kernel``'s TARGETS):
    the targets [rows], the loss output and the row sums (forward; label smoothing only), the
    ignored target value and the label smoothing eps (float32-rounded by the caller); ``fused``:
    a forward that writes dx too, planned as the softmax forward (FUSED); ``resume``: a backward
    into the dx such a forward wrote (RESUME)."""
    target: torch.Tensor
    loss: Optional[torch.Tensor]
    row_sum: Optional[torch.Tensor]
    ignore_index: int
    smoothing: float
    fused: bool = False
    resume: bool = False


#: Cross-entropy's own launch choices where its family's plan ("auto") would take another, on
#: the H100, three interleaved rounds, bf16 (``benchmarks/results/h100-probe-cross-entropy-*``):
#: the forward "online" with 4 warps where logsumexp's plan is "cooperative" (8192 x 128256
#: 693 against 748 us, 4096 x 151936 427 against 457, 16384 x 32000 350 against 390); the
#: backward "split" with one segment per program where it is "online" (1424 against 1500, 845
#: against 893); the forward that writes dx "cooperative" with one segment per program where the
#: softmax forward's plan is "cooperative" with more (1806 against 1867, 1097 against 1306).
#: Compiled launches only: the interpreter runs a row's programs one after another.
_CROSS_ENTROPY_ONLINE = Tuning(num_warps=4)
_CROSS_ENTROPY_ONE_SEGMENT = Tuning(segments_per_program=1)


def _cross_entropy_plan(op: int, backward: bool, n: int, rows: int, x: torch.Tensor, strategy: str,
                        tuning: Tuning) -> Plan:
    """``_plan_for``, with cross-entropy's own choices (above) where the caller left it "auto"."""
    p = _plan_for(op, backward, n, rows, x, strategy, tuning)
    if strategy != "auto" or tuning != _DEFAULT_TUNING or backend.INTERPRETED:
        return p
    if op == _LOGSUMEXP and not backward and p.strategy == "cooperative":
        return _plan_for(op, False, n, rows, x, "online", _CROSS_ENTROPY_ONLINE)
    if op == _LOGSUMEXP and backward and p.strategy == "online":
        return _plan_for(op, True, n, rows, x, "split", _CROSS_ENTROPY_ONE_SEGMENT)
    if op == _SOFTMAX and p.strategy == "cooperative" and p.segments_per_program > 1:
        return _plan_for(op, False, n, rows, x, "cooperative", _CROSS_ENTROPY_ONE_SEGMENT)
    return p


def cross_entropy_forward(x: torch.Tensor, target: torch.Tensor, ignore_index: int, smoothing: float, *,
                          dloss: Optional[torch.Tensor] = None, strategy: str = "auto",
                          tuning: Tuning = _DEFAULT_TUNING) -> tuple:
    """(loss [rows], stats [2, rows]), float32, of logits ``x`` [rows, n >= 1] and targets [rows]:
    the logsumexp launches with each row's loss written beside its M' and log Z (``stats``, whose
    sum is the row's lse; what the backward reads). Label smoothing first sums each row in the
    order's trees (``reduce.tree_sum_rows``: one more read of x).

    ``dloss`` (a float32 tensor of one element): also dx for that dloss on every row not ignored,
    as ``cross_entropy_backward`` gives it, bit for bit, returned third; the launches are then
    the softmax forward's (``strategy`` and ``tuning`` as there), which write elementwise outputs."""
    rows, n = x.shape
    loss = x.new_empty((rows,), dtype=torch.float32)
    stats = x.new_empty((2, rows), dtype=torch.float32)
    dx = None if dloss is None else _new_output(x.shape, x.dtype, x)
    if rows == 0:
        return (loss, stats) if dx is None else (loss, stats, dx)
    x2, x_stride = (x, n) if x.is_contiguous() else _rows(x, n)
    row_sum = _reduce.tree_sum_rows(x2, out_dtype=torch.float32) if smoothing else None
    targets = _Targets(target.contiguous(), loss, row_sum, ignore_index, smoothing, fused=dloss is not None)
    if dx is None:
        p = _cross_entropy_plan(_LOGSUMEXP, False, n, rows, x, strategy, tuning)
        _launch(p, x2, x2, stats, stats, rows, n, x_stride, x_stride, 1, 1.0, targets=targets)
        return loss, stats
    p = _cross_entropy_plan(_SOFTMAX, False, n, rows, x, strategy, tuning)
    _launch(p, x2, dloss.reshape(()).float(), dx, stats, rows, n, x_stride, 0, n, 1.0, targets=targets)
    return loss, stats, dx


def cross_entropy_backward(grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, stats: torch.Tensor,
                           ignore_index: int, smoothing: float, *, written: Optional[tuple] = None,
                           strategy: str = "auto", tuning: Tuning = _DEFAULT_TUNING) -> torch.Tensor:
    """dx of the cross-entropy losses from dloss = ``grad`` ([rows], or one element for every
    row) and the forward's ``stats`` ([2, rows]: M', log Z): the logsumexp backward launch, one
    read of x and one write of dx.

    ``written`` = (dx, its dloss): the dx a fused forward wrote (``cross_entropy_forward``'s
    ``dloss``) and the one-element dloss it was written for. The launch then writes over that dx
    and returns it: at once, reading nothing, where ``grad`` (one element) is that dloss;
    otherwise the plain backward."""
    rows, n = x.shape
    if written is not None:
        dx, g_stride = written[0], 0
        g = torch.stack((grad.reshape(()).float(), written[1].reshape(()).float()))
    elif grad.numel() == rows:
        dx, g, g_stride = _new_output(x.shape, x.dtype, x), grad.contiguous(), 1
    else:
        dx, g, g_stride = _new_output(x.shape, x.dtype, x), grad.reshape(()).float(), 0
    if dx.numel() == 0:
        return dx
    x2, x_stride = (x, n) if x.is_contiguous() else _rows(x, n)
    p = _cross_entropy_plan(_LOGSUMEXP, True, n, rows, x, strategy, tuning)
    _launch(p, x2, g, dx, stats.contiguous(), rows, n, x_stride, g_stride, n, 1.0,
            targets=_Targets(target.contiguous(), None, None, ignore_index, smoothing, resume=written is not None))
    return dx


# ---- the registered ops: kernel or reference, by device ------------------------------------

@torch.library.custom_op("treefold::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor, log: bool, temperature: float, dtype: Optional[torch.dtype],
                strategy: str) -> torch.Tensor:
    if backend.use_kernel(x):
        return softmax_forward(x, log=log, temperature=temperature, out_dtype=dtype, strategy=strategy)
    return reference.softmax(x, log=log, temperature=temperature, out_dtype=dtype)


@_softmax_op.register_fake
def _(x, log, temperature, dtype, strategy):
    return x.new_empty(x.shape, dtype=dtype or x.dtype)


@torch.library.custom_op("treefold::softmax_backward", mutates_args=())
def _softmax_backward_op(grad: torch.Tensor, y: torch.Tensor, log: bool, temperature: float,
                         x_dtype: torch.dtype, strategy: str) -> torch.Tensor:
    if backend.use_kernel(y):
        return softmax_backward(grad, y, log=log, temperature=temperature, x_dtype=x_dtype, strategy=strategy)
    return reference.softmax_backward(grad, y, log=log, temperature=temperature, x_dtype=x_dtype)


@_softmax_backward_op.register_fake
def _(grad, y, log, temperature, x_dtype, strategy):
    return y.new_empty(y.shape, dtype=x_dtype)


@torch.library.custom_op("treefold::logsumexp", mutates_args=())
def _logsumexp_op(x: torch.Tensor, strategy: str) -> torch.Tensor:
    if backend.use_kernel(x):
        return logsumexp_forward(x, strategy=strategy)
    return reference.logsumexp(x)


@_logsumexp_op.register_fake
def _(x, strategy):
    return x.new_empty(x.shape[:-1])


@torch.library.custom_op("treefold::logsumexp_backward", mutates_args=())
def _logsumexp_backward_op(grad: torch.Tensor, x: torch.Tensor, lse: torch.Tensor, strategy: str) -> torch.Tensor:
    if backend.use_kernel(x):
        return logsumexp_backward(grad, x, lse, strategy=strategy)
    return reference.logsumexp_backward(grad, x, lse)


@_logsumexp_backward_op.register_fake
def _(grad, x, lse, strategy):
    return x.new_empty(x.shape)


def _softmax_setup(ctx, inputs, output):
    x, log, temperature, dtype, strategy = inputs
    ctx.save_for_backward(output)
    ctx.log, ctx.temperature, ctx.x_dtype, ctx.strategy = log, temperature, x.dtype, strategy


def _recorded_softmax_backward(ctx, grad):
    """dx by torch's operations (the float64 reference, rounded once to x's dtype), for a
    backward that is being recorded (``backend.recording_backward``): differentiable again."""
    (y,) = ctx.saved_tensors
    return reference.softmax_backward(grad, y, log=ctx.log, temperature=ctx.temperature, x_dtype=ctx.x_dtype)


def _softmax_grad(ctx, grad):
    (y,) = ctx.saved_tensors
    if backend.recording_backward():
        dx = _recorded_softmax_backward(ctx, grad)
    else:
        dx = _softmax_backward_op(grad, y, ctx.log, ctx.temperature, ctx.x_dtype, ctx.strategy)
    return dx, None, None, None, None


def _logsumexp_setup(ctx, inputs, output):
    x, strategy = inputs
    ctx.save_for_backward(x, output)
    ctx.strategy = strategy


def _logsumexp_grad(ctx, grad):
    x, lse = ctx.saved_tensors
    if backend.recording_backward():  # torch's operations, differentiable again
        return reference.logsumexp_backward(grad, x, lse), None
    return _logsumexp_backward_op(grad, x, lse, ctx.strategy), None


def _cross_entropy_impl(x, target, ignore_index, smoothing, strategy="auto"):
    """(loss, stats): the kernels, or the float64 reference where they do not run."""
    if backend.use_kernel(x):
        return cross_entropy_forward(x, target, ignore_index, smoothing, strategy=strategy)
    return reference.cross_entropy(x, target, ignore_index, smoothing)


def _cross_entropy_backward_impl(grad, x, target, stats, ignore_index, smoothing, strategy="auto"):
    """dx: the kernel, or torch's operations (the float64 reference, differentiable again) where
    the kernels do not run or a backward is being recorded (``backend.recording_backward``)."""
    if backend.use_kernel(x) and not backend.recording_backward():
        return cross_entropy_backward(grad, x, target, stats, ignore_index, smoothing, strategy=strategy)
    return reference.cross_entropy_backward(grad, x, target, ignore_index, smoothing)


@torch.library.custom_op("treefold::cross_entropy", mutates_args=())
def _cross_entropy_op(x: torch.Tensor, target: torch.Tensor, ignore_index: int, smoothing: float,
                      strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _cross_entropy_impl(x, target, ignore_index, smoothing, strategy)


@_cross_entropy_op.register_fake
def _(x, target, ignore_index, smoothing, strategy):
    return x.new_empty(x.shape[:1], dtype=torch.float32), x.new_empty((2, x.shape[0]), dtype=torch.float32)


@torch.library.custom_op("treefold::cross_entropy_backward", mutates_args=())
def _cross_entropy_backward_op(grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, stats: torch.Tensor,
                               ignore_index: int, smoothing: float, strategy: str) -> torch.Tensor:
    return _cross_entropy_backward_impl(grad, x, target, stats, ignore_index, smoothing, strategy)


@_cross_entropy_backward_op.register_fake
def _(grad, x, target, stats, ignore_index, smoothing, strategy):
    return x.new_empty(x.shape)


def _cross_entropy_setup(ctx, inputs, output):
    x, target, ignore_index, smoothing, strategy = inputs
    ctx.save_for_backward(x, target, output[1])
    ctx.ignore_index, ctx.smoothing, ctx.strategy = ignore_index, smoothing, strategy


def _cross_entropy_grad(ctx, grad_loss, grad_stats):
    # the stats are an output only so that the backward can read them: the public functions
    # never return them
    x, target, stats = ctx.saved_tensors
    if backend.recording_backward():  # torch's operations, differentiable again
        dx = reference.cross_entropy_backward(grad_loss, x, target, ctx.ignore_index, ctx.smoothing)
    else:
        dx = _cross_entropy_backward_op(grad_loss, x, target, stats, ctx.ignore_index, ctx.smoothing, ctx.strategy)
    return dx, None, None, None, None


_softmax_op.register_autograd(_softmax_grad, setup_context=_softmax_setup)
_logsumexp_op.register_autograd(_logsumexp_grad, setup_context=_logsumexp_setup)
_cross_entropy_op.register_autograd(_cross_entropy_grad, setup_context=_cross_entropy_setup)


# ---- eager autograd: the same launchers, without the dispatcher --------------------------------

class _SoftmaxFunction(torch.autograd.Function):
    """Eager-mode autograd for softmax / log_softmax: the same kernels (or references) as the
    registered op and its autograd formula, called directly (a registered op's autograd path costs
    tens of microseconds of host time per call)."""

    @staticmethod
    def forward(ctx, x, log, temperature, dtype):
        if x.is_cuda and temperature == 1.0 and dtype is None:
            y = _prepared_call(_LOG_SOFTMAX if log else _SOFTMAX, x)
        elif backend.use_kernel(x):
            y = softmax_forward(x, log=log, temperature=temperature, out_dtype=dtype)
        else:
            y = reference.softmax(x, log=log, temperature=temperature, out_dtype=dtype)
        ctx.save_for_backward(y)
        ctx.log, ctx.temperature, ctx.x_dtype = log, temperature, x.dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        return _softmax_backward(ctx, grad)


def _softmax_backward(ctx, grad):
    (y,) = ctx.saved_tensors
    if backend.recording_backward():
        dx = _recorded_softmax_backward(ctx, grad)
    elif y.is_cuda:
        dx = _prepared_backward(grad, y, ctx.log, ctx.temperature, ctx.x_dtype)
    elif backend.use_kernel(y):
        dx = softmax_backward(grad, y, log=ctx.log, temperature=ctx.temperature, x_dtype=ctx.x_dtype)
    else:
        dx = reference.softmax_backward(grad, y, log=ctx.log, temperature=ctx.temperature, x_dtype=ctx.x_dtype)
    return dx, None, None, None


class _LogsumexpFunction(torch.autograd.Function):
    """Eager-mode autograd for logsumexp (see ``_SoftmaxFunction``)."""

    @staticmethod
    def forward(ctx, x):
        if x.is_cuda:
            lse = _prepared_call(_LOGSUMEXP, x)
        else:
            lse = logsumexp_forward(x) if backend.use_kernel(x) else reference.logsumexp(x)
        ctx.save_for_backward(x, lse)
        return lse

    @staticmethod
    def backward(ctx, grad):
        return _logsumexp_backward(ctx, grad)


def _logsumexp_backward(ctx, grad):
    x, lse = ctx.saved_tensors
    if backend.use_kernel(x) and not backend.recording_backward():
        return logsumexp_backward(grad, x, lse)
    return reference.logsumexp_backward(grad, x, lse)  # (torch's operations: differentiable again)


class _CrossEntropyFunction(torch.autograd.Function):
    """Eager-mode autograd for the cross-entropy losses (see ``_SoftmaxFunction``)."""

    @staticmethod
    def forward(ctx, x, target, ignore_index, smoothing):
        loss, stats = _cross_entropy_impl(x, target, ignore_index, smoothing)
        ctx.save_for_backward(x, target, stats)
        ctx.ignore_index, ctx.smoothing = ignore_index, smoothing
        return loss

    @staticmethod
    def backward(ctx, grad):
        x, target, stats = ctx.saved_tensors
        return _cross_entropy_backward_impl(grad, x, target, stats, ctx.ignore_index, ctx.smoothing), None, None, None


#: An eager "mean" or "sum" cross-entropy whose logits need a gradient has the forward write dx
#: (``cross_entropy_forward``'s ``dloss``) for the dloss a plain ``loss.backward()`` gives (1, or
#: 1 / the rows counted): one write in the forward instead of a read of the logits and a write in
#: the backward, whose launch then returns at once (``_ReducedCrossEntropyFunction``). Another
#: dloss (a loss scaled before its backward) makes the backward the plain one, writing over that
#: dx: one write more than without. The bits are the same either way; the choice is by the bytes
#: moved, not yet timed on a GPU (``benchmarks/probe_cross_entropy.py``). Not while saved-tensor
#: hooks are active (non-reentrant activation checkpointing, ``save_on_cpu``): the dx written
#: ahead is held on the Function, out of the hooks' reach, so it would outlive a checkpointed
#: region that otherwise keeps nothing.
FUSED_GRADIENT = True
#: The innermost default saved-tensor hooks (None when there are none); a torch without this
#: query is taken to have some.
_saved_tensors_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


class _ReducedCrossEntropyFunction(torch.autograd.Function):
    """Eager autograd for a "mean" or "sum" cross-entropy through the forward that writes dx
    (``FUSED_GRADIENT``): returns the reduced loss, as ``treefold.cross_entropy`` computes it from
    the row losses (their ``treefold.sum``, divided by the rows counted for "mean")."""

    @staticmethod
    def forward(ctx, x, target, ignore_index, smoothing, mean):
        counted = (target.long() != ignore_index).sum()
        ones = torch.ones((), dtype=torch.float32, device=x.device)
        # the dloss of every row under a plain backward: autograd's grad / counted for "mean"
        expected = ones / counted if mean else ones
        loss, stats, dx = cross_entropy_forward(x, target, ignore_index, smoothing, dloss=expected)
        total = _reduce.sum_rows(loss.reshape(1, -1), "sum", torch.float32).reshape(())
        ctx.save_for_backward(x, target, stats)
        ctx.written = (dx, expected)
        ctx.counted, ctx.mean, ctx.ignore_index, ctx.smoothing = counted, mean, ignore_index, smoothing
        # (not the view itself: autograd refuses in-place changes, `loss /= steps`, to a view made
        # inside a Function)
        return total / counted if mean else total.clone()

    @staticmethod
    def backward(ctx, grad):
        x, target, stats = ctx.saved_tensors
        dloss = grad / ctx.counted if ctx.mean else grad  # (what autograd gives each row unfused)
        if backend.recording_backward():  # torch's operations, differentiable again
            dx = reference.cross_entropy_backward(dloss.expand(x.shape[0]), x, target, ctx.ignore_index,
                                                  ctx.smoothing)
            return dx, None, None, None, None
        # the forward's dx is handed out once: a second backward through the same graph gets its own
        written, ctx.written = ctx.written, None
        dx = cross_entropy_backward(dloss, x, target, stats, ctx.ignore_index, ctx.smoothing, written=written)
        return dx, None, None, None, None


# ---- entry points for the public functions --------------------------------------------------

def _path(x: torch.Tensor) -> int:
    """0: eager, no graph needed (plain launchers); 1: eager with a gradient (autograd.Function);
    2: anything else (tracing, compiling, tensor subclasses): the registered ops."""
    if type(x) is not torch.Tensor or torch.compiler.is_compiling():
        return 2
    return 1 if x.requires_grad and torch.is_grad_enabled() else 0


def _prepared_call(op: int, x: torch.Tensor) -> torch.Tensor:
    """op over the last dim of CUDA ``x`` (eager, no temperature, default dtype): through the
    prepared launches of this kind of call when there are; else launched as usual, preparing
    them when ``x`` is contiguous."""
    key = (op, x.shape, x.stride(), x.dtype, x.get_device())
    prepared = _PREPARED.get(key)
    if prepared is not None:
        out = _new_output(x.shape if op != _LOGSUMEXP else x.shape[:-1], x.dtype, x)
        if prepared(x, out):
            return out
    key = key if prepared is None and x.is_contiguous() else None
    if op == _LOGSUMEXP:
        return logsumexp_forward(x, prepare_key=key)
    return softmax_forward(x, log=op == _LOG_SOFTMAX, prepare_key=key)


def _prepared_backward(grad: torch.Tensor, y: torch.Tensor, log: bool, temperature: float,
                       x_dtype: torch.dtype) -> torch.Tensor:
    """dx of softmax / log_softmax on CUDA, as ``softmax_backward`` gives it: through the prepared
    launches of this kind of call when there are; else launched as usual, preparing them when
    ``y`` and ``grad`` are distinct contiguous tensors."""
    key = ("backward", _LOG_SOFTMAX if log else _SOFTMAX, y.shape, y.stride(), grad.stride(), y.dtype,
           grad.dtype, x_dtype, y.get_device(), temperature)
    prepared = _PREPARED.get(key)
    if prepared is not None and grad is not y:
        dx = _new_output(y.shape, x_dtype, y)
        if prepared(y, grad, dx):
            return dx
    key = key if prepared is None and grad is not y and y.is_contiguous() and grad.is_contiguous() else None
    return softmax_backward(grad, y, log=log, temperature=temperature, x_dtype=x_dtype, prepare_key=key)


def softmax(x: torch.Tensor, log: bool, temperature: float, dtype: Optional[torch.dtype]) -> torch.Tensor:
    """softmax / log_softmax over the last dim of ``x`` (validated by the caller)."""
    path = _path(x)
    if path == 0:
        if x.is_cuda and temperature == 1.0 and dtype is None:
            return _prepared_call(_LOG_SOFTMAX if log else _SOFTMAX, x)
        if backend.use_kernel(x):
            return softmax_forward(x, log=log, temperature=temperature, out_dtype=dtype)
        return reference.softmax(x, log=log, temperature=temperature, out_dtype=dtype)
    if path == 1:
        return _SoftmaxFunction.apply(x, log, temperature, dtype)
    return _softmax_op(x, log, temperature, dtype, "auto")


def logsumexp(x: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dim of ``x`` (validated by the caller)."""
    path = _path(x)
    if path == 0:
        if x.is_cuda:
            return _prepared_call(_LOGSUMEXP, x)
        return logsumexp_forward(x) if backend.use_kernel(x) else reference.logsumexp(x)
    if path == 1:
        return _LogsumexpFunction.apply(x)
    return _logsumexp_op(x, "auto")


def cross_entropy(x: torch.Tensor, target: torch.Tensor, ignore_index: int, smoothing: float) -> torch.Tensor:
    """The float32 cross-entropy loss of each row of ``x`` [rows, n >= 1] (validated by the caller;
    ``smoothing`` already float32)."""
    path = _path(x)
    if path == 0:
        return _cross_entropy_impl(x, target, ignore_index, smoothing)[0]
    if path == 1:
        return _CrossEntropyFunction.apply(x, target, ignore_index, smoothing)
    return _cross_entropy_op(x, target, ignore_index, smoothing, "auto")[0]


def fuses_gradient(x: torch.Tensor) -> bool:
    """Whether a "mean" or "sum" cross-entropy of ``x`` goes through ``cross_entropy_reduced``:
    an eager call whose logits need a gradient, where the kernels run and no saved-tensor hooks
    are active (``FUSED_GRADIENT``)."""
    return (FUSED_GRADIENT and _path(x) == 1 and backend.use_kernel(x) and _saved_tensors_hooks is not None
            and _saved_tensors_hooks(False) is None)


def cross_entropy_reduced(x: torch.Tensor, target: torch.Tensor, ignore_index: int, smoothing: float,
                          mean: bool) -> torch.Tensor:
    """The "mean" or "sum" cross-entropy of ``x`` [rows, n >= 1] whose forward writes the gradient
    (``_ReducedCrossEntropyFunction``; validated by the caller, where ``fuses_gradient``)."""
    return _ReducedCrossEntropyFunction.apply(x, target, ignore_index, smoothing, mean)
