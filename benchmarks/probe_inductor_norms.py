"""What torch.compile (Inductor) generates for the norms where it beats treefold, and how fast.

    TORCHINDUCTOR_CACHE_DIR=DIR python benchmarks/probe_inductor_norms.py [OUT]  (CUDA)

For each case: compiles Hugging Face's Llama RMSNorm (or F.layer_norm) for one shape with
``dynamic=False`` as the bench's compile peer does, writes the generated source to
OUT/inductor-<case>.py, copies the autotuner's chosen config (the ``.best_config`` files of the
cache dir), and times the compiled call against treefold's with L2 flushed before each call
(triton.testing.do_bench, median), in three interleaved rounds. Prints a short table last.
"""
import glob
import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F
import triton
from torch._inductor.utils import run_and_get_code

import treefold
from treefold.bench.cases import hf_llama_rms_norm

CASES = [
    ("rms bf16 16384x8192", "rms", torch.bfloat16, 16384, 8192),
    ("rms fp32 8192x4096", "rms", torch.float32, 8192, 4096),
    ("rms bf16 65536x1024", "rms", torch.bfloat16, 65536, 1024),
    ("rms bf16 4096x16384", "rms", torch.bfloat16, 4096, 16384),
    ("rms bf16 8192x4096", "rms", torch.bfloat16, 8192, 4096),
    ("ln bf16 65536x1024", "ln", torch.bfloat16, 65536, 1024),
]


def main(out):
    os.makedirs(out, exist_ok=True)
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    rows = {}
    calls = {}
    for name, kind, dtype, m, n in CASES:
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype)
        if kind == "rms":
            src = lambda x=x, w=w: hf_llama_rms_norm(x, w)
            mine = lambda x=x, w=w: treefold.rms_norm(x, w, 1e-6)
        else:
            src = lambda x=x, w=w, b=b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
            mine = lambda x=x, w=w, b=b: treefold.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
        torch._dynamo.reset()
        before = set(glob.glob(os.path.join(cache, "**", "*.best_config"), recursive=True)) if cache else set()
        compiled = torch.compile(lambda: src(), dynamic=False)
        _, codes = run_and_get_code(compiled)
        tag = name.replace(" ", "-")
        with open(os.path.join(out, f"inductor-{tag}.py"), "w") as f:
            f.write("\n\n# ----- next module -----\n\n".join(codes))
        configs = []
        if cache:
            for p in sorted(set(glob.glob(os.path.join(cache, "**", "*.best_config"), recursive=True)) - before):
                with open(p) as f:
                    configs.append(json.load(f))
        with open(os.path.join(out, f"inductor-{tag}.best_config.json"), "w") as f:
            json.dump(configs, f, indent=1)
        calls[name] = (compiled, mine)
        rows[name] = {"configs": configs}
    results = {name: {"compile": [], "treefold": []} for name in calls}
    for _ in range(3):
        for name, (compiled, mine) in calls.items():
            for who, fn in (("compile", compiled), ("treefold", mine)):
                results[name][who].append(1e3 * triton.testing.do_bench(fn, warmup=25, rep=100))  # ms -> us
    with open(os.path.join(out, "probe-inductor-norms.json"), "w") as f:
        json.dump({"results": results, "rows": rows}, f, indent=1)
    print(f"{'case':24s} {'compile us':>24s} {'treefold us':>24s}  chosen config")
    for name, r in results.items():
        cfg = "; ".join(f"{c.get('XBLOCK', c.get('x', ''))}/{c.get('R0_BLOCK', c.get('RBLOCK', ''))} "
                        f"w{c.get('num_warps')}" for c in rows[name]["configs"])
        print(f"{name:24s} {' '.join(f'{t:7.1f}' for t in r['compile']):>24s} "
              f"{' '.join(f'{t:7.1f}' for t in r['treefold']):>24s}  {cfg}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out/probe-inductor")
