"""The filtered sampling path's passes, timed as they stand in the ``treefold`` on the path, so
that two source trees can be compared in alternating processes:

    PYTHONPATH=OLD/src:benchmarks python benchmarks/probe_sampling_split.py LABEL OUT_DIR
    PYTHONPATH=src:benchmarks     python benchmarks/probe_sampling_split.py LABEL OUT_DIR
    python benchmarks/probe_sampling_split.py --compare OUT_DIR LABEL_A LABEL_B ...
    PYTHONPATH=...                python benchmarks/probe_sampling_split.py --warm I K

(``--warm I K`` runs the I-th of K shares of the cases once, compiling their kernels into
Triton's cache: a driver warms a tree in K parallel processes before the timing process.)

151936 logits (the gpu_sampling inputs), batch 64 and 1, fp32 and bf16, peaked and flat rows;
top-p 0.9, min-p 0.05, top-k 50, top-k 50 + top-p 0.9, top_k(50); the programs per row at the
default (16 per SM) and, with PER_SM=16,8,32 in the environment, at 8 and 32 per SM; SPLIT_CASES
keeps some of the cases. Each call replayed from a CUDA graph (do_bench
median, L2 flushed) in three interleaved rounds; its tokens saved to OUT_DIR/tokens-LABEL.pt and
its times to OUT_DIR/split-LABEL.json. --compare prints the best-of-rounds table of the labels
and whether their tokens are equal.
"""
import json
import os
import sys

import torch

PER_SM = [None if v == "16" else int(v) for v in os.environ.get("PER_SM", "16").split(",")]
#: SPLIT_CASES="64 float32,flat" in the environment keeps the cases whose name holds one of these
CASES = [c for c in os.environ.get("SPLIT_CASES", "").split(",") if c]


def _configs():
    """The filter settings by name. The treefold on PYTHONPATH is imported first: gpu_sampling
    (imported by probe_sampling_bins) puts this repository's src first on sys.path, and every
    label would otherwise time the same tree. ``--compare`` needs neither."""
    import treefold  # noqa: F401
    from probe_sampling_bins import CONFIGS
    return CONFIGS


def cases():
    from gpu_sampling import FLAT, logits
    out = []
    for batch, dtype, flat in ((64, torch.float32, False), (64, torch.bfloat16, False), (1, torch.float32, False),
                               (1, torch.bfloat16, False), (64, torch.float32, True), (1, torch.float32, True)):
        x = logits(batch, dtype, **({"scale": FLAT} if flat else {}))
        seeds = torch.arange(batch, device="cuda", dtype=torch.int64) * 7919 + 1
        names = ("top-p 0.9", "min-p 0.05") if flat else _configs()
        for config in names:
            key = f"{batch} {str(dtype)[6:]} {'flat' if flat else 'peaked'} {config}"
            if not CASES or any(c in key for c in CASES):
                out.append(((key,), x, seeds, config))
    return out


def call(ops, x, seeds, config, per_sm):
    c = _configs()[config]
    ppr = None if per_sm is None else -(-per_sm * torch.cuda.get_device_properties(0).multi_processor_count
                                        // x.shape[0])
    if c is None:
        return lambda: ops.top_k_rows(x, 50, programs_per_row=ppr)
    return lambda: (ops.sample_rows(x, 1.0, c.get("top_k"), c.get("top_p"), c.get("min_p"), seeds, 0,
                                    programs_per_row=ppr),)


def measure(label, out_dir):
    from treefold._ops import sampling as ops
    from probe_report import time_graphed_variants
    print("treefold from", ops.__file__)
    table, tokens = {}, {}
    for key, x, seeds, config in cases():
        table[key] = {f"{per_sm or 16} programs/SM": call(ops, x, seeds, config, per_sm) for per_sm in PER_SM}
        tokens[key] = [t.cpu() for t in call(ops, x, seeds, config, None)()]
    times = time_graphed_variants(table, "", 3)
    top_p_kernel_times(ops, label)
    torch.save(tokens, os.path.join(out_dir, f"tokens-{label}.pt"))
    with open(os.path.join(out_dir, f"split-{label}.json"), "w") as f:
        json.dump({f"{k[0]} | {v}": t for (k, v), t in times.items()}, f, indent=1)


def warm(share, shares):
    from treefold._ops import sampling as ops
    for i, (key, x, seeds, config) in enumerate(cases()):
        if i % shares == share:
            for per_sm in PER_SM:
                call(ops, x, seeds, config, per_sm)()
    torch.cuda.synchronize()


def top_p_kernel_times(ops, label=""):
    """Each launch's time in the top-p 0.9 call, fp32 (torch profiler): at 64 rows at each PER_SM,
    at one row, and on 64 flat rows (where the compaction and the resolve's refinement take most
    of the call); printed with the run's ``label`` (ab_trees.sh gathers the runs' logs in
    file-name order, not run order)."""
    from gpu_sampling import FLAT, PEAKED, logits
    from probe_sampling import kernel_times
    for rows, per_sms, scale in ((64, PER_SM, PEAKED), (1, [None], PEAKED), (64, [None], FLAT)):
        seeds = torch.arange(rows, device="cuda", dtype=torch.int64) * 7919 + 1
        for per_sm in per_sms:
            per = kernel_times(call(ops, logits(rows, torch.float32, scale), seeds, "top-p 0.9", per_sm))
            print(f"kernels{' of ' + label if label else ''}, top-p 0.9, {rows} {'flat ' if scale == FLAT else ''}"
                  f"rows fp32, {per_sm or 16} programs/SM (us per launch): "
                  + ", ".join(f"{k} {v}" for k, v in per.items()))


def compare(out_dir, labels):
    runs = {}
    for label in labels:
        with open(os.path.join(out_dir, f"split-{label}.json")) as f:
            runs[label] = json.load(f)
    paths = {label: os.path.join(out_dir, f"tokens-{label}.pt") for label in labels}
    missing = [p for p in paths.values() if not os.path.exists(p)]
    if missing:
        print(f"tokens not compared: no {', '.join(missing)}")
    else:
        toks = {label: torch.load(path) for label, path in paths.items()}
        first = toks[labels[0]]
        for label in labels[1:]:
            same = all(all(torch.equal(a, b) for a, b in zip(first[k], toks[label][k])) for k in first)
            print(f"tokens {label} == {labels[0]}: {same}")
    print("best of 3 rounds, us: " + " | ".join(labels))
    for key in runs[labels[0]]:
        print(f"{key:58s} " + "  ".join(f"{min(runs[label][key]):7.1f}" for label in labels))


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "--warm":
        warm(int(sys.argv[2]), int(sys.argv[3]))
    else:
        measure(sys.argv[1], sys.argv[2])
