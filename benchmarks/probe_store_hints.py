"""The output stores with the L2 evict-first policy (``store_hint``) against the default policy,
for the row kernels that stream: the softmax forward ("online" reads each row twice, the second
time from L2 if the row is still there; "cooperative" and "block" read once) and backward, and
the norm forward (RMSNorm rows of 16384 are read twice). bf16, every variant first checked bit
for bit against its case's default, then three interleaved rounds, do_bench median, L2 flushed;
bytes: read x (and the residual, or y and dy), write y (and h, or dx).

    python benchmarks/probe_store_hints.py [OUT_DIR]        (CUDA)
    python benchmarks/probe_store_hints.py --ncu NAME       one variant, four times, for ncu

Under Nsight Compute, the DRAM bytes of a variant say whether its second read came from L2:

    ncu --clock-control none --kernel-name regex:'softmax_kernel|norm_forward_kernel' \
        --launch-skip 3 --launch-count 1 --metrics dram__bytes_read.sum,dram__bytes_write.sum \
        python benchmarks/probe_store_hints.py --ncu "softmax 4096x32768 no store hint"
"""
import os
import sys

import torch

from treefold._ops import norms
from treefold._ops import softmax as sm

from probe_report import time_against_roof

_EF = "evict_first"
#: (label, rows, length, the variants: name -> launch options). RMSNorm rows of 16384 are read
#: twice and store with evict-first by default; the others store with no hint by default.
NORM_CASES = [
    ("rms", 4096, 16384, {"default": {}, "no store hint": dict(store_hint="")}),
    ("rms", 16384, 8192, {"default": {}, "stores evict_first": dict(store_hint=_EF)}),
    ("rms", 32768, 4096, {"default": {}, "stores evict_first": dict(store_hint=_EF)}),
    ("rms+residual", 32768, 4096, {"default": {}, "stores evict_first": dict(store_hint=_EF)}),
    ("ln", 16384, 8192, {"default": {}, "stores evict_first": dict(store_hint=_EF)}),
]
_T = sm.Tuning
#: (label, rows, length, the variants: name -> (strategy, Tuning)). The forward "online" launch
#: (the default at 4096 x 32768) stores with evict-first by default; the others with no hint.
SOFTMAX_CASES = [
    ("softmax", 4096, 32768, {"default": ("auto", _T()),
                              "no store hint": ("auto", _T(store_hint="")),
                              "no read hints": ("auto", _T(hints=False)),
                              "8 warps": ("online", _T(num_warps=8)),
                              "blocks of 16384, 8 warps": ("online", _T(seg_block=4, num_warps=8)),
                              "blocks of 16384, 16 warps": ("online", _T(seg_block=4, num_warps=16)),
                              "one block, 16 warps": ("online", _T(seg_block=8, num_warps=16)),
                              "one block, 32 warps": ("online", _T(seg_block=8, num_warps=32))}),
    ("log_softmax", 4096, 32768, {"default": ("auto", _T()), "no store hint": ("auto", _T(store_hint=""))}),
    ("softmax", 256, 131072, {"default": ("auto", _T()),
                              "stores evict_first": ("auto", _T(store_hint=_EF)),
                              "online": ("online", _T())}),
    ("softmax", 32768, 8192, {"default": ("auto", _T()), "stores evict_first": ("auto", _T(store_hint=_EF))}),
    ("softmax", 8192, 4096, {"default": ("auto", _T()), "stores evict_first": ("auto", _T(store_hint=_EF))}),
    ("softmax backward", 4096, 32768, {"default": ("auto", _T()),
                                       "stores evict_first": ("auto", _T(store_hint=_EF))}),
    ("softmax backward", 8192, 4096, {"default": ("auto", _T()),
                                      "stores evict_first": ("auto", _T(store_hint=_EF))}),
]


def _norm_call(label, x, r, w, b, options):
    if label == "ln":
        return lambda: norms.layer_norm_impl(x, w, b, 1e-5, store_stats=False, **options)[:1]
    res = r if label == "rms+residual" else None
    return lambda: norms.rms_norm_impl(x, w, res, 1e-6, 0.0, "llama", x.dtype, store_stats=False, **options)[:2]


def _softmax_call(label, x, y, dy, strategy, tuning):
    if label in ("softmax", "log_softmax"):
        return lambda: (sm.softmax_forward(x, log=label == "log_softmax", strategy=strategy, tuning=tuning),)
    return lambda: (sm.softmax_backward(dy, y, strategy=strategy, tuning=tuning),)


def cases(only: str = ""):
    """{name: (call, bytes moved, its case)} of every variant (or of the one named ``only``)."""
    out = {}
    for label, m, n, variants in NORM_CASES:
        if only and not only.startswith(f"{label} {m}x{n} "):
            continue
        x = torch.randn(m, n, device="cuda").bfloat16()
        r = torch.randn(m, n, device="cuda").bfloat16()
        w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16()
        b = (0.1 * torch.randn(n, device="cuda")).bfloat16()
        moved = (4 if label == "rms+residual" else 2) * x.numel() * x.element_size()
        for name, options in variants.items():
            out[f"{label} {m}x{n} {name}"] = (_norm_call(label, x, r, w, b, options), moved, f"{label} {m}x{n}")
    for label, m, n, variants in SOFTMAX_CASES:
        if only and not only.startswith(f"{label} {m}x{n} "):
            continue
        x = (3 * torch.randn(m, n, device="cuda")).bfloat16()
        y = torch.softmax(x.float(), -1).bfloat16()
        dy = torch.randn(m, n, device="cuda").bfloat16()
        moved = (3 if label == "softmax backward" else 2) * x.numel() * x.element_size()
        for name, choice in variants.items():
            out[f"{label} {m}x{n} {name}"] = (_softmax_call(label, x, y, dy, *choice), moved, f"{label} {m}x{n}")
    return {k: v for k, v in out.items() if not only or k == only}


def main(out_dir):
    torch.manual_seed(0)
    variants = cases()
    unequal, first = [], {}
    for name, (fn, _, case) in variants.items():
        out = [t.clone() for t in fn() if t is not None]
        if case not in first:
            first[case] = out
        elif not all(torch.equal(a.view(torch.int16), c.view(torch.int16)) for a, c in zip(out, first[case])):
            unequal.append(name)
    print("bits equal to the default in every case" if not unequal else f"NOT EQUAL: {unequal}")
    time_against_roof({k: v[0] for k, v in variants.items()}, {k: v[1] for k, v in variants.items()},
                      os.path.join(out_dir, "probe-store-hints.json") if out_dir else "", unequal=unequal)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--ncu":
        torch.manual_seed(0)
        (fn, _, _), = cases(sys.argv[2]).values()
        for _ in range(4):
            fn()
        torch.cuda.synchronize()
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "")
