"""The numerics toolkit: formats, compare, three_way, sequential and compensated sums, TF32."""
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treefold import numerics
from treefold.numerics import TOLERANCES, compare, formats, kahan_sum, neumaier_sum, sequential_sum

FMT = {f.name: f for f in formats()}
WITH_TORCH_DTYPE = [f for f in formats() if f.torch_dtype is not None]


# --------------------------------------------------------------------------------------------
# formats()
# --------------------------------------------------------------------------------------------

def test_formats_lists_the_seven_formats_in_order():
    assert [f.name for f in formats()] == [
        "float32", "tfloat32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"]
    for f in formats():
        assert f.sign_bits == 1
        assert f.decimal_digits == pytest.approx((f.mantissa_bits + 1) * math.log10(2))
        assert f.as_dict()["epsilon"] == f.epsilon


@pytest.mark.parametrize("fmt", WITH_TORCH_DTYPE, ids=lambda f: f.name)
def test_formats_match_torch_finfo(fmt):
    info = torch.finfo(fmt.torch_dtype)
    assert fmt.bits == info.bits
    assert fmt.epsilon == info.eps
    assert fmt.max_finite == info.max
    assert fmt.min_normal == info.smallest_normal
    # The smallest subnormal survives a round trip through the dtype; half of it does not.
    tiny = torch.tensor([fmt.min_subnormal, fmt.min_subnormal / 2], dtype=torch.float64)
    assert tiny.to(fmt.torch_dtype).to(torch.float64).tolist() == [fmt.min_subnormal, 0.0]


def test_formats_without_a_torch_dtype():
    tf32, fp4 = FMT["tfloat32"], FMT["float4_e2m1fn"]
    assert (tf32.exponent_bits, tf32.mantissa_bits) == (8, 10)
    assert tf32.epsilon == 2.0 ** -10
    assert tf32.max_finite == (2 - 2.0 ** -10) * 2.0 ** 127
    assert tf32.min_normal == 2.0 ** -126
    assert (fp4.exponent_bits, fp4.mantissa_bits) == (2, 1)
    assert (fp4.epsilon, fp4.max_finite, fp4.min_normal, fp4.min_subnormal) == (0.5, 6.0, 1.0, 0.5)
    assert not fp4.has_inf and not FMT["float8_e4m3fn"].has_inf and FMT["float8_e5m2"].has_inf


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_limits_from_every_bit_pattern(name):
    fmt = FMT[name]
    values = torch.arange(256, dtype=torch.uint8).view(fmt.torch_dtype).to(torch.float64)
    finite = values[torch.isfinite(values)]
    assert finite.max().item() == fmt.max_finite
    assert finite[finite > 0].min().item() == fmt.min_subnormal
    assert bool(torch.isinf(values).any()) == fmt.has_inf
    # Every finite pattern is a fixed point of FloatFormat.round.
    assert all(fmt.round(v) == v for v in finite.tolist())


def test_fp4_has_exactly_the_ocp_values():
    fp4 = FMT["float4_e2m1fn"]
    grid = np.linspace(0.0, 6.0, 6001)
    assert sorted({fp4.round(float(v)) for v in grid}) == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert fp4.round(5.0) == 4.0  # a tie goes to the even significand (4 = 1.0 x 2^2)
    with pytest.raises(ValueError, match=r"FloatFormat.round: 7.0 overflows float4_e2m1fn"):
        fp4.round(7.0)


def test_format_table_names_every_format():
    table = numerics.format_table()
    assert all(f.name in table for f in formats())
    assert "448" in table and "5.734e+04" in table


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_round_matches_torch_conversion(name, rng):
    fmt = FMT[name]
    # float32 inputs: torch converts them to each of these formats with one correct rounding.
    # (A float64 -> bfloat16 conversion may round twice, so it is no oracle.)
    exponents = rng.integers(fmt.min_exponent - fmt.mantissa_bits - 2, fmt.max_exponent + 2, 4000)
    mantissas = rng.uniform(1.0, 2.0, 4000) * rng.choice([-1.0, 1.0], 4000)
    spacing = np.ldexp(1.0, np.maximum(exponents, fmt.min_exponent) - fmt.mantissa_bits)
    with np.errstate(over="ignore"):  # values past float32's range become inf and are dropped
        values = np.ldexp(mantissas, exponents).astype(np.float32)
        # exact ties between neighbours (in the normal range)
        ties = (np.ldexp(np.floor(mantissas * 2.0 ** fmt.mantissa_bits) / 2.0 ** fmt.mantissa_bits,
                         exponents) + np.sign(mantissas) * spacing / 2).astype(np.float32)
    edge = np.float32([fmt.max_finite, -fmt.max_finite, 0.0, -0.0])
    values = np.concatenate([values, ties, edge])
    values = values[np.isfinite(values)]
    want = torch.from_numpy(values).to(fmt.torch_dtype).to(torch.float64).tolist()
    got = [fmt.round(float(v)) for v in values]
    assert got == want


def test_round_overflow():
    assert FMT["bfloat16"].round(1e39) == math.inf and FMT["float16"].round(-7e4) == -math.inf
    assert FMT["float16"].round(65519.0) == 65504.0  # below the halfway point to 2^16
    with pytest.raises(ValueError, match="overflows float8_e4m3fn"):
        FMT["float8_e4m3fn"].round(480.0)
    assert FMT["float8_e4m3fn"].round(460.0) == 448.0


def test_round_takes_numbers_and_names_what_it_refuses():
    assert FMT["bfloat16"].round(3) == 3.0 and FMT["bfloat16"].round(np.float32(1.00390625)) == 1.0
    with pytest.raises(TypeError, match="FloatFormat.round: value must be a number, got str"):
        FMT["bfloat16"].round("1")
    with pytest.raises(TypeError, match="FloatFormat.round: value must be a number, got bool"):
        FMT["bfloat16"].round(True)
    with pytest.raises(ValueError, match="FloatFormat.round: value is a number too large for a float"):
        FMT["bfloat16"].round(10 ** 400)


# --------------------------------------------------------------------------------------------
# TOLERANCES
# --------------------------------------------------------------------------------------------

def test_tolerance_table_covers_the_dtypes_with_reasons():
    for name in ("float32", "tfloat32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"):
        tol = TOLERANCES[name]
        assert "u = 2^-" in tol.reason, name
        # Never asks for better than one rounding in the format, never allows more than 32.
        unit_roundoff = FMT[name].unit_roundoff
        assert unit_roundoff <= tol.rtol <= 32 * unit_roundoff, name
        assert tol.atol > 0


# --------------------------------------------------------------------------------------------
# compare()
# --------------------------------------------------------------------------------------------

def test_compare_identical_is_ok_and_zero(rng):
    x = torch.from_numpy(rng.standard_normal(1000).astype(np.float32))
    report = compare(x, x.clone())
    assert report.ok and report.numel == 1000 and report.dtype == "float32"
    assert report.max_abs == report.mean_abs == report.relative_l2 == report.max_ulps == 0.0
    assert report.violations == report.nan_mismatches == report.inf_mismatches == 0


def test_compare_measures_known_errors():
    expected = torch.tensor([1.0, 2.0, -4.0, 0.5], dtype=torch.float64)
    delta = torch.tensor([0.0, 2.0 ** -20, -3 * 2.0 ** -21, 0.0], dtype=torch.float64)
    report = compare(expected + delta, expected, dtype=torch.float32)
    assert report.max_abs == 3 * 2.0 ** -21
    assert report.mean_abs == pytest.approx((2.0 ** -20 + 3 * 2.0 ** -21) / 4, rel=1e-15)
    assert report.relative_l2 == pytest.approx(
        math.sqrt(2.0 ** -40 + 9 * 2.0 ** -42) / math.sqrt(1 + 4 + 16 + 0.25), rel=1e-12)
    # float32 ulp at 2 is 2^-22 and at 4 is 2^-21: errors of 4 and 3 ulps
    assert report.max_ulps == 4.0
    assert report.ok and report.worst_index == 2
    assert (report.worst_actual, report.worst_expected) == (-4.0 - 3 * 2.0 ** -21, -4.0)


def test_compare_relative_l2_at_the_ends_of_float64():
    # squares of 1e300 overflow float64 and squares of 1e-300 underflow: the norms are taken
    # over a common power-of-two scale
    for scale in (1e300, 1e-300):
        expected = torch.tensor([1.0, 2.0, -4.0], dtype=torch.float64) * scale
        report = compare(expected * 1.5, expected, dtype=torch.float64)
        assert report.relative_l2 == pytest.approx(0.5, rel=1e-12), scale


def test_compare_ulps_in_the_judged_dtype():
    one = torch.tensor([1.5], dtype=torch.float32)
    assert compare(one + 2.0 ** -7, one, dtype=torch.bfloat16).max_ulps == 1.0
    assert compare(one + 2.0 ** -7, one, dtype="float16").max_ulps == 2.0 ** 3
    assert compare(one + 2.0 ** -7, one, dtype="tfloat32").max_ulps == 2.0 ** 3
    # At zero the ulp is the smallest subnormal; beyond the largest finite it stops growing.
    assert compare(torch.tensor([2.0 ** -24]), torch.tensor([0.0]), dtype=torch.float16).max_ulps == 1.0
    big = torch.tensor([1e6], dtype=torch.float64)
    assert compare(big + 64.0, big, dtype=torch.float8_e4m3fn).max_ulps == 64.0 / 32.0


def test_compare_tolerance_boundary():
    tol = TOLERANCES["float32"]
    expected = torch.tensor([3.0], dtype=torch.float64)
    allowed = tol.atol + tol.rtol * 3.0
    assert compare(expected + allowed * 0.999, expected, dtype=torch.float32).ok
    over = compare(expected + allowed * 1.001, expected, dtype=torch.float32)
    assert not over.ok and over.violations == 1 and "FAIL" in str(over)


def test_compare_counts_nan_and_inf_mismatches():
    nan, inf = math.nan, math.inf
    actual = torch.tensor([nan, 1.0, nan, inf, inf, -inf, 2.0, inf, 5.0])
    expect = torch.tensor([1.0, nan, nan, inf, -inf, 3.0, inf, nan, 5.0])
    report = compare(actual, expect)
    # NaN: positions 0, 1 (one side only) and 7 (Inf vs NaN counts as a NaN mismatch)
    assert report.nan_mismatches == 3
    # Inf: +inf vs -inf, -inf vs 3, 2 vs inf; position 3 (+inf both) agrees
    assert report.inf_mismatches == 3
    assert not report.ok and report.violations == 0 and report.max_abs == 0.0
    assert "NaN mismatches 3, Inf mismatches 3" in str(report)


def test_compare_default_dtype_is_the_coarser_one(rng):
    x32 = torch.from_numpy(rng.standard_normal(256).astype(np.float32))
    report = compare(x32.to(torch.bfloat16), x32)
    assert report.dtype == "bfloat16" and report.ok and report.max_ulps <= 0.5
    assert compare(x32, x32.double()).dtype == "float32"
    assert compare(x32.double(), x32.double()).dtype == "float64"
    assert compare(x32.half(), x32.to(torch.bfloat16)).dtype == "bfloat16"
    fp8 = x32.to(torch.float8_e4m3fn)
    assert compare(fp8, x32).dtype == "float8_e4m3fn"


def test_compare_bfloat16_rounding_passes_but_a_real_error_fails(rng):
    x = torch.from_numpy(rng.uniform(0.5, 2.0, 512).astype(np.float32))
    assert compare(x.to(torch.bfloat16), x).ok
    wrong = x.clone()
    wrong[100] *= 1.05
    report = compare(wrong.to(torch.bfloat16), x)
    assert not report.ok and report.violations == 1 and report.worst_index == 100


def test_compare_accepts_numpy_and_numbers():
    assert compare(np.float32([1.0, 2.0]), np.float32([1.0, 2.0])).ok
    report = compare(1000.9765625, 1000.0, dtype=torch.bfloat16)
    assert report.numel == 1 and report.max_abs == 0.9765625 and report.ok


def test_compare_empty():
    report = compare(torch.empty(0, 3), torch.empty(0, 3))
    assert report.ok and report.numel == 0 and report.max_abs == 0.0 and report.worst_index is None


def test_error_report_prints_one_line_and_converts_to_dict(rng):
    x = torch.from_numpy(rng.standard_normal(64).astype(np.float32))
    report = compare(x.to(torch.bfloat16), x)
    text = str(report)
    assert "\n" not in text and text.startswith("bfloat16 ok:") and "rel_l2" in text and "ulp" in text
    d = report.as_dict()
    assert d["dtype"] == "bfloat16" and d["ok"] is True and set(d) >= {
        "max_abs", "mean_abs", "relative_l2", "max_ulps", "nan_mismatches", "inf_mismatches"}


def test_compare_differences_past_float64s_top():
    # the difference of 1e308 and -1e308 overflows float64 (max_abs says so); the relative L2
    # error is still the finite 2
    report = compare(torch.tensor([1e308, 1.0], dtype=torch.float64),
                     torch.tensor([-1e308, 1.0], dtype=torch.float64))
    assert report.max_abs == math.inf and report.relative_l2 == 2.0 and not report.ok


def test_compare_takes_numpy_arrays_of_any_strides():
    a = np.arange(1.0, 5.0)[::-1]
    report = compare(a, a.copy() * (1 + 1e-9))
    assert report.numel == 4 and 0 < report.relative_l2 < 2e-9


def test_compare_relative_l2_when_expected_is_zero():
    zero = torch.zeros(3)
    assert compare(zero, zero).relative_l2 == 0.0
    assert compare(zero + 1e-7, zero).relative_l2 == math.inf


@pytest.mark.parametrize("args, kwargs, error, message", [
    (("x", torch.ones(2)), {}, TypeError, "compare: actual must be a torch.Tensor, a NumPy array or a number, got str"),
    ((torch.ones(2), [1.0, 2.0]), {}, TypeError, "compare: expected must be a torch.Tensor, a NumPy array or a number, got list"),
    ((torch.ones(2, dtype=torch.int32), torch.ones(2)), {}, TypeError, "compare: actual has dtype int32, expected a floating-point dtype"),
    ((torch.ones(2), torch.ones(3)), {}, ValueError, r"compare: actual has shape \(2,\), expected has shape \(3,\)"),
    ((torch.ones(2, 3), torch.ones(3, 2)), {}, ValueError, r"actual has shape \(2, 3\), expected has shape \(3, 2\)"),
    ((torch.ones(2), torch.ones(2, device="meta")), {}, ValueError, "compare: actual is on cpu, but expected is on meta"),
    ((torch.ones(2), torch.ones(2)), {"dtype": "fp33"}, ValueError, "compare: no tolerance for dtype='fp33'; expected one of float64, float32"),
    ((torch.ones(2), torch.ones(2)), {"dtype": 32}, TypeError, "compare: dtype must be a torch.dtype or a format name, got int"),
    ((torch.ones(2), torch.ones(2)), {"dtype": torch.int8}, ValueError, "compare: no tolerance for dtype=torch.int8"),
    ((torch.ones(2).to(torch.float8_e4m3fnuz), torch.ones(2)), {}, ValueError, "no tolerance for dtype=torch.float8_e4m3fnuz"),
    ((np.ones(2, dtype=np.longdouble), np.ones(2)), {}, TypeError,
     r"compare: actual has NumPy dtype float128, expected a floating-point dtype \(float16, float32 or float64\)"),
    ((np.ones(2), np.array([1.0, None])), {}, TypeError, "compare: expected has NumPy dtype object"),
    ((10 ** 400, 1.0), {}, ValueError, "compare: actual is a number too large for a float"),
])
def test_compare_bad_input(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        compare(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# TF32 warning
# --------------------------------------------------------------------------------------------

@pytest.fixture
def tf32_setting():
    """Restore the global matmul settings after a test changes them."""
    allow, precision = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    yield
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.set_float32_matmul_precision(precision)


def test_no_warning_when_tf32_is_off(tf32_setting):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not numerics.tf32_enabled()
        assert numerics.warn_if_tf32() is False


def test_warns_when_allow_tf32_is_on(tf32_setting):
    torch.backends.cuda.matmul.allow_tf32 = True
    with pytest.warns(UserWarning, match="TF32 matmuls are enabled"):
        assert numerics.warn_if_tf32() is True


def test_warns_when_matmul_precision_is_high(tf32_setting):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("high")
    assert numerics.tf32_enabled()
    with pytest.warns(UserWarning, match="allow_tf32 = False"):
        numerics.warn_if_tf32()


def test_no_warning_for_cpu_tensors_even_with_tf32_on(tf32_setting):
    torch.backends.cuda.matmul.allow_tf32 = True
    x = torch.ones(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert numerics.warn_if_tf32(x, x) is False
        assert compare(x, x).ok


def test_warn_if_tf32_bad_input():
    with pytest.raises(TypeError, match="warn_if_tf32: argument 1 must be a torch.Tensor, got float"):
        numerics.warn_if_tf32(torch.ones(1), 1.0)


@pytest.mark.gpu
def test_compare_warns_for_float32_cuda_tensors_with_tf32_on(tf32_setting):
    torch.backends.cuda.matmul.allow_tf32 = True
    x = torch.ones(4, device="cuda")
    with pytest.warns(UserWarning, match="TF32"):
        compare(x, x)
    torch.backends.cuda.matmul.allow_tf32 = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compare(x, x)
        compare(x.half(), x)


# --------------------------------------------------------------------------------------------
# three_way()
# --------------------------------------------------------------------------------------------

def _fp32_softmax(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def _low_precision_row_sum(x):
    """A row sum whose accumulator has x's dtype: every add rounds to it."""
    total = x[..., 0]
    for i in range(1, x.shape[-1]):
        total = total + x[..., i]
    return total


def test_three_way_passes_a_correct_implementation(rng):
    x = torch.from_numpy(rng.standard_normal((16, 1000)).astype(np.float32) * 3)
    report = numerics.three_way(_fp32_softmax, lambda t: torch.softmax(t, dim=-1), x)
    assert report.ok, str(report)
    assert report.impl_fp32.ok and report.low == "bfloat16"
    assert report.impl_low_vs_fp32.relative_l2 <= report.budget
    assert "within 2x" in report.reason


def test_three_way_passes_a_different_but_sound_order(rng):
    from treefold import order
    x = torch.from_numpy(rng.uniform(0.0, 1.0, (8, 777)).astype(np.float32))

    def tree_sum(t):
        return torch.from_numpy(order.reference_sum(t)).to(t.dtype)
    report = numerics.three_way(tree_sum, lambda t: t.sum(dim=-1), x, low=torch.float16)
    assert report.ok, str(report)


def test_three_way_catches_a_low_precision_accumulator(rng):
    x = torch.from_numpy(rng.uniform(0.0, 1.0, (8, 256)).astype(np.float32))
    report = numerics.three_way(_low_precision_row_sum, lambda t: t.sum(dim=-1), x)
    assert report.impl_fp32.ok  # in float32 it is a fine sum
    assert not report.ok and "accumulator" in report.reason
    assert report.impl_low_vs_fp32.relative_l2 > 2 * report.precision_cost.relative_l2


def test_three_way_catches_a_semantic_bug(rng):
    x = torch.from_numpy(rng.standard_normal((32, 32)).astype(np.float32))
    report = numerics.three_way(lambda t: torch.softmax(t.float(), dim=0).to(t.dtype),
                                lambda t: torch.softmax(t, dim=-1), x)
    assert not report.ok and not report.impl_fp32.ok and "bug" in report.reason


def test_three_way_catches_new_nans(rng):
    x = torch.from_numpy(rng.standard_normal((4, 64)).astype(np.float32))

    def nan_in_low(t):
        out = torch.softmax(t.float(), dim=-1).to(t.dtype)
        if t.dtype != torch.float32:
            out[0, 0] = math.nan
        return out
    report = numerics.three_way(nan_in_low, lambda t: torch.softmax(t, dim=-1), x)
    assert not report.ok and "NaN" in report.reason


def test_three_way_report_text_and_dict(rng):
    x = torch.from_numpy(rng.standard_normal((2, 64)).astype(np.float32))
    report = numerics.three_way(_fp32_softmax, lambda t: torch.softmax(t, dim=-1), x)
    text = str(report)
    assert text.count("\n") == 4 and "(1) yours fp32 vs trusted fp32" in text
    assert "(2) trusted bfloat16 vs trusted fp32" in text and "(3) yours bfloat16 vs trusted bfloat16" in text
    assert report.as_dict()["precision_cost"]["dtype"] == "bfloat16"


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((1, torch.sum, torch.ones(2)), {}, TypeError, "three_way: fn_impl must be callable, got int"),
    ((torch.sum, None, torch.ones(2)), {}, TypeError, "three_way: fn_trusted must be callable, got NoneType"),
    ((torch.sum, torch.sum, [1.0]), {}, TypeError, "three_way: x must be a torch.Tensor, got list"),
    ((torch.sum, torch.sum, torch.ones(2, dtype=torch.int64)), {}, TypeError, "three_way: x has dtype int64"),
    ((torch.sum, torch.sum, torch.ones(2)), {"low": torch.float32}, ValueError, "three_way: low=torch.float32 is not supported"),
    ((torch.sum, torch.sum, torch.ones(2)), {"factor": 1.0}, ValueError, "three_way: factor must be a finite number > 1, got 1.0"),
    ((torch.sum, torch.sum, torch.ones(2)), {"factor": math.inf}, ValueError, "three_way: factor must be a finite number > 1, got inf"),
    ((torch.sum, torch.sum, torch.ones(2)), {"factor": 10 ** 400}, ValueError,
     "three_way: factor must be a finite number > 1, got a number too large for a float"),
    ((torch.sum, torch.sum, torch.ones(2)), {"factor": "2"}, TypeError, "three_way: factor must be a number > 1, got str"),
    ((torch.sum, torch.sum, torch.ones(2)), {"low": None}, TypeError,
     r"three_way: low must be a torch.dtype \(torch.bfloat16 or torch.float16\), got NoneType"),
    ((lambda t: 3.0, torch.sum, torch.ones(2)), {}, TypeError, "three_way: fn_impl must return a torch.Tensor, got float"),
    ((lambda t: t, torch.sum, torch.ones(2)), {}, ValueError, r"three_way: fn_impl returned shape \(2,\) for a float32 input but \(\) for float32"),
])
def test_three_way_bad_input(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        numerics.three_way(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# Sequential and compensated sums
# --------------------------------------------------------------------------------------------

def _loop(values, fmt):
    total = 0.0
    for v in values:
        total = fmt.round(total + fmt.round(float(v)))
    return total


def test_numpy_cumsum_is_a_true_sequential_float32_fold(rng):
    # The fast path of sequential_sum rests on this: cumsum's last element is the left fold.
    x = (rng.standard_normal(20000) * np.exp(rng.uniform(-8, 8, 20000))).astype(np.float32)
    total = np.float32(0)
    for v in x:
        total = np.float32(total + v)
    assert np.cumsum(x, dtype=np.float32)[-1] == total
    assert sequential_sum(x, torch.float32) == _loop(x, FMT["float32"]) == float(total)
    # ...and it differs from NumPy's pairwise x.sum(), or the check would prove nothing.
    assert float(x.sum(dtype=np.float32)) != float(total)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_fast_path_equals_the_loop(dtype, rng, monkeypatch):
    x = (rng.uniform(0.0, 1.0, 5000) * 8).astype(np.float64)
    monkeypatch.setattr(numerics, "_FOLD_CHUNK", 777)  # chunk boundaries must not change the bits
    if dtype == torch.float64:
        want = 0.0
        for v in x.tolist():
            want += v
    else:
        want = _loop(x, FMT[numerics._dtype_name(dtype)])
    assert sequential_sum(x, dtype) == want


def test_float32_serial_sum_of_ones_stalls_at_2_pow_24():
    x = np.ones((1 << 24) + 1000, dtype=np.float32)
    # Every partial sum is exact up to 2^24; there the spacing is 2, and 2^24 + 1 is a tie
    # between 2^24 and 2^24 + 2 that goes to the even 2^24, again and again.
    assert sequential_sum(x, torch.float32) == 2.0 ** 24
    assert sequential_sum(x, torch.float64) == float(x.size)


def test_bfloat16_tenths():
    values = torch.full((10000,), 0.1, dtype=torch.bfloat16)
    exact = 10000 * 0.10009765625
    assert sequential_sum(values, torch.bfloat16) == 32.0
    assert sequential_sum(values, torch.float32) == exact  # every partial sum is exact in float32
    kahan = kahan_sum(values, torch.bfloat16)
    assert abs(kahan - exact) <= 4.0  # one bfloat16 spacing at 1000
    assert abs(kahan_sum(values, torch.float16) - exact) <= 0.5
    # values are rounded to the storage format first: 0.1 as bfloat16
    assert kahan_sum([0.1], torch.bfloat16) == 0.10009765625


def test_kahan_and_neumaier_on_cancellation():
    values = [1e8, 1.0, -1e8]
    assert sequential_sum(values, torch.float32) == 0.0
    assert kahan_sum(values, torch.float32) == 0.0  # the big value arrives after the small one
    assert neumaier_sum(values, torch.float32) == 1.0


@pytest.mark.parametrize("storage", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(4))
def test_compensated_sums_meet_their_bound(storage, seed):
    rng = np.random.default_rng(seed)
    n = 3000
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-10, 10, n))).astype(np.float32)
    u = 2.0 ** -(24 if storage == torch.float32 else 53)
    exact = math.fsum(x.astype(np.float64))
    magnitude = math.fsum(np.abs(x.astype(np.float64)))
    # Kahan/Neumaier: |error| <= (2u + O(n u^2)) sum|x|, plus the final rounding u |sum|
    bound = (2 * u + 2 * n * u * u) * magnitude + u * abs(exact)
    assert abs(kahan_sum(x, storage) - exact) <= bound
    assert abs(neumaier_sum(x, storage) - exact) <= bound


@settings(max_examples=60, deadline=None, database=None)
@given(st.lists(st.floats(min_value=-2.0 ** 100, max_value=2.0 ** 100, allow_nan=False, width=32), max_size=80))
def test_neumaier_float64_is_close_to_fsum(values):
    exact = math.fsum(values)
    magnitude = math.fsum(abs(v) for v in values)
    u = 2.0 ** -53
    assert abs(neumaier_sum(values, torch.float64) - exact) <= 3 * u * magnitude
    assert abs(kahan_sum(values, torch.float64) - exact) <= (2 * u + 2 * len(values) * u * u) * magnitude + u * abs(exact)


def test_sums_with_overflow_inf_and_nan():
    for fn in (sequential_sum, kahan_sum, neumaier_sum):
        assert fn([60000.0, 60000.0, -60000.0], torch.float16) == math.inf, fn.__name__
        assert math.isnan(fn([math.inf, -math.inf], torch.float32)), fn.__name__
        assert math.isnan(fn([1.0, math.nan, 2.0], torch.bfloat16)), fn.__name__
        assert fn([1.0, math.inf], torch.float32) == math.inf, fn.__name__
        assert fn([], torch.float32) == 0.0 and fn(torch.empty(0), torch.bfloat16) == 0.0


def test_sums_accept_tensors_arrays_and_lists():
    values = [0.5, 0.25, 0.125]
    for v in (values, tuple(values), np.array(values), torch.tensor(values),
              torch.tensor(values, dtype=torch.bfloat16)):
        assert kahan_sum(v) == neumaier_sum(v) == sequential_sum(v) == 0.875


@pytest.mark.parametrize("fn", [sequential_sum, kahan_sum, neumaier_sum], ids=lambda f: f.__name__)
def test_sums_bad_input(fn):
    name = fn.__name__
    with pytest.raises(ValueError, match=f"{name}: values is on meta; the sum runs on the host"):
        fn(torch.ones(3, device="meta"))
    with pytest.raises(TypeError, match=f"{name}: values has dtype int64, expected a floating-point dtype"):
        fn(torch.ones(3, dtype=torch.int64))
    with pytest.raises(TypeError, match=f"{name}: values has dtype int32"):
        fn(np.ones(3, dtype=np.int32))
    with pytest.raises(ValueError, match=rf"{name}: values must be 1-D, got shape \(2, 2\)"):
        fn(torch.ones(2, 2))
    with pytest.raises(TypeError, match=f"{name}: values must hold numbers, found str"):
        fn([1.0, "2"])
    with pytest.raises(ValueError, match=f"{name}: values holds a number too large for a float"):
        fn([10 ** 400, 1.0])
    with pytest.raises(TypeError, match=f"{name}: values must be a 1-D torch.Tensor, NumPy array, list or tuple, got float"):
        fn(1.0)
    with pytest.raises(ValueError, match=f"{name}: storage_dtype=torch.float8_e4m3fn is not supported"):
        fn([1.0], torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=f"{name}: storage_dtype must be a torch.dtype, got str"):
        fn([1.0], "float32")
