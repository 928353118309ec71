"""The norms' public calls against their launches, at the shapes where the bench put treefold level
with torch.compile, and decode batches flushed at other launch choices.

The bench times ``treefold.layer_norm`` / ``treefold.rms_norm`` (the eager call, through its
prepared launch after the first call); ``probe_read_twice_warps.py`` times ``layer_norm_impl`` /
``rms_norm_impl`` (the ordinary launch). At LayerNorm 65536 x 1024 the two put the same kernel at
70.1 us (bench, ``results/h200-norms-rounds.md``) and 68.2 us (probe, same device call). Here both,
on the bench's own inputs, with torch.compile's kernel in the same rounds; every variant checked bit
for bit against the first of its case, then three interleaved rounds, do_bench median, L2 flushed.

    python benchmarks/probe_public_norms.py [OUT_DIR] [kernels]   (CUDA)

With ``kernels``: the kernel's own duration under the profiler, public call against launch.
"""
import os
import sys

import torch
import torch.nn.functional as F

import treefold
from probe_report import _bits, time_against_roof
from treefold._ops import norms
from treefold.bench.cases import CASES_BY_NAME, Shape

EPS = {"rms": 1e-6, "ln": 1e-5}


def _inputs(label: str, m: int, n: int, dtype: str) -> dict:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    case = CASES_BY_NAME["layer_norm" if label == "ln" else "rms_norm"]
    return case.make_inputs(Shape(m, n, dtype), torch.device("cuda"), gen)


def _variants(label: str, m: int, n: int, dtype: str, launches: dict) -> dict:
    """name -> (call returning y, bytes moved)."""
    i = _inputs(label, m, n, dtype)
    x, w, b = i["x"], i["weight"], i.get("bias")
    moved = 2 * x.numel() * x.element_size()
    eps = EPS[label]
    if label == "ln":
        out = {"public": lambda: treefold.layer_norm(x, (n,), w, b, eps)}
        impl = lambda **o: norms.layer_norm_impl(x, w, b, eps, store_stats=False, **o)[0]  # noqa: E731
        compiled = torch.compile(lambda x, w, b: F.layer_norm(x, (n,), w, b, eps))
        out["compile"] = lambda: compiled(x, w, b)
    else:
        out = {"public": lambda: treefold.rms_norm(x, w, eps)}
        impl = lambda **o: norms.rms_norm_impl(x, w, None, eps, 0.0, "llama", x.dtype,  # noqa: E731
                                               store_stats=False, **o)[0]

        def hf(x, w):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return w * h.to(x.dtype)
        compiled = torch.compile(hf)
        out["compile"] = lambda: compiled(x, w)
    for name, options in launches.items():
        out[name] = lambda o=options: impl(**o)
    return {f"{label} {dtype} {m}x{n} {name}": (fn, moved) for name, fn in out.items()}


LARGE = [("ln", 65536, 1024, "bf16", {"impl": {}}),
         ("ln", 8192, 4096, "bf16", {"impl": {}}),
         ("rms", 16384, 8192, "bf16", {"impl": {}}),
         ("rms", 65536, 1024, "bf16", {"impl": {}}),
         ("rms", 8192, 4096, "fp32", {"impl": {}})]

#: decode batches, flushed (the bench's eager column): the default holds each row in one program
DECODE = [("rms", 64, 8192, "bf16", {"impl": {}, "2w": dict(num_warps=2), "8w": dict(num_warps=8),
                                     "16w": dict(num_warps=16), "twice 8w": dict(read_twice=True, num_warps=8),
                                     "split 2": dict(segments_per_program=2)}),
          ("rms", 1, 4096, "bf16", {"impl": {}, "2w": dict(num_warps=2), "8w": dict(num_warps=8),
                                    "twice 4w": dict(read_twice=True, num_warps=4)})]


def main(out_dir: str) -> None:
    torch.manual_seed(0)
    for which, cases in (("large", LARGE), ("decode", DECODE)):
        variants = {}
        for case in cases:
            variants.update(_variants(*case))
        unequal, first = [], {}
        for name, (fn, _) in variants.items():
            y = fn().clone()
            key = " ".join(name.split(" ")[:3])
            if key not in first:
                first[key] = y
            elif "compile" not in name and not torch.equal(_bits(y), _bits(first[key])):
                unequal.append(name)
        print("bits equal among the treefold variants" if not unequal else f"NOT EQUAL: {unequal}")
        time_against_roof({k: v[0] for k, v in variants.items()}, {k: v[1] for k, v in variants.items()},
                          os.path.join(out_dir, f"probe-public-norms-{which}.json") if out_dir else "",
                          unequal=unequal)




def kernel_durations(out_dir: str) -> None:
    """The norm kernel's own duration (the profiler's, CUPTI) of the public call and of the
    launch, each after an L2 flush as do_bench makes it: whether the gap do_bench shows is the
    kernel's or the timing's."""
    from torch.profiler import ProfilerActivity, profile
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    lines = []
    for label, m, n in (("ln", 65536, 1024), ("rms", 65536, 1024), ("rms", 16384, 8192), ("rms", 1, 4096)):
        variants = _variants(label, m, n, "bf16", {"impl": {}})
        for name, (fn, _) in variants.items():
            if name.endswith("compile"):
                continue
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(50):
                    cache.zero_()
                    fn()
                torch.cuda.synchronize()
            times = sorted(e.device_time for e in prof.events() if "norm_forward" in e.name)
            line = (f"{name:32s} kernel median {times[len(times) // 2]:7.2f} us  min {times[0]:7.2f}  "
                    f"({len(times)} launches)")
            print(line)
            lines.append(line)
    if out_dir:
        with open(os.path.join(out_dir, "probe-public-norms-kernels.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "kernels":
        kernel_durations(sys.argv[1])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "")
