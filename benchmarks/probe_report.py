"""What the probe_* scripts share: timing their calls in interleaved rounds against the same-run
copy roof (``time_against_roof``) or replayed from CUDA graphs after a check that every variant
gives the same tensors (``time_graphed_variants``), printing and writing the results as JSON, with
each call's kernel time beside (``graph_and_kernel_report``); the
command line of the sampling launch-choice probes (``sampling_variants``, ``variant_probe``); the
norm backward's inputs (``norm_backward_inputs``); and the launch-choice variants of the row ops
(``row_op_variants``), checked bit for bit and timed flushed or in CUDA graphs as the bench's
decode column (``check_and_time``), or one of them run for ncu (``repeat_one``)."""
import json
import os

import torch

from treefold._ops import norms
from treefold.bench.roofs import measure_copy_roof
from treefold.bench.timing import CudaTimer, cuda_graph_us, interleaved_us


def time_against_roof(calls: dict, nbytes: dict, out_path: str = "", **extra) -> list[dict]:
    """Rows of (name, us per round, % of the roof per round) for ``calls`` (name -> callable),
    each moving ``nbytes[name]`` bytes; written to ``out_path`` (with ``extra``) when given."""
    times = interleaved_us(calls, CudaTimer(warmup_ms=10, rep_ms=50))
    roof = measure_copy_roof(torch.device("cuda"), CudaTimer())
    rows = [dict(name=name, us=ts, pct=[roof.percent(nbytes[name], t) for t in ts]) for name, ts in times.items()]
    print(f"roof {roof.gbs:.0f} GB/s")
    width = max((len(r["name"]) for r in rows), default=0)
    for r in rows:
        print(f"{r['name']:{width}s}  " + "  ".join(f"{t:8.1f} us {p:5.1f}%" for t, p in zip(r["us"], r["pct"])))
    if out_path:
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(dict(roof_gbs=roof.gbs, rows=rows, **extra), f, indent=1)
    return rows


def with_values(module, values: dict, fn):
    """fn with ``module``'s attributes set to ``values`` (name -> value) while it runs, its graph
    capture included, and restored after."""
    def run():
        saved = {name: getattr(module, name) for name in values}
        for name, value in values.items():
            setattr(module, name, value)
        try:
            return fn()
        finally:
            for name, value in saved.items():
                setattr(module, name, value)
    return run


def time_graphed_variants(cases: dict, out_path: str = "", rounds: int = 3) -> dict:
    """For ``cases`` (key -> {variant name -> fn returning a sequence of tensors}): check each
    variant's tensors equal the first variant's of its key, then time every variant replayed
    from a CUDA graph (do_bench median, L2 flushed) in ``rounds`` interleaved rounds; print the
    rounds with their best and median, and write checks and times to ``out_path`` (JSON) when
    given. Returns {(key, name): [us per round]}."""
    from gpu_sampling import graphed

    checks, replays = {}, {}
    for key, calls in cases.items():
        want = None
        for name, fn in calls.items():
            got = [t.clone() for t in fn()]
            want = want or got
            checks[f"{key} {name}"] = all(torch.equal(a, b) for a, b in zip(got, want))
            replays[(key, name)] = graphed(fn)
    times = interleaved_us(replays, CudaTimer(warmup_ms=10, rep_ms=40), rounds)
    bad = [k for k, v in checks.items() if not v]
    print(f"device {torch.cuda.get_device_name()}; {len(checks)} variants, "
          f"tokens not equal to the first: {bad or 'none'}")
    print(f"graph replay, L2 flushed, us ({rounds} rounds)")
    width = max((len(name) for calls in cases.values() for name in calls), default=0)
    for key, calls in cases.items():
        print(" ".join(map(str, key)))
        for name in calls:
            ts = times[(key, name)]
            print(f"  {name:{width}s} " + "  ".join(f"{t:7.1f}" for t in ts)
                  + f"   best {min(ts):7.1f}   median {sorted(ts)[len(ts) // 2]:7.1f}")
    if out_path:
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        with open(out_path, "w") as f:
            json.dump({"checks": checks, "times_us": {f"{k[0]} | {k[1]}": v for k, v in times.items()}}, f, indent=1)
    return times


def graph_and_kernel_report(cases: dict, graph: dict, out_path: str, mismatches: dict, offsets: int = 8) -> list[dict]:
    """For ``cases`` timed by ``time_graphed_variants`` (``graph``: {(key, name): [us per round]}):
    each call's kernel time replayed from a CUDA graph (``kernel_us``), rows of (case, call, median
    graph us, kernel us) written to ``out_path`` (JSON, with the device and the token
    ``mismatches`` per case over ``offsets`` draws), then printed: the mismatches, and a table of
    cases by calls."""
    from gpu_sampling import graphed

    from treefold.bench.timing import kernel_us

    rows = []
    for key, calls in cases.items():
        for name, fn in calls.items():
            ts = graph[(key, name)]
            rows.append(dict(case=" ".join(map(str, key)), call=name, graph_us=sorted(ts)[len(ts) // 2],
                             kernel_us=kernel_us(graphed(fn)) or float("nan")))
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), mismatches=mismatches, rows=rows), f, indent=1)
    print(f"device {torch.cuda.get_device_name()}; token mismatches ({offsets} offsets each): "
          f"{sum(mismatches.values())} in all {mismatches}")
    names = list(dict.fromkeys(name for calls in cases.values() for name in calls))
    width = max(16, max(len(name) + 6 for name in names))
    print(f"{'case':36s} " + " ".join(f"{name + ' graph':>{width}s} {'kernel':>7s}" for name in names))
    for key in cases:
        case = " ".join(map(str, key))
        line = f"{case:36s}"
        for name in names:
            r = next((r for r in rows if r["case"] == case and r["call"] == name), None)
            line += f" {r['graph_us']:{width}.1f} {r['kernel_us']:7.1f}" if r else f" {'-':>{width}s} {'-':>7s}"
        print(line)
    return rows


def sampling_variants(ops, variants: dict, cases) -> dict:
    """{(case,): {variant: call}} for a sampling launch-choice probe: ``cases`` are (batch, dtype,
    flat, filter names) over the gpu_sampling inputs (151936 logits, peaked or flat), each call
    ``probe_sampling_split.call`` under ``with_values(ops, settings)`` for every variant
    (name -> settings of the ``ops`` module)."""
    from gpu_sampling import FLAT, logits
    from probe_sampling_split import call
    out = {}
    for batch, dtype, flat, configs in cases:
        x = logits(batch, dtype, **({"scale": FLAT} if flat else {}))
        seeds = torch.arange(batch, device="cuda", dtype=torch.int64) * 7919 + 1
        for config in configs:
            fn = call(ops, x, seeds, config, None)
            out[(f"{batch} {str(dtype)[6:]} {'flat' if flat else 'peaked'} {config}",)] = {
                name: with_values(ops, values, fn) for name, values in variants.items()}
    return out


def variant_probe(argv, variants: dict, table, json_name: str) -> None:
    """The command line of a launch-choice probe whose ``table()`` gives ``sampling_variants``:
    ``--warm VARIANT`` runs that variant's calls once (compiling its kernels into Triton's cache,
    so that a driver can warm the variants in parallel processes first); ``OUT_DIR`` checks and
    times every variant (``time_graphed_variants``, three rounds, JSON to OUT_DIR/json_name) and
    prints the best round of each."""
    if argv[1] == "--warm":
        for calls in table().values():
            calls[argv[2]]()
        torch.cuda.synchronize()
        return
    cases = table()
    times = time_graphed_variants(cases, os.path.join(argv[1], json_name), 3)
    print("best of 3 rounds, us: " + " | ".join(variants))
    for key, calls in cases.items():
        print(f"{key[0]:36s} " + "  ".join(f"{min(times[(key, name)]):7.1f}" for name in calls))


def norm_backward_inputs(m: int, n: int):
    """bfloat16 inputs of the norm backward at m x n and the forward statistics they need:
    (x, weight, bias, dy, RMSNorm rstd, LayerNorm mean, LayerNorm rstd)."""
    x = torch.randn(m, n, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16()
    b = (0.1 * torch.randn(n, device="cuda")).bfloat16()
    dy = torch.randn(m, n, device="cuda").bfloat16()
    _, _, rstd = norms.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", x.dtype)
    _, mean, rstd_ln = norms.layer_norm_impl(x, w, b, 1e-5)
    return x, w, b, dy, rstd, mean, rstd_ln


def row_op_variants(cases, only: str = "") -> dict:
    """{name: (call, bytes moved, case)} for ``cases``: (label, rows, length, {variant name: launch
    options}), bf16. Labels: "rms", "rms+residual", "ln" (options: keywords of the norm forward's
    launch; "rms fp32", "ln fp32": float32 rows), "rms backward", "ln backward" (of the norm
    backward's), "softmax", "log_softmax",
    "softmax backward" (options: (strategy, Tuning)). Names are "label MxN variant"; ``only``
    keeps the one so named. Bytes: read x (and the residual, or y / x and dy), write y (and h, or
    dx)."""
    from treefold._ops import softmax as sm

    out = {}
    for label, m, n, variants in cases:
        case = f"{label} {m}x{n}"
        # "rms fp32", "ln fp32": the forward of float32 rows
        dtype = torch.float32 if label.endswith(" fp32") else torch.bfloat16
        label = label.removesuffix(" fp32")
        if only and not only.startswith(case + " "):
            continue
        if label.endswith("backward") and label != "softmax backward":
            x, w, b, dy, rstd, mean, rstd_ln = norm_backward_inputs(m, n)
            if label == "rms backward":
                def make(o, x=x, w=w, dy=dy, rstd=rstd):
                    return lambda: norms.rms_norm_backward_impl(dy, None, x, w, rstd, 0.0, "llama", x.dtype, None,
                                                                True, **o)
            else:
                def make(o, x=x, w=w, dy=dy, mean=mean, rstd=rstd_ln):
                    return lambda: norms.layer_norm_backward_impl(dy, x, w, mean, rstd, True, x.dtype, **o)
            moved = 3 * x.numel() * x.element_size()
        elif label in ("rms", "rms+residual", "ln"):
            x = torch.randn(m, n, device="cuda").to(dtype)
            r = torch.randn(m, n, device="cuda").to(dtype)
            w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
            b = (0.1 * torch.randn(n, device="cuda")).to(dtype)
            if label == "ln":
                def make(o, x=x, w=w, b=b):
                    return lambda: norms.layer_norm_impl(x, w, b, 1e-5, store_stats=False, **o)[:1]
            else:
                def make(o, x=x, w=w, res=r if label == "rms+residual" else None):
                    return lambda: norms.rms_norm_impl(x, w, res, 1e-6, 0.0, "llama", x.dtype, store_stats=False,
                                                       **o)[:2]
            moved = (4 if label == "rms+residual" else 2) * x.numel() * x.element_size()
        else:
            x = (3 * torch.randn(m, n, device="cuda")).bfloat16()
            if label == "softmax backward":
                y = torch.softmax(x.float(), -1).bfloat16()
                dy = torch.randn(m, n, device="cuda").bfloat16()

                def make(choice, y=y, dy=dy):
                    return lambda: (sm.softmax_backward(dy, y, strategy=choice[0], tuning=choice[1]),)
            else:
                def make(choice, x=x, log=label == "log_softmax"):
                    return lambda: (sm.softmax_forward(x, log=log, strategy=choice[0], tuning=choice[1]),)
            moved = (3 if label == "softmax backward" else 2) * x.numel() * x.element_size()
        for name, options in variants.items():
            if not only or only == f"{case} {name}":
                out[f"{case} {name}"] = (make(options), moved, case)
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def check_bits(variants: dict) -> list[str]:
    """The names of the variants of ``row_op_variants`` whose outputs differ, bit for bit, from the
    first variant of their case; printed too."""
    unequal, first = [], {}
    for name, (fn, _, case) in variants.items():
        out = [t.clone() for t in fn() if t is not None]
        if case not in first:
            first[case] = out
        elif not all(torch.equal(_bits(a), _bits(c)) for a, c in zip(out, first[case])):
            unequal.append(name)
    print("bits equal to the default in every case" if not unequal else f"NOT EQUAL: {unequal}")
    return unequal


def check_and_time(variants: dict, out_path: str = "", graphed: bool = False) -> None:
    """Check every variant of ``row_op_variants`` bit for bit against its case's first, then time
    them all (``time_against_roof``, three interleaved rounds, L2 flushed; with ``graphed``, the
    device time per call of 20 calls captured in a CUDA graph, ``cuda_graph_us``, as the bench's
    decode column) and write ``out_path``."""
    unequal = check_bits(variants)
    if not graphed:
        time_against_roof({k: v[0] for k, v in variants.items()}, {k: v[1] for k, v in variants.items()}, out_path,
                          unequal=unequal)
        return
    times = interleaved_us({k: v[0] for k, v in variants.items()}, cuda_graph_us)
    width = max((len(k) for k in times), default=0)
    for name, ts in times.items():
        print(f"{name:{width}s}  " + "  ".join(f"{t:6.2f} us" for t in ts))
    if out_path:
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(dict(graphed_us=times, unequal=unequal), f, indent=1)


def repeat_one(variants: dict) -> None:
    """Run the one variant of ``variants`` four times (the first compiles): for ncu."""
    (fn, _, _), = variants.values()
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
