"""Sampling on the GPU: correctness, determinism and speed of treefold.sample and treefold.top_k.

Run on the device machine from the repository root:

    python benchmarks/gpu_sampling.py            # OUT=<dir> also writes <dir>/sampling.json
    CHECKS=0 python benchmarks/gpu_sampling.py   # timings only (the GPU test tier checks)
    DESCENT=0 python benchmarks/gpu_sampling.py  # top-p on the pipeline at every batch (1: the descent where it serves)
    ONLY="top-p 0.9,min-p 0.05" BASELINES=0 ...  # some calls, treefold's only (a short run)

It first checks every path on CUDA (greedy == torch.argmax, top_k == a stable torch.sort,
sampled tokens inside the float64 filtered support, tokens equal to the NumPy reference, the
same tokens twice, for a row alone and inside the batch, and from a CUDA graph), then times, for
fp32 and bf16 logits of 151936 tokens at batch 1 and 64: greedy, top-k 50, top-p 0.9,
top-k 50 + top-p 0.9 and min-p 0.05 sampling, plain temperature sampling and top_k(50), against
torch.argmax, torch.topk, torch.multinomial and the Hugging Face sort-based warpers (written out
below), and FlashInfer when it is installed.

Four times per case: ``gpu`` is do_bench of the eager call (median, L2 flushed: the GPU time
from the first kernel to the last, launch gaps included), ``graph`` is do_bench of the same call
replayed from a CUDA graph (the graph's own launch on the device included), ``kernel`` is the time
during which the replayed call's kernels run, by the profiler's start and end of each, after the
same flush (``treefold.bench.timing.kernel_us``: overlapping dependent launches count once, the
graph's launch not at all), ``clean`` the same after a flush that leaves the L2 clean (do_bench's
zeroes 256 MB, and the call's first reads then write dirty lines back; this one reads another
256 MB after the zeroing), ``host`` is the wall time per eager call in a loop of calls with no
synchronisation (what a decode loop pays without graphs). GB/s counts the logits read once; the
roof is a 2 GiB device-to-device copy (read + write) measured in the same run.

The logits are Gaussian with standard deviation 4 ("peaked": top-p 0.9 keeps about 1 to 1000
tokens, min-p 0.05 about 10 to 50), plus one "flat" case (standard deviation 2: top-p keeps
about 35000 tokens) that exercises the long boundary lists.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import treefold  # noqa: E402
from treefold._ops import sampling as sampling_ops  # noqa: E402
from treefold.bench.timing import clean_flush, kernel_us  # noqa: E402
from treefold.reference import sampling as reference  # noqa: E402

VOCAB = 151936
BATCHES = (1, 64)
DTYPES = (torch.float32, torch.bfloat16)
PEAKED, FLAT = 4.0, 2.0
CONFIGS = {  # name -> treefold.sample keyword arguments
    "greedy": dict(temperature=0.0),
    "sample": dict(temperature=1.0),
    "top-k 50": dict(top_k=50),
    "top-p 0.9": dict(top_p=0.9),
    "top-k 50 + top-p 0.9": dict(top_k=50, top_p=0.9),
    "min-p 0.05": dict(min_p=0.05),
}
LOG = []
RESULTS = {"checks": [], "timings": [], "profile": {}, "errors": []}


def say(msg: str) -> None:
    print(msg, flush=True)
    LOG.append(msg)


def guarded(label: str, fn):
    """Run one step; a failure is reported and recorded, and the script goes on."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a failing variant must not stop the run
        say(f"FAILED {label}: {type(e).__name__}: {e}")
        RESULTS["errors"].append({"step": label, "error": f"{type(e).__name__}: {e}",
                                  "trace": traceback.format_exc(limit=6)})
        return None


def check(name: str, ok: bool, detail: str = "") -> None:
    RESULTS["checks"].append({"check": name, "ok": bool(ok), "detail": detail})
    say(f"{'ok  ' if ok else 'FAIL'} {name}{(': ' + detail) if detail else ''}")


def logits(batch: int, dtype: torch.dtype, scale: float = PEAKED, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(batch, VOCAB, device="cuda", generator=g) * scale).to(dtype)


# ---- the baselines ---------------------------------------------------------------------------
# Hugging Face's warpers (TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper) followed by
# softmax and torch.multinomial, as transformers' generate() samples.

def hf_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    kth = torch.topk(scores, k)[0][..., -1, None]
    return scores.masked_fill(scores < kth, float("-inf"))


def hf_top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - p)
    remove_sorted[..., -1:] = False  # keep at least one token
    remove = remove_sorted.scatter(1, sorted_indices, remove_sorted)
    return scores.masked_fill(remove, float("-inf"))


def hf_min_p(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = torch.softmax(scores, dim=-1)
    top = probs.amax(dim=-1, keepdim=True)
    return scores.masked_fill(probs < min_p * top, float("-inf"))


def torch_sample(x: torch.Tensor, config: dict) -> torch.Tensor:
    if config.get("temperature") == 0.0:
        return torch.argmax(x, dim=-1)
    scores = x.float() / config.get("temperature", 1.0)
    if "top_k" in config:
        scores = hf_top_k(scores, config["top_k"])
    if "top_p" in config:
        scores = hf_top_p(scores, config["top_p"])
    if "min_p" in config:
        scores = hf_min_p(scores, config["min_p"])
    return torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(-1)


def flashinfer_sampler(config: dict):
    """FlashInfer's sorting-free sampler for this config, or None (not installed / no match)."""
    try:
        import flashinfer.sampling as fs
    except Exception:  # noqa: BLE001
        return None
    if config.get("temperature") == 0.0:
        return None
    if "top_k" in config and "top_p" in config and hasattr(fs, "top_k_top_p_sampling_from_logits"):
        return lambda x: fs.top_k_top_p_sampling_from_logits(x.float(), config["top_k"], config["top_p"])
    if "top_p" in config and hasattr(fs, "top_p_sampling_from_probs"):
        return lambda x: fs.top_p_sampling_from_probs(torch.softmax(x.float(), -1), config["top_p"])
    if "top_k" in config and hasattr(fs, "top_k_sampling_from_probs"):
        return lambda x: fs.top_k_sampling_from_probs(torch.softmax(x.float(), -1), config["top_k"])
    if "min_p" in config and hasattr(fs, "min_p_sampling_from_probs"):
        return lambda x: fs.min_p_sampling_from_probs(torch.softmax(x.float(), -1), config["min_p"])
    if config.keys() <= {"temperature"} and hasattr(fs, "sampling_from_probs"):
        return lambda x: fs.sampling_from_probs(torch.softmax(x.float(), -1))
    return None


# ---- timing ----------------------------------------------------------------------------------

def gpu_us(fn) -> float:
    from triton.testing import do_bench
    return 1000.0 * do_bench(fn, warmup=25, rep=100, return_mode="median")


def host_us(fn, calls: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def graphed(fn):
    """fn captured in a CUDA graph (static inputs): returns replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def roof_gbps() -> float:
    n = 1 << 29  # 2 GiB of float32
    src = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    us = gpu_us(lambda: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (n * 4) / (us * 1e-6) / 1e9


# ---- checks ----------------------------------------------------------------------------------

def checks() -> None:
    for dtype in DTYPES:
        for batch in BATCHES:
            x = logits(batch, dtype, seed=batch)
            tag = f"{str(dtype).replace('torch.', '')} {batch}x{VOCAB}"
            guarded(f"greedy {tag}", lambda: check(
                f"greedy == torch.argmax ({tag})",
                torch.equal(treefold.sample(x, temperature=0), torch.argmax(x.float(), -1))))
    for dtype in DTYPES:
        x = logits(8, dtype, seed=1)
        x[2] = torch.round(x[2])  # ties
        x[3] = 0.0  # one tie group: the bracket search
        def top_k_check(x=x, dtype=dtype):
            for k in (1, 50, 1000):
                v, i = treefold.top_k(x, k)
                sv, si = torch.sort(x, dim=-1, descending=True, stable=True)
                check(f"top_k({k}) == stable torch.sort ({dtype})",
                      torch.equal(i, si[:, :k]) and torch.equal(v, sv[:, :k]))
        guarded(f"top_k {dtype}", top_k_check)
    rows = 16
    for scale, label in ((PEAKED, "peaked"), (FLAT, "flat")):
        x = logits(rows, torch.float32, scale=scale, seed=7)
        seeds = torch.arange(rows, device="cuda") * 7919 + 1
        offsets = torch.full((rows,), 5, device="cuda")
        for name, config in CONFIGS.items():
            def sample_checks(x=x, name=name, config=config, seeds=seeds, offsets=offsets,
                              label=label):
                tokens = treefold.sample(x, seed=seeds, offset=offsets, **config)
                again = treefold.sample(x, seed=seeds, offset=offsets, **config)
                alone = torch.stack([treefold.sample(x[r:r + 1], seed=seeds[r:r + 1],
                                                     offset=offsets[r:r + 1], **config)[0]
                                     for r in range(0, rows, 5)])
                probs = reference.filtered_probs(x[:4].cpu(), **config)
                inside = bool((probs[torch.arange(4), tokens[:4].cpu()] > 0).all())
                want = reference.sample(x.cpu(), seed=seeds.cpu(), offset=offsets.cpu(), **config)
                agree = float((tokens.cpu() == want).float().mean())
                ok = (inside and torch.equal(tokens, again)
                      and torch.equal(alone, tokens[0:rows:5]) and agree >= 0.9)
                check(f"sample {name} ({label})", ok,
                      f"in support {inside}, same twice {torch.equal(tokens, again)}, "
                      f"alone == in batch {torch.equal(alone, tokens[0:rows:5])}, "
                      f"equal to the reference {agree:.3f}")
            guarded(f"sample {name} {label}", sample_checks)

    def graph_check():
        x = logits(64, torch.float32, seed=3)
        seeds = torch.arange(64, device="cuda")
        offset = torch.zeros(1, dtype=torch.int64, device="cuda")
        out = torch.empty(64, dtype=torch.int64, device="cuda")
        replay = graphed(lambda: out.copy_(treefold.sample(x, seed=seeds, offset=offset,
                                                           top_k=50, top_p=0.9)))
        same, fresh = True, set()
        for step in range(4):
            offset.fill_(step)
            replay()
            eager = treefold.sample(x, seed=seeds, offset=step, top_k=50, top_p=0.9)
            same &= torch.equal(out, eager)
            fresh.add(tuple(out.tolist()))
        check("CUDA graph replay == eager, fresh tokens per offset", same and len(fresh) > 1)
    guarded("cuda graph", graph_check)


# ---- timings ---------------------------------------------------------------------------------

def time_case(op: str, dtype, batch: int, impl: str, fn, nbytes: int, roof: float,
              with_graph: bool = True) -> None:
    row = {"op": op, "dtype": str(dtype).replace("torch.", ""), "batch": batch, "impl": impl}
    row["gpu_us"] = gpu_us(fn)
    row["host_us"] = host_us(fn)
    if with_graph:
        replay = graphed(fn)
        row["graph_us"] = gpu_us(replay)
        row["graph_host_us"] = host_us(replay)
        row["kernel_us"] = kernel_us(replay)
        row["kernel_clean_us"] = kernel_us(replay, flush=clean_flush)
    row["gbps"] = nbytes / (row["gpu_us"] * 1e-6) / 1e9
    row["roof_pct"] = 100.0 * row["gbps"] / roof
    RESULTS["timings"].append(row)
    save()
    say(f"  {op:22s} {row['dtype']:8s} {batch:3d} {impl:26s} gpu {row['gpu_us']:9.1f} us  "
        f"graph {row.get('graph_us', float('nan')):9.1f} us  kernel {row.get('kernel_us') or float('nan'):9.1f} us  "
        f"clean {row.get('kernel_clean_us') or float('nan'):9.1f} us  "
        f"host {row['host_us']:8.1f} us")


def timings(roof: float) -> None:
    # ONLY: the CONFIGS names (and "top_k(50)", "top-p 0.9 (flat)") to time; BASELINES=0: no torch
    # or FlashInfer rows (a short run beside a table that has them)
    only = set(filter(None, os.environ.get("ONLY", "").split(","))) or None
    baselines = os.environ.get("BASELINES", "1") != "0"
    for dtype in DTYPES:
        for batch in BATCHES:
            x = logits(batch, dtype, seed=11)
            seeds = torch.arange(batch, device="cuda") + 12345
            offset = torch.zeros(1, dtype=torch.int64, device="cuda")
            nbytes = x.numel() * x.element_size()
            for name, config in CONFIGS.items():
                if only is not None and name not in only:
                    continue
                guarded(f"time treefold {name} {dtype} {batch}", lambda: time_case(
                    name, dtype, batch, "treefold.sample",
                    lambda: treefold.sample(x, seed=seeds, offset=offset, **config), nbytes, roof))
                if not baselines:
                    continue
                base = "torch.argmax" if name == "greedy" else (
                    "torch.multinomial" if name == "sample" else
                    "torch.topk+multinomial" if name == "top-k 50" else "HF warpers+multinomial")
                guarded(f"time {base} {name} {dtype} {batch}", lambda: time_case(
                    name, dtype, batch, base, lambda: torch_sample(x, config), nbytes, roof))
                fi = flashinfer_sampler(config)
                if fi is not None:
                    guarded(f"time flashinfer {name} {dtype} {batch}", lambda: time_case(
                        name, dtype, batch, "flashinfer", lambda: fi(x), nbytes, roof))
    for batch in BATCHES:
        x = logits(batch, torch.float32, seed=13)
        nbytes = x.numel() * 4
        if only is None or "top_k(50)" in only:
            guarded(f"time top_k {batch}", lambda: time_case(
                "top_k(50)", torch.float32, batch, "treefold.top_k", lambda: treefold.top_k(x, 50),
                nbytes, roof))
            if baselines:
                guarded(f"time torch.topk {batch}", lambda: time_case(
                    "top_k(50)", torch.float32, batch, "torch.topk", lambda: torch.topk(x, 50), nbytes,
                    roof))
        if only is not None and "top-p 0.9 (flat)" not in only:
            continue
        xf = logits(batch, torch.float32, scale=FLAT, seed=17)
        seeds = torch.arange(batch, device="cuda")
        guarded(f"time flat top-p {batch}", lambda: time_case(
            "top-p 0.9 (flat)", torch.float32, batch, "treefold.sample",
            lambda: treefold.sample(xf, seed=seeds, top_p=0.9), nbytes, roof))
        if baselines:
            guarded(f"time flat top-p HF {batch}", lambda: time_case(
                "top-p 0.9 (flat)", torch.float32, batch, "HF warpers+multinomial",
                lambda: torch_sample(xf, dict(top_p=0.9)), nbytes, roof))


def profile() -> None:
    """GPU time per kernel of a few calls (where the time of a call goes)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    for batch in BATCHES:
        x = logits(batch, torch.float32, seed=19)
        seeds = torch.arange(batch, device="cuda")
        for name in ("top-p 0.9", "top-k 50", "min-p 0.05"):
            config = CONFIGS[name]
            treefold.sample(x, seed=seeds, **config)
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    treefold.sample(x, seed=seeds, **config)
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.key_averages():
                t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
                if t and "kernel" in e.key:
                    kernels[e.key] = round(t / 20.0, 2)
            RESULTS["profile"][f"{name} fp32 batch {batch}"] = kernels
            say(f"  profile {name} batch {batch}: " + ", ".join(
                f"{k.split('_kernel')[0]} {v} us" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])))


def _speedup(base: dict, tf: dict) -> float:
    """The baseline's time over treefold's, replayed from CUDA graphs where both were (at decode
    sizes the eager times are mostly the host's), else eager."""
    if base.get("graph_us") and tf.get("graph_us"):
        return base["graph_us"] / tf["graph_us"]
    return base["gpu_us"] / tf["gpu_us"]


def table(roof: float) -> None:
    """One line per case: treefold's times, its share of the roof, the baseline and the ratio."""
    by = {}
    for r in RESULTS["timings"]:
        by.setdefault((r["op"], r["dtype"], r["batch"]), {})[r["impl"]] = r
    say("")
    say(f"roof {roof:.0f} GB/s (2 GiB device-to-device copy, read + write); us = do_bench median "
        f"of the eager call; graph = replayed from a CUDA graph; kernel = the replayed call's kernels "
        f"running (profiler); clean = the same after a flush that leaves the L2 clean; host = wall us "
        f"per eager call")
    say(f"{'op':21s} {'shape':15s} {'us':>7s} {'graph':>7s} {'kernel':>7s} {'clean':>7s} {'host':>6s} {'GB/s':>5s} "
        f"{'%roof':>5s} | {'vs torch':22s} {'us':>7s} {'graph':>7s} {'kernel':>7s} {'speedup':>8s}")
    say("speedup: the baseline's graph time over treefold's")
    for (op, dtype, batch), impls in by.items():
        tf = next((r for k, r in impls.items() if k.startswith("treefold")), None)
        base = next((r for k, r in impls.items() if not k.startswith("treefold")
                     and k != "flashinfer"), None)
        if tf is None:
            continue
        short = {"float32": "fp32", "bfloat16": "bf16"}.get(dtype, dtype)
        line = (f"{op:21s} {short + ' ' + str(batch) + 'x' + str(VOCAB):15s} "
                f"{tf['gpu_us']:7.1f} {tf.get('graph_us', math.nan):7.1f} {tf.get('kernel_us') or math.nan:7.1f} "
                f"{tf.get('kernel_clean_us') or math.nan:7.1f} "
                f"{tf['host_us']:6.1f} "
                f"{tf['gbps']:5.0f} {tf['roof_pct']:5.1f} |")
        if base:
            line += (f" {base['impl']:22s} {base['gpu_us']:7.1f} {base.get('graph_us', math.nan):7.1f}"
                     f" {base.get('kernel_us') or math.nan:7.1f} {_speedup(base, tf):7.1f}x")
        if "flashinfer" in impls:
            line += f" (flashinfer {impls['flashinfer']['gpu_us']:.1f})"
        say(line)
    failed = [c["check"] for c in RESULTS["checks"] if not c["ok"]]
    say(f"checks: {len(RESULTS['checks']) - len(failed)} passed, {len(failed)} failed"
        + (": " + "; ".join(failed) if failed else "") + f"; errors: {len(RESULTS['errors'])}")


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 1
    t0 = time.time()
    say(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    RESULTS["device"] = torch.cuda.get_device_name()
    if os.environ.get("DESCENT") in ("0", "1"):  # the descent's routing on or off (a study switch)
        sampling_ops.DESCENT_SAMPLES = os.environ["DESCENT"] == "1"
    RESULTS["descent"] = sampling_ops.DESCENT_SAMPLES
    say(f"sampling by descent: {'on' if sampling_ops.DESCENT_SAMPLES else 'off'}")
    if os.environ.get("CHECKS", "1") != "0":  # CHECKS=0: timings only (the GPU test tier checks)
        say("checks")
        checks()
    say(f"timings (checks took {time.time() - t0:.0f} s)")
    roof = guarded("roof", roof_gbps) or float("nan")
    RESULTS["roof_gbps"] = roof
    timings(roof)
    guarded("profile", profile)
    table(roof)
    RESULTS["seconds"] = time.time() - t0
    save()
    return 0


def save() -> None:
    """Write RESULTS to $OUT/sampling.json (after every timed case too: a run cut short by a time
    limit keeps what it measured)."""
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "sampling.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=lambda v: None if isinstance(v, float)
                      and not math.isfinite(v) else str(v))


if __name__ == "__main__":
    sys.exit(main())
