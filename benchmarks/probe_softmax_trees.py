"""The softmax family's default launches at the bench's long-row shapes, timed in one process,
with a hash of every output: run it once per source tree, alternating, to compare trees that
should give the same bits (the hashes must match) and may differ in speed.

    for t in base new base new; do PYTHONPATH=<that tree's src>:benchmarks \\
        python benchmarks/probe_softmax_trees.py; done        (CUDA)

Cases: softmax 4096x32768, 256x131072, 8192x4096, 32768x8192, log_softmax 4096x32768, the
softmax backward at 4096x32768 (bf16), then for the hash alone softmax and log_softmax of 8 rows
of 151936 float32 holding NaN, a row of -inf, +inf, and runs of -0.0 and +0.0. Timing: three
interleaved rounds, do_bench median, L2 flushed (``probe_report.check_and_time``).
"""
import hashlib

import torch

from treefold._ops import softmax as sm

from probe_report import _bits, check_and_time, row_op_variants

_DEFAULT = sm.Tuning()
CASES = [(label, m, n, {"default": ("auto", _DEFAULT)}) for label, m, n in (
    ("softmax", 4096, 32768), ("softmax", 256, 131072), ("softmax", 8192, 4096), ("softmax", 32768, 8192),
    ("log_softmax", 4096, 32768), ("softmax backward", 4096, 32768))]


def main():
    torch.manual_seed(0)
    variants = row_op_variants(CASES)
    digest = hashlib.sha256()
    for fn, _, _ in variants.values():
        for t in fn():
            digest.update(_bits(t).cpu().numpy().tobytes())
    x = (3 * torch.randn(8, 151936, device="cuda")).float()
    x[0, 5], x[2, 7] = float("nan"), float("inf")
    x[1, :] = float("-inf")
    x[3, 100:200], x[3, 200:300] = -0.0, 0.0
    for log in (False, True):
        digest.update(_bits(sm.softmax_forward(x, log=log)).cpu().numpy().tobytes())
    print("outputs sha256", digest.hexdigest()[:16])
    check_and_time(variants)


if __name__ == "__main__":
    main()
