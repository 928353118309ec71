import os

import numpy as np
import pytest
import torch

CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="GPU tier: needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def device():
    """The device the CPU tier or the GPU tier runs on."""
    return "cuda" if CUDA else "cpu"


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)
