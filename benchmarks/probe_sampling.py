"""Where the time of a sampling call goes, and how it moves with the programs per row.

For logits of 151936 tokens (Gaussian, standard deviation 4; fp32) at batch 1 and 64: the device
time of each configuration in a CUDA graph (20 calls per graph, no L2 flush:
`treefold.bench.timing.cuda_graph_us`) for several programs-per-SM choices, a check that every
choice gives the same tokens (launch choices never change a result), and the time of each kernel
of one choice from the profiler. python benchmarks/probe_sampling.py (CUDA); OUT=<dir> also
writes <dir>/probe-sampling.json.
"""
from __future__ import annotations

import json
import os

import torch

from treefold import order
from treefold._ops import sampling as ops
from treefold.bench.timing import cuda_graph_us as graph_us

VOCAB = 151936
PROGRAMS_PER_SM = (8, 16)
CONFIGS = {
    "greedy": dict(temperature=0.0),
    "sample": dict(temperature=1.0),
    "top-k 50": dict(temperature=1.0, top_k=50),
    "top-p 0.9": dict(temperature=1.0, top_p=0.9),
    "top-k 50 + top-p 0.9": dict(temperature=1.0, top_k=50, top_p=0.9),
    "min-p 0.05": dict(temperature=1.0, min_p=0.05),
}


def call(x, seeds, config, ppr):
    if config == "top_k(50)":
        return lambda: ops.top_k_rows(x, 50, programs_per_row=ppr)
    c = CONFIGS[config]
    return lambda: ops.sample_rows(x, c["temperature"], c.get("top_k"), c.get("top_p"),
                                   c.get("min_p"), seeds, 0, programs_per_row=ppr)


def kernel_times(fn) -> dict:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            out[e.key.split("_kernel")[0][:24]] = round(t / 20.0, 2)
    return out


def main() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for batch in (1, 64):
            g = torch.Generator(device="cuda").manual_seed(batch)
            x = (torch.randn(batch, VOCAB, device="cuda", generator=g) * 4).to(dtype)
            seeds = torch.arange(batch, device="cuda") + 12345
            names = list(CONFIGS) + ["top_k(50)"]
            if dtype == torch.bfloat16:
                names = ["greedy", "sample", "top-p 0.9"]
            for name in names:
                row = {"config": name, "dtype": str(dtype)[6:], "batch": batch, "graph_us": {}}
                want = None
                same = True
                for pps in PROGRAMS_PER_SM:
                    ppr = order.cdiv(pps * sms, batch)
                    fn = call(x, seeds, name, ppr)
                    got = fn()
                    got = got if isinstance(got, torch.Tensor) else torch.cat([got[0].float(), got[1].float()], 1)
                    want = got if want is None else want
                    same &= torch.equal(got, want)
                    row["graph_us"][pps] = round(graph_us(fn), 2)
                row["same_tokens"] = same
                best = min(row["graph_us"], key=row["graph_us"].get)
                row["kernels"] = kernel_times(call(x, seeds, name, order.cdiv(best * sms, batch)))
                results.append(row)
                print(f"{name:22s} {row['dtype']:8s} {batch:3d} same {same!s:5s} "
                      + " ".join(f"{p}/SM {t:7.1f}" for p, t in row["graph_us"].items())
                      + "  | " + ", ".join(f"{k} {v}" for k, v in row["kernels"].items()), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "probe-sampling.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
