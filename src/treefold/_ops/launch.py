"""A lean launch path for treefold's Triton kernels.

Triton's ``kernel[grid](...)`` binds every argument, re-derives its specialisation and hashes the
result on every call: 20-40 us of host time per launch in Triton 3.6 for kernels with many
constexpr arguments, which is most of what a decode-sized call costs. ``Launcher`` keeps the
compiled kernel per specialisation key and calls it directly.

The key holds everything Triton specialises on: for each tensor its dtype and whether its
address is 16-byte aligned; for each integer what Triton 3.6 specialises it on (equal to 1,
divisible by 16, and whether it needs 32 or 64 bits, signed or not; for an integer the kernel
names in ``do_not_specialize``, the bits alone), so that an argument that changes on every call
(a seed, an offset) does not miss the cache every time; the type of any
other value; the device; and the constexpr values and launch options. Tensors are passed to the compiled launcher
as their addresses, and with Triton 3.6 its C entry point is called directly. A new key goes through Triton's own path once (which
compiles or finds the kernel) and is then cached.

Only compiled CUDA launches without launch hooks take the lean path: while a profiler has
installed hooks, every call goes through Triton's own path, which calls them. Under Triton's
interpreter, or with TREEFOLD_TRITON_LAUNCH=1 in the environment, every call goes through
``kernel[grid](...)``.
"""
from __future__ import annotations

import functools
import inspect
import os
from typing import Optional

import torch

import triton
from triton import knobs as _knobs

from ..backend import INTERPRETED
from ..kernels.combine import HAS_DEPENDENT_LAUNCH

#: Triton's chain of launch hooks (empty by default), None in a Triton without one.
_HookChain = getattr(_knobs, "HookChain", None)

_TRITON_VERSION = triton.__version__
#: Cached specialisations per kernel before the cache is emptied.
_MAX_ENTRIES = 4096
_INT32_END = 1 << 31
_INT64_END = 1 << 63
_PLAIN = INTERPRETED or os.environ.get("TREEFOLD_TRITON_LAUNCH", "0") not in ("", "0")
#: The current CUDA device's index; None in a CPU-only torch build, which launches on no GPU.
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def _active(hook):
    """The hook, or None when there is none to call (Triton 3.6 installs empty HookChains)."""
    if hook is None or (isinstance(getattr(hook, "calls", None), list) and not hook.calls):
        return None
    return hook


def launch_hooks_active() -> bool:
    """Whether a profiler's launch hooks are installed (they must see Triton's own launch path).
    Asked on every prepared launch: the usual case, Triton 3.6's two empty HookChains, is read
    from their lists of calls directly."""
    enter, leave = _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook
    if enter.__class__ is _HookChain and leave.__class__ is _HookChain:
        return bool(enter.calls or leave.calls)
    return _active(enter) is not None or _active(leave) is not None


def _specialise(args):
    """(key, run arguments): each tensor becomes its address (the compiled launcher then reads it
    directly instead of calling ``data_ptr()`` and querying the driver about the pointer), keyed
    by dtype, 16-byte alignment and device index; each integer by what Triton specialises it on
    (``int_key``); a bool tagged apart from the integers 0 and 1; any other value by its type."""
    key, run = [], []
    for value in args:
        cls = value.__class__
        if cls is int:
            key.append(int_key(value))
            run.append(value)
        elif isinstance(value, torch.Tensor):
            # the device index too: addresses skip the launcher's own check that they are
            # device memory, so a tensor elsewhere must miss the cache and take Triton's path
            address = value.data_ptr()
            key.append((value.dtype, address % 16 == 0, value.get_device()))
            run.append(address)
        elif cls is bool:
            key.append(("b", value))
            run.append(value)
        else:
            key.append(cls)
            run.append(value)
    return tuple(key), tuple(run)


def int_key(value: int):
    """What Triton 3.6 specialises an integer argument on (its ``native_specialize_impl``): the
    value 1 (made a constant), divisibility by 16, and the type: i32 inside [-2^31, 2^31), u64
    from 2^63, i64 otherwise."""
    if value == 1:
        return "1"
    if -_INT32_END <= value < _INT32_END:
        return "i32" if value & 15 else "i32/16"
    return (int_type_key(value), value & 15 == 0)


def int_type_key(value: int) -> str:
    """What Triton 3.6 keys an integer argument it does not specialise (a kernel's
    ``do_not_specialize``) on: its type alone, i32 inside [-2^31, 2^31), u64 from 2^63, i64
    otherwise."""
    if -_INT32_END <= value < _INT32_END:
        return "i32"
    return "u64" if value >= _INT64_END else "i64"


def unspecialised_names(kernel) -> set:
    """The names of the arguments a jitted kernel declares in ``do_not_specialize`` (given by name
    or by position; the interpreter's function keeps the jit's keywords in ``kwargs``)."""
    fn = getattr(kernel, "fn", kernel)
    names = list(inspect.signature(fn).parameters)
    named = getattr(kernel, "do_not_specialize", None) or getattr(kernel, "kwargs", {}).get("do_not_specialize") or ()
    return {names[a] if isinstance(a, int) else a for a in named}


def check_max_registers(fn: str, value) -> None:
    """A launch's ``max_registers`` (Triton's ``maxnreg``): None, or an int from 24 to 255, the
    per-thread caps ptxas accepts."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 24 <= value <= 255):
        raise ValueError(f"{fn}: max_registers must be None or an int from 24 to 255, got {value!r}")


#: Lanes of a warp.
WARP_LANES = 32


def warp_runs(lanes: int, group: int) -> int:
    """Runs per segment (``kernels.combine.run_tree_sum``) that give each lane of a warp one
    16-byte vector (``group`` lanes) of every run: a block ``[.., segments, runs, 32 x group]``,
    whose warps Triton then gives to its rows and segments, so that a segment's tree stays inside
    its warps. 1 where a segment is narrower than a warp's vectors."""
    return max(1, lanes // (WARP_LANES * group))


def checked_runs(who: str, runs, lanes: int, group: int) -> int:
    """``runs`` asked of a launch (``kernels.combine.run_tree_sum``'s RUNS) checked against its
    segments of ``lanes`` lanes in groups of ``group``: a power of two from 1 to the groups per
    segment, else a ValueError that names ``who`` and says the range."""
    most = lanes // group
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1 or runs & (runs - 1) or runs > most:
        raise ValueError(f"{who}: runs must be a power of two from 1 to {most} (groups per segment), got {runs!r}")
    return runs


def _log2(value: int) -> int:
    return value.bit_length() - 1


def block_bits(shape: tuple, vector: int, num_warps: int) -> list:
    """Where Triton 3.6 puts each index bit of a loaded block: for each dimension, from its lowest
    bit up, "R" (a thread's registers), "L" (lanes of a warp) or "W" (warps).

    For blocks whose last dimension is the contiguous one and whose loads are ``vector`` elements
    wide (every address 16-byte aligned and every integer in them a multiple of 16), as the norm
    forward kernel's ``[rows, segments, runs, lanes // runs]`` blocks are: Triton's default blocked
    layout with sizePerThread ``vector`` on the last dimension and the order (last, 0, 1, ...):
    the 32 lanes, then the warps, fill the last dimension first and then the others in order
    (the last of them takes whatever is left), and the bits above them are registers again.
    ``tests/test_sm90_compile.py`` checks this against the layouts Triton gives the norm kernels'
    trees."""
    rank = len(shape)
    order = [rank - 1] + list(range(rank - 1))
    per_thread = [1] * rank
    per_thread[-1] = min(vector, shape[-1])
    per_warp = [1] * rank
    per_block = [1] * rank
    lanes, warps = WARP_LANES, num_warps
    for i, d in enumerate(order):
        per_warp[d] = lanes if i == rank - 1 else min(lanes, max(1, shape[d] // per_thread[d]))
        lanes //= per_warp[d]
    for i, d in enumerate(order):
        room = max(1, shape[d] // (per_thread[d] * per_warp[d]))
        per_block[d] = warps if i == rank - 1 else min(warps, room)
        warps //= per_block[d]
    bits = []
    for d in range(rank):
        kinds = ["R"] * _log2(per_thread[d]) + ["L"] * _log2(per_warp[d]) + ["W"] * _log2(per_block[d])
        kinds = kinds[:_log2(shape[d])]
        bits.append(kinds + ["R"] * (_log2(shape[d]) - len(kinds)))
    return bits


def warp_levels(bits: list) -> tuple:
    """(first, count): the longest run of at least two consecutive levels of a halving tree whose
    index bits (``bits``, lowest first, as ``block_bits`` gives them) are all warp bits; its levels
    go from the highest bit down. (0, 0) where there is none."""
    levels = list(reversed(bits))
    best = (0, 0)
    level = 0
    while level < len(levels):
        end = level
        while end < len(levels) and levels[end] == "W":
            end += 1
        if end - level >= 2 and end - level > best[1]:
            best = (level, end - level)
        level = max(end, level + 1)
    return best


def tree_exchanges(rows: int, segments: int, runs: int, lanes: int, group: int, vector: int,
                   num_warps: int) -> Optional[tuple]:
    """The levels of a row's trees (``kernels.norms.row_tree_sum``: over the runs, over a run's
    groups, over the segments) that ``kernels.combine.halving_tree`` meets in one exchange between
    warps, for a block ``[rows, segments, runs, lanes // runs]`` of rows grouped by ``group``
    lanes and loaded ``vector`` elements at a time; None where no level is met so or where they
    cannot be told (the interpreter, whose sums take NumPy's order; loads narrower than the
    groups)."""
    if INTERPRETED or vector != group:
        return None
    span = lanes // runs
    bits = block_bits((rows, segments, runs, span), vector, num_warps)
    exchanges = warp_levels(bits[2]), warp_levels(bits[3][_log2(group):]), warp_levels(bits[1])
    return exchanges if any(count for _, count in exchanges) else None


def register_cap(max_registers) -> dict:
    """The launch option that caps registers per thread (``{"maxnreg": n}``), or none for None."""
    return {"maxnreg": max_registers} if max_registers else {}


def check_eviction_policy(fn: str, name: str, value, default: bool = True, keep: bool = False) -> None:
    """A launch's L2 eviction policy ``name`` for its loads or stores: "" (none), "evict_first",
    "evict_last" where the launch offers ``keep`` (loads read again later), or, where the launcher
    has a ``default`` of its own, None for that."""
    allowed = ((None,) if default else ()) + ("", "evict_first") + (("evict_last",) if keep else ())
    if value not in allowed:
        raise ValueError(f"{fn}: {name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


@functools.lru_cache(maxsize=64)
def dependent_launch(device_type: str, index: Optional[int]) -> bool:
    """Whether launches on this device may be programmatic dependent launches: a CUDA device of
    sm_90 or later, compiled kernels (Triton's interpreter runs no inline assembly, and
    ``gdc_wait`` / ``gdc_launch_dependents`` are that), and a Triton that builds them."""
    if device_type != "cuda" or INTERPRETED or not HAS_DEPENDENT_LAUNCH:
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9


def _direct_launch(compiled):
    """The compiled launcher's C entry point, when calling it directly is known to be what
    ``compiled.run`` does (Triton 3.6's CudaLauncher with no scratch buffers); else None."""
    run = getattr(compiled, "run", None)
    launch = getattr(run, "launch", None)
    if (launch is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
            or not _TRITON_VERSION.startswith("3.6.")):
        return None
    return launch, run.launch_cooperative_grid, run.launch_pdl


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
        # runtime arguments Triton does not specialise on their value: keyed by their type alone
        unspecialised = unspecialised_names(kernel)
        self._unspecialised = tuple(i for i, n in enumerate(self._runtime_names) if n in unspecialised)
        # Kernels whose constexpr parameters all come last take the cheap merge.
        self._constexpr_last = all(i in constexpr for i in range(len(names) - len(constexpr), len(names)))
        self._cache: dict = {}

    def __call__(self, grid, *args, **kwargs):
        cuda = bool(args) and isinstance(args[0], torch.Tensor) and args[0].is_cuda
        if cuda:
            device = args[0].device.index
            if device != _current_device():
                # Triton compiles, loads and launches for the current device: a tensor on
                # another GPU (a model split over devices) is launched from its own device
                with torch.cuda.device(device):
                    return self(grid, *args, **kwargs)
        if _PLAIN or not cuda or launch_hooks_active():
            # Launch hooks (profilers) see what Triton's own path gives them.
            return self._triton_launch(grid, args, kwargs)
        spec, run_args = _specialise(args)
        if self._unspecialised:
            spec = self._typed(spec, args)
        key = (device, spec, tuple(kwargs.items()))
        entry = self._cache.get(key)
        if entry is None:
            compiled = self._triton_launch(grid, args, kwargs)
            values = self._constexpr_values(kwargs)
            tail = tuple(values[n] for n in self._constexpr_names) if self._constexpr_last else None
            if len(self._cache) >= _MAX_ENTRIES:
                self._cache.clear()
            self._cache[key] = (compiled, values, tail, _direct_launch(compiled))
            return compiled
        compiled, constexpr_values, tail, direct = entry
        full = run_args + tail if tail is not None else self._merge(run_args, constexpr_values)
        g0 = grid[0]
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        stream = torch._C._cuda_getCurrentRawStream(device)
        if direct is not None:
            launch, cooperative, pdl = direct
            launch(g0, g1, g2, stream, compiled.function, cooperative, pdl, None, None,
                   compiled.packed_metadata, None, None, None, *full)
        else:
            compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *full)
        return compiled

    def _typed(self, spec, args):
        """``spec`` with the integers Triton does not specialise keyed by their type alone."""
        spec = list(spec)
        for i in self._unspecialised:
            if args[i].__class__ is int:
                spec[i] = int_type_key(args[i])
        return tuple(spec)

    def int_key_of(self, index: int):
        """The key function of the runtime argument at ``index`` when it is an integer:
        ``int_type_key`` for one the kernel does not specialise, else ``int_key``."""
        return int_type_key if index in self._unspecialised else int_key

    def takes(self, name: str) -> bool:
        """Whether the kernel has a runtime (non-constexpr) argument of this name."""
        return name in self._runtime_names

    def prepare(self, grid, args, kwargs, slots, scalars=()) -> Optional["PreparedLaunch"]:
        """Launch now, and return a ``PreparedLaunch`` that repeats this launch with other tensors
        in place of ``slots`` (tensors of ``args``, matched by identity; every tensor argument
        must be one) and other integers in place of the runtime arguments named in ``scalars``,
        or None where the lean path does not apply (interpreter, hooks, a CPU tensor, an
        unaligned slot, a tensor argument outside the slots, a Triton whose launcher is not
        called directly)."""
        compiled = self(grid, *args, **kwargs)
        if (_PLAIN or not isinstance(args[0], torch.Tensor) or not args[0].is_cuda
                or any(t.data_ptr() % 16 for t in slots)):
            return None
        device = args[0].device.index
        spec, run_args = _specialise(args)
        if self._unspecialised:
            spec = self._typed(spec, args)
        entry = self._cache.get((device, spec, tuple(kwargs.items())))
        if entry is None or entry[2] is None or entry[3] is None:
            return None
        compiled, _, tail, direct = entry
        positions = tuple(tuple(i for i, a in enumerate(args) if a is t) for t in slots)
        covered = {i for p in positions for i in p}
        if any(isinstance(a, torch.Tensor) and i not in covered for i, a in enumerate(args)):
            # a tensor outside the slots would be launched again at its old address, which its
            # owner may have freed by then: such a launch is not prepared
            return None
        scalar_slots = tuple((i, self.int_key_of(i)(args[i]), self.int_key_of(i))
                             for i in (self._runtime_names.index(name) for name in scalars))
        g = tuple(grid) + (1,) * (3 - len(grid))
        return PreparedLaunch(direct, g, compiled.function, compiled.packed_metadata,
                              list(run_args + tail), positions, device, scalar_slots)

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


class PreparedLaunch:
    """One compiled launch with every argument fixed but a few tensors (and integers):
    ``prepared(*tensors, scalars=())`` launches it with those tensors' addresses in the slots
    (a slot also takes an address as an int) and the integers in the scalar slots, and returns
    True, or launches nothing and returns False when it cannot (an address not 16-byte aligned,
    as the kernel was compiled for; an integer that Triton would specialise differently, such as
    1 where the kernel was compiled for other values; a profiler's launch hooks installed since).
    Callers keep one per (shape, strides, dtypes, device, options) and fall back on the ordinary
    path on False.

    A call is most of what a repeated eager call pays on the host besides Triton's C launcher,
    so it keeps the launcher's whole argument list (grid, stream, function, launch flags,
    metadata, then the kernel's arguments) and only writes the stream and the slots into a copy.
    """

    __slots__ = ("_launch", "_args", "_slots", "_device", "_scalar_slots")

    #: Where the kernel's arguments start in the C launcher's argument list, and the stream's place.
    _KERNEL_ARGS, _STREAM = 13, 3

    def __init__(self, direct, grid, function, metadata, template, positions, device, scalar_slots=()):
        """``scalar_slots``: (position among the kernel's arguments, the integer's key, the
        function that keys it: ``Launcher.int_key_of``) for each scalar slot."""
        launch, cooperative, pdl = direct
        g0, g1, g2 = grid
        self._launch = launch
        # no scratch buffers, no launch metadata, no hooks (a call with hooks declines)
        self._args = [g0, g1, g2, None, function, cooperative, pdl, None, None, metadata, None, None, None,
                      *template]
        self._slots = tuple(tuple(self._KERNEL_ARGS + i for i in p) for p in positions)
        self._device = device
        self._scalar_slots = tuple((self._KERNEL_ARGS + i, key, keyed) for i, key, keyed in scalar_slots)

    def accepts(self, scalars) -> bool:
        """Whether the integers ``scalars`` (in scalar-slot order) fit this compiled launch."""
        return all(keyed(v) == key for (_, key, keyed), v in zip(self._scalar_slots, scalars))

    def __call__(self, *tensors, scalars=()) -> bool:
        # (the checks and the filling in one loop, not through ``launch_addresses``: this is the
        # whole host path of a one-launch eager call, and the extra list and call took it from
        # 1.4-1.6 to 2.2-2.4 us with a stand-in launcher, benchmarks/probe_prepared_host.py)
        if launch_hooks_active():
            return False
        if _current_device is not None and _current_device() != self._device:
            with torch.cuda.device(self._device):
                return self(*tensors, scalars=scalars)
        args = self._args.copy()
        addresses = 0  # every address OR-ed: one alignment test for all
        for positions, tensor in zip(self._slots, tensors):
            address = tensor if tensor.__class__ is int else tensor.data_ptr()
            addresses |= address
            for i in positions:
                args[i] = address
        if addresses & 15:
            return False
        if scalars:
            for (i, key, keyed), value in zip(self._scalar_slots, scalars):
                if keyed(value) != key:
                    return False
                args[i] = value
        args[self._STREAM] = torch._C._cuda_getCurrentRawStream(self._device)
        self._launch(*args)
        return True

    def launch_addresses(self, addresses, scalars=()) -> None:
        """Launch with the slots' ``addresses`` (ints) and the integers ``scalars``, which the
        caller has checked as ``__call__`` does (16-byte aligned, ``accepts``, no launch hooks):
        a ``PreparedPipeline`` checks its call once for all its launches."""
        args = self._args.copy()
        for positions, address in zip(self._slots, addresses):
            for i in positions:
                args[i] = address
        for (i, _, _), value in zip(self._scalar_slots, scalars):
            args[i] = value
        args[self._STREAM] = torch._C._cuda_getCurrentRawStream(self._device)
        self._launch(*args)


class PreparedPipeline:
    """The prepared launches of one kind of eager call of several launches (``sample``, ``top_k``,
    the masks, the reductions): ``launches`` are (PreparedLaunch, its slot names, its scalar slot
    names). A call allocates its outputs (``outputs``: (slot name, shape, dtype) each) and, when
    the launches write other buffers (``buffers``: name -> a tensor of its size), one workspace
    that holds them all, each at a 256-byte offset; then it launches each with the addresses of
    the call's tensors (``x``, and ``tensors`` by slot name) and its integers (``ints`` by slot
    name), and returns the output (a tuple of them when there are several). Returns None, having
    launched nothing, when a launch would decline (an unaligned tensor, an integer that the
    kernels were compiled for differently, profiler hooks): the ordinary path then answers.

    A call is what a repeated eager call pays on the host besides its launches, so the slots are
    resolved when the pipeline is made: each launch's slots are positions in one list of the
    call's values (x, the outputs, the workspace's buffers, the caller's tensors)."""

    __slots__ = ("launches", "offsets", "workspace_bytes", "outputs", "_named", "_plan", "_has_scalars")

    def __init__(self, launches, buffers: dict, outputs: tuple):
        self.launches = launches
        self.offsets, end = {}, 0
        for name, t in buffers.items():
            self.offsets[name] = end
            end += -(-t.numel() * t.element_size() // 256) * 256
        self.workspace_bytes = end  # 0: no workspace to allocate
        self.outputs = outputs
        own = ["x", *(name for name, _, _ in outputs), *self.offsets]
        # the caller's tensors: every other slot name, in a fixed order
        self._named = tuple(sorted({name for _, names, _ in launches for name in names} - set(own)))
        position = {name: i for i, name in enumerate(own + list(self._named))}
        self._plan = tuple((prepared, tuple(position[name] for name in names), tuple(scalars))
                           for prepared, names, scalars in launches)
        self._has_scalars = any(scalars for _, _, scalars in launches)

    def __call__(self, x: torch.Tensor, tensors: dict, ints: dict):
        # the checks of every launch, once: the caller's addresses (the outputs and the workspace
        # are allocated aligned), the hooks, the integers
        x_address = x.data_ptr()
        named = [tensors[name].data_ptr() for name in self._named]
        every = x_address
        for address in named:
            every |= address
        if every & 15 or launch_hooks_active():
            return None
        if self._has_scalars and not all(prepared.accepts(tuple(ints[name] for name in scalars))
                                         for prepared, _, scalars in self._plan):
            return None
        device = x.device
        if x.is_cuda and device.index != _current_device():
            with torch.cuda.device(device):  # the launches' own device (see ``Launcher``)
                return self(x, tensors, ints)
        outs = [torch.empty(shape, dtype=dtype, device=device) for _, shape, dtype in self.outputs]
        values = [x_address, *(out.data_ptr() for out in outs)]
        workspace = None  # (held until the launches are queued: the stream orders its reuse after them)
        if self.workspace_bytes:
            workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device)
            base = workspace.data_ptr()
            values += [base + offset for offset in self.offsets.values()]
        values += named
        for prepared, slots, scalars in self._plan:
            prepared.launch_addresses([values[i] for i in slots],
                                      tuple(ints[name] for name in scalars) if scalars else ())
        del workspace
        return outs[0] if len(outs) == 1 else tuple(outs)
