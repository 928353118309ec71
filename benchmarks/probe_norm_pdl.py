"""``fused_add_rms_norm_(..., enable_pdl=True)`` against the ordinary launch, after the kernel
that writes its x (a decode layer's output projection stands in as a ``torch.mul``):

    python benchmarks/probe_norm_pdl.py [OUT_DIR]

Each timing is ``cuda_graph_us``: 20 pairs (mul, then the add + norm) captured in one CUDA graph,
L2 warm, the median replay per pair, in three interleaved rounds; the mul alone beside them. With
the dependent launch the norm's programs may start while the mul finishes, and wait for it in
place: the launch gap between the two (about a microsecond on an H200 in a graph) is what it can
take off. bf16, rows of 4096 and 8192 at decode batch sizes, and 4096 rows (prefill)."""
import json
import os
import sys

import torch

import treefold
from treefold.bench.timing import cuda_graph_us

SHAPES = ((1, 4096), (64, 4096), (64, 8192), (4096, 4096))


def main(out_dir: str = "") -> None:
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    cases = {}
    for m, n in SHAPES:
        base = torch.randn(m, n, device="cuda").bfloat16()
        x, r = torch.empty_like(base), torch.randn(m, n, device="cuda").bfloat16()
        w = (1 + 0.25 * torch.randn(n, device="cuda")).bfloat16()
        cases[(m, n, "mul alone")] = lambda base=base, x=x: torch.mul(base, 3.0, out=x)
        for pdl in (False, True):
            def pair(base=base, x=x, r=r, w=w, pdl=pdl):
                torch.mul(base, 3.0, out=x)
                treefold.fused_add_rms_norm_(x, r, w, 1e-6, enable_pdl=pdl)
            cases[(m, n, f"mul + norm, enable_pdl={pdl}")] = pair
    times = {key: [] for key in cases}
    for _ in range(3):
        for key, fn in cases.items():
            times[key].append(cuda_graph_us(fn))
    print("us per call in a CUDA graph (20 calls a replay, median replay), three rounds; best")
    for key, ts in times.items():
        print(f"  {key[0]:5d} x {key[1]:5d}  {key[2]:28s} " + "  ".join(f"{t:6.2f}" for t in ts) + f"   {min(ts):6.2f}")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "norm_pdl.json"), "w") as f:
            json.dump({f"{m}x{n} | {label}": ts for (m, n, label), ts in times.items()}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
