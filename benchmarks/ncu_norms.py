"""The norm forwards where torch.compile's kernel was faster, under Nsight Compute, beside
Inductor's kernel for the same call (CUDA):

    ncu --clock-control none --profile-from-start off --csv --page raw \
        --metrics $(python benchmarks/ncu_norms.py --metrics) python benchmarks/ncu_norms.py >ncu.csv 2>err
    python benchmarks/ncu_norms.py --table ncu.csv "$(sed -n 's/^# variants: //p' err)"

Every variant is called (and compiled) first; then, between ``cudaProfilerStart`` and ``Stop``,
each is called CALLS times in the order of ``variants()``, one kernel per call, so the profiled
kernels map back to the variants by position (the table prints each one's kernel name beside it,
and refuses a count that does not match). ncu flushes the caches
before each kernel it profiles, so DRAM bytes are a call's own: the question is whether treefold's
kernel moves more bytes than Inductor's, or issues more instructions, or waits elsewhere.
"""
import csv
import os
import statistics
import sys

import torch

CALLS = 2

#: What ncu collects (``--metrics``); the table prints them in this order.
METRICS = [
    ("gpu__time_duration.sum", "us", 1e-3),
    ("dram__bytes_read.sum", "DRAM rd MB", 1e-6),
    ("dram__bytes_write.sum", "DRAM wr MB", 1e-6),
    ("lts__t_bytes.sum", "L2 MB", 1e-6),
    ("smsp__inst_executed.sum", "Minst", 1e-6),
    ("launch__registers_per_thread", "regs", 1),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "occ %", 1),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %", 1),
    ("smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct", "long sb %", 1),
    ("smsp__warp_issue_stalled_barrier_per_warp_active.pct", "barrier %", 1),
    ("smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct", "lg thr %", 1),
    ("launch__grid_size", "grid", 1),
    ("launch__block_size", "block", 1),
]


#: (row_op_variants label, rows, length, launch choices besides the default)
CASES = [("rms fp32", 8192, 4096, {"held 16w": dict(read_twice=False, num_warps=16)}),
         ("rms", 4096, 16384, {}), ("rms", 16384, 8192, {}), ("rms", 65536, 1024, {}), ("ln", 65536, 1024, {}),
         ("rms", 64, 8192, {"twice 16w": dict(read_twice=True, num_warps=16)})]


def variants():
    """[(name, call)]: treefold's launch choices (``probe_report.row_op_variants``) and
    torch.compile's kernel for the same call at each shape; with BASE_NORMS set (a kernels/norms.py
    of another revision, ``ab_norm_kernels.py``), the default launch with that revision's kernels too."""
    import torch.nn.functional as F

    from ab_norm_kernels import base_launchers, with_kernels
    from probe_report import row_op_variants

    from treefold.bench.cases import hf_llama_rms_norm

    torch.manual_seed(0)
    base = base_launchers(os.environ["BASE_NORMS"]) if os.environ.get("BASE_NORMS") else None
    out = []
    for label, m, n, options in CASES:
        found = row_op_variants([(label, m, n, {"default": {}, **options})])
        out += [(name, fn) for name, (fn, _, _) in found.items()]
        if base is not None:
            out.append((f"{label} {m}x{n} base", with_kernels(base, next(iter(found.values()))[0])))
        dtype = torch.float32 if label.endswith("fp32") else torch.bfloat16
        x = torch.randn(m, n, device="cuda").to(dtype)
        w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
        b = (0.1 * torch.randn(n, device="cuda")).to(dtype)
        if label == "ln":
            source = lambda x=x, w=w, b=b, n=n: F.layer_norm(x, (n,), w, b, 1e-5)
        else:
            source = lambda x=x, w=w: hf_llama_rms_norm(x, w)
        torch._dynamo.reset()
        out.append((f"{label} {m}x{n} compile", torch.compile(source, dynamic=False)))
    return out


def run() -> None:
    calls = variants()
    for _, call in calls:
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _, call in calls:
        for _ in range(CALLS):
            call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("# variants:", ";".join(name for name, _ in calls), file=sys.stderr)


def table(path: str, names: list) -> None:
    """Medians per variant from ncu's raw CSV (one row per profiled kernel, in launch order)."""
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.DictReader(lines))
    rows = [r for r in rows if r.get("ID", "").isdigit()]  # (the units row has no ID)
    if len(rows) != CALLS * len(names):
        raise SystemExit(f"{len(rows)} kernels profiled, {CALLS * len(names)} expected")
    print(f"{'variant':34s} {'kernel':22s} " + " ".join(f"{h:>10s}" for _, h, _ in METRICS))
    for i, name in enumerate(names):
        mine = rows[i * CALLS:(i + 1) * CALLS]
        cells = []
        for metric, _, scale in METRICS:
            values = [float(r[metric].replace(",", "")) for r in mine]
            cells.append(f"{statistics.median(values) * scale:10.2f}")
        print(f"{name:34s} {mine[0]['Kernel Name'][:22]:22s} " + " ".join(cells))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--metrics":
        print(",".join(m for m, _, _ in METRICS))
    elif len(sys.argv) > 2 and sys.argv[1] == "--table":
        table(sys.argv[2], sys.argv[3].split(";"))
    else:
        run()
