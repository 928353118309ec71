"""Whether the filtered path's first two passes (segment maxima from HBM, then the pre-list and
the masses from L2) can be one pass, before anyone builds it.

    SEGMENTS=1,2,4 WARPS=4,8 PYTHONPATH=src:benchmarks python benchmarks/probe_single_pass.py [OUT.json]

The pass timed here (``single_pass_kernel``, this file only) reads each program's segments once
and holds them: it takes each segment's maximum m_s and the fixed-point mass of the segment
relative to it, S_s = sum of trunc(exp(y - m_s) * 2^40) (segments of 1024 tokens depend on n
alone, so a row's mass M = sum over segments of round(S_s * exp(m_s - m_row)) would not depend
on the launch), and lists the tokens within LIST_NATS of the program's own maximum, or, with
RUNNING, of the largest maximum that the row's programs have published so far (a relaxed atomic
max per row): a superset of today's pre-list (within 10 nats of the row's maximum), which a
later pass would cut down once the row maximum is known. No pass after it is built.

Prints, for 64 rows of 151936 logits (fp32 and bf16, the gpu_sampling inputs) and one row:
the graph replay of today's first launch (segment maxima) and first two (plus the histogram
pass with its pre-list), and of the single pass at each of SEGMENTS segments per program and
WARPS warps (default 4 and 8 segments, 4 warps), with and without the running maximum, each
with the memset of its row counters in the graph; the memset alone; then the superset's mean length per row against the exact pre-list's, whether
every exact pre-list token is in it, and the relative difference of M by segments from the sum
of the tokens' own fixed-point weights. do_bench median, L2 flushed, three interleaved rounds.
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

from gpu_sampling import graphed, logits

from treefold._ops import sampling as ops
from treefold.bench.timing import CudaTimer, interleaved_us
from treefold.kernels.sampling import _fixed_weight, _key_value, _list_lane_tokens, _ordered_key

WIDTH = 1024
#: ``_ordered_key(-inf)``: the running maximum's start (below every finite key; not NaN's place).
MINUS_INF_KEY = -2139095041
LIST_NATS = 10.0
#: PART=today or PART=single times one side alone (each in its own process: a replay that faults
#: then takes only its own side down).
PART = os.environ.get("PART", "")
#: The single pass's launch choices: segments per program, and warps per program.
SEGMENT_CHOICES = tuple(int(v) for v in os.environ.get("SEGMENTS", "4,8").split(","))
WARP_CHOICES = tuple(int(v) for v in os.environ.get("WARPS", "4").split(","))


@triton.jit
def single_pass_kernel(x_ptr, n, stride_x, seg_max_ptr, seg_mass_ptr, segments_per_row, row_key_ptr,
                       list_ptr, list_stride, list_count_ptr, part_valid_ptr, programs_per_row,
                       WIDTH: tl.constexpr, SEGMENTS: tl.constexpr, LIST_NATS: tl.constexpr,
                       RUNNING: tl.constexpr):
    """One program: SEGMENTS consecutive segments of WIDTH tokens of one row, held in registers.
    Writes each segment's maximum and fixed-point mass relative to it, the program's count of
    finite tokens, and appends the tokens within LIST_NATS of its (or the row's running) maximum
    to the row's list (``_list_lane_tokens``).

    Bytes: reads the logits once; writes 12 bytes per segment, 4 per program, 4 per listed
    token."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // programs_per_row
    prog = (pid % programs_per_row).to(tl.int32)
    seg = tl.arange(0, SEGMENTS)
    lanes = tl.arange(0, WIDTH)
    first_segment = prog * SEGMENTS
    cols = (first_segment + seg[:, None]) * WIDTH + lanes[None, :]
    in_row = cols < n
    x = tl.load(x_ptr + row * stride_x + cols, mask=in_row, other=0.0).to(tl.float32)
    finite = in_row & (tl.abs(x) < float("inf"))
    y = tl.where(finite, x, float("-inf"))
    m_s = tl.max(y, axis=1)
    gap = tl.where(finite, y - m_s[:, None], float("-inf"))
    s_mass = tl.sum(_fixed_weight(gap), axis=1)
    segment = first_segment + seg
    keep = segment < segments_per_row
    tl.store(seg_max_ptr + row * segments_per_row + segment, m_s, mask=keep)
    tl.store(seg_mass_ptr + row * segments_per_row + segment, s_mass, mask=keep)
    m_p = tl.max(m_s, axis=0)
    if RUNNING:
        seen = tl.atomic_max(row_key_ptr + row, _ordered_key(m_p), sem="relaxed")
        m_p = tl.maximum(m_p, _key_value(seen))
    marked = finite & (y >= m_p - LIST_NATS)
    lane_bits = tl.sum(marked.to(tl.int32) << seg[:, None], axis=0)
    tl.store(part_valid_ptr + pid, tl.sum(tl.sum(finite.to(tl.int32), axis=1), axis=0))
    _list_lane_tokens(list_ptr + row * list_stride, list_stride, list_count_ptr + row, lane_bits,
                      first_segment * WIDTH, SEGMENTS, programs_per_row, lanes, WIDTH)


class SinglePass:
    """The pass's buffers for one input, and a call that clears the row counters and launches."""

    def __init__(self, x, segments, running, num_warps=4):
        rows, n = x.shape
        self.x, self.segments, self.running, self.num_warps = x, segments, running, num_warps
        self.segments_per_row = triton.cdiv(n, WIDTH)
        self.programs_per_row = triton.cdiv(self.segments_per_row, segments)
        dev = x.device
        self.seg_max = torch.empty(rows, self.segments_per_row, device=dev)
        self.seg_mass = torch.empty(rows, self.segments_per_row, device=dev, dtype=torch.int64)
        self.counters = torch.zeros(2, rows, device=dev, dtype=torch.int32)  # running key, list count
        self.list_stride = n // 2
        self.list = torch.empty(rows, self.list_stride, device=dev, dtype=torch.int32)
        self.part_valid = torch.empty(rows * self.programs_per_row, device=dev, dtype=torch.int32)

    def __call__(self):
        rows, n = self.x.shape
        self.counters[0].fill_(MINUS_INF_KEY)
        self.counters[1].zero_()
        single_pass_kernel[(rows * self.programs_per_row,)](
            self.x, n, self.x.stride(0), self.seg_max, self.seg_mass, self.segments_per_row, self.counters[0],
            self.list, self.list_stride, self.counters[1], self.part_valid, self.programs_per_row,
            WIDTH=WIDTH, SEGMENTS=self.segments, LIST_NATS=LIST_NATS, RUNNING=self.running,
            num_warps=self.num_warps)


def check(sp: SinglePass) -> dict:
    """The superset against the exact pre-list, and M by segments against M by tokens."""
    sp()
    if sp.x.is_cuda:
        torch.cuda.synchronize()
    y = sp.x.float()
    finite = torch.isfinite(y)
    m_row = torch.where(finite, y, float("-inf")).amax(dim=1, keepdim=True)
    exact = finite & (y >= m_row - LIST_NATS)
    counts = sp.counters[1].long()
    complete = bool((counts <= sp.list_stride).all())
    covered = True
    for r in range(y.shape[0]):
        listed = torch.zeros(y.shape[1], dtype=torch.bool, device=y.device)
        listed[sp.list[r, :min(int(counts[r]), sp.list_stride)].long()] = True
        covered &= bool((listed | ~exact[r]).all())
    w = torch.exp(torch.where(finite, y - m_row, float("-inf")).double())
    m_tokens = torch.floor(w * 2.0 ** 40).sum(dim=1)
    m_segments = (sp.seg_mass.double() * torch.exp(sp.seg_max.double() - m_row.double())).round().sum(dim=1)
    return {"superset_per_row": float(counts.double().mean()), "exact_per_row": float(exact.sum(1).double().mean()),
            "complete": complete, "covers_exact": covered,
            "mass_rel_diff": float(((m_segments - m_tokens).abs() / m_tokens).max()),
            "valid_ok": bool(sp.part_valid.view(y.shape[0], -1).sum(1).eq(finite.sum(1)).all())}


def today(x, seeds, launches):
    """Graph replay of the first ``launches`` launches of today's top-p 0.9 call (as
    probe_sampling_chain)."""
    from probe_sampling_chain import _Prefix
    _Prefix.limit = launches
    original = ops._Run
    ops._Run = _Prefix
    try:
        replay = graphed(lambda: ops.sample_rows(x, 1.0, None, 0.9, None, seeds, 0))
    finally:
        ops._Run = original
        _Prefix.limit = 1 << 30
    return replay


def main(out_path=""):
    calls, checks = {}, {}
    # A graph reads and writes the tensors it was captured with: everything made outside the
    # capture (the logits, seeds, the single pass's buffers) must outlive the timing (replays of
    # freed ones faulted with an illegal address, each part of this probe alone too).
    keep = []
    for rows, dtype in ((64, torch.float32), (64, torch.bfloat16), (1, torch.float32)):
        x = logits(rows, dtype)
        seeds = torch.arange(rows, device="cuda", dtype=torch.int64) * 7919 + 1
        keep += [x, seeds]
        name = f"{rows} {str(dtype)[6:]}"
        if PART in ("", "today"):
            calls[(name, "today: segment max")] = today(x, seeds, 1)
            calls[(name, "today: + histogram")] = today(x, seeds, 2)
        choices = [(s, w, r) for s in SEGMENT_CHOICES for w in WARP_CHOICES for r in (False, True)]
        for segments, warps, running in (choices if PART in ("", "single") else ()):
            sp = SinglePass(x, segments, running, warps)
            keep.append(sp)
            label = f"single pass {segments} seg {warps} w{' running' if running else ''}"
            checks[(name, label)] = check(sp)
            calls[(name, label)] = graphed(sp)
        if PART == "today":
            continue
        counters = torch.zeros(2, rows, device="cuda", dtype=torch.int32)
        calls[(name, "memset alone")] = graphed(lambda c=counters: (c[0].fill_(MINUS_INF_KEY), c[1].zero_()))
        torch.cuda.synchronize()
    times = interleaved_us(calls, CudaTimer(warmup_ms=10, rep_ms=40), 3)
    print(f"device {torch.cuda.get_device_name()}; graph replay, L2 flushed, best of 3 rounds, us")
    result = {}
    for (name, label), t in times.items():
        c = checks.get((name, label), {})
        extra = ""
        if c:
            extra = (f"  list {c['superset_per_row']:.0f}/row (exact {c['exact_per_row']:.0f}), "
                     f"covers {c['covers_exact']}, complete {c['complete']}, valid {c['valid_ok']}, "
                     f"M rel diff {c['mass_rel_diff']:.1e}")
        print(f"{name:12s} {label:32s} {min(t):7.1f}{extra}", flush=True)
        result[f"{name} | {label}"] = {"rounds_us": t, **c}
    if out_path:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
