"""How a call is timed, how often its output changes, and what one eager call costs the host.

Two timers share one interface (``timer(fn) -> microseconds``):

- ``CudaTimer``: ``triton.testing.do_bench`` with ``return_mode="median"``. do_bench clears a
  256 MB buffer before every timed call, so no input is served from L2, and it times with CUDA
  events around the call alone.
- ``CpuTimer``: the median of wall-clock runs; used only by ``--cpu`` smoke runs, whose numbers
  describe the harness and the CPU path, not any GPU.

``kernel_us`` is the time during which the call's kernels run, by the profiler: do_bench's window
between two events holds 1-3 us besides the kernels, and not the same for every way of launching
the same kernel (benchmarks/NOTES.md), so where providers are within a few percent the kernels'
own times decide.

``cuda_graph_us`` times a call with the host out of the way: at decode sizes an eager call is
bound by its Python and launch cost, and do_bench then measures the host, not the kernels.
``interleaved_us`` times several calls in rounds, the way launch choices are compared.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Hashable

import torch


class CudaTimer:
    """Median time of ``fn`` on the current CUDA device, L2 flushed before each call."""

    device_kind = "cuda"

    def __init__(self, warmup_ms: float = 25.0, rep_ms: float = 100.0):
        self.warmup_ms = float(warmup_ms)
        self.rep_ms = float(rep_ms)

    def __call__(self, fn: Callable[[], Any]) -> float:
        import triton.testing

        ms = triton.testing.do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median")
        return float(ms) * 1e3

    def describe(self) -> str:
        return (f"triton.testing.do_bench, median, L2 flushed before each call, "
                f"warmup {self.warmup_ms:g} ms, rep {self.rep_ms:g} ms")


class CpuTimer:
    """Median wall time of ``fn`` on the CPU: at least ``min_runs`` runs and about ``budget_s``."""

    device_kind = "cpu"

    def __init__(self, min_runs: int = 3, max_runs: int = 50, budget_s: float = 0.2):
        self.min_runs = int(min_runs)
        self.max_runs = int(max_runs)
        self.budget_s = float(budget_s)

    def __call__(self, fn: Callable[[], Any]) -> float:
        fn()  # one warm-up call: first calls pay for imports and caches
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < self.min_runs or (
                len(times) < self.max_runs and time.perf_counter() - start < self.budget_s):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    def describe(self) -> str:
        return f"wall clock on the CPU, median of {self.min_runs} to {self.max_runs} runs"


_CLEAN_FLUSH_BUFFERS: dict[str, torch.Tensor] = {}


def clean_flush() -> None:
    """Empty the L2 of a call's inputs and leave it clean, on the current CUDA device: zero 256 MB
    as do_bench's flush does, then read another 256 MB, which writes the zeroes' dirty lines back
    before the call instead of during its first reads. A ``flush`` for ``kernel_us``."""
    if not _CLEAN_FLUSH_BUFFERS:
        _CLEAN_FLUSH_BUFFERS["zeros"] = torch.empty(1 << 26, dtype=torch.int32, device="cuda")
        _CLEAN_FLUSH_BUFFERS["other"] = torch.ones(1 << 26, dtype=torch.int32, device="cuda")
    _CLEAN_FLUSH_BUFFERS["zeros"].zero_()
    _CLEAN_FLUSH_BUFFERS["other"].sum()


#: The names of the kernels of each L2 flush ``kernel_us`` has used, profiled once per process.
_FLUSH_KERNELS: dict[Any, set[str]] = {}


def busy_us(intervals) -> float:
    """The length of the union of ``(start, end)`` intervals: time covered by at least one of
    them, an overlap counted once and a gap not at all."""
    total, covered_to = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > covered_to:
            total += end - max(start, covered_to)
            covered_to = end
    return total


def kernel_us(fn: Callable[[], Any], calls: int = 20, flush: Callable[[], Any] | None = None) -> float | None:
    """GPU time per call of ``fn``'s kernels alone: the time during which at least one of the
    kernels and memory operations ``fn`` puts on the device runs, by the profiler's (CUPTI)
    start and end of each, over ``calls`` calls, each after the L2 flush do_bench makes. Gaps
    between a call's kernels are not counted (in an eager call of several launches they are
    mostly the host's); launches that overlap (programmatic dependent launches: sampling, the
    split softmax) count the overlap once, a dependent kernel's wait for its producer included.
    For a call of one kernel this is that kernel's duration. ``flush``: another way to empty the
    L2 before each call (do_bench's zeroes 256 MB and leaves the L2 full of dirty lines, which
    the call's first reads write back; ``clean_flush`` does not). A flush's own kernels are known by their names, taken from
    a profile of the flush alone, once per flush (a call that launches a kernel of the same name,
    an int8 fill for do_bench's, would lose it too). None when the profiler records nothing."""
    import triton  # noqa: PLC0415
    from torch.autograd import DeviceType  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    if flush is None:
        driver = triton.runtime.driver.active
        cache = driver.get_empty_cache_for_benchmark()
        flush_key = "do_bench"

        def flush():
            driver.clear_cache(cache)
    else:
        flush_key = flush

    def device_events(run) -> list:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        return [e for e in prof.events() if e.device_type == DeviceType.CUDA and e.device_time > 0]

    if flush_key not in _FLUSH_KERNELS:
        _FLUSH_KERNELS[flush_key] = {e.name for e in device_events(flush)}
    flush_names = _FLUSH_KERNELS[flush_key]

    def calls_after_flush():
        for _ in range(calls):
            flush()
            fn()

    fn()
    torch.cuda.synchronize()
    events = [e for e in device_events(calls_after_flush) if e.name not in flush_names]
    if not events:
        return None
    return busy_us((e.time_range.start, e.time_range.end) for e in events) / calls


def cuda_graph_us(fn: Callable[[], Any], calls: int = 20, replays: int = 21) -> float:
    """Device time per call with no host cost: ``calls`` calls captured in one CUDA graph (after
    one eager warm-up call), the graph replayed ``replays`` times; the median replay, divided by
    ``calls``. No L2 flush between the calls: decode-sized inputs stay in L2 either way."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def interleaved_us(calls: dict[Hashable, Callable[[], Any]], timer: Callable[[Callable[[], Any]], float],
                   rounds: int = 3) -> dict[Hashable, list[float]]:
    """Each call timed ``rounds`` times, round-robin: every call once per round, in order, before
    the next round. Launch choices are chosen on these: one timing of each, one after the other,
    confounds a choice with whatever drifted between them (clocks, another process, the memory
    the previous call left behind), while a choice that wins every round wins. Returns the times
    in microseconds per key of ``calls``, in round order."""
    if rounds < 1:
        raise ValueError(f"interleaved_us: rounds must be >= 1, got {rounds}")
    times: dict[Hashable, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(float(timer(fn)))
    return times


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_overhead_us(fn: Callable[[], Any], device: torch.device, calls: int = 2000,
                     warmup_calls: int = 50) -> float:
    """Host time per eager call: ``calls`` calls with no synchronisation inside the loop, wall time
    divided by ``calls``. At decode sizes this, not the kernel, is what a user pays unless the
    step runs in a CUDA graph. (The queue is drained before the loop and after it, outside the
    measured interval.)"""
    for _ in range(warmup_calls):
        fn()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    synchronize(device)
    return elapsed / calls * 1e6


def _flat_bytes(out: Any) -> list[torch.Tensor]:
    """The output(s) of a call as flat uint8 views, in a fixed order, to compare as bytes."""
    if isinstance(out, torch.Tensor):
        t = out.detach()
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        return [t.contiguous().reshape(-1).view(torch.uint8)]
    if isinstance(out, (tuple, list)):
        parts: list[torch.Tensor] = []
        for o in out:
            parts.extend(_flat_bytes(o))
        return parts
    if out is None:
        return []
    raise TypeError(f"count_distinct: outputs must be tensors or tuples of tensors, got {type(out).__name__}")


def _same_bytes(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.numel() == y.numel() and torch.equal(x, y) for x, y in zip(a, b))


def count_distinct(fn: Callable[[], Any], runs: int = 20) -> int:
    """How many different outputs ``runs`` calls of ``fn`` give, comparing every byte.

    The comparison stays on the output's device (no copies to the host), and only the distinct
    outputs are kept, so a deterministic op holds one copy whatever ``runs`` is.
    """
    if runs < 1:
        raise ValueError(f"count_distinct: runs must be >= 1, got {runs}")
    seen: list[list[torch.Tensor]] = []
    for _ in range(runs):
        current = [t.clone() for t in _flat_bytes(fn())]
        if not any(_same_bytes(current, s) for s in seen):
            seen.append(current)
    return len(seen)
