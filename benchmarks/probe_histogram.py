"""Probe: ways to count the bins of a sampling row, for the next design of the filtered path.

The filtered sampling passes are bound by instructions (``NOTES.md``): Triton's ballot histogram
costs about (bins / 32) * log2(bins) instructions per token and thread whatever the mask. This
probe times one pass over logits [rows, 151936] fp32 that bins every token as the library does
(bin = floor((m - y) * 4), m the row maximum) and counts the bins in four ways:

- ``ballot``: ``tl.histogram`` of all NUM_BINS bins (what ``bin_histogram_kernel`` does);
- ``near-atomic``: only tokens in the first NEAR bins are counted, one global atomic each, with
  their exact fixed-point mass per bin (a second atomic); the far tokens are summed per lane;
- ``adaptive``: per segment, ``tl.histogram`` of the near bins when more than DENSE tokens of
  the segment are near, the atomics otherwise;
- ``lanes``: the per-lane sums alone (the floor of any pass that reads and bins every token).

Every method's near-bin counts are checked against ``torch.bincount``. Time per call (two
zero fills of the outputs included, the same for every method) in a CUDA graph (``treefold.bench.timing.cuda_graph_us``: no L2 flush), for peaked (standard deviation 4)
and flat (2) rows, at 1 and 64 rows. Run on a CUDA machine: python benchmarks/probe_histogram.py;
OUT=<dir> writes <dir>/probe-histogram.json. On a CPU with TRITON_INTERPRET=1 it runs the check
alone, on a small row.
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

NUM_BINS = 128  # the library's bins: 1/4 nat each, 32 nats
NEAR = 64  # bins counted one by one by the atomic methods: 16 nats below the maximum
BINS_PER_NAT = 4.0
DENSE = 64  # near tokens per 1024-token segment above which ``adaptive`` takes the histogram
FIXED_ONE = tl.constexpr(1099511627776.0)
METHODS = {"ballot": 0, "near-atomic": 1, "adaptive": 2, "lanes": 3}


@triton.jit
def count_bins_kernel(x_ptr, n, m_ptr, counts_ptr, mass_ptr, far_ptr, programs_per_row,
                      METHOD: tl.constexpr, WIDTH: tl.constexpr, SEGMENTS_PER_PROGRAM: tl.constexpr,
                      NUM_BINS: tl.constexpr, NEAR: tl.constexpr, BINS_PER_NAT: tl.constexpr,
                      DENSE: tl.constexpr):
    """Bins of the tokens of one program's segments, counted by METHOD (see the module text).

    Args:
        x_ptr: float32 logits [rows, n], contiguous.
        m_ptr: float32 [rows] row maxima.
        counts_ptr: int32 [rows, NUM_BINS] bin counts (atomic adds).
        mass_ptr: int64 [rows, NUM_BINS] fixed-point mass of the near bins (atomic methods).
        far_ptr: int64 [rows * programs_per_row, 2] per program: tokens and fixed-point mass that
            the method did not count bin by bin.
    """
    pid = tl.program_id(0).to(tl.int64)
    row = pid // programs_per_row
    prog = (pid % programs_per_row).to(tl.int32)
    m = tl.load(m_ptr + row)
    lanes = tl.arange(0, WIDTH)
    counts = tl.zeros([NUM_BINS], tl.int32)
    lane_far = tl.zeros([WIDTH], tl.int32)
    lane_far_mass = tl.zeros([WIDTH], tl.int64)
    for j in range(SEGMENTS_PER_PROGRAM):
        cols = (prog * SEGMENTS_PER_PROGRAM + j) * WIDTH + lanes
        live = cols < n
        y = tl.load(x_ptr + row * n + cols, mask=live, other=float("-inf"))
        d = tl.minimum(tl.maximum((m - y) * BINS_PER_NAT, 0.0), NUM_BINS - 1.0)
        b = tl.where(live, d, NUM_BINS - 1.0).to(tl.int32)
        w = tl.where(live, tl.exp(y - m), 0.0)
        w_fixed = (w * FIXED_ONE).to(tl.int64)
        near = live & (b < NEAR)
        if METHOD == 0:
            counts += tl.histogram(b, NUM_BINS, mask=live)
        elif METHOD == 1:
            tl.atomic_add(counts_ptr + row * NUM_BINS + b, 1, mask=near, sem="relaxed")
            tl.atomic_add(mass_ptr + row * NUM_BINS + b, w_fixed, mask=near, sem="relaxed")
        elif METHOD == 2:
            if tl.sum(near.to(tl.int32), axis=0) > DENSE:
                counts += tl.histogram(b, NUM_BINS, mask=near)
            else:
                tl.atomic_add(counts_ptr + row * NUM_BINS + b, 1, mask=near, sem="relaxed")
        if METHOD == 3:
            lane_far += live.to(tl.int32)
            lane_far_mass += w_fixed
        elif METHOD != 0:
            far = live & (near == 0)
            lane_far += far.to(tl.int32)
            lane_far_mass += tl.where(far, w_fixed, 0)
    if METHOD % 2 == 0:  # ballot and adaptive hold counts in registers
        tl.atomic_add(counts_ptr + row * NUM_BINS + tl.arange(0, NUM_BINS), counts, mask=counts > 0)
    tl.store(far_ptr + pid * 2, tl.sum(lane_far, axis=0).to(tl.int64))
    tl.store(far_ptr + pid * 2 + 1, tl.sum(lane_far_mass, axis=0))


def run(x: torch.Tensor, method: str, programs_per_row: int):
    rows, n = x.shape
    width = 1024
    segments = triton.cdiv(n, width)
    spp = triton.cdiv(segments, programs_per_row)
    ppr = triton.cdiv(segments, spp)
    m = x.amax(dim=1)
    counts = torch.zeros(rows, NUM_BINS, dtype=torch.int32, device=x.device)
    mass = torch.zeros(rows, NUM_BINS, dtype=torch.int64, device=x.device)
    far = torch.empty(rows * ppr, 2, dtype=torch.int64, device=x.device)

    def call():
        counts.zero_()
        mass.zero_()
        count_bins_kernel[(rows * ppr,)](x, n, m, counts, mass, far, ppr, METHOD=METHODS[method],
                                         WIDTH=width, SEGMENTS_PER_PROGRAM=spp, NUM_BINS=NUM_BINS,
                                         NEAR=NEAR, BINS_PER_NAT=BINS_PER_NAT, DENSE=DENSE,
                                         num_warps=4)
    return call, counts


def reference_counts(x: torch.Tensor) -> torch.Tensor:
    m = x.amax(dim=1, keepdim=True)
    b = ((m - x) * BINS_PER_NAT).clamp(0.0, NUM_BINS - 1.0).to(torch.int64)
    return torch.stack([torch.bincount(r, minlength=NUM_BINS) for r in b]).to(torch.int32)


def check(x: torch.Tensor, programs_per_row: int) -> dict:
    want = reference_counts(x)
    ok = {}
    for method in METHODS:
        call, counts = run(x, method, programs_per_row)
        call()
        if method == "ballot":
            ok[method] = torch.equal(counts, want)
        elif method == "lanes":
            ok[method] = True
        else:
            ok[method] = torch.equal(counts[:, :NEAR], want[:, :NEAR])
    return ok


def main() -> None:
    if not torch.cuda.is_available():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 3000, generator=g) * 4
        print("interpreted check, 2 x 3000:", check(x, 2))
        return
    from treefold.bench.timing import cuda_graph_us
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for scale, shape in ((4.0, "peaked"), (2.0, "flat")):
        for rows in (1, 64):
            g = torch.Generator(device="cuda").manual_seed(rows)
            x = torch.randn(rows, 151936, device="cuda", generator=g) * scale
            ppr = triton.cdiv(16 * sms, rows)
            ok = check(x, ppr)
            near = float((reference_counts(x)[:, :NEAR].sum() / x.numel()).item())
            line = {"data": shape, "rows": rows, "near_fraction": round(near, 4), "check": ok,
                    "graph_us": {}}
            for method in METHODS:
                call, _ = run(x, method, ppr)
                line["graph_us"][method] = round(cuda_graph_us(call), 2)
            results.append(line)
            print(f"{shape:6s} {rows:3d} rows, near {100 * near:5.1f}%: " + "  ".join(
                f"{k} {v:7.1f} us{'' if ok[k] else ' (WRONG)'}" for k, v in line["graph_us"].items()),
                flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "probe-histogram.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
