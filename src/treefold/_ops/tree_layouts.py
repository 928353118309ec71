"""Which compiled float sums realise the treefold order: a check of a kernel's TTGIR.

Fused tree levels (``treefold.kernels.combine``, "Levels fused by layout") ask the compiler for one
sum over several levels of a halving tree. That sum is the halving tree only when the summed axis
lies on lanes alone or on warps alone, index bit k on lane (or warp) bit k: the compiler then
reduces it by a butterfly from the highest bit down. Over registers it would fold sequentially,
and over lanes and warps together it would take the low bits first. The layout is the compiler's
choice, so ``Launcher`` reads it from each compiled kernel that fuses levels (``WARP_BITS``) and
launches the level-by-level tree instead where this check finds a sum that is not one butterfly.
"""
from __future__ import annotations

import re

_LAYOUT = re.compile(r"^(#\w+) = #ttg\.(?:linear|blocked)<\{(.*)\}>$", re.M)
_REDUCE = re.compile(r'"tt\.reduce"\(%[\w.]+\) <\{axis = (\d+) : i32\}> \(\{((?:(?!"tt\.reduce").)*?)\}\) : '
                     r'\(tensor<([\dx]+)x(\w+), (#\w+)>', re.S)
_KINDS = ("register", "lane", "warp")


def layout_bases(body: str, shape: list[int]) -> dict[str, list[list[int]]]:
    """Basis vectors per hardware dimension (register, lane, warp) of a TTGIR linear layout, or of a
    blocked layout laid over a tensor of ``shape``: bit i of a thread's register (lane, warp) index
    adds the i-th vector to the element's coordinates."""
    if body.startswith("register"):
        out = {}
        for kind in _KINDS:
            listed = re.search(kind + r" = (\[(?:\[[-\d, ]*\](?:, )?)*\])", body).group(1)
            out[kind] = [[int(v) for v in vector.split(",")] if vector.strip() else []
                         for vector in re.findall(r"\[([-\d, ]*)\]", listed[1:-1])]
        return out
    fields = {name: [int(v) for v in re.search(name + r" = \[([\d, ]*)\]", body).group(1).split(",")]
              for name in ("sizePerThread", "threadsPerWarp", "warpsPerCTA", "order")}
    out = {kind: [] for kind in _KINDS}
    covered = [1] * len(shape)

    def extend(kind: str, dim: int, count: int) -> None:
        for _ in range(count.bit_length() - 1):
            vector = [0] * len(shape)
            vector[dim] = covered[dim] if covered[dim] < shape[dim] else 0  # beyond the shape: broadcast
            out[kind].append(vector)
            covered[dim] *= 2

    for kind, name in zip(_KINDS, ("sizePerThread", "threadsPerWarp", "warpsPerCTA")):
        for dim in fields["order"]:
            extend(kind, dim, fields[name][dim])
    for dim in fields["order"]:  # a shape larger than the layout's tile repeats it in registers
        while covered[dim] < shape[dim]:
            vector = [0] * len(shape)
            vector[dim] = covered[dim]
            out["register"].append(vector)
            covered[dim] *= 2
    return out


def unordered_sums(ttgir: str) -> list[tuple]:
    """The float32 sums of a TTGIR module over more than two values that are not one butterfly over
    lanes alone or warps alone: (shape, axis, the axis's index bits per hardware dimension) each."""
    layouts = dict(_LAYOUT.findall(ttgir))
    found = []
    for match in _REDUCE.finditer(ttgir):
        axis, region, shape = int(match.group(1)), match.group(2), [int(v) for v in match.group(3).split("x")]
        if match.group(4) != "f32" or "arith.addf" not in region or shape[axis] <= 2:
            continue
        layout = layouts.get(match.group(5))
        if layout is None:  # a layout this check cannot read counts as unordered
            found.append((shape, axis, None))
            continue
        bits = {kind: [v[axis] for v in vectors if v[axis]] for kind, vectors in layout_bases(layout, shape).items()}
        kinds = [kind for kind, values in bits.items() if values]
        ordered = (len(kinds) == 1 and kinds[0] != "register"
                   and bits[kinds[0]] == [1 << i for i in range(len(bits[kinds[0]]))]
                   and 1 << len(bits[kinds[0]]) == shape[axis])
        if not ordered:
            found.append((shape, axis, bits))
    return found


def float_sums(ttgir: str) -> int:
    """How many float32 sums a TTGIR module holds (for tests of this check)."""
    return sum(1 for m in _REDUCE.finditer(ttgir) if m.group(4) == "f32" and "arith.addf" in m.group(2))
