"""Where the resolve pass's time goes: SM clock stamps at the boundaries of its phases, read back
after each call.

    python benchmarks/probe_resolve_stamps.py --build DIR      # here: DIR/src = src + stamps
    PYTHONPATH=DIR/src:benchmarks python benchmarks/probe_resolve_stamps.py OUT_DIR   (CUDA)

``--build`` copies this tree's ``src`` to ``DIR/src`` and adds the stamps to that copy alone (the
library itself carries none): ``resolve_kernel`` reads ``%clock64`` on entry, after the wait for
the previous pass, after the row's partials, after the race of the sure-kept tokens, after the
sub-bin refinement and at its end (after a barrier), and ``%globaltimer`` on entry and at the
end (to turn cycles into nanoseconds), and in MODE_SAMPLE writes them, with the boundary list's
length before and after the refinement and the count of sure-listed tokens, to an int64
workspace of 16 that the copy's ``_ops.sampling.STAMPS`` holds (the ``thr`` output, which
sampling does not use otherwise). Each stamp after a phase depends on that phase's results, so
the compiler cannot hoist it; the copy's kernels are otherwise the library's.

The run: 151936 fp32 logits, Gaussian of standard deviation 4 (the benchmark's peaked rows), 1 and
64 rows (every program writes the same slots: at 64 rows the stamps are those of whichever program
wrote last), top-p 0.9, min-p 0.05, top-k 50 + top-p 0.9 and top-k 50, and logits drawn alike and
rounded to bf16 under top-p 0.9; 30 eager calls and 30 graph replays each, medians; then the per-launch
kernel times of the torch profiler over 10 graph replays (under dependent launches a pass's time
includes its wait for the previous one). ``STAMPS_QUICK=1``: top-p 0.9 on float32 rows alone;
``STAMPS_FLAT=1``: the benchmark's flat rows (standard deviation 2), top-p 0.9 and min-p 0.05 on
float32 rows.
"""
import os
import shutil
import statistics
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

#: (anchor in kernels/sampling.py, replacement): the stamps. Each anchor must occur once.
_KERNEL_EDITS = [
    ("\n@triton.jit\ndef resolve_kernel(", '''
@triton.jit
def _clock():
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _gtimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def resolve_kernel('''),
    ("""    start_dependent_launch(WAIT_FOR_PRIOR, False)
    row = tl.program_id(0).to(tl.int64)
    inv_t, noise_scale, valid_row,""", """    c_entry = _clock()
    g_entry = _gtimer()
    start_dependent_launch(WAIT_FOR_PRIOR, False)
    c0 = _clock()
    row = tl.program_id(0).to(tl.int64)
    inv_t, noise_scale, valid_row,"""),
    ("""    kept_low = tl.full([], INT64_MAX, tl.int64)
    if valid_row & (n_valid > 0):""", """    kept_low = tl.full([], INT64_MAX, tl.int64)
    c1 = _clock() + (n_list * 0).to(tl.int64) + (best_index * 0)
    c2 = c1
    c3 = c1
    r1 = c1
    rm = c1
    r2 = c1
    n_before = n_list
    if valid_row & (n_valid > 0):"""),
    ("""        # Shorten the boundary list first""", """        c2 = _clock() + (best_index * 0)
        c3 = c2
        r1 = c2
        rm = c2
        r2 = c2
        # Shorten the boundary list first"""),
    ("""        ONE_CHUNK: tl.constexpr = MODE != MODE_TOPK
""", """        c3 = _clock() + (n_list * 0).to(tl.int64) + (best_index * 0)
        ONE_CHUNK: tl.constexpr = MODE != MODE_TOPK
"""),
    ("""            tl.store(mass_ptr + row, 0.0)


@triton.jit
def apply_filter_kernel(""", """            tl.store(mass_ptr + row, 0.0)
    tl.debug_barrier()
    c4 = _clock()
    g4 = _gtimer()
    if MODE == MODE_SAMPLE:
        tl.store(thr_ptr + 0, c_entry)
        tl.store(thr_ptr + 1, c0)
        tl.store(thr_ptr + 2, c1)
        tl.store(thr_ptr + 3, c2)
        tl.store(thr_ptr + 4, c3)
        tl.store(thr_ptr + 5, c4)
        tl.store(thr_ptr + 6, g_entry)
        tl.store(thr_ptr + 7, g4)
        tl.store(thr_ptr + 8, n_before.to(tl.int64))
        tl.store(thr_ptr + 9, n_list.to(tl.int64))
        tl.store(thr_ptr + 10, (counts >> 32))
        tl.store(thr_ptr + 11, r1)
        tl.store(thr_ptr + 12, rm)
        tl.store(thr_ptr + 13, r2)


@triton.jit
def apply_filter_kernel("""),
]
#: Stamps inside the sub-bin refinement (``_refine``): after its sub-bin plan (r1), after the first
#: block's sums and race (rm, ``_refine_block`` returns it), after that block's list write (r2).
_KERNEL_EDITS += [
    ("""    flo, fhi = _plan_fine(fine_counts, lo, hi, count_above, mass_above, total, kk, p, mp, topk_on,
                          topp_on, minp_on, FINE_BINS, BINS_PER_NAT)
""", """    flo, fhi = _plan_fine(fine_counts, lo, hi, count_above, mass_above, total, kk, p, mp, topk_on,
                          topp_on, minp_on, FINE_BINS, BINS_PER_NAT)
    r1 = _clock() + (flo * 0).to(tl.int64) + (fhi * 0).to(tl.int64)
"""),
    ("""    written = _move_to_front(list_ptr, row, list_stride, written, idx, inside)
    return written, count_above, mass_above, kept_above, best_score, best_index, kept_low
""", """    rm = _clock() + (best_index * 0) + (kept_above * 0) + (kept_low * 0)
    written = _move_to_front(list_ptr, row, list_stride, written, idx, inside)
    return written, count_above, mass_above, kept_above, best_score, best_index, kept_low, rm
"""),
    ("""    written, count_above, mass_above, kept_above, best_score, best_index, kept_low = _refine_block(
        list_ptr, row, list_stride, first,""", """    written, count_above, mass_above, kept_above, best_score, best_index, kept_low, rm = _refine_block(
        list_ptr, row, list_stride, first,"""),
    ("""    start = tl.full([], BLOCK, tl.int32)
    while start < n_list:  # a loop bound read from memory
""", """    r2 = _clock() + (written * 0).to(tl.int64)
    start = tl.full([], BLOCK, tl.int32)
    while start < n_list:  # a loop bound read from memory
"""),
    ("""        written, count_above, mass_above, kept_above, best_score, best_index, kept_low = _refine_block(
            list_ptr, row, list_stride, block,""", """        written, count_above, mass_above, kept_above, best_score, best_index, kept_low, rm_later = _refine_block(
            list_ptr, row, list_stride, block,"""),
    ("""    tl.debug_barrier()
    return written, count_above, mass_above, kept_above, best_score, best_index, kept_low
""", """    tl.debug_barrier()
    return written, count_above, mass_above, kept_above, best_score, best_index, kept_low, r1, rm, r2
"""),
    ("""                n_list, count_above, mass_above, kept_above, best_score, best_index, kept_low = \\
""", """                n_list, count_above, mass_above, kept_above, best_score, best_index, kept_low, r1, rm, r2 = \\
"""),
]
_OPS_EDITS = [
    ("""        outputs.get("thr", spare),""",
     """        outputs.get("thr", STAMPS.setdefault(dev, torch.zeros(16, dtype=torch.int64, device=dev))),"""),
    ("\nScalar = Union[int, float]\n", "\nSTAMPS = {}\nScalar = Union[int, float]\n"),
]
PHASES = ["wait", "setup + partials", "sure race", "refine: sub-bin plan", "refine: first block's sums and race",
          "refine: its list write", "refine: later blocks", "ranking + finish"]
#: The stamps' slots in the order of the phases' boundaries (c_entry, c0, c1, c2, r1, rm, r2, c3, c4).
ORDER = [0, 1, 2, 3, 11, 12, 13, 4, 5]


def _edit(path, edits):
    with open(path) as f:
        text = f.read()
    for anchor, replacement in edits:
        if text.count(anchor) != 1:
            raise SystemExit(f"{path}: the anchor {anchor.strip()[:60]!r} occurs {text.count(anchor)} times")
        text = text.replace(anchor, replacement)
    with open(path, "w") as f:
        f.write(text)


def build(out_dir):
    src = os.path.join(os.path.dirname(_HERE), "src")
    dst = os.path.join(out_dir, "src")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    _edit(os.path.join(dst, "treefold", "kernels", "sampling.py"), _KERNEL_EDITS)
    _edit(os.path.join(dst, "treefold", "_ops", "sampling.py"), _OPS_EDITS)
    print(f"stamped copy in {dst}")


def measure(out_dir):
    import torch
    from torch.profiler import ProfilerActivity, profile

    from treefold._ops import sampling
    if not hasattr(sampling, "STAMPS"):
        raise SystemExit(f"{sampling.__file__} has no stamps: put a --build copy first on PYTHONPATH")
    lines = [f"treefold from {sampling.__file__}; device {torch.cuda.get_device_name()}"]
    g = torch.Generator(device="cuda").manual_seed(0)
    cases = {"top-p 0.9": dict(top_p=0.9), "min-p 0.05": dict(min_p=0.05),
             "top-k 50 + top-p 0.9": dict(top_k=50, top_p=0.9), "top-k 50": dict(top_k=50)}
    shapes = ((1, torch.float32), (64, torch.float32), (1, torch.bfloat16), (64, torch.bfloat16))
    scale = 4.0
    if os.environ.get("STAMPS_QUICK"):  # top-p 0.9 on float32 rows alone
        cases, shapes = {"top-p 0.9": cases["top-p 0.9"]}, shapes[:2]
    if os.environ.get("STAMPS_FLAT"):  # the benchmark's flat rows (standard deviation 2), float32
        cases = {"top-p 0.9": cases["top-p 0.9"], "min-p 0.05": cases["min-p 0.05"]}
        shapes, scale = shapes[:2], 2.0
    lines.append(f"logits: Gaussian of standard deviation {scale}")
    for rows, dtype in shapes:
        x = (torch.randn(rows, 151936, device="cuda", generator=g) * scale).to(dtype)
        for label, kw in cases.items():
            if dtype != torch.float32 and label != "top-p 0.9":
                continue
            label = label if dtype == torch.float32 else label + " bf16"
            call = lambda: sampling.sample_rows(x, 1.0, seed=1, **kw)  # noqa: E731
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            stamps = next(iter(sampling.STAMPS.values()))
            eager = []
            for _ in range(30):
                call()
                torch.cuda.synchronize()
                eager.append(stamps.cpu().tolist())
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                call()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            replays = []
            for _ in range(30):
                graph.replay()
                torch.cuda.synchronize()
                replays.append(stamps.cpu().tolist())
            for tag, records in (("eager", eager), ("graph", replays)):
                ns = statistics.median((r[7] - r[6]) / max(1, r[5] - r[0]) for r in records)
                parts = [statistics.median(r[ORDER[i + 1]] - r[ORDER[i]] for r in records) * ns / 1000
                         for i in range(len(PHASES))]
                total = statistics.median(r[5] - r[0] for r in records) * ns / 1000
                last = records[-1]
                lines.append(f"{rows:3d} rows {label:22s} {tag}: resolve {total:6.2f} us = "
                             + ", ".join(f"{n} {p:5.2f}" for n, p in zip(PHASES, parts))
                             + f" | list {last[8]} -> {last[9]}, sure listed {last[10]}, ns/cycle {ns:.3f}")
                print(lines[-1], flush=True)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    graph.replay()
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    kernels.setdefault(e.name.split("(")[0].split("<")[0], []).append(e.device_time)
            lines.append("    kernels, us: " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in kernels.items()))
            print(lines[-1], flush=True)
    with open(os.path.join(out_dir, "resolve-stamps.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--build":
        build(sys.argv[2])
    else:
        measure(sys.argv[1])
