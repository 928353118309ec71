"""The norm backward kernel loading each row's successor before working on the row ("prefetch"),
against not, at several warp counts, bf16.

(At commit 40c108b this probe also timed forward programs that loop over tiles of rows, with
and without loading the next tile ahead, for the norms and the softmax rows held in registers:
every such variant ran slower than one program per tile, and they were removed. Results:
``results/h200-probe-prefetch.txt``.)

Every variant is first checked bit for bit against the default launch, then all are timed in
three interleaved rounds (do_bench median, L2 flushed), so that a launch choice is told apart
from the run-to-run spread. Bytes: each input read once, each output written once.

    python benchmarks/probe_prefetch.py [OUT_DIR]    (CUDA; writes probe-prefetch.json there)
"""
import json
import os
import sys

import torch

from treefold._ops import norms
from treefold.bench.roofs import measure_copy_roof
from treefold.bench.timing import CudaTimer, interleaved_us

ROUNDS = 3


def variants_backward_norm(kind, x, w, dy):
    if kind == "rms":
        _, _, rstd = norms.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", x.dtype)
        def call(**launch):
            return lambda: norms.rms_norm_backward_impl(dy, None, x, w, rstd, 0.0, "llama", x.dtype, None, True,
                                                        **launch)[::2]
    else:
        _, mean, rstd = norms.layer_norm_impl(x, w, w, 1e-5)
        def call(**launch):
            return lambda: norms.layer_norm_backward_impl(dy, x, w, mean, rstd, True, x.dtype, **launch)
    return {"default": call(), "prefetch 4 warps": call(prefetch=True, num_warps=4), "no prefetch": call(prefetch=False, num_stages=1),
            "prefetch 8 warps": call(prefetch=True, num_warps=8), "prefetch 16 warps": call(prefetch=True, num_warps=16)}


def main(out_dir):
    torch.manual_seed(0)
    cases = {}  # label -> (bytes, {variant: fn})
    for kind, (m, n) in [("rms", (32768, 4096)), ("rms", (16384, 8192)), ("ln", (16384, 8192))]:
        x = torch.randn(m, n, device="cuda").bfloat16()
        w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16()
        dy = torch.randn(m, n, device="cuda").bfloat16()
        cases[f"{kind} bwd {m}x{n}"] = (3 * m * n * 2, variants_backward_norm(kind, x, w, dy))
    checks = {}
    for label, (_, calls) in cases.items():
        want = [t.clone() for t in calls["default"]() if t is not None]
        for name, fn in list(calls.items()):
            try:
                got = [t for t in fn() if t is not None]
                checks[f"{label} | {name}"] = all(torch.equal(a, b) for a, b in zip(got, want))
            except Exception as error:  # a variant that does not compile or fit is reported, not timed
                checks[f"{label} | {name}"] = f"failed: {error!r:.160}"
                del calls[name]
    timed = interleaved_us({(label, name): fn for label, (_, calls) in cases.items() for name, fn in calls.items()},
                           CudaTimer(warmup_ms=10, rep_ms=50), ROUNDS)
    times = {label: {name: timed[(label, name)] for name in calls} for label, (_, calls) in cases.items()}
    roof = measure_copy_roof(torch.device("cuda"), CudaTimer()).gbs
    result = {"device": torch.cuda.get_device_name(), "roof_GBps": roof, "checks": checks, "times_us": times}
    if out_dir:
        with open(os.path.join(out_dir, "probe-prefetch.json"), "w") as f:
            json.dump(result, f, indent=1)
    bad = {k: v for k, v in checks.items() if v is not True}
    print(f"device {result['device']}, roof {roof:.0f} GB/s; {len(checks)} variants checked, not equal: {bad or 'none'}")
    for label, (nbytes, _) in cases.items():
        print(label)
        for name, ts in times[label].items():
            pct = [100 * nbytes / t / 1e3 / roof for t in ts]
            print(f"  {name:30s} " + "  ".join(f"{t:7.1f} us {p:5.1f}%" for t, p in zip(ts, pct))
                  + f"   best {max(pct):5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
