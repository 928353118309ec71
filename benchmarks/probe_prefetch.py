"""Programs that loop over tiles of rows and load their next tile before working on the current
one ("prefetch"), against one program per tile, for the norms (forward and backward) and the
softmax rows held in registers (forward and backward), bf16 unless named.

Every variant is first checked bit for bit against the default launch, then all are timed in
three interleaved rounds (do_bench median, L2 flushed), so that a launch choice is told apart
from the run-to-run spread. Bytes: each input read once, each output written once.

    python benchmarks/probe_prefetch.py [OUT_DIR]    (CUDA; writes probe-prefetch.json there)
"""
import json
import os
import sys

import torch
import triton

from treefold._ops import norms
from treefold._ops import softmax as sm

ROUNDS = 3


def variants_forward_norm(kind, x, w, b, r):
    """name -> call for the norm forward at one shape."""
    def call(**launch):
        if kind == "rms":
            return lambda: norms.rms_norm_impl(x, w, r, 1e-6, 0.0, "llama", x.dtype, store_stats=False, **launch)[:2]
        return lambda: norms.layer_norm_impl(x, w, b, 1e-5, store_stats=False, **launch)[:1]
    out = {"default": call()}
    for per_sm in (2, 4, 8):
        out[f"{per_sm}/SM prefetch"] = call(programs=per_sm * SMS, prefetch=True)
    out["4/SM no prefetch"] = call(programs=4 * SMS, prefetch=False)
    return out


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
    return {"default": call(), "prefetch": call(prefetch=True), "no prefetch": call(prefetch=False),
            "prefetch 8 warps": call(prefetch=True, num_warps=8), "prefetch 16 warps": call(prefetch=True, num_warps=16)}


def variants_softmax(x, dy=None, y=None):
    def call(tuning):
        if dy is None:
            return lambda: (sm.softmax_forward(x, strategy="block", tuning=tuning),)
        return lambda: (sm.softmax_backward(dy, y, strategy="block", tuning=tuning),)
    out = {"default": (lambda: (sm.softmax_forward(x),)) if dy is None else (lambda: (sm.softmax_backward(dy, y),))}
    base = sm.plan(0, dy is not None, x.shape[-1], x.shape[0], SMS, x.element_size())
    for per_sm in (2, 4, 8):
        out[f"{per_sm}/SM prefetch"] = call(sm.Tuning(programs_per_sm=per_sm, prefetch=True))
    out["4/SM no prefetch"] = call(sm.Tuning(programs_per_sm=4, prefetch=False))
    if base.strategy == "block" and base.rows_per_program > 1:
        out["1 row/program, 4/SM prefetch"] = call(sm.Tuning(rows_per_program=1, programs_per_sm=4, prefetch=True))
    return out, base


def main(out_dir):
    global SMS
    SMS = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    cases = {}  # label -> (bytes, {variant: fn})
    for kind, (m, n) in [("rms", (8192, 4096)), ("rms", (32768, 4096)), ("rms", (16384, 8192)),
                         ("rms", (4096, 16384)), ("rms", (65536, 1024)), ("rms+res", (32768, 4096)),
                         ("ln", (8192, 4096)), ("ln", (16384, 8192))]:
        x = torch.randn(m, n, device="cuda").bfloat16()
        w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16()
        b = (0.1 * torch.randn(n, device="cuda")).bfloat16()
        r = torch.randn(m, n, device="cuda").bfloat16() if kind == "rms+res" else None
        streams = 4 if r is not None else 2
        cases[f"{kind} fwd {m}x{n}"] = (streams * m * n * 2, variants_forward_norm(kind.split("+")[0], x, w, b, r))
    for kind, (m, n) in [("rms", (32768, 4096)), ("rms", (16384, 8192)), ("ln", (16384, 8192))]:
        x = torch.randn(m, n, device="cuda").bfloat16()
        w = (1 + 0.1 * torch.randn(n, device="cuda")).bfloat16()
        dy = torch.randn(m, n, device="cuda").bfloat16()
        cases[f"{kind} bwd {m}x{n}"] = (3 * m * n * 2, variants_backward_norm(kind, x, w, dy))
    plans = {}
    for (m, n, dtype) in [(8192, 4096, torch.bfloat16), (32768, 8192, torch.bfloat16), (8192, 4096, torch.float32)]:
        x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
        label = f"softmax fwd {m}x{n}{'' if dtype == torch.bfloat16 else ' fp32'}"
        calls, plans[label] = variants_softmax(x)
        cases[label] = (2 * m * n * x.element_size(), calls)
    for (m, n) in [(8192, 4096), (4096, 32768)]:
        x = (torch.randn(m, n, device="cuda") * 3).bfloat16()
        y = sm.softmax_forward(x)
        dy = torch.randn(m, n, device="cuda").bfloat16()
        label = f"softmax bwd {m}x{n}"
        calls, plans[label] = variants_softmax(x, dy, y)
        cases[label] = (3 * m * n * 2, calls)

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
    times = {label: {name: [] for name in calls} for label, (_, calls) in cases.items()}
    for _ in range(ROUNDS):
        for label, (_, calls) in cases.items():
            for name, fn in calls.items():
                times[label][name].append(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3)
    src = torch.empty(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    roof = 2 * src.numel() * 4 / triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6
    result = {"device": torch.cuda.get_device_name(), "roof_GBps": roof, "checks": checks,
              "plans": {k: str(v.strategy) + f" rpp={v.rows_per_program} warps={v.num_warps}" for k, v in plans.items()},
              "times_us": times}
    if out_dir:
        with open(os.path.join(out_dir, "probe-prefetch.json"), "w") as f:
            json.dump(result, f, indent=1)
    bad = {k: v for k, v in checks.items() if v is not True}
    print(f"device {result['device']}, roof {roof:.0f} GB/s; {len(checks)} variants checked, not equal: {bad or 'none'}")
    print("default plans:", result["plans"])
    for label, (nbytes, _) in cases.items():
        print(label)
        for name, ts in times[label].items():
            pct = [100 * nbytes / t / 1e3 / roof for t in ts]
            print(f"  {name:30s} " + "  ".join(f"{t:7.1f} us {p:5.1f}%" for t, p in zip(ts, pct))
                  + f"   best {max(pct):5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
