"""The CPU tier's check that every interpreted load, store and atomic stays inside the launch's
tensors (conftest's ``accesses_inside_the_launch_tensors``) catches what it is for and lets
masked lanes, strided views and several arguments be."""
import pytest
import torch
import triton
import triton.language as tl

from conftest import INTERPRETED

pytestmark = pytest.mark.skipif(not INTERPRETED, reason="checks Triton's interpreter (TRITON_INTERPRET=1)")


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, stride_x, READ_PAST: tl.constexpr, WRITE_PAST: tl.constexpr,
                 BLOCK: tl.constexpr):
    """y[i] = x[i * stride_x] for i < n; READ_PAST reads one more element, WRITE_PAST writes one."""
    i = tl.arange(0, BLOCK)
    read = i < n + READ_PAST
    v = tl.load(x_ptr + i * stride_x, mask=read, other=0.0)
    tl.store(y_ptr + i, v, mask=i < n + WRITE_PAST)


@triton.jit
def _count_kernel(counter_ptr, n, PAST: tl.constexpr):
    """One relaxed atomic add per program on counter[0], or with PAST on counter[n]."""
    tl.atomic_add(counter_ptr + PAST * n, 1, sem="relaxed")


def test_masked_lanes_strided_views_and_several_tensors_pass():
    x = torch.randn(40)
    y = torch.full((10,), float("nan"))
    _copy_kernel[(1,)](x[::4], y, 10, 4, False, False, BLOCK=16)  # lanes 10..15 masked off
    assert torch.equal(y, x[::4])
    counter = torch.zeros(3, dtype=torch.int32)
    _count_kernel[(5,)](counter, 3, False)
    assert counter.tolist() == [5, 0, 0]


@pytest.mark.parametrize("read_past, write_past", [(True, False), (False, True)])
def test_a_load_or_store_one_past_the_end_fails(read_past, write_past):
    # (x and y views into larger buffers: the element past each end is real memory, and still outside)
    x, y = torch.randn(64)[:10], torch.empty(64)[:10]
    with pytest.raises(Exception, match="outside every tensor of the launch"):
        _copy_kernel[(1,)](x, y, 10, 1, read_past, write_past, BLOCK=16)


def test_an_atomic_past_the_end_fails():
    counter = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(Exception, match="an atomic of 1 live lane"):
        _count_kernel[(1,)](counter, 3, True)
