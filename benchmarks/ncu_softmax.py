"""One softmax launch to profile under Nsight Compute (CUDA):

    ncu --clock-control none --kernel-name softmax_kernel --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats python benchmarks/ncu_softmax.py ROWS N STRATEGY SPP WARPS

Launches the variant four times (the first compiles); profile the fourth.
"""
import sys

import torch

from treefold._ops import softmax as ops


def main():
    rows, n, strategy, spp, warps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    x = (torch.randn(rows, n, device="cuda") * 3).bfloat16()
    tuning = ops.Tuning(num_warps=warps, segments_per_program=spp if strategy == "cooperative" else None)
    for _ in range(4):
        ops.softmax_forward(x, strategy=strategy, tuning=tuning)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
