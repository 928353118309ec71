"""rms_norm backward on the H200: launch variants (same bits as the default) and other rows per
block (another weight-gradient order: dx bits equal, dw partials not comparable), time, % of a
copy roof (bytes: read x and dy, write dx). python benchmarks/probe_norm_backward.py (CUDA)."""
import torch, triton
from treefold._ops import norms as ops
torch.manual_seed(0)
def bench(fn): return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3
a = torch.empty(1 << 28, dtype=torch.float32, device="cuda"); b = torch.empty_like(a)
roof = 2 * a.numel() * 4 / bench(lambda: b.copy_(a)) / 1e9; del a, b
print(f"roof {roof:.0f} GB/s")
for m, n in [(32768, 4096), (16384, 8192)]:
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16); dy = torch.randn_like(x)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y, _, rstd = ops.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", torch.bfloat16)
    rpb, warps, stages = ops.backward_config(m, n)
    blocks = (m + rpb - 1) // rpb
    dx = torch.empty_like(x); part = torch.empty(blocks, n, device="cuda", dtype=torch.float32)
    def run(**kw):
        ops.launch_backward(dy, None, x, w, None, rstd.view(-1), dx, None, part, None, offset=0.0, is_rms=True,
                            round_normalised=True, rows_per_block=rpb, **kw)
    run(); want = (dx.clone(), part.clone())
    nbytes = 3 * m * n * 2
    print(f"{m}x{n}: rows_per_block {rpb}, default warps {warps} stages {stages}")
    for name, kw in [("default", {}), ("unroll2", {"unroll": 2}), ("unroll4", {"unroll": 4}),
                     ("stages2", {"num_stages": 2}), ("stages4", {"num_stages": 4}),
                     ("unroll2 stages2", {"unroll": 2, "num_stages": 2}), ("w8", {"num_warps": 8}),
                     ("w8 unroll2", {"num_warps": 8, "unroll": 2}), ("w2", {"num_warps": 2})]:
        try:
            dx.fill_(float("nan")); run(**kw)
            same = torch.equal(dx, want[0]) and torch.equal(part, want[1])
            t = bench(lambda: run(**kw))
            print(f"  {name:18s} {t*1e6:8.1f} us {nbytes/t/1e9/roof*100:6.1f}% same bits {same}")
        except Exception as e:
            print(f"  {name:18s} failed {e!r:.200}")
    for r in (8, 16, 32, 64):
        blocks_r = (m + r - 1) // r
        part_r = torch.empty(blocks_r, n, device="cuda", dtype=torch.float32)
        def run_r(r=r, part_r=part_r):
            ops.launch_backward(dy, None, x, w, None, rstd.view(-1), dx, None, part_r, None, offset=0.0,
                                is_rms=True, round_normalised=True, rows_per_block=r)
        dx.fill_(float("nan")); run_r()
        same_dx = torch.equal(dx, want[0])
        t = bench(run_r)
        extra = blocks_r * n * 4
        print(f"  rows_per_block {r:3d} ({blocks_r} programs) {t*1e6:8.1f} us {nbytes/t/1e9/roof*100:6.1f}% "
              f"(+{extra / 2**20:.0f} MiB of partials) dx same bits {same_dx}")
