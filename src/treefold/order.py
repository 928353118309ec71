"""The treefold order: the one summation order every treefold reduction follows.

A reduction of a vector of length N (float32 add; the online (max, sum) merge) is evaluated as:

1. The vector is cut into S = ceil(N / C) *segments* of C = lanes(N) elements (C a power of two,
   at most MAX_LANES); the last segment is padded with the operator's identity.
2. Inside a segment, consecutive lanes form *groups* of G = group(dtype) lanes, one 16-byte vector
   of the input dtype (8 lanes for bf16/fp16, 4 for fp32). Each group is reduced by a halving tree
   (lane j takes lane j + G/2, then j + G/4, ...).
3. The C / G group results are reduced by a halving tree (group g takes group g + C/(2G), ...).
4. The S segment results, now float32, form a vector of length S that is reduced again by this
   same rule with groups of one lane (G = 1: a plain halving tree, padded to a power of two)
   while more than one value is left. For every row up to MAX_LANES**2 elements that is a
   single halving tree over the S results.

C and G depend on N and the input dtype alone: never on the device, the grid, num_warps, the batch
size, the position of a row or its strides. Every launch strategy (a row in registers, one program
streaming a row, a row split over many programs, a whole tensor tiled over the grid) computes the
same segment results and combines them with the same trees, so all give the same bits.

Why this shape: on the GPU a thread loads 16-byte vectors, so a group is one thread's vector and
its tree costs plain register adds; the group tree then needs the same few warp shuffles as a
compiler-chosen reduction. A tree that pairs lane j with j + C/2 across the whole segment first
would exchange every value between threads (measured 5-10x slower on the H200; see
benchmarks/NOTES.md).

This module holds the rule (integers only) and a NumPy reference of it. The Triton helpers that
evaluate the same trees are in ``treefold.kernels.combine``.
"""
from __future__ import annotations

import numpy as np

#: Widest segment: C = min(next_pow2(N), MAX_LANES).
MAX_LANES = 4096
#: Bytes per group: one 16-byte vector load of the input.
GROUP_BYTES = 16


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def log2(n: int) -> int:
    """log2 of a power of two."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"log2: expected a power of two, got {n}")
    return n.bit_length() - 1


def lanes(n: int) -> int:
    """C(N): the segment width, a power of two."""
    return min(next_pow2(n), MAX_LANES)


def itemsize(dtype) -> int:
    """Bytes per element of a torch or NumPy dtype (or a plain int of bytes)."""
    if isinstance(dtype, int):
        return dtype
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int):
        return size
    return np.dtype(dtype).itemsize


def group(n: int, dtype) -> int:
    """G(N, dtype): lanes per group, one 16-byte vector of the input dtype (at most C).

    ``dtype=None`` means a vector of segment results (step 4 of the order): groups of one lane.
    """
    if dtype is None:
        return 1
    return min(max(1, GROUP_BYTES // itemsize(dtype)), lanes(n))


def num_segments(n: int) -> int:
    """S(N) = ceil(N / C(N)); 1 for N = 0."""
    return max(1, cdiv(n, lanes(n)))


def levels(n: int) -> list[int]:
    """Lengths of the vectors reduced at each level: [N, S(N), S(S(N)), ..., 1]."""
    out = [int(n)]
    while out[-1] > 1:
        out.append(num_segments(out[-1]))
    return out


def describe(n: int, dtype=np.float32) -> str:
    """A one-line human description of the order for length n."""
    parts, m, dt = [], int(n), dtype
    while True:
        parts.append(f"N={m}: {num_segments(m)} segment(s) of {lanes(m)} lanes in groups of {group(m, dt)}")
        if num_segments(m) == 1:
            break
        m, dt = num_segments(m), None
    return "; then ".join(parts)


# --------------------------------------------------------------------------------------------
# NumPy reference of the order (float32 arithmetic, every add IEEE-rounded)
# --------------------------------------------------------------------------------------------

def halving_tree(a: np.ndarray) -> np.ndarray:
    """Halving tree over the last axis (its length a power of two): lane j += lane j + w/2."""
    w = a.shape[-1]
    if w & (w - 1):
        raise ValueError(f"halving_tree: last axis must be a power of two, got {w}")
    while w > 1:
        w //= 2
        a = a[..., :w] + a[..., w:]
    return a[..., 0]


def grouped_tree(a: np.ndarray, group_width: int) -> np.ndarray:
    """Steps 2-3 of the order over the last axis (width C): groups of G lanes, then the groups."""
    c = a.shape[-1]
    a = a.reshape(a.shape[:-1] + (c // group_width, group_width))
    return halving_tree(halving_tree(a))


def _segment_results(a: np.ndarray, group_width: int) -> np.ndarray:
    """One level of the rule over the last axis: [..., N] -> [..., S] segment results."""
    n = a.shape[-1]
    c, s = lanes(n), num_segments(n)
    if s * c != n:
        pad = np.zeros(a.shape[:-1] + (s * c - n,), dtype=a.dtype)
        a = np.concatenate([a, pad], axis=-1)
    return grouped_tree(a.reshape(a.shape[:-1] + (s, c)), group_width)


def reference_sum(x, axis: int = -1, dtype=None) -> np.ndarray:
    """Sum along ``axis`` in the treefold order, in float32 (NumPy); the CPU reference.

    ``x`` is a NumPy array or a torch tensor of any float dtype; values are converted to float32
    (the accumulation type). ``dtype`` is the dtype the kernel reads, which sets the group width
    (default: the dtype of ``x``; pass e.g. ``torch.bfloat16`` when ``x`` holds float32 values
    computed from a bf16 input, such as squares). Returns float32 with ``axis`` removed.
    """
    if hasattr(x, "detach"):
        dtype = x.dtype if dtype is None else dtype
        x = x.detach().to("cpu").float().numpy()
    a = np.moveaxis(np.asarray(x), axis, -1)
    dtype = a.dtype if dtype is None else dtype
    a = a.astype(np.float32, copy=False)
    if a.shape[-1] == 0:
        return np.zeros(a.shape[:-1], dtype=np.float32)
    first = True
    while a.shape[-1] > 1:
        a = _segment_results(a, group(a.shape[-1], dtype if first else None))
        first = False
    return a[..., 0]


def pairwise_error_bound(values: np.ndarray) -> float:
    """A bound on |treefold sum - exact sum| for float32 inputs.

    Every element passes through D = sum over levels of log2(C) adds; with u = 2^-24 the classic
    bound for such a summation is (D u / (1 - D u)) * sum |x_i|.
    """
    n = int(values.size)
    if n <= 1:
        return 0.0
    depth = sum(log2(lanes(m)) for m in levels(n)[:-1])
    u = 2.0 ** -24
    return depth * u / (1 - depth * u) * float(np.abs(values.astype(np.float64)).sum())
