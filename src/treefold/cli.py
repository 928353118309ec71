"""The ``treefold`` command: demo, bench, check, info."""
from __future__ import annotations

import argparse
import sys

DTYPE_NAMES = ("fp32", "bf16", "fp16")
NO_GPU = ("no CUDA device here, so nothing was measured (treefold measures GPU kernels); "
          "add --cpu to run small shapes on the CPU as a smoke test")


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _positive_float(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treefold", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the numerics experiments, measured on this machine")
    demo.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    demo.add_argument("--quick", action="store_true", help="smaller sizes (seconds, for tests)")

    bench = sub.add_parser(
        "bench", help="time every op against torch, torch.compile, Liger-Kernel and QuACK on this GPU",
        description="Median time (L2 flushed), GB/s of the minimum bytes, % of the same-run copy roof, "
                    "speed against the best peer, accuracy against float64 and determinism, per op and "
                    "shape. Writes NAME.json, NAME.md and NAME-*.png into --out.")
    bench.add_argument("ops", nargs="*", metavar="OP",
                       help="ops or cases to run (default: all), e.g. softmax rms_norm sum.accurate")
    bench.add_argument("--dtype", choices=DTYPE_NAMES, help="force every shape to this dtype")
    bench.add_argument("--shapes", choices=("small", "llm", "sweep"),
                       help="small: a fast smoke run; llm: LLM shapes (hidden sizes, vocabularies; default); "
                            "sweep: N from 256 to 262144 at 2^26 elements, for plots")
    bench.add_argument("--peers", metavar="LIST",
                       help="comma-separated peers among torch,hf,compile,liger,quack, or none "
                            "(default: all five on a GPU, torch with --cpu)")
    bench.add_argument("--backward", action="store_true", help="add the backward cases (autograd.grad timed)")
    bench.add_argument("--out", metavar="DIR", default="out/bench", help="where results go (default out/bench)")
    bench.add_argument("--name", default="bench", help="file name stem: NAME.json, NAME.md, NAME-*.png")
    bench.add_argument("--cpu", action="store_true", help="smoke test on the CPU: small shapes, wall-clock timing")
    bench.add_argument("--runs", type=_positive_int, default=20,
                       help="calls compared byte for byte for determinism (default 20)")
    bench.add_argument("--rounds", type=_positive_int, default=3,
                       help="timings per provider and shape, the providers timed round-robin; the median "
                            "is reported (default 3)")
    bench.add_argument("--warmup", type=_positive_float, default=25.0, help="do_bench warm-up in ms (default 25)")
    bench.add_argument("--rep", type=_positive_float, default=100.0, help="do_bench timing window in ms (default 100)")
    bench.add_argument("--roof-gib", type=_positive_float, help="size of the roof copy's buffer in GiB "
                       "(default 1 on a GPU, 1/16 on the CPU)")
    bench.add_argument("--no-host", dest="host", action="store_false",
                       help="skip the host-overhead section (eager calls at tiny shapes)")
    bench.add_argument("--host-calls", type=_positive_int,
                       help="calls per host-overhead measurement (default 2000; 20 with --cpu)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    bench.add_argument("--budget", type=_positive_float, metavar="SECONDS",
                       help="start no new shape after this many seconds; what was measured is kept")
    bench.add_argument("--from-json", metavar="PATH", nargs="+",
                       help="measure nothing: write the markdown and plots of saved results (several "
                            "runs on one machine are merged) into --out as NAME.*")
    bench.add_argument("--list", action="store_true", help="list the cases and their shapes, then exit")

    check = sub.add_parser("check", help="every op against float64 references: the error-budget table",
                           description="Runs every available op on this GPU (or --cpu) against float64 "
                                       "references and torch eager, and prints the error budget per op and dtype.")
    check.add_argument("ops", nargs="*", metavar="OP", help="ops or cases to check (default: all)")
    check.add_argument("--dtype", choices=DTYPE_NAMES, help="check only this dtype (default: all three)")
    check.add_argument("--backward", action="store_true", help="also check the gradients")
    check.add_argument("--cpu", action="store_true", help="run on the CPU, small shapes")
    check.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    check.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")

    info = sub.add_parser("info", help="this machine: GPU, SMs, L2, copy roof, versions, peers")
    info.add_argument("--cpu", action="store_true", help="also measure the CPU copy roof")
    return parser


def _has_cuda() -> bool:
    import torch  # noqa: PLC0415
    return torch.cuda.is_available()


def _list_cases() -> int:
    from .bench.cases import CASES  # noqa: PLC0415

    for c in CASES:
        print(f"{c.name:<20} {c.title}")
        for set_name in ("llm", "small", "sweep"):
            shapes = ", ".join(f"{c.label(s)} {s.dtype}" for s in c.shapes_for(set_name))
            print(f"    {set_name:<6} {shapes}")
    return 0


def _bench(args, parser) -> int:
    import os  # noqa: PLC0415

    from .bench import report  # noqa: PLC0415

    if args.list:
        return _list_cases()
    if args.from_json:
        try:
            result = report.merge_results([report.read_json(p) for p in args.from_json], args.name)
        except (OSError, ValueError) as e:
            parser.error(str(e))
        return _write_outputs(result, args.out, args.name)
    from .bench.cases import select_cases  # noqa: PLC0415
    from .bench.providers import PEER_NAMES, parse_peers  # noqa: PLC0415
    from .bench.runner import BenchConfig, run_bench  # noqa: PLC0415

    try:
        select_cases(args.ops, True)
        peers = [] if args.peers == "none" else parse_peers(args.peers or ("torch" if args.cpu else
                                                                          ",".join(PEER_NAMES)))
    except ValueError as e:
        parser.error(str(e))
    if not args.cpu and not _has_cuda():
        print(f"treefold bench: {NO_GPU}")
        return 0
    shapes = args.shapes or ("small" if args.cpu else "llm")
    if args.cpu and shapes != "small":
        print(f"--cpu runs the small shapes only (asked for {shapes})")
        shapes = "small"
    config = BenchConfig(
        ops=list(args.ops), shapes=shapes, dtype=args.dtype, peers=peers, backward=args.backward, cpu=args.cpu,
        out=args.out, name=args.name, runs=args.runs, rounds=args.rounds, warmup_ms=args.warmup, rep_ms=args.rep,
        roof_bytes=int(args.roof_gib * 2**30) if args.roof_gib else None, host=args.host,
        host_calls=args.host_calls or (20 if args.cpu else 2000), seed=args.seed, budget_s=args.budget)
    json_path = os.path.join(config.out, f"{config.name}.json")
    result = run_bench(config, checkpoint=lambda partial: report.write_json(partial, json_path))
    return _write_outputs(result, config.out, config.name)


def _write_outputs(result: dict, out: str, name: str) -> int:
    import os  # noqa: PLC0415

    from .bench import plots, report  # noqa: PLC0415

    written = [report.write_json(result, os.path.join(out, f"{name}.json"))]
    written.append(report.write_markdown(result, os.path.join(out, f"{name}.md")))
    paths, why_not = plots.write_plots(result, out, name)
    written += paths
    print()
    if result["summary"]:
        print("\n".join(report.summary_table(result)))
    else:
        print("nothing was measured")
    failed = sum(r["status"] != "ok" for r in result["results"])
    if failed:
        print(f"\n{failed} measurement(s) did not run cleanly; the remark column of {name}.md says why")
    if why_not:
        print(why_not)
    print("\nwrote " + ", ".join(written))
    print(f"reproduce: {result['command']}")
    return 0


def _check(args) -> int:
    import json  # noqa: PLC0415

    from .bench.check import CheckConfig, render_check, run_check  # noqa: PLC0415
    from .bench.report import _clean  # noqa: PLC0415

    if not args.cpu and not _has_cuda():
        print(f"treefold check: {NO_GPU}")
        return 0
    result = run_check(CheckConfig(ops=list(args.ops), dtype=args.dtype, backward=args.backward, cpu=args.cpu,
                                   seed=args.seed))
    print(render_check(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_clean(result), f, indent=1, allow_nan=False)
    return 1 if result["over_budget"] else 0


def _info(args) -> int:
    import torch  # noqa: PLC0415

    from .bench.env import describe_machine, machine_info, peer_status  # noqa: PLC0415
    from .bench.roofs import measure_copy_roof  # noqa: PLC0415
    from .bench.timing import CpuTimer, CudaTimer  # noqa: PLC0415

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    info = machine_info(device)
    print(describe_machine(info))
    if cuda:
        l2 = info.get("l2_bytes")
        print(f"GPU: {info['gpu']}, compute capability {info['compute_capability']}, {info['sm_count']} SMs, "
              f"L2 {l2 / 2**20:.0f} MiB, {info['memory_bytes'] / 2**30:.1f} GiB memory, CUDA {info['cuda']}"
              if l2 else f"GPU: {info['gpu']}, {info['sm_count']} SMs")
        roof = measure_copy_roof(device, CudaTimer())
        print(f"copy roof: {roof.gbs:.0f} GB/s ({roof.how})")
    else:
        print("GPU: no CUDA device here")
    if args.cpu:
        roof = measure_copy_roof(torch.device("cpu"), CpuTimer())
        print(f"CPU copy roof: {roof.gbs:.1f} GB/s ({roof.how})")
    print(f"Python {info['python']}, torch {info['torch']}, triton {info['triton']}, treefold {info['treefold']}")
    for p in peer_status():
        state = f"imports ({p['version']})" if p["available"] else f"not available: {p['reason']}"
        print(f"peer {p['name']:<8} {state}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from . import demo as demo_mod
        return demo_mod.main(args)
    if args.command == "bench":
        return _bench(args, parser)
    if args.command == "check":
        return _check(args)
    if args.command == "info":
        return _info(args)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
