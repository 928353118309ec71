"""The treefold order: the rule, its NumPy reference, and the Triton trees giving the same bits."""
import math

import numpy as np
import pytest
import torch

from treefold import order
from treefold.backend import use_kernel
from treefold._ops.reduce import tree_sum_rows

LENGTHS_CPU = [1, 2, 3, 31, 1000, 1024, 1025, 4097, 100003]


def test_rule_depends_on_length_and_dtype_only():
    assert order.lanes(1) == 1 and order.lanes(3) == 4 and order.lanes(5000) == order.MAX_LANES
    assert order.group(4096, torch.bfloat16) == 8 and order.group(4096, torch.float16) == 8
    assert order.group(4096, torch.float32) == 4 and order.group(4096, np.float32) == 4
    assert order.group(2, torch.bfloat16) == 2  # never wider than the segment
    assert order.group(100, None) == 1  # segment results: a plain halving tree
    assert order.num_segments(0) == 1
    assert order.num_segments(4097) == 2
    assert order.levels(151936) == [151936, 38, 1]
    assert order.levels(1 << 28) == [1 << 28, 1 << 16, 16, 1]
    assert "segment" in order.describe(1 << 26)


def test_grouped_tree_reduces_each_vector_first():
    a = np.arange(16, dtype=np.float32) + 1
    # groups of 4: (1+3)+(2+4)=10, 26, 42, 58; then (10+42)+(26+58)
    assert order.grouped_tree(a, 4) == np.float32(136)
    x = np.array([2.0 ** 24, 1, 1, 1, 1, 1, 1, 1], dtype=np.float32)
    g4 = order.grouped_tree(x, 4)
    g1 = order.grouped_tree(x, 1)
    assert g4 == np.float32(np.float32(np.float32(2.0 ** 24) + np.float32(2)) + np.float32(4))
    assert g1 == order.halving_tree(x)


def test_halving_tree_pairs_lane_j_with_j_plus_half():
    a = np.array([1.0, 2.0, 4.0, 8.0], dtype=np.float32)
    # (1 + 4) + (2 + 8), done as level one [5, 10], level two [15]
    assert order.halving_tree(a) == 15.0
    big, small = np.float32(2.0 ** 24), np.float32(1.0)
    # lanes 0,2 and 1,3 pair first: (2^24 + 1) + (1 + 1) rounds differently from a left fold
    v = np.array([big, small, small, small], dtype=np.float32)
    assert order.halving_tree(v) == np.float32(np.float32(big + small) + np.float32(small + small))
    with pytest.raises(ValueError, match="power of two"):
        order.halving_tree(np.ones(3, dtype=np.float32))


@pytest.mark.parametrize("n", LENGTHS_CPU + [(1 << 20) + 7])
def test_reference_is_a_valid_sum(n, rng):
    """|treefold sum - fsum| within the bound of a depth-D summation."""
    x = rng.standard_normal(n).astype(np.float32) * rng.uniform(0.1, 100)
    got = float(order.reference_sum(x))
    exact = math.fsum(x.astype(np.float64))
    assert abs(got - exact) <= order.pairwise_error_bound(x) + 1e-30


@pytest.mark.parametrize("n", LENGTHS_CPU)
def test_triton_tree_matches_reference_bits(n, rng):
    x = torch.from_numpy(rng.standard_normal((3, n)).astype(np.float32) * 37.0)
    if not use_kernel(x):
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU-only machine")
    got = tree_sum_rows(x).numpy()
    want = order.reference_sum(x.numpy())
    assert got.tobytes() == want.tobytes()


def test_triton_sum_of_squares_matches_reference_bits(rng):
    x = torch.from_numpy(rng.standard_normal((2, 4095)).astype(np.float32))
    if not use_kernel(x):
        pytest.skip("needs TRITON_INTERPRET=1")
    got = tree_sum_rows(x, square=True).numpy()
    want = order.reference_sum(x.numpy() * x.numpy())
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_group_by_eight_and_match_reference(dtype, rng):
    x = torch.from_numpy(rng.standard_normal((3, 5000)).astype(np.float32)).to(dtype)
    if not use_kernel(x):
        pytest.skip("needs TRITON_INTERPRET=1")
    got = tree_sum_rows(x).numpy()
    assert got.tobytes() == order.reference_sum(x).tobytes()
    # the group width is part of the order: the float32 copy of the same values sums differently
    # in general, and equals the reference computed with groups of four
    assert tree_sum_rows(x.float()).numpy().tobytes() == order.reference_sum(x.float()).tobytes()


def test_long_vector_three_levels_matches_reference(rng):
    n = (1 << 24) // 64 + 4099
    x = torch.from_numpy(rng.uniform(0, 1, (1, n)).astype(np.float32))
    if not use_kernel(x):
        pytest.skip("needs TRITON_INTERPRET=1")
    assert tree_sum_rows(x).numpy().tobytes() == order.reference_sum(x.numpy()).tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 31, 4097, 151936, (1 << 24) + 1, 1 << 26])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_tree_matches_cpu_reference_bits(n, dtype):
    x = (torch.rand(n, generator=torch.Generator().manual_seed(n)) * 2 - 1).to(dtype)
    want = order.reference_sum(x)
    got = tree_sum_rows(x.view(1, n).cuda()).cpu().numpy()[0]
    assert got.tobytes() == np.float32(want).tobytes()
