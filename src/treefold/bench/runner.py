"""``treefold bench``: every selected case, shape and provider, measured in one run.

Per (case, shape, provider): median time (the median of ``rounds`` timings, every provider of a
shape timed once per round, round-robin), GB/s of the case's declared bytes, % of the copy roof
measured in the same run, accuracy against the float64 reference, and the number of distinct
outputs over ``runs`` calls. A provider that cannot be imported is skipped with a line; one that
refuses a shape or fails gets a row saying so; the run always goes on.
"""
from __future__ import annotations

import datetime as _dt
import shlex
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .accuracy import wrong_output
from .cases import HOST_OVERHEAD, CASES_BY_NAME, Case, Shape, to_float64, select_cases
from .env import machine_info, short_error
from .progress import Progress
from .providers import PEER_NAMES, Impl, Provider, TreefoldProvider, Unsupported, make_providers
from .roofs import measure_copy_roof
from .timing import CpuTimer, CudaTimer, count_distinct, cuda_graph_us, host_overhead_us, kernel_us

#: Providers whose failures mean "does not support this shape" rather than a bug worth flagging.
PEERS_WITH_LIMITS = ("liger", "quack")
#: On a GPU, calls that move at most this many bytes (decode-sized: they fit in L2, as they do in
#: a decode step) are also timed inside a CUDA graph (``timing.cuda_graph_us``): their eager time
#: is mostly the host's. Larger calls are not: without the L2 flush a graph would flatter them.
GRAPH_MAX_BYTES = 48 << 20


@dataclass
class BenchConfig:
    ops: list[str] = field(default_factory=list)
    shapes: str = "llm"
    dtype: str | None = None
    peers: list[str] = field(default_factory=lambda: list(PEER_NAMES))
    backward: bool = False
    cpu: bool = False
    out: str = "out/bench"
    name: str = "bench"
    runs: int = 20
    rounds: int = 3
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    roof_bytes: int | None = None
    host: bool = True
    host_calls: int = 2000
    seed: int = 0
    budget_s: float | None = None

    def command(self) -> str:
        """The one line that reproduces this run."""
        argv = ["treefold", "bench", *self.ops, "--shapes", self.shapes]
        if self.dtype:
            argv += ["--dtype", self.dtype]
        argv += ["--peers", ",".join(self.peers) if self.peers else "none"]
        if self.backward:
            argv.append("--backward")
        if self.cpu:
            argv.append("--cpu")
        if self.runs != 20:
            argv += ["--runs", str(self.runs)]
        if self.rounds != 3:
            argv += ["--rounds", str(self.rounds)]
        if self.warmup_ms != 25.0 or self.rep_ms != 100.0:
            argv += ["--warmup", f"{self.warmup_ms:g}", "--rep", f"{self.rep_ms:g}"]
        if not self.host:
            argv.append("--no-host")
        elif self.host_calls != 2000:
            argv += ["--host-calls", str(self.host_calls)]
        if self.seed:
            argv += ["--seed", str(self.seed)]
        if self.budget_s is not None:
            argv += ["--budget", f"{self.budget_s:g}"]
        argv += ["--name", self.name, "--out", self.out]
        return shlex.join(argv)


# ----------------------------------------------------------------------------------------------
# inputs, references, and the call that is timed
# ----------------------------------------------------------------------------------------------

def make_inputs(case: Case, shape: Shape, device: torch.device, seed: int) -> dict:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return case.make_inputs(shape, device, gen)


def clone_inputs(case: Case, inputs: dict) -> dict:
    """A private copy for one provider (some write into their inputs); the tensors the backward
    pass differentiates become leaves that require grad."""
    wrt = set(case.backward.wrt) if case.backward else set()
    out = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.detach().clone().requires_grad_(k in wrt)
        elif isinstance(v, torch.Generator):
            out[k] = torch.Generator(device=v.device)
        else:
            out[k] = v
    return out


def differentiable(out: Any) -> list[torch.Tensor]:
    """The outputs a backward pass starts from: float tensors that require grad, in order."""
    if isinstance(out, torch.Tensor):
        return [out] if out.requires_grad else []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in differentiable(o)]
    return []


@dataclass
class Reference:
    value: Any                  # the float64 forward output, or the float64 gradients
    grad_outputs: list          # float32 dy per differentiable output (backward cases)


def compute_reference(case: Case, inputs: dict, seed: int) -> Reference:
    inputs64 = to_float64(clone_inputs(case, inputs))
    if case.backward is None:
        with torch.no_grad():
            return Reference(case.reference(inputs64), [])
    outs = differentiable(case.reference(inputs64))
    gen = torch.Generator(device=outs[0].device)
    gen.manual_seed(seed + 1)
    if case.backward.unit_grad:
        dys = [torch.ones(o.shape, device=o.device, dtype=torch.float32) for o in outs]
    else:
        dys = [torch.randn(o.shape, generator=gen, device=o.device, dtype=torch.float32) for o in outs]
    wrt = [inputs64[n] for n in case.backward.wrt]
    grads = torch.autograd.grad(outs, wrt, [d.to(torch.float64) for d in dys])
    return Reference(tuple(g.detach() for g in grads), dys)


def make_runner(case: Case, impl: Impl, grad_outputs: list) -> tuple[Callable[[], Any], Any]:
    """(the call to time, the output of a first call). Forward cases time the op; backward cases
    time ``torch.autograd.grad`` from saved outputs (weight gradients included), or forward and
    gradient together for ops that compute both in one pass."""
    if case.backward is None:
        return impl.fn, impl.fn()
    wrt = [impl.inputs[n] for n in case.backward.wrt]

    def start():
        outs = differentiable(impl.fn())
        if len(outs) != len(grad_outputs):
            raise RuntimeError(f"{len(outs)} output(s) requiring grad, expected {len(grad_outputs)} "
                               f"(is the op differentiable?)")
        return outs

    outs = start()
    dys = [d.to(o.dtype) for d, o in zip(grad_outputs, outs)]
    if case.backward.fused:
        first = torch.autograd.grad(outs, wrt, dys)
        return (lambda: torch.autograd.grad(start(), wrt, dys)), first
    run = lambda: torch.autograd.grad(outs, wrt, dys, retain_graph=True)  # noqa: E731
    return run, run()


# ----------------------------------------------------------------------------------------------
# one measurement
# ----------------------------------------------------------------------------------------------

def _row(case: Case, shape: Shape, provider: Provider, status: str, **extra) -> dict:
    row = {"case": case.name, "kind": case.kind, "title": case.title, "backward": case.backward is not None,
           "label": case.label(shape), "shape": shape.as_dict(), "bytes": case.count_bytes(shape),
           "provider": provider.name, "status": status, "message": "", "note": "", "us": None, "gbs": None,
           "pct_roof": None, "accuracy": None, "distinct": None, "runs": None, "graph_us": None,
           "kernel_us": None}
    row.update(extra)
    return row


def _add_note(row: dict, text: str) -> None:
    """Append ``text`` to the row's note (once)."""
    if text not in row.get("note", ""):
        row["note"] = "; ".join(x for x in (row.get("note", ""), text) if x)


def _failed(provider: str) -> str:
    """The status of a row whose call raised: a peer with known limits refused the shape."""
    return "unsupported" if provider in PEERS_WITH_LIMITS else "error"


@dataclass
class _Timed:
    """A provider's call at one shape, built and called once, waiting for its timing rounds."""
    row: dict
    provider: Provider
    impl: Impl
    run: Callable[[], Any]
    first: Any
    times: list[float] = field(default_factory=list)
    kernel_times: list[float] = field(default_factory=list)


def prepare(case: Case, shape: Shape, provider: Provider, base_inputs: dict,
            reference: Reference | None) -> dict | _Timed | None:
    """The provider's call built on its own copy of the inputs and called once; a finished row
    when it cannot be (unsupported, failed), None when the provider has no implementation."""
    inputs = clone_inputs(case, base_inputs)
    failed = _failed(provider.name)
    try:
        impl = provider.build(case, inputs, shape)
    except Unsupported as e:
        return _row(case, shape, provider, "unsupported", message=str(e))
    except Exception as e:
        return _row(case, shape, provider, failed, message=short_error(e))
    if impl is None:
        return None
    try:
        run, first = make_runner(case, impl, reference.grad_outputs if reference else [])
    except Exception as e:
        return _row(case, shape, provider, failed, message=short_error(e), note=impl.note)
    timed = _Timed(_row(case, shape, provider, "ok", note=impl.note), provider, impl, run, first)
    # An in-place op's first output is its mutated input, which the timed calls change again:
    # checked before they run. The others are checked after their timing (see finish).
    if impl.mutates_input:
        _check_accuracy(case, timed, reference)
    return timed


def _check_accuracy(case: Case, timed: _Timed, reference: Reference | None) -> None:
    if reference is not None and timed.impl.comparable:
        try:
            timed.row["accuracy"] = case.accuracy(timed.first, reference.value, timed.impl.inputs)
        except Exception as e:
            timed.row["accuracy"] = {"error": short_error(e)}


def time_rounds(calls: list[_Timed], timer: Callable, rounds: int,
                kernel_timer: Callable[[Callable], float | None] | None = None) -> None:
    """Every call timed once per round, round-robin, ``rounds`` rounds: a provider timed alone,
    one after the other, carries whatever drifted between the timings (clocks, the memory the
    previous call left behind) into the comparison, and at the norms' large shapes that drift
    (1-2%) is as large as the margins between the fastest providers. With ``kernel_timer``
    (``timing.kernel_us`` on a GPU), each round also takes the call's kernel time. A call that
    fails stops being timed and its row says why."""
    for _ in range(rounds):
        for timed in calls:
            if timed.row["status"] != "ok":
                continue
            try:
                timed.times.append(float(timer(timed.run)))
            except Exception as e:
                timed.row.update(status=_failed(timed.row["provider"]), message=short_error(e))
                continue
            if kernel_timer is not None:
                try:
                    kernel = kernel_timer(timed.run)
                except Exception as e:  # the profiler, not the call: the row keeps its times
                    kernel = None
                    _add_note(timed.row, f"no kernel time: {short_error(e)}")
                if kernel is not None:
                    timed.kernel_times.append(float(kernel))


def finish(case: Case, timed: _Timed, reference: Reference | None, config: BenchConfig, timer: Callable,
           roof_gbs: float) -> dict:
    """The row of a call whose rounds have run: its median round, the distinct outputs over
    ``config.runs`` calls, its accuracy, and the CUDA graph time of decode-sized calls.

    The checks copy to the host and synchronise, so they come after every timing round: a short
    kernel timed right after them ran up to 2x slow on the H200 while the clocks came back up
    (benchmarks/NOTES.md)."""
    row, impl = timed.row, timed.impl
    if row["status"] == "ok" and not impl.mutates_input:
        try:
            row["distinct"] = count_distinct(timed.run, config.runs)
            row["runs"] = config.runs
        except Exception as e:
            row.update(status=_failed(row["provider"]), message=short_error(e))
    if not impl.mutates_input:
        _check_accuracy(case, timed, reference)
    wrong = wrong_output(row["accuracy"])
    if wrong:
        wrong = f"wrong output ({wrong})" + (": not counted as a peer" if timed.provider.is_peer else "")
        _add_note(row, wrong)
    timed.first = None
    if row["status"] != "ok" or not timed.times:
        return row
    us = statistics.median(timed.times)
    row["us"] = us
    row["rounds_us"] = list(timed.times)
    if timed.kernel_times:
        row["kernel_us"] = statistics.median(timed.kernel_times)
        row["kernel_rounds_us"] = list(timed.kernel_times)
    row["gbs"] = row["bytes"] / us / 1e3 if us > 0 else None
    row["pct_roof"] = 100.0 * row["gbs"] / roof_gbs if row["gbs"] and roof_gbs else None
    if isinstance(timer, CudaTimer) and row["bytes"] <= GRAPH_MAX_BYTES:
        try:
            row["graph_us"] = cuda_graph_us(timed.run)
        except Exception as e:  # a provider that cannot be captured: say so, keep the eager row
            torch.cuda.synchronize()
            _add_note(row, f"not capturable in a CUDA graph: {short_error(e)}")
    return row


def summarize(rows: list[dict]) -> list[dict]:
    """Per (case, shape): treefold's row against the fastest peer that ran and gave a right output."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["case"], r["label"], r["shape"]["dtype"]), []).append(r)
    out = []
    for (case, label, dtype), group in groups.items():
        ok = [r for r in group if r["status"] == "ok" and r["us"]]
        tf = next((r for r in ok if r["provider"] == "treefold"), None)
        peers = [r for r in ok if r["provider"] != "treefold" and not wrong_output(r["accuracy"])]
        best = min(peers, key=lambda r: r["us"]) if peers else None
        timed_kernels = [r for r in peers if r.get("kernel_us")]
        best_kernel = min(timed_kernels, key=lambda r: r["kernel_us"]) if timed_kernels else None
        tf_kernel = tf.get("kernel_us") if tf else None
        graphed = [r for r in peers if r.get("graph_us")]
        best_graph = min(graphed, key=lambda r: r["graph_us"]) if graphed else None
        treefold_row = next((r for r in group if r["provider"] == "treefold"), None)
        out.append({
            "case": case, "label": label, "dtype": dtype,
            "treefold_status": treefold_row["status"] if treefold_row else "missing",
            "treefold_us": tf["us"] if tf else None, "treefold_gbs": tf["gbs"] if tf else None,
            "treefold_pct_roof": tf["pct_roof"] if tf else None,
            "accuracy": tf["accuracy"] if tf else None, "distinct": tf["distinct"] if tf else None,
            "runs": tf["runs"] if tf else None,
            "best_peer": best["provider"] if best else None, "best_peer_us": best["us"] if best else None,
            "best_peer_pct_roof": best["pct_roof"] if best else None,
            "speedup_vs_best_peer": best["us"] / tf["us"] if (tf and best) else None,
            "treefold_kernel_us": tf_kernel,
            "best_kernel_peer": best_kernel["provider"] if best_kernel else None,
            "best_kernel_peer_us": best_kernel["kernel_us"] if best_kernel else None,
            "kernel_speedup_vs_best_peer": best_kernel["kernel_us"] / tf_kernel if (tf_kernel and best_kernel)
            else None,
            "treefold_graph_us": tf.get("graph_us") if tf else None,
            "best_peer_graph": best_graph["provider"] if best_graph else None,
            "best_peer_graph_us": best_graph["graph_us"] if best_graph else None,
        })
    return out


# ----------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------

def load_providers(providers: list[Provider], log: Callable[[str], None]) -> list[Provider]:
    """The providers that import here; a line for each one that does not."""
    ready = []
    for p in providers:
        try:
            p.load()
        except Exception as e:
            if not p.is_peer:
                raise
            log(f"{p.name}: not available ({short_error(e)}); skipped")
            continue
        ready.append(p)
    return ready


def _treefold(providers: list[Provider]) -> TreefoldProvider:
    for p in providers:
        if isinstance(p, TreefoldProvider):
            return p
    raise ValueError("run_bench: the providers must include treefold")


def runnable_cases(config: BenchConfig, treefold: TreefoldProvider, log: Callable[[str], None],
                   cases: list[Case] | None = None) -> list[Case]:
    chosen = []
    for case in select_cases(config.ops, config.backward, cases):
        if treefold.has(case):
            chosen.append(case)
        else:
            log(f"treefold has no {case.treefold_op}() yet: {case.name} skipped")
    return chosen


def run_bench(config: BenchConfig, *, providers: list[Provider] | None = None, cases: list[Case] | None = None,
              treefold_namespace: Any = None, log: Callable[[str], None] = print, use_rich: bool = True,
              checkpoint: Callable[[dict], None] | None = None) -> dict:
    """Run the bench; return everything it measured as one JSON-ready dict.

    ``checkpoint``, when given, receives the result so far after every shape, so a run cut short
    (a time limit, a crash) still leaves what it measured. With ``config.budget_s`` no new shape
    starts once that many seconds have passed; the shapes left out are listed under "skipped".
    """
    device = torch.device("cpu") if config.cpu else torch.device("cuda", torch.cuda.current_device())
    timer = CpuTimer() if config.cpu else CudaTimer(config.warmup_ms, config.rep_ms)
    started = _dt.datetime.now(_dt.timezone.utc)
    clock0 = time.monotonic()
    skipped: list[str] = []

    def note(line: str) -> None:
        skipped.append(line)
        log(line)

    def out_of_time() -> bool:
        return config.budget_s is not None and time.monotonic() - clock0 > config.budget_s

    all_providers = providers if providers is not None else make_providers(config.peers, treefold_namespace)
    treefold = _treefold(all_providers)
    ready = load_providers(all_providers, note)
    selected = runnable_cases(config, treefold, note, cases)
    if config.cpu:
        from treefold import backend  # noqa: PLC0415
        log(f"--cpu: treefold runs its {backend.describe(torch.empty(1))} path; times describe this CPU only")

    roof = measure_copy_roof(device, timer, config.roof_bytes)
    log(f"roof: {roof.gbs:.0f} GB/s ({roof.how}, {timer.describe()})")
    result = {
        "schema": 1,
        "name": config.name,
        "created": started.isoformat(timespec="seconds"),
        "command": config.command(),
        "config": {"ops": config.ops, "shapes": config.shapes, "dtype": config.dtype, "peers": config.peers,
                   "backward": config.backward, "cpu": config.cpu, "runs": config.runs, "rounds": config.rounds,
                   "seed": config.seed},
        "timing": f"{timer.describe()}; the median of {config.rounds} round(s), the providers of a shape "
                  f"timed round-robin",
        "machine": machine_info(device),
        "roof": roof.as_dict(),
        "providers": [{"name": p.name, "title": p.title, "version": p.version()} for p in ready],
        "cases": {c.name: {"title": c.title, "notes": c.notes} for c in selected},
        "skipped": skipped,
        "results": [],
        "summary": [],
        "host_overhead": [],
    }
    rows: list[dict] = result["results"]

    plan = [(c, s) for c in selected for s in c.shapes_for(config.shapes, config.dtype)]
    progress = Progress(len(plan) * len(ready), use_rich=use_rich, log=log)
    try:
        for index, (case, shape) in enumerate(plan):
            label = f"{case.name} {case.label(shape)} {shape.dtype}"
            if out_of_time():
                left = ", ".join(f"{c.name} {c.label(s)} {s.dtype}" for c, s in plan[index:])
                progress.log(f"time budget of {config.budget_s:g} s spent: not measured: {left}")
                skipped.append(f"time budget of {config.budget_s:g} s spent; not measured: {left}")
                break
            try:
                base = make_inputs(case, shape, device, config.seed)
                reference = compute_reference(case, base, config.seed)
            except Exception as e:
                progress.log(f"{label}: could not build inputs or the float64 reference ({short_error(e)}); "
                             f"shape skipped")
                skipped.append(f"{label}: no inputs/reference ({short_error(e)})")
                for _ in ready:
                    progress.done()
                continue
            built: list[dict | _Timed] = []
            for p in ready:
                progress.begin(f"{label} {p.name}")
                got = prepare(case, shape, p, base, reference)
                progress.done()
                if got is not None:
                    built.append(got)
            timed = [b for b in built if isinstance(b, _Timed)]
            time_rounds(timed, timer, config.rounds, kernel_us if isinstance(timer, CudaTimer) else None)
            for b in built:
                row = finish(case, b, reference, config, timer, roof.gbs) if isinstance(b, _Timed) else b
                if row["status"] != "ok":
                    progress.log(f"{label} {row['provider']}: {row['status']}: {row['message']}")
                rows.append(row)
            del base, reference, built, timed
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if checkpoint is not None:
                result["summary"] = summarize(rows)
                checkpoint(result)
    finally:
        progress.close()

    if config.host and out_of_time():
        note("time budget spent: host-overhead section not measured")
    elif config.host:
        result["host_overhead"] = run_host_overhead(config, ready, selected, device, log)
    result["summary"] = summarize(rows)
    return result


def run_host_overhead(config: BenchConfig, providers: list[Provider], selected: list[Case],
                      device: torch.device, log: Callable[[str], None]) -> list[dict]:
    """Host time per eager call at tiny shapes, for the selected cases among HOST_OVERHEAD."""
    names = {c.name for c in selected}
    out = []
    for case_name, shape in HOST_OVERHEAD:
        if case_name not in names:
            continue
        case = CASES_BY_NAME[case_name]
        base = make_inputs(case, shape, device, config.seed)
        for p in providers:
            inputs = clone_inputs(case, base)
            entry = {"case": case.name, "label": case.label(shape), "dtype": shape.dtype, "provider": p.name,
                     "us_per_call": None, "calls": config.host_calls, "status": "ok", "message": ""}
            try:
                impl = p.build(case, inputs, shape)
                if impl is None:
                    continue
                entry["us_per_call"] = host_overhead_us(impl.fn, device, calls=config.host_calls)
            except Unsupported as e:
                entry.update(status="unsupported", message=str(e))
            except Exception as e:
                entry.update(status="error", message=short_error(e))
            out.append(entry)
    if out:
        log(f"host time per eager call measured over {config.host_calls} calls")
    return out
