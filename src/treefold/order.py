"""The treefold order: the one summation order every treefold reduction follows.

A reduction of a vector of length N (float32 add, the online (max, sum) merge) is evaluated as:

1. The vector is cut into S = ceil(N / L) *segments* of length L = C * F, the last one padded
   with the operator's identity.
2. Inside a segment there are C *lanes* (C a power of two). Lane j folds the segment's elements
   j, j + C, j + 2C, ... sequentially (F elements per lane).
3. The C lane values are combined by a *halving tree*: lane j takes lane j + C/2, then j + C/4,
   ... until one value is left.
4. The S segment results form a new vector of length S, reduced again by this same rule while
   more than one is left. (When S <= MAX_LANES this is a single halving tree over S values padded
   to a power of two.)

C = lanes(N) and F = tiles_per_segment(N) depend on N alone: never on the dtype, the device, the
grid, num_warps, the batch size, the position of a row or its strides. That is what makes every
launch strategy (a row in registers, one program streaming a row, a row split over many programs,
a whole tensor tiled over the grid) produce the same bits: each one computes the same segment
results and combines them with the same trees.

For rows up to 2^20 elements F = 1, so a segment is a single tile of C lanes and the reduction is
a two-level tree. Longer vectors (whole tensors) let each lane fold F = 32 elements first, which
lets a program stream 32 tiles with a single accumulator before its one tree.

This module holds the rule (pure Python on integers) and a NumPy reference of it. The Triton
helpers that evaluate the same trees on the GPU are in ``treefold.kernels.combine``.
"""
from __future__ import annotations

import numpy as np

#: Widest tile: C = min(next_pow2(N), MAX_LANES).
MAX_LANES = 1024
#: Vectors longer than this fold several tiles per lane before the tree.
SEQUENTIAL_FOLD_ABOVE = 1 << 20
#: Tiles folded per lane for vectors longer than SEQUENTIAL_FOLD_ABOVE.
LONG_TILES_PER_SEGMENT = 32


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def lanes(n: int) -> int:
    """C(N): the tile width, a power of two."""
    return min(next_pow2(n), MAX_LANES)


def tiles_per_segment(n: int) -> int:
    """F(N): elements each lane folds sequentially inside one segment."""
    return 1 if n <= SEQUENTIAL_FOLD_ABOVE else LONG_TILES_PER_SEGMENT


def segment_length(n: int) -> int:
    """L(N) = C(N) * F(N)."""
    return lanes(n) * tiles_per_segment(n)


def num_segments(n: int) -> int:
    """S(N) = ceil(N / L(N)); 1 for N = 0."""
    return max(1, cdiv(n, segment_length(n)))


def levels(n: int) -> list[int]:
    """Lengths of the vectors reduced at each level: [N, S(N), S(S(N)), ..., 1]."""
    out = [int(n)]
    while out[-1] > 1:
        out.append(num_segments(out[-1]))
    return out


def describe(n: int) -> str:
    """A one-line human description of the order for length n."""
    parts = []
    m = int(n)
    while True:
        c, f, s = lanes(m), tiles_per_segment(m), num_segments(m)
        parts.append(f"N={m}: {s} segment(s) x {f} tile(s) x {c} lanes")
        if s == 1:
            break
        m = s
    return "; then ".join(parts)


def log2(n: int) -> int:
    """log2 of a power of two."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"log2: expected a power of two, got {n}")
    return n.bit_length() - 1


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


def _segment_results(a: np.ndarray) -> np.ndarray:
    """One level of the rule over the last axis: [..., N] -> [..., S] segment results."""
    n = a.shape[-1]
    c, f = lanes(n), tiles_per_segment(n)
    s = num_segments(n)
    padded = s * c * f
    if padded != n:
        pad = np.zeros(a.shape[:-1] + (padded - n,), dtype=a.dtype)
        a = np.concatenate([a, pad], axis=-1)
    a = a.reshape(a.shape[:-1] + (s, f, c))
    acc = a[..., 0, :]
    for t in range(1, f):
        acc = acc + a[..., t, :]
    return halving_tree(acc)


def reference_sum(x, axis: int = -1) -> np.ndarray:
    """Sum along ``axis`` in the treefold order, in float32 (NumPy); the CPU reference.

    Accepts a NumPy array or a torch tensor of any float dtype; the values are converted to
    float32 first (the accumulation type). Returns a float32 array with ``axis`` removed.
    """
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").float().numpy()
    a = np.moveaxis(np.asarray(x, dtype=np.float32), axis, -1)
    if a.shape[-1] == 0:
        return np.zeros(a.shape[:-1], dtype=np.float32)
    while a.shape[-1] > 1:
        a = _segment_results(a)
    return a[..., 0]


def pairwise_error_bound(values: np.ndarray) -> float:
    """A bound on |treefold sum - exact sum| for float32 inputs.

    Every element passes through at most D = F - 1 + log2(C) adds per level, summed over the
    levels; with u = 2^-24 the classic bound for such a summation is (D u / (1 - D u)) * sum|x_i|.
    """
    n = int(values.size)
    if n <= 1:
        return 0.0
    depth = 0
    for m in levels(n)[:-1]:
        depth += tiles_per_segment(m) - 1 + log2(lanes(m))
    u = 2.0 ** -24
    gamma = depth * u / (1 - depth * u)
    return gamma * float(np.abs(values.astype(np.float64)).sum())
