"""One filtered sampling call to profile under Nsight Compute (CUDA):

    ncu --clock-control none --kernel-name regex:'segment_max|bin_histogram|bin_count|compact|resolve' \
        --launch-skip 15 --launch-count 5 --section SpeedOfLight --section WarpStateStats \
        --section InstructionStats --section Occupancy --section LaunchStats \
        python benchmarks/ncu_sampling.py ROWS FILTER DTYPE

FILTER is top_p (0.9), min_p (0.05) or top_k (50). The logits are Gaussian with standard
deviation 4, as in ``gpu_sampling.py``'s peaked case. Calls the sampler four times (the first
compiles), so --launch-skip 15 lands on the fourth call's five launches of those kernels (calls
with a pre-list, 64 rows: the plan pass is the sixth, left out; one row has no ``bin_count``:
take 'plan' in its place). ncu flushes the caches before each launch it profiles.
"""
import sys

import torch

import treefold


def main():
    rows, which, dtype = int(sys.argv[1]), sys.argv[2], getattr(torch, sys.argv[3])
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(rows, 151936, device="cuda", generator=g) * 4.0).to(dtype)
    args = {"top_p": dict(top_p=0.9), "min_p": dict(min_p=0.05), "top_k": dict(top_k=50)}[which]
    for _ in range(4):
        treefold.sample(x, temperature=1.0, seed=1, **args)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
