"""The norm backward holding a row's 16-bit dy and x through its sums (``hold_16bit``) or not,
against its default, RMSNorm and LayerNorm at 32768 x 4096 and 16384 x 8192 bf16 (there also
with 16 warps), called directly (dx and the weight/bias partials and their column sums);
each variant checked bit for bit against the default first, then three interleaved rounds,
do_bench median, L2 flushed; bytes: read x and dy, write dx.

    python benchmarks/probe_norm_backward_hold.py [OUT_DIR]   (CUDA)
"""
import os
import sys

import torch

from treefold._ops import norms

from probe_report import norm_backward_inputs, time_against_roof


def main(out_dir):
    torch.manual_seed(0)
    calls, nbytes, unequal = {}, {}, []
    for m, n in ((32768, 4096), (16384, 8192)):
        x, w, b, dy, rstd, mean, rstd_ln = norm_backward_inputs(m, n)
        for label, call in (
                ("rms", lambda o, x=x, w=w, dy=dy, rstd=rstd: norms.rms_norm_backward_impl(
                    dy, None, x, w, rstd, 0.0, "llama", x.dtype, None, True, **o)),
                ("ln", lambda o, x=x, w=w, dy=dy, mean=mean, rstd=rstd_ln: norms.layer_norm_backward_impl(
                    dy, x, w, mean, rstd, True, x.dtype, **o))):
            first = None
            variants = [("default", {}), ("hold", dict(hold_16bit=True)), ("float32 held", dict(hold_16bit=False))]
            if n == 8192:
                variants += [("16 warps", dict(num_warps=16, hold_16bit=False)),
                             ("16 warps hold", dict(num_warps=16, hold_16bit=True))]
            for name, options in variants:
                fn = lambda call=call, options=options: call(options)
                out = [t.clone() for t in fn() if t is not None]
                if first is None:
                    first = out
                elif not all(torch.equal(a, c) for a, c in zip(out, first)):
                    unequal.append(f"{label} {m}x{n} {name}")
                calls[f"{label} backward {m}x{n} {name}"] = fn
                nbytes[f"{label} backward {m}x{n} {name}"] = 3 * x.numel() * x.element_size()
    print("bits equal to the default in every case" if not unequal else f"NOT EQUAL: {unequal}")
    time_against_roof(calls, nbytes, os.path.join(out_dir, "probe-norm-backward-hold.json") if out_dir else "",
                      unequal=unequal)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
