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
    sentinel (integers), so that a result or a scratch buffer a kernel forgets to write (or reads
    before writing) cannot pass by luck. Take the references first: they allocate too."""
    real_empty, real_like, real_new = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def fill(t):
        return t.fill_(float("nan") if t.dtype.is_floating_point else -777)

    def start():
        monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
        monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_like(*a, **k)))
        monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: fill(real_new(self, *a, **k)))
    return start
