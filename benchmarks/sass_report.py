"""What a launch compiles to on sm_90, without a GPU: registers, spills, shared memory, and the
order in which its global loads, stores and barriers come in the SASS.

    python benchmarks/sass_report.py "norms.rms_norm_impl(bf16(4096, 16384), bf16(16384), None,
        1e-6, 0.0, 'llama', torch.bfloat16)" [--set '{"num_warps": 8}'] [--launch 0] [--out DIR]

The expression is evaluated with ``torch``, ``norms``, ``reduce``, ``softmax``, ``sampling`` (the
``treefold._ops`` launchers) and ``bf16(*shape)``, ``f32(*shape)`` (empty CPU tensors) in scope.
Nothing runs: the launcher's calls are recorded instead of launched, and the chosen one
(``--launch``, default the first) is compiled for sm_90 with Triton's bundled ptxas, its
constexprs and options as the launcher chose them, ``--set`` overriding any of them. Pointers,
and integer arguments that are multiples of 16, get the 16-byte divisibility the GPU launcher
would give them (without it the loads do not vectorise and every count doubles). Plans that
depend on the device (its SM count, whether programs run at once) are made as on a machine
without a GPU: grids and strategies may differ from the H200's, so set the constexprs that
matter with ``--set`` or call the launcher with the strategy and tuning wanted.

Prints registers per thread (``cuobjdump -res-usage``), the counts of global loads and stores,
barriers and shuffles, and a timeline: each global load, store and barrier with its line in the
SASS. Loads that reuse one destination register one after another wait for each other: the
timeline shows them. ``--out`` keeps the SASS, PTX and TTGIR.
"""
import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import treefold.backend as backend
from treefold._ops import launch, norms, reduce, sampling, softmax  # noqa: F401 (the expression's scope)

_POINTER = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float64: "*fp64",
            torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16", torch.int8: "*i8", torch.uint8: "*u8"}


def _type_of(value) -> str:
    if isinstance(value, torch.Tensor):
        return _POINTER[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, float):
        return "fp32"
    return "i64" if abs(value) >= 2 ** 31 else "i32"


def record_launches(expression: str) -> list:
    """(kernel, grid, args, kwargs) of every launch the expression's launcher makes, none run."""
    recorded = []

    def record(self, grid, *args, **kwargs):
        recorded.append((self.kernel, grid, args, kwargs))

    launch.Launcher.__call__ = record
    backend.use_kernel = lambda t: True
    scope = dict(torch=torch, norms=norms, reduce=reduce, softmax=softmax, sampling=sampling,
                 bf16=lambda *s: torch.empty(*s, dtype=torch.bfloat16),
                 f32=lambda *s: torch.empty(*s, dtype=torch.float32))
    eval(expression, scope)  # noqa: S307 (a command-line tool: the expression is the user's)
    return recorded


def compile_sm90(kernel, args, kwargs, overrides: dict):
    parameters = inspect.signature(kernel.fn).parameters
    # constexprs the launcher leaves at their defaults (only constexprs have defaults here)
    defaults = {k: p.default for k, p in parameters.items() if p.default is not inspect.Parameter.empty}
    kwargs = {**defaults, **kwargs, **overrides}
    params = list(parameters)
    runtime = [p for p in params if p not in kwargs]
    signature = {p: _type_of(v) for p, v in zip(runtime, args)}
    attrs = {}
    # integers the kernel does not specialise (``do_not_specialize``) get no divisibility, as on a device
    unspecialised = launch.unspecialised_names(kernel)
    for p, v in zip(runtime, args):
        aligned = isinstance(v, int) and not isinstance(v, bool) and v and v % 16 == 0 and p not in unspecialised
        if isinstance(v, torch.Tensor) or aligned:
            attrs[(params.index(p),)] = [["tt.divisibility", 16]]
    constexprs = {k: v for k, v in kwargs.items() if k in params}
    signature.update({k: "constexpr" for k in constexprs})
    options = {k: v for k, v in kwargs.items() if k not in params}
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options), constexprs, options


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def report(compiled, out_dir: str = "") -> str:
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True,
                               check=True).stdout
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        for suffix, text in (("sass", sass), ("ptx", compiled.asm["ptx"]), ("ttgir", compiled.asm["ttgir"])):
            with open(os.path.join(out_dir, f"{compiled.name}.{suffix}"), "w") as f:
                f.write(text)
    # lines "        /*0350*/  @P1 LDG.E.128 R20, desc[UR8][R100.64] ;  /* 0x... */"
    instructions = [re.sub(r"\s+", " ", m.group(1)) for m in
                    (re.match(r"\s+/\*[0-9a-f]+\*/\s*(.*?)\s*;", line) for line in sass.splitlines()) if m]
    resources = next((line.strip() for line in usage.splitlines() if "REG:" in line), "")
    counts = {k: sum(k in i for i in instructions) for k in ("LDG", "STG", "LDS", "STS", "BAR.SYNC", "SHFL")}
    lines = [f"{compiled.name}: {resources}", f"{len(instructions)} instructions; "
             + ", ".join(f"{k} {v}" for k, v in counts.items()), "global loads, stores and barriers:"]
    lines += [f"  {i:5d}  {ins}" for i, ins in enumerate(instructions) if re.search(r"\b(LDG|STG|BAR\.SYNC)", ins)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("expression", help="a launcher call, e.g. \"norms.rms_norm_impl(bf16(8, 4096), ...)\"")
    parser.add_argument("--set", default="{}", help="JSON of constexprs or options to override")
    parser.add_argument("--launch", type=int, default=0, help="which of the recorded launches (default 0)")
    parser.add_argument("--out", default="", help="directory to keep the SASS, PTX and TTGIR in")
    ns = parser.parse_args(argv)
    recorded = record_launches(ns.expression)
    if not recorded:
        print("the expression made no launch", file=sys.stderr)
        return 1
    if not 0 <= ns.launch < len(recorded):
        print(f"--launch {ns.launch}: the expression made {len(recorded)} launches", file=sys.stderr)
        return 1
    kernel, grid, args, kwargs = recorded[ns.launch]
    compiled, constexprs, options = compile_sm90(kernel, args, kwargs, json.loads(ns.set))
    print(f"launch {ns.launch} of {len(recorded)}: grid {grid}, options {options}")
    print("constexprs " + ", ".join(f"{k}={v}" for k, v in constexprs.items()))
    print(report(compiled, ns.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
