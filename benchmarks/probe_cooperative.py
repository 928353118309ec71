"""Where the "cooperative" softmax loses time: the same launches with the wait on the row's other
programs left out, and with the arrival counter left out too (wrong outputs, right bytes), against
"block" and "online" at the same shapes; and the arrival counter's zeroing alone.

    python benchmarks/probe_cooperative.py        (CUDA; runs one process per variant of the kernel)

Each kernel variant runs in its own process: Triton keeps a compiled kernel per specialisation for
the life of a process, so a patched helper would otherwise meet the unpatched binary. Times are
triton.testing.do_bench medians with the L2 flushed, of the kernel launch alone (buffers made
beforehand; the counter is zeroed inside the timed call only where the kernel waits on it).
"""
import json
import os
import subprocess
import sys

import torch
import triton
import triton.language as tl

SHAPES = [(32768, 8192), (4096, 32768), (256, 131072)]
COOPERATIVE = [(1, 4), (2, 4), (1, 2)]  # (segments per program, warps)


def _patch(mode):
    from treefold.kernels import softmax as K
    if mode in ("no_wait", "no_arrival"):
        @triton.jit
        def _no_wait(arrivals_ptr, row, arrived, target):
            pass
        K.wait_for_arrivals = _no_wait  # the name the softmax kernel module calls
    if mode == "no_arrival":
        @triton.jit
        def _no_arrival(arrivals_ptr, row):
            tl.debug_barrier()
            return 0
        K.arrive = _no_arrival


def _child(mode):
    _patch(mode)
    from treefold._ops import softmax as ops
    from treefold.kernels import softmax as K
    rows_out = []
    for rows, n in SHAPES:
        x = (torch.randn(rows, n, device="cuda") * 3).bfloat16()
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * 2
        variants = [("cooperative", ops.Tuning(segments_per_program=s, num_warps=w), f"coop spp{s} w{w}")
                    for s, w in COOPERATIVE]
        if mode == "normal":
            variants += [("online", ops.Tuning(), "online"), ("split", ops.Tuning(), "split")]
            if n <= 32768:
                variants += [("block", ops.Tuning(num_warps=w), f"block w{w}") for w in (4, 8, 16)]
        for strategy, tuning, label in variants:
            try:
                plan = ops.plan(0, False, n, rows, torch.cuda.get_device_properties(0).multi_processor_count, 2,
                                strategy, tuning)
                segments = plan.num_segments
                part_p = torch.empty(rows, segments, device="cuda")
                part_q = torch.empty_like(part_p)
                arrivals = torch.zeros(rows, dtype=torch.int32, device="cuda")

                def call(plan=plan, part_p=part_p, part_q=part_q, arrivals=arrivals):
                    if plan.arrivals and mode == "normal":
                        arrivals.zero_()
                    for phase in plan.phases:
                        K.softmax_kernel[phase.grid](x, x, y, x, part_p, part_q, arrivals, rows, n, segments,
                                                     phase.programs_per_row, n, n, n, 1.0, **phase.kwargs)
                call()
                torch.cuda.synchronize()
                us = triton.testing.do_bench(call, warmup=10, rep=50, return_mode="median") * 1e3
                rows_out.append({"mode": mode, "shape": f"{rows}x{n}", "variant": label, "us": us,
                                 "gbs": nbytes / us / 1e3})
            except Exception as e:  # noqa: BLE001
                rows_out.append({"mode": mode, "shape": f"{rows}x{n}", "variant": label, "error": str(e)[:200]})
        if mode == "normal":
            arrivals = torch.zeros(rows, dtype=torch.int32, device="cuda")
            us = triton.testing.do_bench(lambda: arrivals.zero_(), warmup=10, rep=50, return_mode="median") * 1e3
            rows_out.append({"mode": mode, "shape": f"{rows}x{n}", "variant": "counter zeroing alone", "us": us,
                             "gbs": 0.0})
    print("RESULT " + json.dumps(rows_out))


def main():
    if len(sys.argv) > 1:
        _child(sys.argv[1])
        return
    results = []
    for mode in ("normal", "no_wait", "no_arrival"):
        out = subprocess.run([sys.executable, __file__, mode], capture_output=True, text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            print(f"{mode}: failed\n{out.stderr[-2000:]}")
            continue
        results += json.loads(lines[0][len("RESULT "):])
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    roof = 2 * src.numel() * 4 / triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6
    print(f"roof {roof:.0f} GB/s (1 GiB copy)")
    print(f"{'shape':14} {'mode':11} {'variant':24} {'us':>8} {'% roof':>7}")
    for r in results:
        if "error" in r:
            print(f"{r['shape']:14} {r['mode']:11} {r['variant']:24} error {r['error']}")
        else:
            print(f"{r['shape']:14} {r['mode']:11} {r['variant']:24} {r['us']:8.1f} {100 * r['gbs'] / roof:7.1f}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe-cooperative.json"), "w") as f:
            json.dump({"roof_gbs": roof, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
