"""A lean launch path for treefold's Triton kernels.

Triton's ``kernel[grid](...)`` binds every argument, re-derives its specialisation and hashes the
result on every call: 20-40 us of host time per launch in Triton 3.6 for kernels with many
constexpr arguments, which is most of what a decode-sized call costs. ``Launcher`` keeps the
compiled kernel per specialisation key and calls it directly.

The key holds everything Triton specialises on, conservatively: for each tensor its dtype and
whether its address is 16-byte aligned; for each integer whether it equals 1, whether it is
divisible by 16 and whether it fits in 32 bits; the type of any other value; the device; and
the constexpr values and launch options. A new key goes through Triton's own path once (which
compiles or finds the kernel) and is then cached.

Only compiled CUDA launches take the lean path; launch hooks (profilers install them) are called
as Triton calls them. Under Triton's interpreter, or with TREEFOLD_TRITON_LAUNCH=1 in the
environment, every call goes through ``kernel[grid](...)``.
"""
from __future__ import annotations

import inspect
import os

import torch

from triton import knobs as _knobs

from ..backend import INTERPRETED

_PLAIN = INTERPRETED or os.environ.get("TREEFOLD_TRITON_LAUNCH", "0") not in ("", "0")


def _active(hook):
    """The hook, or None when there is none to call (Triton 3.6 installs empty HookChains)."""
    if hook is None or (isinstance(getattr(hook, "calls", None), list) and not hook.calls):
        return None
    return hook


def _spec(value):
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        return (value == 1, value % 16 == 0, -(1 << 31) <= value < (1 << 31))
    return type(value)


class Launcher:
    """Launch ``kernel`` as ``launcher(grid, *runtime_args, **constexprs_and_options)``.

    Runtime (non-constexpr) arguments are passed positionally in the kernel's order; constexpr
    arguments and launch options (num_warps, num_stages, enable_fp_fusion, ...) by keyword.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        fn = getattr(kernel, "fn", kernel)
        signature = inspect.signature(fn)
        names = list(signature.parameters)
        params = list(signature.parameters.values())
        constexpr = {i for i, p in enumerate(params) if "constexpr" in str(p.annotation)}
        self._runtime_names = [n for i, n in enumerate(names) if i not in constexpr]
        self._constexpr_names = [n for i, n in enumerate(names) if i in constexpr]
        self._defaults = {p.name: p.default for i, p in enumerate(params) if i in constexpr}
        self._layout = [(i in constexpr, n) for i, n in enumerate(names)]
        # Kernels whose constexpr parameters all come last take the cheap merge.
        self._constexpr_last = all(i in constexpr for i in range(len(names) - len(constexpr), len(names)))
        self._cache: dict = {}

    def __call__(self, grid, *args, **kwargs):
        if _PLAIN or not args or not isinstance(args[0], torch.Tensor) or not args[0].is_cuda:
            return self._triton_launch(grid, args, kwargs)
        device = args[0].device.index
        key = (device, tuple(map(_spec, args)), tuple(kwargs.items()))
        entry = self._cache.get(key)
        if entry is None:
            compiled = self._triton_launch(grid, args, kwargs)
            values = self._constexpr_values(kwargs)
            tail = tuple(values[n] for n in self._constexpr_names) if self._constexpr_last else None
            self._cache[key] = (compiled, values, tail)
            return compiled
        compiled, constexpr_values, tail = entry
        full = args + tail if tail is not None else self._merge(args, constexpr_values)
        g0 = grid[0]
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        stream = torch._C._cuda_getCurrentRawStream(device)
        enter, leave = _active(_knobs.runtime.launch_enter_hook), _active(_knobs.runtime.launch_exit_hook)
        metadata = compiled.launch_metadata(grid, stream, *full) if enter is not None else None
        compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, metadata, enter, leave, *full)
        return compiled

    def _triton_launch(self, grid, args, kwargs):
        if self._runtime_names and len(args) != len(self._runtime_names):
            raise TypeError(f"{getattr(self.kernel, '__name__', 'kernel')}: expected {len(self._runtime_names)} runtime arguments "
                            f"({', '.join(self._runtime_names)}), got {len(args)}")
        return self.kernel[grid](*args, **kwargs)

    def _constexpr_values(self, kwargs):
        return {name: kwargs.get(name, self._defaults.get(name)) for name in self._constexpr_names}

    def _merge(self, args, constexpr_values):
        out, it = [], iter(args)
        for is_constexpr, name in self._layout:
            out.append(constexpr_values[name] if is_constexpr else next(it))
        return out
