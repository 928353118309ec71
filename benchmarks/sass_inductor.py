"""A kernel torch.compile built, as saved by ``probe_inductor_norms.py`` under
``results/inductor-norms/``, compiled for sm_90 without a GPU and reported as ``sass_report.py``
reports treefold's launches: registers, counts of loads, stores, barriers and shuffles, and the
timeline of global loads, stores and barriers.

    python benchmarks/sass_inductor.py results/inductor-norms/inductor-rms-bf16-16384x8192.py \
        '{"XBLOCK": 1, "R0_BLOCK": 2048}' 16 [--out DIR]

The second argument is the constexprs the autotuner chose (``probe_inductor_norms.py`` prints
them), the third num_warps. The module's first kernel is taken; its signature comes from its
``triton_meta``, every pointer and every integer Inductor marked 16-divisible as it marked them.
"""
import argparse
import ast
import importlib.util
import json
import os
import re
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sass_report import report

#: What Inductor's kernel sources import, without its autotuning decorators.
_HEADER = """import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
"""


def load_kernel(module_path: str):
    """(the first ``@triton.jit`` kernel of a saved Inductor module, its triton_meta)."""
    text = open(module_path).read()
    match = re.search(r"async_compile\.triton\('(\w+)', '''(.*?)'''", text, re.S)
    if match is None:
        raise ValueError(f"{module_path}: no async_compile.triton(...) kernel source in it")
    name, source = match.groups()
    meta = re.search(r"triton_meta=(\{.*?\}),\n", source, re.S)
    signature = ast.literal_eval(re.search(r"'signature': (\{[^}]*\})", meta.group(1)).group(1))
    divisible = [int(i) for i in re.findall(r"\((\d+),\): \[\['tt.divisibility', 16\]\]", meta.group(1))]
    body = source[source.index("@triton.jit"):]
    tmp = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    tmp.write(_HEADER + body)
    tmp.close()  # triton.jit reads the function's source from its file
    spec = importlib.util.spec_from_file_location(name, tmp.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name), signature, divisible


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module")
    parser.add_argument("constexprs", help="JSON: the autotuner's constexprs, e.g. '{\"XBLOCK\": 1}'")
    parser.add_argument("num_warps", type=int)
    parser.add_argument("--out", default="", help="keep the SASS, PTX and TTGIR here")
    args = parser.parse_args(argv)
    kernel, signature, divisible = load_kernel(args.module)
    constexprs = json.loads(args.constexprs)
    attrs = {(i,): [["tt.divisibility", 16]] for i in divisible}
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": args.num_warps})
    print(f"{os.path.basename(args.module)}: {constexprs}, num_warps {args.num_warps}")
    print(report(compiled, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
