import os

import numpy as np
import pytest
import torch

CUDA = torch.cuda.is_available()
#: Where tests put data that should reach the kernels: the GPU when there is one (compiled
#: kernels), else the CPU (the interpreter under TRITON_INTERPRET=1, otherwise the references).
DEVICE = "cuda" if CUDA else "cpu"
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="GPU tier: needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not CUDA:
            item.add_marker(skip_gpu)


_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t):
    return t.detach().cpu().contiguous().view(-1).view(_SAME_SIZE_INT[t.element_size()])


def assert_same_bits(a, b, what=""):
    """The same shape, dtype and bits (NaN payloads included)."""
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert torch.equal(_bits(a), _bits(b)), f"{what}: {int((_bits(a) != _bits(b)).sum())} elements differ"


@pytest.fixture
def device():
    """The device the CPU tier or the GPU tier runs on."""
    return DEVICE


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


@pytest.fixture
def poison_allocations(monkeypatch):
    """Call it to make every later torch.empty / empty_like / new_empty return NaN (floats) or a
    sentinel (integers; 0xA5 in each byte of unsigned ones), so that a result or a scratch buffer
    a kernel forgets to write (or reads before writing) cannot pass by luck. Take the references
    first: they allocate too."""
    real_empty, real_like, real_new = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def fill(t):
        if t.dtype.is_floating_point:
            return t.fill_(float("nan"))
        return t.fill_(-777 if t.dtype.is_signed else 0xA5)  # (0xA5: a workspace's bytes)

    def start():
        monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
        monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_like(*a, **k)))
        monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: fill(real_new(self, *a, **k)))
    return start


class InterpretedPrepared:
    """Stands for ``Launcher.prepare``'s PreparedLaunch under Triton's interpreter: it keeps the
    launch's arguments and, when called, launches again with the slots' new tensors (an int slot
    is an address in the caller's workspace: a view of that memory with the prepared tensor's
    dtype and shape) and the new integers in the scalar slots."""

    def __init__(self, launcher, grid, args, kwargs, slots, scalars):
        self.launcher, self.grid, self.args, self.kwargs = launcher, grid, list(args), kwargs
        # as Launcher.prepare requires: every tensor argument is a slot (none is relaunched from
        # the prepared call's own memory)
        assert all(not isinstance(a, torch.Tensor) or any(a is t for t in slots) for a in args)
        self.positions = [[i for i, a in enumerate(args) if a is t] for t in slots]
        self.like = list(slots)
        # (position, key, key function) per scalar slot, as Launcher.prepare makes them
        self._scalar_slots = []
        for name in scalars:
            i = launcher._runtime_names.index(name)
            self._scalar_slots.append((i, launcher.int_key_of(i)(args[i]), launcher.int_key_of(i)))

    def accepts(self, values):
        from treefold._ops.launch import PreparedLaunch
        return PreparedLaunch.accepts(self, values)  # the same test over the same slots

    def __call__(self, *values, scalars=()):
        import ctypes
        args = list(self.args)
        for positions, like, value in zip(self.positions, self.like, values):
            if isinstance(value, int):
                raw = (ctypes.c_char * (like.numel() * like.element_size())).from_address(value)
                value = torch.frombuffer(raw, dtype=like.dtype).view(like.shape)
            for i in positions:
                args[i] = value
        assert self.accepts(scalars)
        for (i, _, _), v in zip(self._scalar_slots, scalars):
            args[i] = v
        self.launcher(self.grid, *args, **self.kwargs)
        InterpretedPrepared.launched += 1
        return True

    def launch_addresses(self, addresses, scalars=()):
        self(*addresses, scalars=scalars)

    launched = 0


def prepare_through_the_interpreter(monkeypatch, ops):
    """Launcher.prepare launches and returns an ``InterpretedPrepared``; ``ops`` (a launcher
    module) keeps no prepared call yet."""
    from treefold._ops import launch as launch_mod

    def prepare(self, grid, args, kwargs, slots, scalars=()):
        self(grid, *args, **kwargs)
        return InterpretedPrepared(self, grid, args, kwargs, slots, scalars)

    monkeypatch.setattr(launch_mod.Launcher, "prepare", prepare)
    monkeypatch.setattr(ops, "_PREPARED", {})
    monkeypatch.setattr(InterpretedPrepared, "launched", 0)


# ---- every interpreted memory access inside the launch's tensors --------------------------------
# Triton's interpreter reads and writes host memory at whatever address a kernel computes, so an
# access past a tensor's end goes unseen on the CPU (it reads a neighbour's bytes, or another
# allocation's) and would be an out-of-bounds access on the GPU. Under the interpreter every
# launch records the byte span of each tensor it is given, and every load, store and atomic
# checks that the addresses its live lanes touch lie inside one of them: a kernel that reaches
# outside its arguments fails the test that launched it, whatever it does with the bytes.


class LaunchSpans:
    """The byte spans [start, end) of the tensors of the launch the interpreter is running,
    merged and sorted, and the kernel's name for the failure message."""

    current = None

    def __init__(self, name: str, tensors):
        spans = []
        for t in tensors:
            if t.numel() == 0:
                continue
            size = t.element_size()
            low = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
            high = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0)
            spans.append((t.data_ptr() + low * size, t.data_ptr() + (high + 1) * size))
        merged = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.name = name
        self.starts = np.array([s for s, _ in merged], dtype=np.uint64)
        self.ends = np.array([e for _, e in merged], dtype=np.uint64)

    def check(self, what: str, pointers, mask, size: int) -> None:
        pointers = np.asarray(pointers, dtype=np.uint64)
        live = pointers if mask is None else pointers[np.broadcast_to(np.asarray(mask, dtype=bool), pointers.shape)]
        live = live.reshape(-1)
        if live.size == 0:
            return
        place = np.searchsorted(self.starts, live, side="right").astype(np.int64) - 1
        inside = place >= 0
        inside[inside] = live[inside] + np.uint64(size) <= self.ends[place[inside]]
        if not inside.all():
            bad = live[~inside]
            raise AssertionError(
                f"{self.name}: {what} of {bad.size} live lane(s) outside every tensor of the launch, first at "
                f"{int(bad[0]):#x} ({size}-byte elements; the tensors' spans: "
                + ", ".join(f"[{int(s):#x}, {int(e):#x})" for s, e in zip(self.starts, self.ends)) + ")")


def _tensors_of(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, tuple):
            yield from _tensors_of(v)


@pytest.fixture(autouse=True)
def accesses_inside_the_launch_tensors(monkeypatch):
    """Under the interpreter, every kernel launch of every test checks its memory accesses
    (``LaunchSpans``); without it, nothing is patched."""
    if not INTERPRETED:
        yield
        return
    from triton.runtime import interpreter

    run = interpreter.GridExecutor.__call__

    def launch(self, *args, **kwargs):
        outer = LaunchSpans.current
        tensors = list(_tensors_of(list(args) + list(kwargs.values())))
        if any(t.device.type != "cpu" for t in tensors):
            return run(self, *args, **kwargs)
        LaunchSpans.current = LaunchSpans(getattr(self.fn, "__name__", "kernel"), tensors)
        try:
            return run(self, *args, **kwargs)
        finally:
            LaunchSpans.current = outer

    builder = interpreter.InterpreterBuilder

    def element_size(pointers):
        return interpreter._get_np_dtype(pointers.get_element_ty()).itemsize

    def checked(method, what, pointer_at, mask_at):
        original = getattr(builder, method)

        def wrapper(self, *args, **kwargs):
            spans = LaunchSpans.current
            if spans is not None:
                pointers = args[pointer_at]
                mask = None if mask_at is None else args[mask_at]
                spans.check(what, pointers.data, None if mask is None else mask.data, element_size(pointers))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(builder, method, wrapper)

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", launch)
    checked("create_masked_load", "a load", 0, 1)
    checked("create_masked_store", "a store", 0, 2)
    checked("create_atomic_rmw", "an atomic", 1, 3)
    checked("create_atomic_cas", "an atomic compare-and-swap", 0, None)
    yield
