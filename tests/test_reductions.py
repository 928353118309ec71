"""sum, mean, amax, amin, argmax, argmin, norm: the kernels against the references.

Sums, means and norms must equal the NumPy references of the treefold order bit for bit (that is
the promise; no tolerance is stated because none is allowed). ``accurate=True`` must return the
float32 nearest the exact sum, judged by an exact rational sum and by ``math.fsum``. Max, min and
their indices are exact: they must equal NumPy's / torch's choices (first NaN, lowest index).

CPU tier: kernels through Triton's interpreter (TRITON_INTERPRET=1), small shapes; on a machine
with a GPU the same tests run the compiled kernels (``on_device``). Without either the public
functions run the references and the kernel-only tests skip.
GPU tier (``gpu`` marker): the compiled kernels at the issue's sizes.
"""
import fractions
import math

import numpy as np
import pytest
import torch

import treefold as tf
from treefold import order
from treefold._ops import reduce as reduce_ops
from treefold._ops.reduce import ExtremeTuning, SumTuning, extreme_rows, tree_sum_rows
from treefold.backend import use_kernel
from treefold.reference import reductions as ref

from conftest import DEVICE, INTERPRETED, InterpretedPrepared, prepare_through_the_interpreter

KERNEL = use_kernel(torch.empty(0, device=DEVICE))
needs_kernel = pytest.mark.skipif(not KERNEL, reason="needs TRITON_INTERPRET=1 (or a GPU)")
FLOATS = [torch.float32, torch.bfloat16, torch.float16]
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class _OnDevice:
    """treefold's reductions and the launchers ``tree_sum_rows`` and ``extreme_rows``, with their
    tensor arguments moved to DEVICE and their tensor results brought back to the CPU. The CPU
    tier keeps its data and references on the CPU and reaches the kernels through this: compiled
    on a GPU machine, in the interpreter on a CPU one (where the moves do nothing)."""

    def __getattr__(self, name):
        fn = getattr(reduce_ops, name) if name in ("tree_sum_rows", "extreme_rows") else getattr(tf, name)

        def call(*args, **kwargs):
            out = fn(*(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args), **kwargs)
            return tuple(t.cpu() for t in out) if isinstance(out, tuple) else out.cpu()

        call.__name__ = name
        setattr(self, name, call)  # one function per name: ``fn is on_device.argmax`` holds
        return call


on_device = _OnDevice()


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor (NaN payloads and signed zeros included)."""
    t = t.detach().cpu().contiguous()
    return t.view(_INT_VIEW[t.element_size()]) if t.dtype.is_floating_point else t


def assert_same_bits(got: torch.Tensor, want: torch.Tensor):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    assert torch.equal(bits(got), bits(want)), (got, want)


def data(rng, shape, dtype=torch.float32, scale=1.0):
    """Random values, never zero: |x| in [0.25, 4) * scale with random signs."""
    mag = rng.uniform(0.25, 4.0, size=shape) * scale
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return torch.from_numpy((mag * sign).astype(np.float32)).to(dtype)


def want_sum(x: torch.Tensor, dim, out_dtype=None) -> torch.Tensor:
    """The order's NumPy reference, rounded once to the output dtype."""
    out_dtype = out_dtype or x.dtype
    if dim is None:
        r = order.reference_sum(x.reshape(-1), dtype=x.dtype)
    else:
        r = order.reference_sum(x, dtype=x.dtype)
    return torch.from_numpy(np.asarray(r, dtype=np.float32)).to(out_dtype)


# ---- sums in the treefold order -------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [1, 2, 3, 31, 1000, 4096, 4097, 20011])
def test_sum_bits_equal_the_order_reference(n, dtype, rng):
    x = data(rng, (3, n), dtype, scale=37.0)
    assert_same_bits(on_device.sum(x, dim=-1), want_sum(x, -1))
    assert_same_bits(on_device.sum(x), want_sum(x, None))
    # float32 output: the accumulator itself, unrounded
    assert_same_bits(on_device.sum(x, dim=1, dtype=torch.float32), want_sum(x, -1, torch.float32))


def test_whole_tensor_of_three_levels_matches_reference(rng):
    # 2^24 + 5 values: 4097 segment results, then 2, then 1 (the order's third level)
    n = (1 << 24) + 5
    x = torch.from_numpy(rng.uniform(0, 1, n).astype(np.float32))
    assert order.levels(n) == [n, 4097, 2, 1]
    assert_same_bits(on_device.sum(x), want_sum(x, None))


@needs_kernel
@pytest.mark.parametrize("tuning", [
    SumTuning(), SumTuning(fuse_finish=False), SumTuning(segments_per_program=1),
    SumTuning(segments_per_program=4, num_warps=8), SumTuning(rows_per_program=1),
    SumTuning(finish_elements=4096, evict_first=True),
    # tree nodes at the first level (whole-tensor sums on the GPU), 1 or 2 segments per step
    SumTuning(node_stride=2), SumTuning(node_stride=4, segments_per_program=2),
    SumTuning(node_stride=1, segments_per_program=4),
    # segments held as runs of lanes (a launch choice of where the warps sit), or not
    SumTuning(runs=1), SumTuning(runs=2, rows_per_program=4), SumTuning(runs=8, segments_per_program=2),
])
@pytest.mark.parametrize("n", [31, 5000, 70001])
def test_launch_choices_never_change_the_bits(tuning, n, rng):
    x = data(rng, (5, n), torch.float32, scale=3.0)
    want = torch.from_numpy(order.reference_sum(x.numpy()))
    assert_same_bits(on_device.tree_sum_rows(x, tuning=tuning), want)
    acc = on_device.tree_sum_rows(x, accurate=True, tuning=tuning)
    assert_same_bits(acc, torch.from_numpy(ref.accurate_sum(x.numpy())))


def test_batch_size_and_row_position_do_not_change_a_row(rng):
    x = data(rng, (9, 3001), torch.bfloat16).to(DEVICE)  # slices keep their offsets in the batch
    alone = on_device.sum(x[4:5], dim=-1)
    assert_same_bits(on_device.sum(x, dim=-1)[4:5], alone)
    assert_same_bits(on_device.sum(x[2:7], dim=-1)[2:3], alone)


def test_repeated_calls_give_one_value(rng):
    x = data(rng, (70001,), torch.float32)
    values = {bits(on_device.sum(x)).item() for _ in range(5)}
    assert len(values) == 1


def test_evenly_strided_rows_are_read_in_place(rng, monkeypatch):
    wide = data(rng, (6, 5000), torch.float32).to(DEVICE)
    x = wide[:, 7:4103]  # rows 5000 apart, last dim contiguous
    assert not x.is_contiguous()
    copies = []
    real = torch.Tensor.contiguous
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda self, *a, **k: copies.append(1) or real(self, *a, **k))
    got = on_device.sum(x, dim=-1)
    monkeypatch.undo()
    assert copies == []
    assert_same_bits(got, want_sum(x.contiguous().cpu(), -1))


def test_rows_that_a_dimension_of_one_entry_does_not_space_evenly(rng):
    # [B, 1, T, K] cut to [B, 1, q, K]: the 1's stride equals the B's; the rows are not one
    # stride apart, so they are copied, not read at the wrong places
    x = data(rng, (2, 1, 7, 50), torch.float32).to(DEVICE)[:, :, :3]
    assert x.stride() == (350, 350, 50, 1)
    assert_same_bits(on_device.sum(x, dim=-1), want_sum(x.contiguous().cpu(), -1))
    assert torch.equal(on_device.argmax(x, dim=-1).cpu(), x.cpu().argmax(-1))


def test_strided_vectors_and_one_column_slices(rng):
    # tensors whose elements, taken in logical order, are not adjacent: copied into one row
    w = data(rng, (5, 3), torch.float32).to(DEVICE)
    v = data(rng, (10,), torch.float32).to(DEVICE)[::2]
    for x in (w[:, :1], w[:, 0], v, data(rng, (1, 4), torch.float32).to(DEVICE).expand(3, 4)):
        assert_same_bits(on_device.sum(x), want_sum(x.contiguous().reshape(-1).cpu(), -1))
        assert float(on_device.amax(x)) == float(x.amax())
        assert_same_bits(on_device.norm(x), on_device.norm(x.contiguous()))
    assert_same_bits(on_device.sum(v, dim=-1), want_sum(v.contiguous().cpu(), -1))
    assert_same_bits(on_device.mean(w[:, 0], dim=-1), on_device.mean(w[:, 0].contiguous(), dim=-1))


def test_non_contiguous_tensors_reduce_their_logical_order(rng):
    base = data(rng, (300, 70), torch.float32)
    xt = base.t()  # not contiguous
    assert_same_bits(on_device.sum(xt), want_sum(xt.contiguous(), None))
    assert_same_bits(on_device.sum(xt, dim=-1), want_sum(xt.contiguous(), -1))
    assert int(on_device.argmax(xt)) == int(torch.argmax(xt.contiguous()))
    assert_same_bits(on_device.amin(xt, dim=-1), xt.amin(dim=-1))


def test_leading_dims_are_batch(rng):
    x = data(rng, (2, 3, 4, 777), torch.float16)
    got = on_device.sum(x, dim=-1, keepdim=True)
    assert got.shape == (2, 3, 4, 1)
    assert_same_bits(got[..., 0].reshape(-1), want_sum(x.reshape(-1, 777), -1))


def test_shapes_and_keepdim():
    x = torch.ones(2, 3, 5)
    assert on_device.sum(x).shape == () and on_device.sum(x, keepdim=True).shape == (1, 1, 1)
    assert on_device.sum(x, dim=2).shape == (2, 3) and on_device.sum(x, dim=-1, keepdim=True).shape == (2, 3, 1)
    assert on_device.argmax(x, keepdim=True).shape == (1, 1, 1) and on_device.argmax(x, dim=-1).shape == (2, 3)
    s = torch.tensor(2.5)
    for fn in (on_device.sum, on_device.mean, on_device.amax, on_device.norm):
        assert fn(s).shape == () and fn(s, dim=0).shape == () and fn(s, dim=-1, keepdim=True).shape == ()
    assert float(on_device.sum(s)) == 2.5 and int(on_device.argmax(s)) == 0


def test_signed_zeros_follow_the_reference():
    x = torch.full((4096,), -0.0)
    # -0.0: no padding, every add is -0 + -0. Compiled, and in the reference, the float32 tree
    # keeps the sign; combine.tree_sum's tl.sum runs as NumPy's axis sum in the interpreter,
    # which starts from +0.0, so there only the value is checked.
    if not INTERPRETED or not KERNEL:
        assert_same_bits(on_device.sum(x), want_sum(x, None))
    assert float(on_device.sum(x)) == 0.0 and bits(want_sum(x, None)).item() == bits(torch.tensor(-0.0)).item()
    assert_same_bits(on_device.sum(x, accurate=True), torch.tensor(-0.0))  # pairs keep it everywhere
    y = torch.full((31,), -0.0)
    assert_same_bits(on_device.sum(y), want_sum(y, None))  # +0.0: padded with +0.0
    assert_same_bits(on_device.sum(y, accurate=True), torch.tensor(0.0))


def test_every_output_is_written(rng, poison_allocations):
    xs = [data(rng, (37, 31)), data(rng, (5, 9000)), data(rng, (3, 70001), torch.bfloat16)]
    wants = [(want_sum(x, -1), ref.extreme_rows(x, True)) for x in xs]
    poison_allocations()
    for x, (want, (v, i)) in zip(xs, wants):
        assert_same_bits(on_device.sum(x, dim=-1), want)
        assert torch.equal(on_device.argmax(x, dim=-1), i)
        assert_same_bits(on_device.amax(x, dim=-1), v)
        assert not torch.isnan(on_device.sum(x, dim=-1, accurate=True)).any()
        assert not torch.isnan(on_device.mean(x, dim=-1)).any()


# ---- integer sums ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n", [1, 33, 9000])
def test_integer_sums_are_exact_int64(dtype, n, rng):
    big = 2**31 - 1 if dtype == torch.int32 else 2**62
    x = torch.from_numpy(rng.integers(-big, big, size=(3, n))).to(dtype)
    got = on_device.sum(x, dim=-1)
    assert got.dtype == torch.int64
    assert torch.equal(got, x.sum(dim=-1, dtype=torch.int64))  # wraps like torch for int64
    assert torch.equal(on_device.sum(x), x.sum(dtype=torch.int64))
    assert torch.equal(on_device.sum(x, dim=-1, dtype=torch.int32), x.sum(dim=-1, dtype=torch.int64).to(torch.int32))
    assert torch.equal(on_device.amax(x, dim=-1), x.amax(dim=-1)) and torch.equal(on_device.amin(x), x.amin())


# ---- mean and norm --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [1, 3, 4097, 20011])
def test_mean_and_norms_bits(n, dtype, rng):
    x = data(rng, (3, n), dtype)
    a = x.float().numpy()
    mean = (order.reference_sum(a, dtype=dtype).astype(np.float64) / n).astype(np.float32)
    assert_same_bits(on_device.mean(x, dim=-1), torch.from_numpy(mean).to(dtype))
    norm2 = np.sqrt(order.reference_sum(a * a, dtype=dtype))
    assert_same_bits(on_device.norm(x, dim=-1, dtype=torch.float32), torch.from_numpy(norm2))
    assert_same_bits(on_device.norm(x, dim=-1), torch.from_numpy(norm2).to(dtype))
    norm1 = order.reference_sum(np.abs(a), dtype=dtype)
    assert_same_bits(on_device.norm(x, dim=-1, ord=1), torch.from_numpy(norm1).to(dtype))
    assert_same_bits(on_device.norm(x, dim=-1, ord=math.inf), x.abs().amax(dim=-1))
    # against float64, with the bound of the order's depth (a property, not a definition)
    exact = torch.linalg.vector_norm(x.double(), dim=-1)
    assert torch.allclose(on_device.norm(x, dim=-1, dtype=torch.float32).double(), exact, rtol=2e-6, atol=0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_norm_of_huge_values_overflows_without_scaling():
    x = torch.tensor([3e19, 4e19])
    assert math.isinf(float(on_device.norm(x)))  # documented: no scaling
    assert float(on_device.norm(x, ord=math.inf)) == pytest.approx(4e19)


# ---- the accurate sum -----------------------------------------------------------------------

def _cases(rng):
    n = 20011
    yield "normal", rng.standard_normal(n).astype(np.float32)
    yield "uniform", rng.uniform(0, 1, n).astype(np.float32)
    # magnitudes over 2^-60 .. 2^60: the float32 sum loses most of them
    yield "wide", (rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))).astype(np.float32)
    # heavy cancellation: pairs x, -x plus small noise; the exact sum is tiny
    big = (rng.standard_normal(n // 2) * 1e6).astype(np.float32)
    yield "cancel", rng.permutation(np.concatenate([big, -big, rng.standard_normal(11).astype(np.float32)]))
    yield "tiny", (rng.standard_normal(4097) * 1e-42).astype(np.float32)  # subnormals
    yield "ones", np.ones(4099, dtype=np.float32)


@pytest.mark.parametrize("exact_groups", [True, False])
def test_accurate_sum_is_the_nearest_float(exact_groups, rng):
    for name, a in _cases(rng):
        x = torch.from_numpy(a)
        nearest = ref.correctly_rounded_sum(a)
        assert ref.fsum_float32(a) == nearest, name  # the two yardsticks agree
        if KERNEL:
            got = on_device.tree_sum_rows(x.view(1, -1), accurate=True, exact_groups=exact_groups)[0]
        else:
            got = torch.tensor(ref.accurate_sum(a, exact_groups=exact_groups))
        assert_same_bits(got, torch.tensor(nearest)), name
        assert_same_bits(got, torch.from_numpy(ref.accurate_sum(a, exact_groups=exact_groups)))


def test_accurate_sum_beats_float32_where_float32_fails(rng):
    # 2^20 uniform [0, 1) values: float32 trees are a few ulps off; accurate is exact-rounded
    a = rng.uniform(0, 1, 1 << 20).astype(np.float32)
    x = torch.from_numpy(a)
    nearest = ref.correctly_rounded_sum(a)
    assert float(on_device.sum(x, accurate=True)) == float(nearest)
    assert_same_bits(on_device.sum(x, accurate=True), torch.tensor(nearest))


def nearest_float32(q: fractions.Fraction) -> float:
    """The float32 nearest the rational q (ties to even), without a rounding through float64."""
    guess = np.float32(float(q))
    candidates = [guess, np.nextafter(guess, np.float32(np.inf)), np.nextafter(guess, np.float32(-np.inf))]
    return float(min(candidates, key=lambda f: (abs(fractions.Fraction(float(f)) - q),
                                                int(np.array(f).view(np.int32)) & 1)))


def test_accurate_sum_keeps_what_cancels_inside_a_group(rng):
    # a small value between two large ones that cancel, all in one 16-byte group: plain float64
    # adds there lose it (1.4901161e-07 for 1.5e-07); the default TwoSum groups keep it
    cases = [np.array([1e8, 0, 1.5e-7, 0, -1e8, 0, 0, 0], dtype=np.float32),
             np.array([2.0 ** 31, 0, 1 + 2.0 ** -23, 0, -(2.0 ** 31), 0, 0, 0], dtype=np.float32)]
    pairs = (rng.standard_normal(2048) * 1e8).astype(np.float32)
    groups = np.stack([pairs, rng.standard_normal(2048).astype(np.float32), -pairs,
                       rng.standard_normal(2048).astype(np.float32)], axis=1)  # x, noise, -x, noise
    cases.append(groups.reshape(-1))
    for a in cases:
        x = torch.from_numpy(a).to(DEVICE)
        nearest = ref.correctly_rounded_sum(a)
        assert_same_bits(tf.sum(x, accurate=True).cpu(), torch.tensor(nearest))
        assert float(tf.mean(x, accurate=True)) == nearest_float32(sum(map(fractions.Fraction, a.tolist())) / len(a))
    assert float(tf.sum(torch.from_numpy(cases[0]).to(DEVICE), accurate=True)) == float(np.float32(1.5e-7))


def nearest_16bit(q: fractions.Fraction, dtype: torch.dtype) -> torch.Tensor:
    """The bfloat16 or float16 value nearest the rational q (ties to even), from q itself: the
    16-bit neighbours of q's float64 rounding compared with q exactly."""
    largest = torch.finfo(dtype).max
    below = torch.tensor([largest], dtype=dtype).view(torch.int16) - 1
    # past the largest value by half its ulp or more: infinity (the tie goes to even, which it is)
    if abs(q) >= fractions.Fraction(largest) + (fractions.Fraction(largest) - fractions.Fraction(
            below.view(dtype).item())) / 2:
        return torch.tensor(math.copysign(math.inf, q), dtype=dtype)
    as_int = torch.tensor([float(q)], dtype=torch.float64).to(dtype).view(torch.int16).item()
    candidates = [torch.tensor([as_int + d], dtype=torch.int16).view(dtype) for d in (-1, 0, 1)]
    finite = [c for c in candidates if math.isfinite(c.item())]
    return min(finite, key=lambda c: (abs(fractions.Fraction(c.item()) - q), c.view(torch.int16).item() & 1))[0]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_accurate_sum_rows_and_dtypes(rng):
    for dtype in FLOATS:
        x = data(rng, (4, 3001), dtype, scale=1e3)
        got = on_device.sum(x, dim=-1, accurate=True, dtype=torch.float32)
        want = [ref.correctly_rounded_sum(x[i].float().numpy()) for i in range(4)]
        assert_same_bits(got, torch.tensor(np.array(want)))
        if dtype != torch.float32:
            exact = [ref.exact_sum(x[i].float().numpy()) for i in range(4)]
            assert_same_bits(on_device.sum(x, dim=-1, accurate=True).cpu(),
                             torch.stack([nearest_16bit(q, dtype) for q in exact]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_accurate_16bit_sums_and_means_round_once(dtype):
    """A 16-bit accurate result is the 16-bit value nearest the exact sum (and the float64 mean),
    not a rounding of the nearest float32: sums that lie just past a 16-bit midpoint, whose
    nearest float32 is the midpoint itself (rounded again, to even, it would go the other way)."""
    bits = 8 if dtype == torch.bfloat16 else 11  # significand bits of the 16-bit format
    for top in (1.0, 1.0 + 2.0 ** (1 - bits)):  # even and odd last bits below the midpoint
        for tail in (2.0 ** -30, -(2.0 ** -30)):
            values = [top, 2.0 ** -bits, tail]  # top + half a 16-bit ulp, nudged by the tail
            x = torch.tensor(values, dtype=dtype, device=DEVICE)
            if any(v != float(t) for v, t in zip(values, x.cpu())):
                continue  # (the tail is below float16's range)
            exact = sum(map(fractions.Fraction, values))
            assert_same_bits(on_device.sum(x, accurate=True).cpu(), nearest_16bit(exact, dtype))
            n = len(values)
            mean = fractions.Fraction(float(exact)) / n  # the float64 dividend the mean takes
            assert_same_bits(on_device.mean(x, accurate=True).cpu(),
                             nearest_16bit(fractions.Fraction(float(mean)), dtype))
    # the case a review found: 1 + 2^-8 + 2^-30 in bfloat16 is 1.0078125, not 1.0
    if dtype == torch.bfloat16:
        x = torch.tensor([1.0, 2.0 ** -8, 2.0 ** -30], dtype=dtype, device=DEVICE)
        assert tf.sum(x, accurate=True).item() == 1.0078125


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_accurate_sum_handles_overflowing_partials_and_non_finite():
    f32max = float(np.finfo(np.float32).max)
    x = torch.tensor([f32max, -f32max, f32max, 1.0])  # lanes 0 and 2 meet first
    assert float(on_device.sum(x, accurate=True)) == f32max  # the exact sum rounds to f32max
    assert math.isinf(float(on_device.sum(x)))  # float32 partials overflow
    assert math.isinf(float(on_device.sum(torch.tensor([f32max, f32max]), accurate=True)))
    assert float(on_device.sum(torch.tensor([1.0, math.inf, 2.0]), accurate=True)) == math.inf
    assert math.isnan(float(on_device.sum(torch.tensor([math.inf, -math.inf]), accurate=True)))
    assert math.isnan(float(on_device.sum(torch.tensor([1.0, math.nan]), accurate=True)))


def test_accurate_mean(rng):
    a = rng.uniform(-1, 3, 5003).astype(np.float32)
    x = torch.from_numpy(a)
    exact = ref.exact_sum(a) / 5003
    got = float(on_device.mean(x, accurate=True))
    assert got == float(ref.round_to_float32(exact)) or abs(got - float(exact)) <= 2 ** -24 * abs(float(exact))
    assert_same_bits(on_device.mean(x, accurate=True), torch.from_numpy(np.asarray(ref.accurate_mean(a))))


def test_exact_sum_and_round_to_float32_yardsticks():
    from fractions import Fraction
    assert ref.exact_sum(np.array([1e30, 1.0, -1e30], dtype=np.float32)) == 1
    # 2^24 + 1 is a float32 midpoint: ties to even (2^24), and a hair above rounds up
    assert ref.round_to_float32(Fraction(2**24 + 1)) == np.float32(2**24)
    assert ref.round_to_float32(Fraction(2**24 + 1) + Fraction(1, 2**40)) == np.float32(2**24 + 2)
    assert ref.round_to_float32(Fraction(2**24 + 3)) == np.float32(2**24 + 4)
    assert np.isinf(ref.round_to_float32(Fraction(2) ** 129))
    assert ref.fsum_float32(np.array([2**24, 1, 2**-30], dtype=np.float32)) == np.float32(2**24 + 2)
    with pytest.raises(ValueError, match="finite"):
        ref.exact_sum(np.array([1.0, np.inf], dtype=np.float32))


# ---- max, min and their indices -------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS + [torch.int32, torch.int64])
@pytest.mark.parametrize("n", [1, 2, 31, 4097, 70001])
def test_extremes_match_numpy(n, dtype, rng):
    if dtype.is_floating_point:
        x = data(rng, (3, n), dtype)
    else:
        x = torch.from_numpy(rng.integers(-1000, 1000, size=(3, n))).to(dtype)  # many ties
    a = x.float().numpy() if dtype.is_floating_point else x.numpy()
    for is_max, val_fn, idx_fn, np_fn in ((True, on_device.amax, on_device.argmax, np.argmax),
                                          (False, on_device.amin, on_device.argmin, np.argmin)):
        idx = torch.from_numpy(np_fn(a, axis=1))
        assert torch.equal(idx_fn(x, dim=-1), idx)
        assert_same_bits(val_fn(x, dim=-1), x[torch.arange(3), idx])
        flat = int(np_fn(a.reshape(-1)))
        assert int(idx_fn(x)) == flat
        assert_same_bits(val_fn(x), x.reshape(-1)[flat])


def test_all_negative_inputs_use_minus_infinity_as_identity(rng):
    x = -data(rng, (4, 5000), torch.float32).abs() - 1
    assert (on_device.amax(x, dim=-1) < 0).all()
    assert_same_bits(on_device.amax(x, dim=-1), x.amax(dim=-1))
    assert torch.equal(on_device.argmax(x), x.argmax())
    xi = torch.full((3, 100), torch.iinfo(torch.int64).min, dtype=torch.int64)
    assert torch.equal(on_device.amax(xi, dim=-1), xi[:, 0]) and (on_device.argmax(xi, dim=-1) == 0).all()


def test_ties_go_to_the_lowest_index():
    for n in (8, 4097, 70001):
        x = torch.zeros(n)
        for pos in (n - 1, n // 2, 3):
            x[pos] = 5.0
            assert int(on_device.argmax(x)) == min(p for p in (n - 1, n // 2, 3) if x[p] == 5.0)
        assert int(on_device.argmin(x)) == 0
    x = torch.full((3, 9000), -math.inf)
    assert (on_device.argmax(x, dim=-1) == 0).all() and (on_device.argmin(x, dim=-1) == 0).all()
    z = torch.tensor([-0.0, 0.0, 0.0])
    assert int(on_device.argmax(z)) == 0 and bits(on_device.amax(z)).item() == bits(torch.tensor(-0.0)).item()


def test_nan_wins_and_the_first_nan_is_chosen():
    for n in (5, 4097, 70001):
        x = torch.arange(n, dtype=torch.float32)
        x[n - 2] = math.nan
        x[n // 3 + 1] = math.nan
        for fn in (on_device.argmax, on_device.argmin):
            assert int(fn(x)) == n // 3 + 1 == int(torch.argmax(x) if fn is on_device.argmax else torch.argmin(x))
        assert math.isnan(float(on_device.amax(x))) and math.isnan(float(on_device.amin(x)))
        assert math.isnan(float(on_device.sum(x))) and math.isnan(float(on_device.norm(x, ord=math.inf)))
    x = torch.tensor([1.0, math.inf, -5.0])
    assert int(on_device.argmax(x)) == 1 and float(on_device.amax(x)) == math.inf
    assert float(on_device.sum(x)) == math.inf


@needs_kernel
@pytest.mark.parametrize("tuning", [ExtremeTuning(), ExtremeTuning(lanes=64, tiles=5, loads_in_flight=4),
                                    ExtremeTuning(lanes=256, tiles=1, loads_in_flight=1)])
def test_extreme_launch_choices_give_the_same_pair(tuning, rng):
    x = data(rng, (3, 6001), torch.bfloat16)
    x[1, 3000] = math.nan
    x[2, 100:6000:577] = 9.0  # ties across segments
    v, i = on_device.extreme_rows(x, True, tuning=tuning)
    wv, wi = ref.extreme_rows(x, True)
    assert torch.equal(i, wi) and torch.equal(bits(v), bits(wv))
    v, i = on_device.extreme_rows(x, True, absolute=True, tuning=tuning)
    wv, wi = ref.extreme_rows(x, True, absolute=True)
    assert torch.equal(i, wi) and torch.equal(v.isnan(), wv.isnan())  # |NaN|'s payload is free
    assert torch.equal(bits(v[~v.isnan()]), bits(wv[~wv.isnan()]))
    v, i = on_device.extreme_rows(x, False, absolute=True, tuning=tuning)
    wv, wi = ref.extreme_rows(x, False, absolute=True)
    assert torch.equal(i, wi) and torch.equal(v.isnan(), wv.isnan())


# ---- empty tensors --------------------------------------------------------------------------

def test_empty_tensors():
    e = torch.empty(0)
    assert float(on_device.sum(e)) == 0.0 and math.isnan(float(on_device.mean(e))) and float(on_device.norm(e)) == 0.0
    assert on_device.sum(torch.empty(0, dtype=torch.int32)).dtype == torch.int64
    assert torch.equal(on_device.sum(torch.empty(3, 0), dim=-1), torch.zeros(3))
    assert torch.isnan(on_device.mean(torch.empty(3, 0), dim=-1)).all()
    assert on_device.sum(torch.empty(0, 4), dim=-1).shape == (0,)
    assert on_device.argmax(torch.empty(0, 4), dim=-1).shape == (0,)
    assert on_device.amax(torch.empty(2, 0, 4), dim=-1).shape == (2, 0)
    for odd in (torch.empty(0, 1).expand(0, 4), torch.empty(0, 8)[:, ::2]):  # empty, with odd strides
        assert on_device.sum(odd, dim=-1).shape == (0,) and on_device.amax(odd, dim=-1).shape == (0,)
        assert float(on_device.sum(odd)) == 0.0
    for fn in (on_device.amax, on_device.amin, on_device.argmax, on_device.argmin):
        with pytest.raises(ValueError, match=f"{fn.__name__}: cannot reduce an empty tensor"):
            fn(e)
        with pytest.raises(ValueError, match=r"empty dimension \(dim=-1\)"):
            fn(torch.empty(3, 0), dim=-1)
    with pytest.raises(ValueError, match="norm: cannot reduce"):
        on_device.norm(e, ord=math.inf)


# ---- validation -----------------------------------------------------------------------------

def test_bad_arguments_raise_with_the_function_and_the_value():
    x = torch.ones(3, 4)
    cases = [
        (lambda: on_device.sum([1.0, 2.0]), TypeError, "sum: x must be a torch.Tensor, got list"),
        (lambda: on_device.sum(x.double()), TypeError, "sum: x has dtype float64"),
        (lambda: tf.sum(x.to_sparse()), TypeError, "sum: x is a sparse_coo tensor; treefold takes dense"),
        (lambda: on_device.mean(x.int()), TypeError, "mean: x has dtype int32"),
        (lambda: on_device.norm(x.long()), TypeError, "norm: x has dtype int64"),
        (lambda: on_device.sum(x, dim=0), ValueError, r"sum: dim=0 is not supported; only the last dimension"),
        (lambda: on_device.amax(x, dim=-2), ValueError, r"amax: dim=-2 is not supported"),
        (lambda: on_device.sum(x, dim=2), ValueError, r"sum: dim=2 is out of range"),
        (lambda: on_device.sum(x, dim=(1,)), TypeError, "sum: dim must be an int, got tuple"),
        (lambda: on_device.argmax(x, dim=1.0), TypeError, "argmax: dim must be an int, got float"),
        (lambda: on_device.sum(x, keepdim=1), TypeError, "sum: keepdim must be a bool, got int"),
        (lambda: on_device.sum(x, accurate="yes"), TypeError, "sum: accurate must be a bool, got str"),
        (lambda: on_device.sum(x, dtype="float32"), TypeError, "sum: dtype must be a torch.dtype or None, got str"),
        (lambda: on_device.sum(x, dtype=torch.int64), TypeError, "sum: dtype=int64 is not supported"),
        (lambda: on_device.sum(x.int(), dtype=torch.float32), TypeError, "sum: dtype=float32 is not supported"),
        (lambda: on_device.mean(x, dtype=torch.float64), TypeError, "mean: dtype=float64 is not supported"),
        (lambda: on_device.argmax(x, dtype=torch.float32), TypeError, "argmax: dtype=float32 is not supported"),
        (lambda: on_device.amin(x, dtype=torch.int32), TypeError, "amin: dtype=int32 is not supported"),
        (lambda: on_device.norm(x, ord=3), ValueError, "norm: ord must be 1, 2 or math.inf, got 3"),
        (lambda: on_device.norm(x, ord="fro"), TypeError, "norm: ord must be 1, 2 or math.inf, got str"),
        (lambda: on_device.sum(x, keepdim=np.True_), TypeError, "sum: keepdim must be a bool, got numpy.bool"),
        (lambda: on_device.tree_sum_rows(x.t()), ValueError, "tree_sum_rows: x must have a contiguous last dimension"),
        (lambda: on_device.tree_sum_rows(x[0]), ValueError,
         r"tree_sum_rows: x must be 2-D \[rows, n\], got shape \(4,\)"),
        (lambda: on_device.tree_sum_rows(x, final="max"), ValueError, "tree_sum_rows: final must be"),
        (lambda: on_device.tree_sum_rows(x, tuning=SumTuning(num_warps=3)), ValueError,
         "tuning: num_warps must be a power of two >= 1, got 3"),
        (lambda: on_device.tree_sum_rows(x, tuning=SumTuning(runs=3)), ValueError,
         r"tuning: runs must be a power of two from 1 to 1 \(groups per segment\), got 3"),
        (lambda: on_device.tree_sum_rows(x, tuning=SumTuning(runs=8)), ValueError,
         r"tuning: runs must be a power of two from 1 to 1 \(groups per segment\), got 8"),
        (lambda: on_device.extreme_rows(x, True, tuning=ExtremeTuning(loads_in_flight=8)), ValueError,
         r"tuning: loads_in_flight must be one of \(1, 2, 4\), got 8"),
    ]
    for call, exc, message in cases:
        with pytest.raises(exc, match=message):
            call()
    assert on_device.argmax(x, dtype=torch.int32).dtype == torch.int32


# ---- autograd -------------------------------------------------------------------------------

def test_gradients_match_torch(rng):
    x = data(rng, (3, 500), torch.float32)
    cases = [
        (lambda t: on_device.sum(t, dim=-1), lambda t: t.sum(dim=-1)),
        (lambda t: on_device.sum(t, accurate=True), lambda t: t.sum()),
        (lambda t: on_device.mean(t), lambda t: t.mean()),
        (lambda t: on_device.norm(t, dim=-1), lambda t: torch.linalg.vector_norm(t, dim=-1)),
        (lambda t: on_device.norm(t, ord=1), lambda t: torch.linalg.vector_norm(t, ord=1)),
        (lambda t: on_device.amax(t, dim=-1), lambda t: t.amax(dim=-1)),  # no ties in this data
        (lambda t: on_device.norm(t, dim=-1, ord=math.inf),
         lambda t: torch.linalg.vector_norm(t, ord=math.inf, dim=-1)),
    ]
    g = data(rng, (3,), torch.float32)
    for ours, theirs in cases:
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(a), theirs(b)
        w = g if ya.dim() else g[0]
        (ya * w).sum().backward()
        (yb * w).sum().backward()
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7)
    z = torch.zeros(2, 8, requires_grad=True)
    on_device.norm(z, dim=-1).sum().backward()
    assert torch.equal(z.grad, torch.zeros(2, 8))  # 0 at the origin, as torch


@pytest.mark.skipif(not INTERPRETED or torch.cuda.is_available(), reason="the interpreter stands in for the GPU here")
@pytest.mark.parametrize("n", [700, (1 << 19) + 33])
def test_prepared_reductions_through_the_interpreter(monkeypatch, rng, n):
    # the prepared path of a repeated eager reduction (its result in the public shape, partials
    # and the other output of a max in the workspace), with Launcher.prepare standing in: new
    # inputs give the launchers' own results; rows of 700 take one launch, 2^19 + 33 two
    prepare_through_the_interpreter(monkeypatch, reduce_ops)
    x = data(rng, (3, n))
    cases = [("sum", torch.float32, 0, lambda t, p: tree_sum_rows(t, prepare=p)),
             ("accurate", torch.float32, 0, lambda t, p: tree_sum_rows(t, accurate=True, prepare=p)),
             ("argmax", torch.int64, 1, lambda t, p: extreme_rows(t, True, prepare=p)[1]),
             ("amin", torch.float32, 0, lambda t, p: extreme_rows(t, False, prepare=p)[0])]
    for name, dtype, result, run in cases:
        run(x, reduce_ops.Preparation((name, n), (3, 1), dtype, result))
        launched = InterpretedPrepared.launched
        new = data(rng, (3, n), scale=3.0)
        got = reduce_ops._PREPARED[(name, n)](new, {}, {})
        assert_same_bits(got, run(new, None).reshape(3, 1))
        assert InterpretedPrepared.launched > launched, name


# ---- GPU tier -------------------------------------------------------------------------------

GPU_LENGTHS = [1, 2, 31, (1 << 24) + 1, 1 << 26]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", GPU_LENGTHS)
def test_gpu_sum_bits_equal_cpu_reference_and_are_deterministic(n, dtype):
    x = (torch.rand(n, generator=torch.Generator().manual_seed(n)) * 2 - 1).to(dtype)
    want = torch.from_numpy(np.asarray(order.reference_sum(x), dtype=np.float32))
    xc = x.cuda()
    runs = {bits(tf.sum(xc, dtype=torch.float32)).item() for _ in range(20)}
    assert runs == {bits(want).item()}
    for tuning in (SumTuning(fuse_finish=False), SumTuning(segments_per_program=4, num_warps=8),
                   SumTuning(finish_elements=65536), SumTuning(evict_first=True, num_warps=16),
                   SumTuning(node_stride=0), SumTuning(node_stride=2, num_warps=4),
                   SumTuning(node_stride=128, segments_per_program=2), SumTuning(dependent_launch=False)):
        assert_same_bits(tree_sum_rows(xc.view(1, n), tuning=tuning)[0].cpu(), want)


@pytest.mark.gpu
def test_gpu_sum_above_2_31_elements_uses_64_bit_offsets():
    n = (1 << 31) + 4099
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.rand(n, device="cuda", generator=g, dtype=torch.bfloat16)
    x[n - 3] = 3.0  # beyond 2^31: must be seen
    want = np.float32(ref.reference_sum_chunked(x))
    runs = {bits(tf.sum(x, dtype=torch.float32)).item() for _ in range(20)}
    assert runs == {bits(torch.tensor(want)).item()}
    x[n - 5] = 7.0
    assert int(tf.argmax(x)) == n - 5 and float(tf.amax(x)) == 7.0


@pytest.mark.gpu
def test_gpu_accurate_sum_of_2_26_uniform_floats_is_the_nearest_float():
    x = torch.rand(1 << 26, generator=torch.Generator().manual_seed(26))
    nearest = ref.correctly_rounded_sum(x.numpy())
    xc = x.cuda()
    for exact_groups in (True, False):
        runs = {bits(tree_sum_rows(xc.view(1, -1), accurate=True, exact_groups=exact_groups)).item()
                for _ in range(20)}
        assert runs == {bits(torch.tensor(nearest)).item()}
    assert_same_bits(tf.sum(xc, accurate=True).cpu(), torch.tensor(nearest))
    # the default sum is not it, but within the order's bound
    assert abs(float(tf.sum(xc)) - float(nearest)) <= order.pairwise_error_bound(x.numpy())


@pytest.mark.gpu
@pytest.mark.parametrize("rows_per_program", [None, 1, 2, 4, 16])
@pytest.mark.parametrize("num_warps", [None, 2, 8])
@pytest.mark.parametrize("runs", [None, 1, 16])
def test_gpu_row_sums_bf16_bits(rows_per_program, num_warps, runs):
    x = (torch.randn(8192, 4096, generator=torch.Generator().manual_seed(1))).to(torch.bfloat16)
    want = torch.from_numpy(order.reference_sum(x))
    got = tree_sum_rows(x.cuda(), tuning=SumTuning(rows_per_program=rows_per_program, num_warps=num_warps,
                                                   runs=runs))
    assert_same_bits(got.cpu(), want)
    assert_same_bits(tf.sum(x.cuda(), dim=-1).cpu(), want.to(torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_gpu_extremes_match_torch(dtype):
    g = torch.Generator().manual_seed(3)
    if dtype.is_floating_point:
        x = (torch.randn(1 << 24, generator=g) - 10).to(dtype)  # all negative
    else:
        x = torch.randint(-50, 50, (1 << 24,), generator=g, dtype=dtype)  # many ties
    xc = x.cuda()
    assert int(tf.argmax(xc)) == int(np.argmax(x.float().numpy() if dtype.is_floating_point else x.numpy()))
    assert int(tf.argmin(xc)) == int(np.argmin(x.float().numpy() if dtype.is_floating_point else x.numpy()))
    rows = xc.view(4096, 4096)
    assert torch.equal(tf.argmax(rows, dim=-1), rows.argmax(dim=-1))
    assert torch.equal(tf.amin(rows, dim=-1), rows.amin(dim=-1))
    if dtype.is_floating_point:
        xc[12345678] = math.nan
        xc[1234567] = math.nan
        assert int(tf.argmax(xc)) == 1234567 == int(tf.argmin(xc))


@pytest.mark.gpu
def test_gpu_norms_and_means_bits():
    x = torch.randn(64, 151936, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    a = x.float().numpy()
    xc = x.cuda()
    assert_same_bits(tf.norm(xc, dim=-1, dtype=torch.float32).cpu(),
                     torch.from_numpy(np.sqrt(order.reference_sum(a * a, dtype=torch.bfloat16))))
    mean = (order.reference_sum(a, dtype=torch.bfloat16).astype(np.float64) / a.shape[1]).astype(np.float32)
    assert_same_bits(tf.mean(xc, dim=-1, dtype=torch.float32).cpu(), torch.from_numpy(mean))


def test_sum_plans_use_tree_nodes_only_where_a_row_takes_more_than_one_launch():
    from treefold._ops import reduce as ops
    # a row that one program finishes keeps its single launch, at any batch size
    assert len(ops.plan_sum(16384, 8192, torch.float32, 4, dependent_launch=True)) == 1
    assert len(ops.plan_sum(4096, 1, torch.bfloat16, 4, dependent_launch=True)) == 1
    # a whole tensor: nodes of the next level's tree (a run of 4096 segment results), then one
    # finishing program launched as a dependent launch where the device has it
    first, finish = ops.plan_sum(1 << 26, 1, torch.float32, 4, dependent_launch=True)
    assert first.node_segments * first.node_stride == order.MAX_LANES
    assert first.grid == ops.NODE_PROGRAMS and first.release_dependents and not first.finish
    assert finish.finish and finish.wait_for_prior and finish.lanes == first.node_stride
    plain = ops.plan_sum(1 << 26, 1, torch.float32, 4, dependent_launch=False)
    assert not plain[0].release_dependents and not plain[1].wait_for_prior
    # very long tensors keep nodes small: the grid grows instead
    huge = ops.plan_sum(1 << 34, 1, torch.float32, 4)
    assert huge[0].node_segments == ops.NODE_MAX_SEGMENTS and len(huge) == 2
    # the interpreter takes segment results unless a node stride is asked for
    assert all(lv.node_segments == 1 for lv in ops.plan_sum(1 << 26, 1, torch.float32, 4, SumTuning(), True))
    asked = ops.plan_sum(1 << 26, 1, torch.float32, 4, SumTuning(node_stride=64), True)
    assert asked[0].node_stride == 64 and asked[0].node_segments == 64


def test_extreme_plans_fill_the_grid_and_keep_rows_of_4096_in_one_launch():
    from treefold._ops import reduce as ops
    (rows,) = ops.plan_extreme(4096, 8192)
    assert rows.finish and rows.lanes == ops.EXTREME_LANES and rows.tiles == 2
    first, merge = ops.plan_extreme(151936, 64)
    assert first.tiles == 8 and merge.finish and merge.n == first.segments
    whole = ops.plan_extreme(1 << 28, 1)[0]
    assert whole.tiles == ops.EXTREME_TILES and whole.grid == (1 << 28) // (ops.EXTREME_LANES * ops.EXTREME_TILES)


#: (function, keyword arguments, the direct launcher call that gives its result for rows x2)
PREPARED_CALLS = [
    ("sum", {}, lambda x2: tree_sum_rows(x2, out_dtype=x2.dtype)),
    ("sum", {"dtype": torch.float32}, lambda x2: tree_sum_rows(x2)),
    ("sum", {"accurate": True}, lambda x2: tree_sum_rows(x2, accurate=True, out_dtype=x2.dtype)),
    ("mean", {}, lambda x2: tree_sum_rows(x2, final="mean", out_dtype=x2.dtype)),
    ("norm", {}, lambda x2: tree_sum_rows(x2, square=True, final="sqrt", out_dtype=x2.dtype)),
    ("norm", {"ord": 1}, lambda x2: tree_sum_rows(x2, absolute=True, out_dtype=x2.dtype)),
    ("norm", {"ord": math.inf}, lambda x2: extreme_rows(x2, True, absolute=True)[0]),
    ("amax", {}, lambda x2: extreme_rows(x2, True)[0]),
    ("amin", {}, lambda x2: extreme_rows(x2, False)[0]),
    ("argmax", {}, lambda x2: extreme_rows(x2, True)[1]),
    ("argmin", {}, lambda x2: extreme_rows(x2, False)[1]),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dim,keepdim", [((1, 151936), -1, False), ((64, 151936), -1, True),
                                               ((1 << 20,), None, False), ((3, 5, 33), None, True),
                                               ((7, 4096), 1, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_prepared_reductions_give_the_same_results_with_new_tensors(shape, dim, keepdim, dtype):
    # the first eager call of a kind prepares its launches, later ones take them with new
    # tensors: the same results as the launchers called directly, in the public shape and dtype
    reduce_ops._PREPARED.clear()
    g = torch.Generator(device="cuda").manual_seed(11)
    for step in range(3):
        x = torch.randn(shape, device="cuda", generator=g).to(dtype) * (step + 1)
        if step == 2:
            x.view(-1)[10] = math.nan
        x2 = x.reshape(1, -1) if dim is None else x.reshape(-1, shape[-1])
        out_shape = ((1,) * x.ndim if keepdim else ()) if dim is None else (
            tuple(shape[:-1]) + ((1,) if keepdim else ()))
        for name, kwargs, direct in PREPARED_CALLS:
            got = getattr(tf, name)(x, dim=dim, keepdim=keepdim, **kwargs)
            want = direct(x2).reshape(out_shape)
            assert got.dtype == want.dtype and got.shape == want.shape, (name, kwargs)
            if got.is_floating_point():
                assert_same_bits(got.cpu(), want.cpu())
            else:
                assert torch.equal(got, want), (name, kwargs)
    assert len(reduce_ops._PREPARED) == len(PREPARED_CALLS)
    # each prepared call itself launches (the checks above pass through the ordinary path too)
    key = next(k for k in reduce_ops._PREPARED if k[0] == "argmax")
    x = torch.randn(shape, device="cuda", dtype=dtype)
    x.view(-1)[-1] = 1e4
    got = reduce_ops._PREPARED[key](x, {}, {})
    assert got.shape == out_shape and int(got.view(-1)[-1]) == (math.prod(shape) if dim is None else shape[-1]) - 1
    # an input off the 16-byte grid: the prepared launches decline, the ordinary path answers
    base = torch.randn(math.prod(shape) + 1, device="cuda", dtype=dtype)
    odd = base[1:].view(shape)
    assert reduce_ops._PREPARED[key](odd, {}, {}) is None
    odd2 = odd.reshape(1, -1) if dim is None else odd.reshape(-1, shape[-1])
    assert torch.equal(tf.argmax(odd, dim=dim, keepdim=keepdim), extreme_rows(odd2, True)[1].reshape(out_shape))
    assert_same_bits(tf.sum(odd, dim=dim, keepdim=keepdim).cpu(),
                     tree_sum_rows(odd2, out_dtype=dtype).reshape(out_shape).cpu())


@pytest.mark.gpu
def test_gpu_reductions_not_prepared_still_answer():
    # a result that needs a conversion (int32 indices), a non-contiguous tensor reduced whole
    # (a copy), a gradient: these calls keep no prepared launches and stay right
    reduce_ops._PREPARED.clear()
    x = torch.randn(96, 64, device="cuda")
    for _ in range(2):
        assert torch.equal(tf.argmax(x, dtype=torch.int32), torch.argmax(x).to(torch.int32))
        t = x.t()
        assert int(tf.argmax(t)) == int(torch.argmax(t.contiguous()))
        assert_same_bits(tf.sum(t).cpu(), tree_sum_rows(t.contiguous().view(1, -1), out_dtype=t.dtype)[0].cpu())
    assert not any(k[0] == "argmax" and k[7] == torch.int32 for k in reduce_ops._PREPARED)
    assert not any(k[1] == (64, 96) for k in reduce_ops._PREPARED)
    xg = x.clone().requires_grad_()
    assert tf.sum(xg).grad_fn is not None and tf.amax(xg, dim=-1).grad_fn is not None
