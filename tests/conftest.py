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
