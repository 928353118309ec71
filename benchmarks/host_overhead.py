"""Host time per eager call at decode sizes: 2000 calls with no synchronisation inside, wall time / 2000.

python benchmarks/host_overhead.py  (CUDA). Prints one line per call; what a decode step pays per
call outside a CUDA graph. HOST_CASES="argmax,sum" in the environment keeps the calls whose name
holds one of these. With OUT=dir it also writes dir/host_profile.txt: where the time of
each treefold call goes (cProfile, by own time), and the cost of the launch path's pieces.
"""
import cProfile
import itertools
import io
import os
import pstats
import time

import torch
import torch.nn.functional as F

import treefold
from treefold._ops import sampling as sampling_ops


def per_call_us(fn, calls=2000):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    dev = "cuda"
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    logits = torch.randn(1, 151936, device=dev)
    vocab = torch.randn(1, 151936, device=dev, dtype=torch.bfloat16)
    vocab64 = torch.randn(64, 151936, device=dev, dtype=torch.bfloat16)
    seeds = torch.arange(64, device=dev)
    steps = itertools.count()
    cases = [
        ("treefold.softmax 1x151936 bf16 (split)", lambda: treefold.softmax(vocab)),
        ("torch.softmax 1x151936 bf16", lambda: torch.softmax(vocab, -1)),
        ("treefold.softmax 64x151936 bf16 (split)", lambda: treefold.softmax(vocab64)),
        ("treefold.logsumexp 1x151936 bf16 (split)", lambda: treefold.logsumexp(vocab)),
        ("treefold.softmax 1x4096 bf16", lambda: treefold.softmax(x)),
        ("torch.softmax 1x4096 bf16", lambda: torch.softmax(x, -1)),
        ("treefold.logsumexp 1x4096 bf16", lambda: treefold.logsumexp(x)),
        ("treefold.rms_norm 1x4096 bf16", lambda: treefold.rms_norm(x, w)),
        ("F.rms_norm 1x4096 bf16", lambda: F.rms_norm(x, (4096,), w, 1e-6)),
        ("treefold.rms_norm + residual 1x4096", lambda: treefold.rms_norm(x, w, residual=r)),
        ("treefold.layer_norm 1x4096 bf16", lambda: treefold.layer_norm(x, (4096,), w, b)),
        ("F.layer_norm 1x4096 bf16", lambda: F.layer_norm(x, (4096,), w, b)),
        ("treefold.argmax 1x151936 fp32", lambda: treefold.argmax(logits, dim=-1)),
        ("torch.argmax 1x151936 fp32", lambda: torch.argmax(logits, -1)),
        ("treefold.argmax 64x151936 bf16", lambda: treefold.argmax(vocab64, dim=-1)),
        ("torch.argmax 64x151936 bf16", lambda: torch.argmax(vocab64, -1)),
        ("treefold.amax 1x151936 fp32, whole", lambda: treefold.amax(logits)),
        ("torch.amax 1x151936 fp32, whole", lambda: torch.amax(logits)),
        ("treefold.sum 1x151936 fp32, whole", lambda: treefold.sum(logits)),
        ("torch.sum 1x151936 fp32, whole", lambda: torch.sum(logits)),
        ("treefold.sum 1x4096 bf16, rows", lambda: treefold.sum(x, dim=-1)),
        ("torch.sum 1x4096 bf16, rows", lambda: torch.sum(x, -1)),
        ("treefold.norm 1x4096 bf16, rows", lambda: treefold.norm(x, dim=-1)),
        ("torch.linalg.vector_norm 1x4096 bf16", lambda: torch.linalg.vector_norm(x, dim=-1)),
        ("treefold.sample greedy 1x151936", lambda: treefold.sample(logits, temperature=0.0)),
        ("treefold.sample top_p 0.9 1x151936", lambda: treefold.sample(logits, top_p=0.9, seed=1)),
        # the same call without validation and prepared launches: the ordinary launch path
        ("sampling.sample_rows top_p 0.9 1x151936", lambda: sampling_ops.sample_rows(logits, 1.0, None, 0.9, None, 1, 0)),
        ("treefold.sample 1x151936, offset = step", lambda: treefold.sample(logits, seed=1, offset=next(steps))),
        ("treefold.sample top_k 50 64x151936 bf16", lambda: treefold.sample(vocab64, top_k=50, seed=seeds)),
        ("sampling.sample_rows top_k 50 64x151936 bf16", lambda: sampling_ops.sample_rows(vocab64, 1.0, 50, None, None, seeds, 0)),
        ("torch.multinomial(softmax) 1x151936", lambda: torch.multinomial(torch.softmax(logits, -1), 1)),
        ("treefold.top_k 50 1x151936 fp32", lambda: treefold.top_k(logits, 50)),
        ("sampling.top_k_rows 50 1x151936 fp32", lambda: sampling_ops.top_k_rows(logits, 50)),
        ("torch.topk 50 1x151936 fp32", lambda: torch.topk(logits, 50)),
        ("treefold.top_k 50 64x151936 bf16", lambda: treefold.top_k(vocab64, 50)),
        ("torch.topk 50 64x151936 bf16", lambda: torch.topk(vocab64, 50)),
        ("treefold.top_p_mask 0.9 1x151936 fp32", lambda: treefold.top_p_mask(logits, 0.9)),
        ("treefold.min_p_mask 0.05 probs 1x151936 fp32", lambda: treefold.min_p_mask(logits, 0.05, probs=True)),
    ]
    wanted = [c for c in os.environ.get("HOST_CASES", "").split(",") if c]
    cases = [(name, fn) for name, fn in cases if not wanted or any(w in name for w in wanted)]
    for name, fn in cases:
        try:
            print(f"host us/call  {name:40s} {per_call_us(fn):8.1f}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"host us/call  {name:40s} failed: {e!r:.120}", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "host_profile.txt"), "w") as f:
            pieces(x, f)
            for name, fn in cases:
                if name.startswith("treefold"):
                    profile(name, fn, f)


def pieces(x, f):
    """The launch path of softmax 1x4096, piece by piece (us per call)."""
    from treefold._ops import softmax as sm
    out = torch.empty_like(x)
    plan = sm._plan_for(sm._SOFTMAX, False, x.shape[-1], 1, x)
    phase = plan.phases[0]
    args = (x, x, out, x, x, x, x, 1, x.shape[-1], plan.num_segments, phase.programs_per_row, x.shape[-1],
            x.shape[-1], x.shape[-1], 1.0)
    compiled = sm._KERNEL(phase.grid, *args, **phase.kwargs)
    compiled = sm._KERNEL(phase.grid, *args, **phase.kwargs)
    stream = torch._C._cuda_getCurrentRawStream(0)
    values = sm._KERNEL._constexpr_values(phase.kwargs)
    tail = tuple(values[n] for n in sm._KERNEL._constexpr_names)
    ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args) + tail
    tens = args + tail
    rows = [
        ("torch.empty_like", lambda: torch.empty_like(x)),
        ("_plan_for", lambda: sm._plan_for(sm._SOFTMAX, False, x.shape[-1], 1, x)),
        ("Launcher call", lambda: sm._KERNEL(phase.grid, *args, **phase.kwargs)),
        ("compiled.run, tensors", lambda: compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata,
                                                       None, None, None, *tens)),
        ("compiled.run, addresses", lambda: compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata,
                                                         None, None, None, *ints)),
        ("torch.compiler.is_compiling", torch.compiler.is_compiling),
        ("current raw stream", lambda: torch._C._cuda_getCurrentRawStream(0)),
    ]
    for name, fn in rows:
        line = f"piece us/call  {name:40s} {per_call_us(fn):8.2f}"
        print(line, flush=True)
        f.write(line + "\n")


def profile(name, fn, f, calls=2000):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
    f.write(f"==== {name} ({calls} calls)\n{buf.getvalue()}\n")


if __name__ == "__main__":
    main()
