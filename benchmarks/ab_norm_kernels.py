"""The norm kernels (forward and backward) of another revision beside this tree's, in one process
(CUDA): the same launchers, plans and inputs; only the kernels differ. Bits are compared first (a
change of the kernels' code that is not a change of their order must keep them), then both are
timed by their kernels' duration after the L2 flush (``timing.kernel_us``, 50 calls), in three
interleaved rounds.

    git show REV:src/treefold/kernels/norms.py > .tcache/base_norms.py        (here)
    python benchmarks/ab_norm_kernels.py .tcache/base_norms.py [OUT_DIR]      (device, carry .tcache)

The file is loaded as a module of ``treefold.kernels`` (its relative imports resolve there).
"""
import importlib.util
import json
import os
import statistics
import sys

import torch

from probe_report import check_bits, row_op_variants, with_values
from treefold._ops import norms
from treefold._ops.launch import Launcher
from treefold.bench.timing import interleaved_us, kernel_us

#: The bench's norm shapes (``--shapes llm``), forward and backward: label, rows, length.
CASES = [("rms", 8192, 4096), ("rms", 32768, 4096), ("rms", 16384, 8192), ("rms", 4096, 16384),
         ("rms", 65536, 1024), ("rms", 64, 8192), ("rms", 1, 4096), ("rms fp32", 8192, 4096),
         ("rms+residual", 32768, 4096), ("rms+residual", 1, 4096), ("ln", 8192, 4096), ("ln", 16384, 8192),
         ("ln", 65536, 1024), ("rms backward", 32768, 4096), ("rms backward", 16384, 8192),
         ("ln backward", 8192, 4096), ("ln backward", 16384, 8192)]


class _BaseLauncher:
    """The base revision's kernel under this tree's launcher: constexprs it does not take are
    dropped (N_POW2, then with ``n_float`` given back as N rather than 1/N), and a backward kernel
    from before ``block_rows`` gets the rows per block as its BLOCK_ROWS constexpr."""

    def __init__(self, kernel):
        self.launcher = Launcher(kernel)
        self.names = set(kernel.arg_names)
        self.backward = "dw_part_ptr" in self.names

    def __call__(self, grid, *args, **kwargs):
        # both kernels take ten tensors, then rows, then (this tree's backward) block_rows, n, n_float
        if self.backward and "block_rows" not in self.names:
            kwargs["BLOCK_ROWS"] = args[11]
            args = args[:11] + args[12:]
        n_float = 13 if "block_rows" in self.names else 12
        if "N_POW2" not in self.names and kwargs.pop("N_POW2", False):
            args = args[:n_float] + (1.0 / args[n_float],) + args[n_float + 1:]
        option_names = {"num_warps", "num_stages", "maxnreg", "enable_fp_fusion", "launch_pdl"}
        kwargs = {k: v for k, v in kwargs.items() if k in self.names or k in option_names}
        return self.launcher(grid, *args, **kwargs)


def base_launchers(path: str) -> tuple:
    """(forward, backward) launchers of the kernels in ``path``."""
    spec = importlib.util.spec_from_file_location("treefold.kernels._base_norms", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return _BaseLauncher(module.norm_forward_kernel), _BaseLauncher(module.norm_backward_kernel)


def with_kernels(launchers: tuple, fn):
    """``fn`` run with the norm ops launching ``launchers`` (forward, backward)."""
    return with_values(norms, {"_forward_kernel": launchers[0], "_backward_kernel": launchers[1]}, fn)


def main(base_path: str, out_dir: str = "") -> None:
    torch.manual_seed(0)
    kernels = {"base": base_launchers(base_path), "tree": (norms._forward_kernel, norms._backward_kernel)}
    variants = {}  # (check_bits compares each case's "tree" with its "base", listed first)
    for fn, moved, case in row_op_variants([(label, m, n, {"default": {}}) for label, m, n in CASES]).values():
        for who, launchers in kernels.items():
            variants[f"{case} {who}"] = (with_kernels(launchers, fn), moved, case)
    unequal = check_bits(variants)
    times = interleaved_us({name: v[0] for name, v in variants.items()}, lambda fn: kernel_us(fn, calls=50))
    width = max(len(n) for n in times)
    for name, ts in times.items():
        print(f"{name:{width}s}  " + "  ".join(f"{t:7.2f}" for t in ts) + f"  median {statistics.median(ts):7.2f} us")
    if out_dir:
        with open(os.path.join(out_dir, "ab-norm-kernels.json"), "w") as f:
            json.dump(dict(kernel_us=times, unequal=unequal), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
