"""RMSNorm and LayerNorm on the GPU: check every treefold strategy, then time it against its peers.

Run from the repository root on a CUDA machine (under two minutes):

    python benchmarks/gpu_norms.py                  # all cases
    python benchmarks/gpu_norms.py --quick          # the default launch of each case only
    source .peers/activate.sh; python benchmarks/gpu_norms.py   # with Liger-Kernel and QuACK

1. Checks, on the device: every launch variant of a case gives the bits of the default launch,
   twice in a row (determinism); the default matches the CPU reference
   (``treefold.reference.norms``) bit for bit on a sample of rows; bfloat16 output agrees with
   Hugging Face's eager code on >= 99.99% of elements. Backward: dx and dweight identical across
   variants and runs; float32 backward equal to the CPU reference.
2. Times (``triton.testing.do_bench``, median, L2 flushed) treefold, its launch variants, torch
   eager, Hugging Face's eager code, torch.compile of it (two shapes), Liger-Kernel and QuACK
   when importable, and a 1 GiB device-to-device copy: the roof, in the same run.
   Bytes = inputs read once + outputs written once (backward: read x, read dy, write dx).
3. Host time per eager call at 1 x 4096 (1000 calls, no synchronisation inside the loop): the
   public functions, the implementation without validation, and forward + backward through
   autograd, against torch's.

Prints the variant and check lines as it goes and a short table last; writes everything to
``$OUT/norms.json`` when OUT is set. A failing variant or peer is reported and skipped. A time
budget (``--budget`` seconds, default 100) drops the remaining optional measurements (variants,
peers) when exceeded; the default treefold launches and torch eager are always measured.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import treefold  # noqa: E402
from treefold import order  # noqa: E402
from treefold._ops import norms as ops  # noqa: E402
from treefold.reference import norms as ref  # noqa: E402

EPS = 1e-6
SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
START = time.perf_counter()
ROWS = []      # every timing: dicts
CHECKS = []    # every check: dicts
NOTES = []     # peers missing, failures, skipped work


def elapsed() -> float:
    return time.perf_counter() - START


def note(msg: str) -> None:
    NOTES.append(msg)
    print(msg, flush=True)


def bench_us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.detach(), b.detach()
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    eq = (a.view(ints) == b.view(ints)) | (torch.isnan(a) & torch.isnan(b))
    return bool(eq.all())


def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a == b).double().mean().item()


def check(name: str, ok: bool, detail: str = "") -> bool:
    CHECKS.append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"  [{'ok' if ok else 'FAIL'}] {name}{(': ' + detail) if detail else ''}", flush=True)
    return ok


# --------------------------------------------------------------------------------------------
# Peers
# --------------------------------------------------------------------------------------------

def hf_llama_rms_norm(hidden_states, weight, eps=EPS):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def hf_add_rms_norm(x, residual, weight, eps=EPS):
    h = x + residual
    return hf_llama_rms_norm(h, weight, eps), h


def load_peers() -> dict:
    peers = {}
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
        from liger_kernel.transformers.layer_norm import LigerLayerNorm
        peers["liger_rms"] = LigerRMSNorm
        peers["liger_ln"] = LigerLayerNorm
    except Exception as e:  # noqa: BLE001
        note(f"peer Liger-Kernel skipped: {type(e).__name__}: {e}")
    try:
        from quack.rmsnorm import rmsnorm as quack_rmsnorm
        peers["quack_rms"] = quack_rmsnorm
        try:
            from quack.layernorm import layernorm as quack_layernorm
        except Exception:  # noqa: BLE001
            from quack.rmsnorm import layernorm as quack_layernorm
        peers["quack_ln"] = quack_layernorm
    except Exception as e:  # noqa: BLE001
        note(f"peer QuACK skipped: {type(e).__name__}: {e}")
    return peers


# --------------------------------------------------------------------------------------------
# Recording
# --------------------------------------------------------------------------------------------

def record(op, shape, dtype, strategy, fn, nbytes, roof, *, optional=True, kind="peer", budget=100.0):
    """Time ``fn`` and append a row; failures and budget skips become notes."""
    if optional and elapsed() > budget:
        note(f"skipped (time budget): {op} {shape} {strategy}")
        return None
    try:
        us = bench_us(fn)
    except Exception as e:  # noqa: BLE001
        note(f"FAILED {op} {shape} {strategy}: {type(e).__name__}: {str(e)[:200]}")
        return None
    gbs = nbytes / (us * 1e-6) / 1e9
    row = {"op": op, "shape": shape, "dtype": SHORT[dtype], "strategy": strategy,
           "kind": kind, "us": us, "gbs": gbs, "pct_roof": 100.0 * gbs / roof, "bytes": nbytes}
    ROWS.append(row)
    return row


def roof_gbs() -> float:
    n = (1 << 30) // 4
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    us = bench_us(lambda: dst.copy_(src))
    del src, dst
    return 2 * (1 << 30) / (us * 1e-6) / 1e9


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------

def _default_launch(n: int, is_rms: bool, has_residual: bool = False) -> tuple[int, int]:
    """(rows per program, warps) of the default launch of a bf16 row with a weight, as
    ``_forward_plan`` decides it (rows read twice and rows with a residual included)."""
    rows, _, plan = ops._forward_plan(n, torch.bfloat16, is_rms, has_residual, True, not is_rms, False, is_rms,
                                      False, None, None)
    return rows, plan["num_warps"]


def fwd_variants(m: int, n: int, quick: bool, is_rms: bool = True, has_residual: bool = False):
    """(name, launch keywords) besides the default: half the warps (twice the elements per
    thread), twice the rows and warps (same elements per thread, a bigger tile), and twice the
    warps; tiles up to 32768 elements, and only rows the batch has. Rows wider than 8192 also
    shared among programs of 4096 and 8192 elements (``segments_per_program``)."""
    if quick:
        return []
    rpp, warps = _default_launch(n, is_rms, has_residual)
    out = [(rpp, warps // 2), (rpp * 2, warps * 2), (rpp, warps * 2)]
    variants = [(f"r{r} w{w}", dict(rows_per_program=r, num_warps=w))
                for r, w in out if 1 <= w <= 32 and r * ops.row_block(n) <= 32768 and r <= max(m, 1)]
    lanes = order.lanes(n)
    if ops.row_block(n) > 8192:
        variants += [(f"spp{h} w{ops._warps_for(h * lanes)}", dict(segments_per_program=h))
                     for h in (4096 // lanes, 8192 // lanes) if h >= 1]
    return variants


def _default_name(n: int, is_rms: bool, has_residual: bool = False) -> str:
    rpp, warps = _default_launch(n, is_rms, has_residual)
    return f"r{rpp} w{warps}"


def rms_forward_case(m, n, dtype, residual, roof, peers, args, compile_hf=False):
    op = "add+rmsnorm" if residual else "rmsnorm"
    shape = f"{m}x{n}"
    print(f"\n{op} {shape} {str(dtype).replace('torch.', '')}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(m * 131 + n)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    r = torch.randn(m, n, device="cuda", dtype=dtype, generator=g) if residual else None
    isz = x.element_size()
    nbytes = m * n * isz * (4 if residual else 2) + n * w.element_size()

    def run_tf(**launch):
        return ops.rms_norm_impl(x, w, r, EPS, 0.0, "llama", dtype, store_stats=False, **launch)

    # checks
    base_y, base_h, _ = run_tf()
    again_y, again_h, _ = run_tf()
    check(f"{op} {shape} deterministic", same_bits(base_y, again_y) and (r is None or same_bits(base_h, again_h)))
    rows = slice(0, min(m, 256))
    want_y, want_h, _ = ref.rms_norm(x[rows].cpu(), w.cpu(), EPS, None if r is None else r[rows].cpu(),
                                     0.0, "llama", dtype)
    check(f"{op} {shape} = CPU reference bits (rows 0-{rows.stop - 1})",
          same_bits(base_y[rows].cpu(), want_y) and (r is None or same_bits(base_h[rows].cpu(), want_h)))
    if residual:
        hf_y, _ = hf_add_rms_norm(x, r, w)
    else:
        hf_y = hf_llama_rms_norm(x, w)
    if dtype == torch.bfloat16:
        a = agreement(base_y, hf_y)
        check(f"{op} {shape} agrees with HF eager", a >= 0.9999, f"{100 * a:.4f}% bitwise equal")

    # timings
    if residual:
        torch_fn = lambda: F.rms_norm(x + r, (n,), w, EPS)  # noqa: E731
    else:
        torch_fn = lambda: F.rms_norm(x, (n,), w, EPS)  # noqa: E731
    record(op, shape, dtype, "torch eager (F.rms_norm)", torch_fn, nbytes, roof, optional=False, kind="torch")
    record(op, shape, dtype, "treefold", (lambda: treefold.rms_norm(x, w, EPS, residual=r)), nbytes, roof,
           optional=False, kind="treefold")
    record(op, shape, dtype, f"treefold default {_default_name(n, True, bool(residual))} (impl)", lambda: run_tf(),
           nbytes, roof, optional=False, kind="treefold-impl")
    if m * n <= 8192:
        try:
            us = triton.testing.do_bench_cudagraph(lambda: run_tf(), rep=100, return_mode="median") * 1e3
            gbs = nbytes / (us * 1e-6) / 1e9
            ROWS.append({"op": op, "shape": shape, "dtype": SHORT[dtype],
                         "strategy": "treefold in a CUDA graph", "kind": "treefold-graph", "us": us, "gbs": gbs,
                         "pct_roof": 100 * gbs / roof, "bytes": nbytes})
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} cuda graph: {type(e).__name__}: {str(e)[:200]}")
    line = []
    for label, launch in fwd_variants(m, n, args.quick, has_residual=bool(residual)):
        name = f"treefold {label}"
        try:
            y, h, _ = run_tf(**launch)
            ok = same_bits(y, base_y) and (r is None or same_bits(h, base_h))
            check(f"{op} {shape} {name} = default bits", ok)
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} {name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        row = record(op, shape, dtype, name, (lambda launch=launch: run_tf(**launch)),
                     nbytes, roof, kind="variant", budget=args.budget)
        if row:
            line.append(f"{name[9:]} {row['pct_roof']:.1f}%")
    if line:
        print("  variants: " + " | ".join(line), flush=True)
    hf_fn = (lambda: hf_add_rms_norm(x, r, w)) if residual else (lambda: hf_llama_rms_norm(x, w))
    record(op, shape, dtype, "HF eager", hf_fn, nbytes, roof, budget=args.budget)
    if compile_hf and not args.quick:
        try:
            fn = torch.compile(hf_add_rms_norm if residual else hf_llama_rms_norm, dynamic=False)
            record(op, shape, dtype, "torch.compile(HF)", (lambda: fn(x, r, w)) if residual else (lambda: fn(x, w)),
                   nbytes, roof, budget=args.budget)
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} torch.compile: {type(e).__name__}: {str(e)[:200]}")
    if "liger_rms" in peers and not residual:
        try:
            mod = peers["liger_rms"](n, eps=EPS, in_place=False).to("cuda", dtype)
            with torch.no_grad():
                mod.weight.copy_(w)
            a = agreement(mod(x), hf_y)
            record(op, shape, dtype, f"Liger (HF agree {100 * a:.2f}%)", lambda: mod(x), nbytes, roof,
                   budget=args.budget)
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} Liger: {type(e).__name__}: {str(e)[:200]}")
    if "quack_rms" in peers:
        try:
            q = peers["quack_rms"]
            if residual:
                fn = lambda: q(x, w, residual=r, eps=EPS, prenorm=True)  # noqa: E731
                out = fn()[0]
            else:
                fn = lambda: q(x, w, eps=EPS)  # noqa: E731
                out = fn()
            a = agreement(out, hf_y)
            record(op, shape, dtype, f"QuACK (HF agree {100 * a:.2f}%)", fn, nbytes, roof, budget=args.budget)
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} QuACK: {type(e).__name__}: {str(e)[:200]}")
    del x, w, r, base_y, base_h, again_y, again_h
    torch.cuda.empty_cache()


def ln_forward_case(m, n, dtype, roof, peers, args):
    op, shape = "layernorm", f"{m}x{n}"
    print(f"\n{op} {shape} {str(dtype).replace('torch.', '')}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    b = (0.1 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    nbytes = 2 * m * n * x.element_size() + 2 * n * w.element_size()

    def run_tf(**launch):
        return ops.layer_norm_impl(x, w, b, 1e-5, store_stats=False, **launch)[0]

    base = run_tf()
    check(f"{op} {shape} deterministic", same_bits(base, run_tf()))
    rows = slice(0, min(m, 256))
    want, _, _ = ref.layer_norm(x[rows].cpu(), w.cpu(), b.cpu(), 1e-5)
    check(f"{op} {shape} = CPU reference bits (rows 0-{rows.stop - 1})", same_bits(base[rows].cpu(), want))
    torch_y = F.layer_norm(x, (n,), w, b, 1e-5)
    check(f"{op} {shape} agrees with F.layer_norm", agreement(base, torch_y) >= 0.999,
          f"{100 * agreement(base, torch_y):.4f}% bitwise equal")
    record(op, shape, dtype, "torch eager (F.layer_norm)", lambda: F.layer_norm(x, (n,), w, b, 1e-5), nbytes, roof,
           optional=False, kind="torch")
    record(op, shape, dtype, "treefold", lambda: treefold.layer_norm(x, n, w, b), nbytes, roof, optional=False,
           kind="treefold")
    record(op, shape, dtype, f"treefold default {_default_name(n, False)} (impl)", lambda: run_tf(), nbytes, roof,
           optional=False, kind="treefold-impl")
    line = []
    for label, launch in fwd_variants(m, n, args.quick, is_rms=False):
        name = f"treefold {label}"
        try:
            check(f"{op} {shape} {name} = default bits", same_bits(run_tf(**launch), base))
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} {name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        row = record(op, shape, dtype, name, (lambda launch=launch: run_tf(**launch)),
                     nbytes, roof, kind="variant", budget=args.budget)
        if row:
            line.append(f"{name[9:]} {row['pct_roof']:.1f}%")
    if line:
        print("  variants: " + " | ".join(line), flush=True)
    if "liger_ln" in peers:
        try:
            mod = peers["liger_ln"](n, eps=1e-5, bias=True).to("cuda", dtype)
            with torch.no_grad():
                mod.weight.copy_(w)
                mod.bias.copy_(b)
            record(op, shape, dtype, "Liger", lambda: mod(x), nbytes, roof, budget=args.budget)
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} Liger: {type(e).__name__}: {str(e)[:200]}")
    if "quack_ln" in peers:
        try:
            w32 = w.float()
            record(op, shape, dtype, "QuACK (no bias, fp32 weight)", lambda: peers["quack_ln"](x, w32, eps=1e-5),
                   nbytes, roof, budget=args.budget)
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} QuACK: {type(e).__name__}: {str(e)[:200]}")
    del x, w, b, base
    torch.cuda.empty_cache()


def backward_case(m, n, dtype, is_rms, roof, peers, args):
    op = "rmsnorm backward" if is_rms else "layernorm backward"
    shape = f"{m}x{n}"
    print(f"\n{op} {shape} {str(dtype).replace('torch.', '')}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g).requires_grad_()
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(n, device="cuda", generator=g)).to(dtype).requires_grad_()
    dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    nbytes = 3 * m * n * x.element_size() + 2 * n * w.element_size() * (1 if is_rms else 2)
    params = (x, w) if is_rms else (x, w, b)

    def forward(fn_kind):
        if fn_kind == "treefold":
            return treefold.rms_norm(x, w, EPS) if is_rms else treefold.layer_norm(x, n, w, b)
        return F.rms_norm(x, (n,), w, EPS) if is_rms else F.layer_norm(x, (n,), w, b, 1e-5)

    y = forward("treefold")
    base = torch.autograd.grad(y, params, dy, retain_graph=True)
    again = torch.autograd.grad(y, params, dy, retain_graph=True)
    check(f"{op} {shape} deterministic (dx, dweight{'' if is_rms else ', dbias'})",
          all(same_bits(p, q) for p, q in zip(base, again)))
    yt = forward("torch")
    torch_grads = torch.autograd.grad(yt, params, dy, retain_graph=True)
    rel = [((p.float() - q.float()).norm() / q.float().norm()).item() for p, q in zip(base, torch_grads)]
    check(f"{op} {shape} close to torch's gradients", max(rel) < 2e-2,
          "relative L2 " + ", ".join(f"{v:.1e}" for v in rel))

    record(op, shape, dtype, "torch eager", lambda: torch.autograd.grad(yt, params, dy, retain_graph=True), nbytes,
           roof, optional=False, kind="torch")
    record(op, shape, dtype, "treefold", lambda: torch.autograd.grad(y, params, dy, retain_graph=True), nbytes, roof,
           optional=False, kind="treefold")

    # launch variants straight through the implementation (no autograd bookkeeping)
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    if is_rms:
        _, _, rstd = ops.rms_norm_impl(xd, wd, None, EPS, 0.0, "llama", dtype)
        mean = None
    else:
        _, mean, rstd = ops.layer_norm_impl(xd, wd, bd, 1e-5)

    def run_bwd(**launch):
        if is_rms:
            dx, _, dw = ops.rms_norm_backward_impl(dy, None, xd, wd, rstd, 0.0, "llama", dtype, None, True, **launch)
            return dx, dw
        return ops.layer_norm_backward_impl(dy, xd, wd, mean, rstd, True, dtype, **launch)

    default_rpb, default_warps, _ = ops.backward_config(m, n)
    # the default launch without autograd: the gap to the row above is host and autograd time
    record(op, shape, dtype, f"treefold default w{default_warps} (impl)", lambda: run_bwd(), nbytes, roof,
           optional=False, kind="treefold-impl")
    line = []
    # warps halved / doubled, software-pipelining stages 1 and 2 (Triton's default is 3), and
    # blocks of half the rows (a different weight-gradient order: timing only)
    variants = [] if args.quick else [
        (None, max(1, default_warps // 2), None), (None, min(32, default_warps * 2), None), (None, None, 1),
        (None, None, 2), (max(1, default_rpb // 2), None, None)]
    for rpb, nw, ns in variants:
        launch = {k: v for k, v in (("rows_per_block", rpb), ("num_warps", nw), ("num_stages", ns)) if v is not None}
        name = "treefold" + "".join(f" {tag}{v}" for tag, v in (("b", rpb), ("w", nw), ("s", ns)) if v is not None)
        try:
            got = run_bwd(**launch)
            if rpb is None:
                check(f"{op} {shape} {name} = default bits", all(same_bits(p, q) for p, q in zip(got, base)))
            else:
                name += " (another weight-grad order)"
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} {name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        row = record(op, shape, dtype, name, lambda launch=launch: run_bwd(**launch), nbytes, roof, kind="variant",
                     budget=args.budget)
        if row:
            line.append(f"{name[9:]} {row['pct_roof']:.1f}%")
    if line:
        print("  variants: " + " | ".join(line), flush=True)
    if is_rms and "liger_rms" in peers:
        try:
            mod = peers["liger_rms"](n, eps=EPS, in_place=False).to("cuda", dtype)
            with torch.no_grad():
                mod.weight.copy_(w)
            xl = x.detach().clone().requires_grad_()
            yl = mod(xl)
            record(op, shape, dtype, "Liger", lambda: torch.autograd.grad(yl, (xl, mod.weight), dy, retain_graph=True),
                   nbytes, roof, budget=args.budget)
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} Liger: {type(e).__name__}: {str(e)[:200]}")
    if not is_rms and "liger_ln" in peers:
        try:
            mod = peers["liger_ln"](n, eps=1e-5, bias=True).to("cuda", dtype)
            xl = x.detach().clone().requires_grad_()
            yl = mod(xl)
            record(op, shape, dtype, "Liger",
                   lambda: torch.autograd.grad(yl, (xl, mod.weight, mod.bias), dy, retain_graph=True),
                   nbytes, roof, budget=args.budget)
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} Liger: {type(e).__name__}: {str(e)[:200]}")
    if is_rms and "quack_rms" in peers:
        try:
            xq = x.detach().clone().requires_grad_()
            wq = w.detach().clone().requires_grad_()
            yq = peers["quack_rms"](xq, wq, eps=EPS)
            record(op, shape, dtype, "QuACK", lambda: torch.autograd.grad(yq, (xq, wq), dy, retain_graph=True),
                   nbytes, roof, budget=args.budget)
        except Exception as e:  # noqa: BLE001
            note(f"FAILED {op} {shape} QuACK: {type(e).__name__}: {str(e)[:200]}")
    del x, w, b, dy, y, yt, base, again, torch_grads
    torch.cuda.empty_cache()


def backward_reference_check():
    """float32 backward against the CPU reference, bit for bit (dx, dweight, dbias, dresidual)."""
    print("\nbackward float32 vs CPU reference", flush=True)
    m, n = 1000, 4096
    g = torch.Generator().manual_seed(3)
    x, r, dy, dh = (torch.randn(m, n, generator=g) for _ in range(4))
    w, b = 1 + 0.1 * torch.randn(n, generator=g), 0.1 * torch.randn(n, generator=g)
    xc, wc, rc, bc = (t.cuda().requires_grad_() for t in (x, w, r, b))
    y, h = treefold.rms_norm(xc, wc, EPS, residual=rc)
    dx, dw, dr = torch.autograd.grad((y, h), (xc, wc, rc), (dy.cuda(), dh.cuda()))
    _, want_h, rstd = ref.rms_norm(x, w, EPS, r)
    want_dx, _, want_dw = ref.rms_norm_backward(dy, want_h, w, rstd, dh_out=dh)
    check("rmsnorm+residual backward fp32 = CPU reference bits",
          same_bits(dx.cpu(), want_dx) and same_bits(dw.cpu(), want_dw) and same_bits(dr.cpu(), want_dx))
    got = torch.autograd.grad(treefold.layer_norm(xc, n, wc, bc), (xc, wc, bc), dy.cuda())
    _, mean, rstd = ref.layer_norm(x, w, b, 1e-5)
    want = ref.layer_norm_backward(dy, x, w, mean, rstd, bias_dtype=torch.float32)
    check("layernorm backward fp32 = CPU reference bits", all(same_bits(p.cpu(), q) for p, q in zip(got, want)))


def host_overhead():
    print("\nhost time per eager call, 1 x 4096 bf16", flush=True)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    dyg = torch.randn_like(x)
    out = {}
    for name, fn in [("treefold.rms_norm", lambda: treefold.rms_norm(x, w)),
                     ("treefold.rms_norm + residual", lambda: treefold.rms_norm(x, w, residual=r)),
                     ("treefold.layer_norm", lambda: treefold.layer_norm(x, 4096, w, w)),
                     ("ops.rms_norm_impl (no validation)",
                      lambda: ops.rms_norm_impl(x, w, None, EPS, 0.0, "llama", x.dtype, store_stats=False)),
                     ("treefold.rms_norm fwd+bwd (autograd)", lambda: torch.autograd.grad(
                         treefold.rms_norm(xg, wg, EPS), (xg, wg), dyg)),
                     ("F.rms_norm fwd+bwd (autograd)", lambda: torch.autograd.grad(
                         F.rms_norm(xg, (4096,), wg, EPS), (xg, wg), dyg)),
                     ("F.rms_norm", lambda: F.rms_norm(x, (4096,), w, EPS)),
                     ("F.layer_norm", lambda: F.layer_norm(x, (4096,), w, w))]:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(1000):
            fn()
        out[name] = (time.perf_counter() - t0) / 1000 * 1e6
        torch.cuda.synchronize()
        print(f"  {name:30s} {out[name]:6.1f} us/call", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="default launches only, no compile peer")
    parser.add_argument("--budget", type=float, default=100.0, help="seconds before optional work is dropped")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this (e.g. backward)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__}", flush=True)
    peers = load_peers()
    roof = roof_gbs()
    print(f"roof (1 GiB device-to-device copy, read + write): {roof:.0f} GB/s", flush=True)

    bf16, fp32 = torch.bfloat16, torch.float32
    stages = [
        ("rmsnorm 8192x4096", lambda: rms_forward_case(8192, 4096, bf16, False, roof, peers, args, compile_hf=True)),
        ("rmsnorm 32768x4096", lambda: rms_forward_case(32768, 4096, bf16, False, roof, peers, args)),
        ("rmsnorm 16384x8192", lambda: rms_forward_case(16384, 8192, bf16, False, roof, peers, args, compile_hf=True)),
        ("rmsnorm 4096x16384", lambda: rms_forward_case(4096, 16384, bf16, False, roof, peers, args)),
        ("rmsnorm 65536x1024", lambda: rms_forward_case(65536, 1024, bf16, False, roof, peers, args)),
        ("rmsnorm 64x8192", lambda: rms_forward_case(64, 8192, bf16, False, roof, peers, args)),
        ("rmsnorm 1x4096", lambda: rms_forward_case(1, 4096, bf16, False, roof, peers, args)),
        ("add+rmsnorm 32768x4096", lambda: rms_forward_case(32768, 4096, bf16, True, roof, peers, args)),
        ("add+rmsnorm 8192x4096", lambda: rms_forward_case(8192, 4096, bf16, True, roof, peers, args)),
        ("add+rmsnorm 1x4096", lambda: rms_forward_case(1, 4096, bf16, True, roof, peers, args)),
        ("rmsnorm fp32 8192x4096", lambda: rms_forward_case(8192, 4096, fp32, False, roof, peers, args)),
        ("layernorm 8192x4096", lambda: ln_forward_case(8192, 4096, bf16, roof, peers, args)),
        ("layernorm 16384x8192", lambda: ln_forward_case(16384, 8192, bf16, roof, peers, args)),
        ("rmsnorm backward 32768x4096", lambda: backward_case(32768, 4096, bf16, True, roof, peers, args)),
        ("rmsnorm backward 16384x8192", lambda: backward_case(16384, 8192, bf16, True, roof, peers, args)),
        ("layernorm backward 16384x8192", lambda: backward_case(16384, 8192, bf16, False, roof, peers, args)),
        ("backward fp32 reference", backward_reference_check),
    ]
    for name, stage in stages:
        if args.only and args.only not in name:
            continue
        try:
            stage()
        except Exception as e:  # noqa: BLE001
            note(f"FAILED stage: {type(e).__name__}: {str(e)[:300]}")
            traceback.print_exc()
            torch.cuda.empty_cache()
    host = {}
    try:
        host = host_overhead()
    except Exception as e:  # noqa: BLE001
        note(f"FAILED host overhead: {type(e).__name__}: {e}")

    # vs torch: torch eager's median over this row's (same op and shape)
    torch_us = {(r["op"], r["shape"], r["dtype"]): r["us"] for r in ROWS if r["kind"] == "torch"}
    for r in ROWS:
        t = torch_us.get((r["op"], r["shape"], r["dtype"]))
        r["vs_torch"] = (t / r["us"]) if t else None

    failed = [c for c in CHECKS if not c["ok"]]
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "norms.json")
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "roof_gbs": roof, "rows": ROWS, "checks": CHECKS,
                       "host_us_per_call": host, "notes": NOTES, "elapsed_s": elapsed(),
                       "command": "python benchmarks/gpu_norms.py" + (" --quick" if args.quick else "")}, f, indent=1)
        print(f"\nwrote {path}")

    # the short table: treefold, its best variant, and every peer, per case
    print(f"\nroof {roof:.0f} GB/s | checks: {len(CHECKS) - len(failed)} ok, {len(failed)} failed | "
          f"{elapsed():.0f} s")
    for c in failed:
        print(f"  FAILED CHECK: {c['check']} {c['detail']}")
    print(f"{'op':19} {'shape':11} {'dtype':5} {'strategy':34} {'us':>9} {'GB/s':>6} {'%roof':>6} {'vs torch':>8}")
    cases = []
    for r in ROWS:
        key = (r["op"], r["shape"], r["dtype"])
        if key not in cases:
            cases.append(key)
    for key in cases:
        rows = [r for r in ROWS if (r["op"], r["shape"], r["dtype"]) == key]
        best_variant = max((r for r in rows if r["kind"] == "variant"), key=lambda r: r["gbs"], default=None)
        for r in rows:
            if r["kind"] == "variant" and r is not best_variant:
                continue
            label = r["strategy"] if r["kind"] != "variant" else r["strategy"] + " (best variant)"
            vs = f"{r['vs_torch']:.2f}x" if r["vs_torch"] else "-"
            print(f"{r['op']:19} {r['shape']:11} {r['dtype']:5} {label[:34]:34} {r['us']:9.1f} "
                  f"{r['gbs']:6.0f} {r['pct_roof']:6.1f} {vs:>8}")
    if host:
        print("host us/call (1x4096): " + ", ".join(f"{k} {v:.1f}" for k, v in host.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
