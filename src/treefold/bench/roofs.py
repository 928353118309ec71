"""The roof every result is measured against: a large copy on the same device, in the same run.

A memory-bound kernel cannot move bytes faster than the card copies them, so the percentage of
this copy's bandwidth (bytes read + bytes written) is the honest score. Absolute bandwidth drifts
between machines and even between runs; the ratio within one run does not.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import torch

#: Bytes in the copy's source buffer on a GPU (the copy moves twice this: read + write).
GPU_COPY_BYTES = 1 << 30
#: On the CPU a smaller copy keeps a smoke run fast; it still dwarfs the caches.
CPU_COPY_BYTES = 64 << 20


@dataclass
class Roof:
    gbs: float          # bandwidth of the copy, counting bytes read + bytes written
    us: float           # median time of one copy
    bytes_moved: int    # 2 x buffer size
    device: str
    how: str

    def as_dict(self) -> dict:
        return asdict(self)

    def percent(self, nbytes: float, us: float) -> float:
        """A call that moves ``nbytes`` in ``us`` microseconds, as a percentage of this roof."""
        return 100.0 * nbytes / (us * 1e3) / self.gbs


def measure_copy_roof(device: torch.device, timer: Callable, nbytes: int | None = None) -> Roof:
    """Time ``dst.copy_(src)`` for a buffer of ``nbytes`` bytes on ``device``."""
    if nbytes is None:
        nbytes = GPU_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES
    nbytes = int(nbytes)
    if nbytes < 4:
        raise ValueError(f"measure_copy_roof: nbytes must be >= 4, got {nbytes}")
    n = nbytes // 4
    src = torch.rand(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    us = timer(lambda: dst.copy_(src))
    moved = 2 * n * 4
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return Roof(gbs=moved / (us * 1e-6) / 1e9, us=us, bytes_moved=moved, device=str(device),
                how=f"copy of {n * 4 / 2**30:.3g} GiB, read + write counted")
