"""softmax, log_softmax and logsumexp: accuracy, the treefold order's bits, strategies, autograd.

CPU tier: the Triton kernels run through the interpreter (TRITON_INTERPRET=1); tests that need
the kernels skip otherwise. On a machine with a GPU the same tests run the compiled kernels on
``DEVICE``. GPU tier (``gpu`` marker): bigger shapes, bitwise equality across strategies,
num_warps and batch sizes.

Tolerances are ``treefold.numerics.TOLERANCES`` for the output dtype (float32: rtol 1.3e-6,
about 22 ulp, covering the log2 depth of the trees, exp and one reciprocal; bf16/fp16: a few
roundings of their own precision), applied by ``numerics.compare`` against float64 references.
"""
import dataclasses
import math
import shutil

import numpy as np
import pytest
import torch

import treefold
from treefold import backend, order
from treefold._ops import softmax as ops
from treefold.numerics import compare
from treefold.reference import softmax as reference

from conftest import DEVICE, assert_same_bits

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

INTERPRETED = backend.INTERPRETED
needs_kernel = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                  reason="needs TRITON_INTERPRET=1 (or a GPU) to run the kernels")
FUNCS = {"softmax": treefold.softmax, "log_softmax": treefold.log_softmax}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
LENGTHS = [1, 33, 4095, 5120]


def _data(shape, dtype=torch.float32, scale=3.0, seed=0):
    """Random normal data, never exactly zero, rounded to ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    x = torch.where(x == 0, torch.full_like(x, 0.5), x)
    return x.to(DEVICE, dtype)


def _float64(op, x, dim=-1, temperature=1.0):
    """torch in float64 from the float32 values the kernel sees (x * float32(1 / T))."""
    xs = x.float()
    if temperature != 1.0:
        xs = xs * torch.tensor(np.float32(1.0 / temperature))
    xs = xs.double()
    if op == "softmax":
        return torch.softmax(xs, dim)
    if op == "log_softmax":
        return torch.log_softmax(xs, dim)
    return torch.logsumexp(xs, dim)


def _call(op, x, **kw):
    return treefold.logsumexp(x, **kw) if op == "logsumexp" else FUNCS[op](x, **kw)


# ---- accuracy against float64 ----------------------------------------------------------------

@pytest.fixture
def poisoned_outputs(poison_allocations):
    """Output and scratch buffers start as NaN, so an element a kernel forgets to write cannot pass."""
    poison_allocations()


#: Unit roundoff of each output dtype.
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
#: Relative L2 error bounds, in unit roundoffs of the output dtype. 16-bit outputs are float32
#: results rounded once: half an ulp each, and float32's own error is thousands of times smaller.
#: float32 outputs carry exp's error (up to 2 ulps on the GPU's fast exp), the row sum's and the
#: division's (or log's) roundings: a few ulps.
RELATIVE_L2_IN_U = {torch.float32: 4.0, torch.bfloat16: 1.0, torch.float16: 1.0}
#: Largest error of one 16-bit output in its ulps: the half ulp of the one rounding, plus the
#: float32 result's error (at most about 30 float32 ulps, under 2^-8 of a float16 ulp).
MAX_ULPS_16_BIT = 0.5 + 2.0 ** -6


@needs_kernel
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_matches_float64_reference(op, dtype, n, poisoned_outputs):
    x = _data((3, n), dtype)
    got = _call(op, x)
    want = _float64(op, x)
    report = compare(got, want)
    assert report.ok, str(report)
    assert report.relative_l2 <= RELATIVE_L2_IN_U[dtype] * UNIT_ROUNDOFF[dtype], str(report)
    if dtype != torch.float32:
        assert report.max_ulps <= MAX_ULPS_16_BIT, str(report)
    assert got.dtype == dtype and got.shape == want.shape


#: Errors of the float32 steps, in units of u = 2^-24 (an ulp is at most 2u relative), measured
#: from the exact value: the GPU's fast exp and its approximate log, up to 2 ulps from the
#: correctly rounded result, so 2.5 ulps from the exact one (the log's near log = 0 taken as
#: absolute: LOG_ERROR_U (|log s| + 1) covers both); a single rounding, u.
EXP_ERROR_U = 5.0
LOG_ERROR_U = 5.0
#: The fast exp flushes results below 2^-126 to zero, where only an absolute bound holds: the
#: relative bounds below hold for rows whose range stays under this (e^-87 ~ 2^-126).
FLOAT32_BOUND_RANGE = 80.0


@needs_kernel
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_float32_error_of_each_output_is_bounded_by_its_distance_from_the_maximum(op, n, poisoned_outputs):
    """float32 outputs have no fixed bound in ulps: an exp's argument d = x - m is rounded (u |d|),
    and the fast exp computes 2^(d * log2(e)) with log2(e) rounded to float32 (under u |d|) and
    the product rounded (u |d|), so exp(d) carries a relative error up to 3u |d| + EXP_ERROR_U,
    which grows with the row's range (17 ulps at this data on the CPU, 26 on the H200). An
    element's exp is taken from its segment's maximum m_s, times a factor exp(m_s - m): the two
    arguments add up to |x - m| (x <= m_s <= m), the two exps' own errors to 2 EXP_ERROR_U.

    The row sum (``treefold.order``): a halving tree over each segment's lanes (one rounding per
    level, log2(lanes) levels), then the segments' (maximum, sum) pairs merged in a tree whose
    every level rescales one sum (an exp, a product and a sum: EXP_ERROR_U + 2 per level). In
    units of u, with t_j = exp(x_j - m) and s = sum(t_j), its relative error is at most

        S = sum_j t_j (3 |x_j - m| + 2 EXP_ERROR_U) / s + log2(lanes) + (EXP_ERROR_U + 2) log2(segments)

    (positive terms: each term's error weighted by its share), and, per element:

    - softmax, relative: 3 |x - m| + 2 EXP_ERROR_U + S + 3 (1/s, the factor, the product);
    - log_softmax = (x - m) - log(s), absolute: |x - m| + S + LOG_ERROR_U (|log s| + 1) + |y| + 2;
    - logsumexp = m + log(s), absolute: |m| + S + LOG_ERROR_U (|log s| + 1) + |log s| + 2.

    Valid for rows whose range is under FLOAT32_BOUND_RANGE (checked)."""
    u = 2.0 ** -24
    x = _data((3, n), torch.float32, seed=5)
    got = _call(op, x).double()
    xs = x.double()
    m = xs.max(-1, keepdim=True).values
    d = (xs - m).abs()
    assert float(d.max()) < FLOAT32_BOUND_RANGE, "the data leaves the bound's range"
    t = torch.exp(xs - m)
    s = t.sum(-1, keepdim=True)
    tree = math.log2(order.lanes(n)) + (EXP_ERROR_U + 2) * math.log2(order.next_pow2(order.num_segments(n)))
    sum_error = (t * (3 * d + 2 * EXP_ERROR_U)).sum(-1, keepdim=True) / s + tree
    want = _float64(op, x)
    err = (got - want).abs()
    if op == "softmax":
        bound = u * (3 * d + 2 * EXP_ERROR_U + sum_error + 3) * want
    elif op == "log_softmax":
        bound = u * (d + sum_error + LOG_ERROR_U * (s.log().abs() + 1) + want.abs() + 2)
    else:
        m, s, sum_error = m.squeeze(-1), s.squeeze(-1), sum_error.squeeze(-1)
        bound = u * (m.abs() + sum_error + LOG_ERROR_U * (s.log().abs() + 1) + s.log().abs() + 2)
    worst = int(torch.argmax(err / bound))
    assert torch.all(err <= bound), (f"{op} n={n}: element {worst} off by {float(err.view(-1)[worst]):.3g}, "
                                     f"bound {float(bound.view(-1)[worst]):.3g}")


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_sum_to_one(dtype):
    x = _data((4, 5000), dtype, scale=5.0, seed=1)
    y = treefold.softmax(x, dtype=torch.float32).double()
    # Each of the 5000 outputs is within a few float32 ulps; their sum within N * 4u of 1.
    assert torch.all((y.sum(-1) - 1).abs() < 5000 * 4 * 2.0 ** -24)
    assert torch.all(y >= 0)


@needs_kernel
@pytest.mark.parametrize("n", [1, 33, 4095, 9000])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_kernel_follows_the_order_bit_for_bit(op, n):
    # order_forward replays the kernel's operations in NumPy float32 (the interpreter's exp and
    # log are NumPy's): equal bits show the kernel follows the documented order exactly.
    if not INTERPRETED:
        pytest.skip("bits against NumPy hold for the interpreter; the GPU's exp differs")
    for dtype in (torch.float32, torch.bfloat16):
        x = _data((3, n), dtype, seed=n)
        if op == "logsumexp":
            got = treefold.logsumexp(x)
            want = torch.from_numpy(reference.order_forward(x, op)).to(dtype)
        else:
            got = FUNCS[op](x, dtype=torch.float32, temperature=0.7)
            want = torch.from_numpy(reference.order_forward(x, op, temperature=0.7))
        assert_same_bits(got, want, f"{op} n={n} {dtype}")


# ---- the treefold order: strategies, launch parameters, batch position -----------------------

STUDY = [
    ("warp", ops.Tuning()), ("warp", ops.Tuning(rows_per_program=4, inner=8)),
    ("block", ops.Tuning()), ("block", ops.Tuning(num_warps=8, inner=32, store_hint="evict_first")),
    ("online", ops.Tuning()), ("online", ops.Tuning(seg_block=1, hints=False, store_hint="")),
    ("online", ops.Tuning(seg_block=1, stages=3)), ("online", ops.Tuning(max_registers=96)),
    ("split", ops.Tuning()), ("split", ops.Tuning(segments_per_program=1)),
    ("split", ops.Tuning(segments_per_program=4, seg_block=1, stages=2)),
    ("split", ops.Tuning(segments_per_program=4, seg_block=2)),
    # the interpreter runs programs one after another: one cooperative program per row, except
    # for logsumexp, whose last program to arrive finishes the row
    ("cooperative", ops.Tuning(segments_per_program=4096)),
    ("cooperative", ops.Tuning(segments_per_program=4096, num_warps=2)),
    ("cooperative", ops.Tuning(segments_per_program=1)),
]


def _held_tile_compiles(strategy, tuning, n):
    """Whether a row held in registers at this length is worth a launch here: under the interpreter
    any tile up to the kernels' limit; compiled, the GPU tier's rule (a warp holds at most 4096
    elements, a thread of a block at most 128), beyond which the register tiles spill and take
    minutes to compile (n = 9000: a warp would hold 16384 elements, 512 per thread)."""
    held = ops._tile_elements(n)
    if INTERPRETED or DEVICE == "cpu":
        return held <= ops.REGISTER_ELEMENTS_LIMIT
    if strategy == "block" and tuning.num_warps is None:
        return True  # the launch plan picks warps that fit
    return _compiled_tile_fits(strategy, held, tuning.num_warps)


def _compiled_tile_fits(strategy, held, num_warps):
    """The GPU's rule for rows held in registers (``held`` elements per row): a warp holds at most
    4096 (whatever ``num_warps``), a thread of a block at most 128."""
    if strategy == "warp":
        return held <= 4096
    return held <= ops.REGISTER_ELEMENTS and held // (32 * num_warps) <= 128


def _study_forward(op, x, strategy, tuning, **kw):
    if op == "logsumexp":
        return ops.logsumexp_forward(x, strategy=strategy, tuning=tuning)
    return ops.softmax_forward(x, log=op == "log_softmax", strategy=strategy, tuning=tuning, **kw)


#: The strategy every other one is compared with in ``test_every_strategy_gives_the_same_bits``:
#: "online" runs at any length.
REFERENCE_STRATEGY = ("online", ops.Tuning())


@needs_kernel
@pytest.mark.parametrize("family", ["warp", "block", "online", "split", "cooperative"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("n", [1, 33, 4095, 9000])
def test_every_strategy_gives_the_same_bits(n, op, family):
    # One op and one strategy family per test, each against REFERENCE_STRATEGY: on a GPU each
    # test compiles its kernels, and one test for every strategy of one op still outlasted a
    # 320-second device call at n = 9000; split, xdist spreads the compiles over its workers.
    x = _data((3, n), torch.bfloat16, seed=7)
    dy = _data((3, n), torch.float32, seed=8)
    study = [REFERENCE_STRATEGY] + [st for st in STUDY if st[0] == family and st != REFERENCE_STRATEGY]
    outs = {}
    for strategy, tuning in study:
        if strategy in ("warp", "block") and not _held_tile_compiles(strategy, tuning, n):
            continue
        if (strategy, tuning) == STUDY[-1] and op != "logsumexp" and n > 4096:
            continue  # programs that wait for one another
        outs[(strategy, tuning)] = _study_forward(op, x, strategy, tuning, out_dtype=torch.float32)
    if len(outs) == 1 and family != REFERENCE_STRATEGY[0]:
        pytest.skip(f"no {family} launch of this study runs at n = {n} here")
    first = next(iter(outs.values()))
    for key, out in outs.items():
        assert_same_bits(out, first, f"{op} n={n} {key}")
    # backward through every strategy, from the same y (or x and lse)
    dxs = {}
    for strategy, tuning in study:
        if strategy in ("warp", "block") and not _held_tile_compiles(strategy, tuning, n):
            continue  # (the backward holds the row as the forward does)
        if (strategy, tuning) == STUDY[-1] and op != "logsumexp" and n > 4096:
            continue
        if op == "logsumexp":
            dxs[(strategy, tuning)] = ops.logsumexp_backward(dy[:, 0], x, first.to(x.dtype), strategy=strategy,
                                                             tuning=tuning)
        else:
            dxs[(strategy, tuning)] = ops.softmax_backward(dy, first, log=op == "log_softmax",
                                                           x_dtype=torch.float32, strategy=strategy, tuning=tuning)
    first_dx = next(iter(dxs.values()))
    for key, dx in dxs.items():
        assert_same_bits(dx, first_dx, f"{op} backward n={n} {key}")


#: Launches that hold a block through the row's merge, and may hold 16-bit inputs as loaded.
#: (The interpreter runs programs one after another: one cooperative program per row.)
HOLDING = [("warp", ops.Tuning()), ("block", ops.Tuning()), ("cooperative", ops.Tuning(segments_per_program=4096))]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 33, 4095])
def test_holding_16bit_inputs_gives_the_same_bits(n, dtype, poisoned_outputs):
    # Held as loaded and widened again for the outputs (the exps taken again): the same values.
    x = _data((4, n), dtype, seed=n)
    x[1, 0] = float("nan")
    x[2] = float("-inf")  # a fully masked row
    y = _data((4, n), dtype, scale=0.01, seed=n + 1).abs()
    dy = _data((4, n), dtype, scale=1.0, seed=n + 2)
    for strategy, tuning in HOLDING:
        if strategy == "warp" and n > 1024:
            continue
        held = dataclasses.replace(tuning, hold_16bit=True)
        for op in ("softmax", "log_softmax", "logsumexp"):
            kw = {} if op == "logsumexp" else {"temperature": 0.7}
            want = _study_forward(op, x, strategy, tuning, **kw)
            assert_same_bits(_study_forward(op, x, strategy, held, **kw), want, f"{op} {strategy}")
        for log in (False, True):
            want = ops.softmax_backward(dy, y, log=log, strategy=strategy,
                                        tuning=dataclasses.replace(tuning, hold_16bit=False))
            got = ops.softmax_backward(dy, y, log=log, strategy=strategy, tuning=held)
            assert_same_bits(got, want, f"backward log={log} {strategy}")
        lse = ops.logsumexp_forward(x, strategy=strategy, tuning=tuning)
        assert_same_bits(ops.logsumexp_backward(dy[:, 0], x, lse, strategy=strategy, tuning=held),
                         ops.logsumexp_backward(dy[:, 0], x, lse, strategy=strategy,
                                                tuning=dataclasses.replace(tuning, hold_16bit=False)),
                         f"logsumexp backward {strategy}")


def test_hold_16bit_defaults_to_the_backward_of_16bit_inputs_and_is_refused_for_32bit_ones():
    def held(strategy, item_size, tuning, backward=False):
        phases = ops.plan(0, backward, 4096, 8, 132, item_size, strategy, tuning).phases
        return [dict(ph.constexprs).get("HOLD_16BIT", False) for ph in phases]
    assert held("block", 2, ops.Tuning()) == [False]  # the forward holds float32
    assert held("block", 2, ops.Tuning(), backward=True) == [ops.HOLD_16BIT_BACKWARD]
    assert held("cooperative", 2, ops.Tuning(), backward=True) == [ops.HOLD_16BIT_BACKWARD]
    assert held("block", 4, ops.Tuning(), backward=True) == [False]
    assert held("block", 2, ops.Tuning(hold_16bit=False), backward=True) == [False]
    assert held("block", 2, ops.Tuning(hold_16bit=True)) == [True]
    assert held("cooperative", 2, ops.Tuning(hold_16bit=True)) == [True]
    with pytest.raises(ValueError, match="softmax: hold_16bit=True holds 16-bit inputs, got 4-byte elements"):
        held("block", 4, ops.Tuning(hold_16bit=True))


def test_store_hint_defaults_to_the_forward_online_launch():
    def policies(strategy, tuning, backward=False, op=0):
        phases = ops.plan(op, backward, 32768, 64, 132, 2, strategy, tuning).phases
        return [dict(ph.constexprs).get("STORE_POLICY", "") for ph in phases]
    # the rows still waiting for their second read stay in L2: only "online" forward has reason
    assert policies("online", ops.Tuning()) == [ops.ONLINE_STORE_POLICY] == ["evict_first"]
    assert policies("online", ops.Tuning(), op=1) == ["evict_first"]  # log_softmax too
    assert policies("online", ops.Tuning(), op=2) == [""]  # logsumexp stores one value per row
    assert policies("online", ops.Tuning(), backward=True) == [""]
    assert policies("online", ops.Tuning(store_hint="")) == [""]
    assert policies("block", ops.Tuning()) == [""] and policies("split", ops.Tuning()) == ["", ""]
    assert policies("block", ops.Tuning(store_hint="evict_first"), backward=True) == ["evict_first"]
    with pytest.raises(ValueError, match="softmax: store_hint must be one of None, '', 'evict_first', got 'evict_last'"):
        policies("block", ops.Tuning(store_hint="evict_last"))


@needs_kernel
@pytest.mark.parametrize("strategy", ["auto", "warp", "online", "split"])
def test_a_row_gives_the_same_bits_in_any_batch_and_position(strategy):
    n = 3000
    x = _data((7, n), torch.float32, seed=11)
    batch = ops.softmax_forward(x, strategy=strategy)
    for i in (0, 3, 6):
        alone = ops.softmax_forward(x[i:i + 1], strategy=strategy)
        assert_same_bits(batch[i:i + 1], alone, f"row {i}")
    shuffled = x[[6, 3, 0, 1, 2, 4, 5]]
    assert_same_bits(ops.softmax_forward(shuffled, strategy=strategy)[0], batch[6], "row 6 moved first")
    lse = ops.logsumexp_forward(x, strategy=strategy)
    assert_same_bits(ops.logsumexp_forward(x[5:6], strategy=strategy), lse[5:6], "logsumexp row 5")


@needs_kernel
def test_shift_by_an_exact_constant_changes_no_bit():
    # Values on a grid of 1/256 below 2^10: x + 1024 is exact in float32, every x - max is the
    # same float, so softmax and log_softmax are bit-identical and logsumexp moves by 1024.
    g = torch.Generator().manual_seed(5)
    x = (torch.randint(-256 * 500, 256 * 500, (4, 5000), generator=g) / 256.0).float().to(DEVICE)
    shifted = x + 1024.0
    assert_same_bits(treefold.softmax(shifted), treefold.softmax(x))
    assert_same_bits(treefold.log_softmax(shifted), treefold.log_softmax(x))
    lse, lse_shifted = treefold.logsumexp(x), treefold.logsumexp(shifted)
    assert torch.allclose(lse_shifted - 1024.0, lse, rtol=0, atol=2e-4)


@needs_kernel
def test_temperature_multiplies_by_its_float32_inverse_first():
    x = _data((3, 700), torch.float32, seed=2)
    t = 0.37
    prescaled = x * torch.tensor(np.float32(1.0 / t))
    assert_same_bits(treefold.softmax(x, temperature=t), treefold.softmax(prescaled))
    assert_same_bits(treefold.log_softmax(x, temperature=t), treefold.log_softmax(prescaled))
    assert compare(treefold.softmax(x, temperature=t), _float64("softmax", x, temperature=t)).ok


@needs_kernel
def test_dtype_argument_rounds_once_at_the_end():
    x = _data((3, 1000), torch.bfloat16, seed=4)
    y = treefold.softmax(x, dtype=torch.float32)
    assert y.dtype == torch.float32
    assert compare(y, _float64("softmax", x)).ok
    # the float32 result rounded to bf16 is the bf16 result: one rounding, at the store
    assert_same_bits(y.to(torch.bfloat16), treefold.softmax(x))
    ls16 = treefold.log_softmax(x, dtype=torch.float16)
    assert ls16.dtype == torch.float16
    assert_same_bits(ls16, treefold.log_softmax(x, dtype=torch.float32).to(torch.float16))


# ---- layouts -----------------------------------------------------------------------------------

@needs_kernel
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_any_dim(op):
    x = _data((5, 6, 40), torch.float32, seed=9)
    for dim in (0, 1, -2):
        got = _call(op, x, dim=dim)
        moved = _call(op, x.movedim(dim, -1).contiguous())
        want = moved if op == "logsumexp" else moved.movedim(-1, dim)
        assert_same_bits(got, want.contiguous(), f"dim={dim}")
        if op != "logsumexp":
            assert got.is_contiguous()
    assert treefold.logsumexp(x, dim=1, keepdim=True).shape == (5, 1, 40)


@needs_kernel
def test_strided_rows_are_read_in_place():
    wide = _data((6, 1200), torch.float32, seed=3)
    x = wide[:, 100:1100]  # rows 1200 elements apart, last dim contiguous
    rows, stride = ops._rows(x, 1000)
    assert rows.data_ptr() == x.data_ptr() and stride == 1200
    assert_same_bits(treefold.softmax(x), treefold.softmax(x.contiguous()))
    assert_same_bits(treefold.logsumexp(x), treefold.logsumexp(x.contiguous()))
    every_other = wide[::2, :1000]
    assert_same_bits(treefold.log_softmax(every_other), treefold.log_softmax(every_other.contiguous()))
    not_contiguous = wide.t()[:50]  # last dim strided: copied
    assert_same_bits(treefold.softmax(not_contiguous), treefold.softmax(not_contiguous.contiguous()))
    # a dimension of one entry between sliced ones (one attention head, [B, 1, T, K] cut to
    # [B, 1, q, K]): its stride says nothing of where the rows lie; the rows are not one stride
    # apart here, so they are copied, not read at the wrong places
    heads = _data((2, 1, 7, 50), torch.float32, seed=4)[:, :, :3]
    assert heads.stride() == (350, 350, 50, 1)
    for op in (treefold.softmax, treefold.log_softmax, treefold.logsumexp):
        assert_same_bits(op(heads), op(heads.contiguous()))
    dy = _data((2, 1, 7, 50), torch.float32, seed=5)[:, :, :3]
    xg, xc = heads.clone().requires_grad_(), heads.contiguous().requires_grad_()
    assert_same_bits(torch.autograd.grad(treefold.softmax(xg), xg, dy)[0],
                     torch.autograd.grad(treefold.softmax(xc), xc, dy.contiguous())[0])


@needs_kernel
def test_strided_vectors_and_their_gradients():
    # a 1-D tensor whose elements are not adjacent (a column, every other element) is copied,
    # and so is the stride-0 gradient that out.sum().backward() hands the backward pass
    v = _data((14,), torch.float32, seed=6)[::2]
    for op in (treefold.softmax, treefold.log_softmax, treefold.logsumexp):
        assert_same_bits(op(v), op(v.contiguous()))
    for op in (treefold.softmax, treefold.log_softmax):
        xg, xc = v.clone().requires_grad_(), v.clone().requires_grad_()
        op(xg).sum().backward()
        op(xc).backward(torch.ones(7, device=xc.device))
        assert_same_bits(xg.grad, xc.grad)
        xd = v.detach().double().requires_grad_()
        (torch.log_softmax if op is treefold.log_softmax else torch.softmax)(xd, -1).sum().backward()
        assert torch.allclose(xg.grad.double(), xd.grad, atol=1e-6), op


@needs_kernel
def test_empty_tensors_and_scalars():
    assert treefold.softmax(torch.empty(0, 7, device=DEVICE)).shape == (0, 7)
    assert treefold.log_softmax(torch.empty(3, 0, device=DEVICE)).shape == (3, 0)
    assert treefold.logsumexp(torch.empty(0, 7, device=DEVICE)).shape == (0,)
    lse = treefold.logsumexp(torch.empty(3, 0, device=DEVICE))
    assert lse.shape == (3,) and torch.all(lse == float("-inf"))
    assert treefold.softmax(torch.tensor(2.5, device=DEVICE)).item() == 1.0
    assert treefold.log_softmax(torch.tensor(2.5, device=DEVICE)).item() == 0.0
    assert treefold.logsumexp(torch.tensor(2.5, device=DEVICE)).item() == 2.5
    one = treefold.softmax(torch.tensor([[3.0], [-1e30]], device=DEVICE))
    assert torch.equal(one, torch.ones(2, 1, device=DEVICE))


# ---- extreme inputs ------------------------------------------------------------------------

EXTREME = torch.tensor([
    [float("-inf")] * 6,                                     # fully masked
    [1.0, float("nan"), 2.0, 3.0, 4.0, 5.0],                 # NaN
    [1.0, float("inf"), 2.0, 3.0, 4.0, 5.0],                 # +inf
    [1e4, -1e4, float("-inf"), 0.0, 1e4, float("-inf")],     # mixed, masked lanes
    [-1e4] * 6,
    [1e4, 1e4 - 1, 1e4 - 2, -1e4, -1e4, float("-inf")],
])


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("strategy", ops.STRATEGIES)
def test_extremes(strategy, dtype):
    extreme = EXTREME.to(DEVICE, dtype)
    y = ops.softmax_forward(extreme, strategy=strategy)
    ls = ops.softmax_forward(extreme, log=True, strategy=strategy)
    lse = ops.logsumexp_forward(extreme, strategy=strategy)
    assert torch.equal(y[0], torch.zeros(6, device=DEVICE, dtype=dtype))
    assert torch.all(ls[0] == float("-inf")) and lse[0] == float("-inf")
    assert torch.all(torch.isnan(y[1])) and torch.all(torch.isnan(ls[1])) and torch.isnan(lse[1])
    assert torch.all(torch.isnan(y[2])) and torch.all(torch.isnan(ls[2])) and lse[2] == float("inf")
    assert torch.equal(lse[2:3].float(), torch.logsumexp(extreme[2:3].float(), -1))
    for row in (3, 4, 5):
        assert compare(y[row], torch.softmax(extreme[row].double(), -1)).ok
        assert compare(ls[row], torch.log_softmax(extreme[row].double(), -1)).ok
        assert compare(lse[row], torch.logsumexp(extreme[row].double(), -1)).ok
    # the gradient of a fully masked row: zero for softmax, dy itself for log_softmax
    dy = torch.arange(1.0, 7.0, device=DEVICE, dtype=dtype).expand(6, 6)
    dx = ops.softmax_backward(dy, y, log=False, x_dtype=dtype, strategy=strategy)
    assert torch.equal(dx[0], torch.zeros(6, device=DEVICE, dtype=dtype))
    dx = ops.softmax_backward(dy, ls, log=True, x_dtype=dtype, strategy=strategy)
    assert torch.equal(dx[0], dy[0])
    if dtype != torch.float32:
        return
    # the rules hold with longer rows too, where the -inf segments meet finite ones in the tree
    # (a segment that is all -inf gets a zero factor, not exp(0 - M), which overflows for M = -1e4)
    long = torch.full((3, 9000), float("-inf"), device=DEVICE)
    long[1, 8999] = -3.0
    long[2, 8990:] = -1e4
    out = ops.softmax_forward(long, strategy=strategy)
    assert torch.all(out[0] == 0) and out[1, 8999] == 1.0 and torch.all(out[1, :8999] == 0)
    assert torch.all(out[2, :8990] == 0) and torch.all(out[2, 8990:] == 0.1)
    want_lse = torch.tensor([float("-inf"), -3.0], device=DEVICE)
    assert torch.equal(ops.logsumexp_forward(long, strategy=strategy)[:2], want_lse)


def test_reference_follows_the_same_rules():
    y, ls, lse = reference.softmax(EXTREME), reference.softmax(EXTREME, log=True), reference.logsumexp(EXTREME)
    assert torch.equal(y[0], torch.zeros(6)) and torch.all(ls[0] == float("-inf")) and lse[0] == float("-inf")
    assert torch.all(torch.isnan(y[1:3])) and torch.isnan(lse[1]) and lse[2] == float("inf")
    assert compare(y[3:], torch.softmax(EXTREME[3:].double(), -1)).ok
    dx = reference.logsumexp_backward(torch.ones(6), EXTREME, lse)
    assert torch.equal(dx[0], torch.zeros(6))


# ---- autograd ------------------------------------------------------------------------------

@needs_kernel
@pytest.mark.parametrize("n", [1, 33, 4095, 5120])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_gradients_match_torch_in_float64(op, n, poisoned_outputs):
    x = _data((3, n), torch.float32, seed=n + 1)
    temperature = 1.0 if op == "logsumexp" else 1.7
    kw = {} if op == "logsumexp" else {"temperature": temperature}
    dy = _data((3,) if op == "logsumexp" else (3, n), torch.float32, scale=1.0, seed=n + 2)
    xg = x.clone().requires_grad_()
    _call(op, xg, **kw).backward(dy)
    x64 = x.double().requires_grad_()
    scaled = x64 * float(np.float32(1.0 / temperature)) if temperature != 1.0 else x64
    torch_op = {"softmax": torch.softmax, "log_softmax": torch.log_softmax, "logsumexp": torch.logsumexp}[op]
    torch_op(scaled, -1).backward(dy.double())
    # float32 gradients of float32 outputs: judged with an absolute floor of the gradient's scale
    err = (xg.grad.double() - x64.grad).abs().max().item()
    scale = x64.grad.abs().max().item() + dy.abs().max().item() * (1.0 / temperature)
    assert err <= 64 * 2.0 ** -24 * scale, (err, scale)


@needs_kernel
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_backward_row_sums_follow_the_order_bit_for_bit(op):
    if not INTERPRETED:
        pytest.skip("bits against NumPy hold for the interpreter; the GPU's exp differs")
    for n, dtype in ((4095, torch.float32), (9000, torch.bfloat16)):
        y = ops.softmax_forward(_data((3, n), dtype, seed=n), log=op == "log_softmax")
        dy = _data((3, n), dtype, scale=1.0, seed=n + 1)
        dx = ops.softmax_backward(dy, y, log=op == "log_softmax", x_dtype=torch.float32, temperature=0.5)
        want = reference.order_backward(dy, y, op, temperature=0.5)
        assert_same_bits(dx, torch.from_numpy(want), f"{op} n={n} {dtype}")


@needs_kernel
def test_gradient_dtypes_and_other_dims():
    x = _data((4, 5, 6), torch.bfloat16, seed=12).requires_grad_()
    y = treefold.softmax(x, dim=1, dtype=torch.float32)
    assert y.dtype == torch.float32
    y.square().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.shape == x.shape
    x64 = x.detach().double().requires_grad_()
    torch.softmax(x64, 1).square().sum().backward()
    assert compare(x.grad, x64.grad).ok
    lse_in = _data((3, 50), torch.float32, seed=13).requires_grad_()
    treefold.logsumexp(lse_in, dim=0, keepdim=True).sum().backward()
    assert compare(lse_in.grad, torch.softmax(lse_in.detach().double(), 0)).ok
    masked = torch.full((2, 8), float("-inf"), device=DEVICE, requires_grad=True)
    treefold.logsumexp(masked).sum().backward()
    assert torch.equal(masked.grad, torch.zeros(2, 8, device=DEVICE))  # a fully masked row gets a zero gradient


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_second_derivatives_are_torchs(op, temperature):
    # a gradient penalty (|dx|^2 added to the loss) and a Hessian-vector product: a backward
    # recorded with create_graph is torch's operations on the saved tensors (the float64
    # reference), whose gradient flows back to x and dy; without create_graph the kernels answer
    kw = {} if op == "logsumexp" else {"temperature": temperature}
    if op == "logsumexp" and temperature != 1.0:
        pytest.skip("logsumexp takes no temperature")
    x0 = _data((3, 40), torch.float32, seed=21)
    dy0 = _data((3, 40) if op != "logsumexp" else (3,), torch.float32, scale=1.0, seed=22)
    results = []
    calls = ((lambda v: _call(op, v, **kw), torch.float32, False),
             (lambda v: _call(op, v, **kw), torch.float32, True),  # a Parameter: the registered op's autograd
             (lambda v: _float64(op, v, temperature=temperature), torch.float64, False))
    for fn, dtype, parameter in calls:
        x = x0.to(dtype).requires_grad_()
        x = torch.nn.Parameter(x.detach()) if parameter else x
        dy = dy0.to(dtype).requires_grad_()
        out = fn(x)
        (dx,) = torch.autograd.grad(out, x, dy, create_graph=True)
        penalty_x, penalty_dy = torch.autograd.grad(out.sum() + dx.pow(2).sum(), (x, dy), retain_graph=True)
        (hvp,) = torch.autograd.grad(dx, x, torch.ones_like(dx))
        results.append([t.double() for t in (dx, penalty_x, penalty_dy, hvp)])
        if dtype == torch.float32:
            (plain,) = torch.autograd.grad(fn(x), x, dy)  # the kernels; float32 apart from the reference
            assert torch.allclose(plain, dx, rtol=1e-5, atol=1e-6)
    for got_results in results[:2]:
        for name, got, want in zip(("dx", "penalty dx", "penalty ddy", "hvp"), got_results, results[2]):
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (op, name, (got - want).abs().max())


def test_prepared_calls_take_their_tensors_distinct_and_in_launch_order():
    a, b, c, d = (torch.empty(2) for _ in range(4))
    assert ops._io_tensors(a, a, b, a) == (a, b)  # forward: (x, out)
    got = ops._io_tensors(a, b, c, a)  # softmax backward: (y, dy, dx)
    assert len(got) == 3 and all(g is w for g, w in zip(got, (a, b, c)))
    got = ops._io_tensors(a, b, c, d)  # logsumexp backward: (x, dy, dx, lse)
    assert len(got) == 4 and all(g is w for g, w in zip(got, (a, b, c, d)))


# ---- torch.compile, the reference path, host-side caching -----------------------------------

@pytest.fixture(params=["kernel", "reference"])
def path_device(request, monkeypatch):
    """The device a test's data goes to for each path of the registered ops: the kernels (on
    DEVICE; skipped without the interpreter or a GPU) and the reference (CPU tensors, with the
    kernels switched off as on a machine without the interpreter)."""
    if request.param == "reference":
        monkeypatch.setattr(backend, "use_kernel", lambda t: False)
        return "cpu"
    if not (INTERPRETED or DEVICE == "cuda"):
        pytest.skip("needs TRITON_INTERPRET=1 (or a GPU) to run the kernels")
    return DEVICE


def test_torch_compile_fullgraph(path_device):
    # Inductor when a C++ compiler is present, otherwise aot_eager; both require a single graph
    # through the registered ops, their fake implementations and their autograd formulas. Each
    # input feeds one treefold op, and the results are returned as they are: the ops' bits must
    # match eager ones, while ops around them (a sum, the adding up of gradients from several
    # uses) are Inductor's to reorder. The reference path (CPU tensors without the interpreter)
    # must return the layouts the fakes promise: log_softmax over dim 0 hands its op a transposed
    # view.
    device = path_device
    compiler = "inductor" if (shutil.which("g++") or shutil.which("c++")) else "aot_eager"

    def f(a, b, c):
        return (treefold.softmax(a * 2.0, dim=-1), treefold.logsumexp(b, -1),
                treefold.log_softmax(c, dim=0, temperature=2.0))

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=compiler)
    inputs = [_data((4, 33), torch.float32, seed=14 + i).to(device).requires_grad_() for i in range(3)]
    cotangents = [_data(shape, seed=20 + i).to(device) for i, shape in enumerate(((4, 33), (4,), (4, 33)))]
    got = compiled(*inputs)
    g_compiled = torch.autograd.grad(got, inputs, cotangents)
    want = f(*inputs)
    g_eager = torch.autograd.grad(want, inputs, cotangents)
    for name, a, b in zip(("softmax", "logsumexp", "log_softmax dim 0"), got, want):
        assert_same_bits(a.detach(), b.detach(), f"{compiler} {name}")
    for name, a, b in zip(("softmax", "logsumexp", "log_softmax dim 0"), g_compiled, g_eager):
        assert_same_bits(a, b, f"{compiler} {name} backward")


def test_torch_compile_fullgraph_with_a_temperature_that_changes(path_device):
    # a float argument that changes between calls is traced as a symbolic float after the first
    # recompile: its checks must guard on it, not break the graph
    x = _data((4, 33), torch.float32, seed=30).to(path_device)

    def f(a, t):
        return treefold.softmax(a, temperature=t), treefold.log_softmax(a, temperature=t)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for t in (0.5, 0.7, 0.9, 2.0):
        for name, a, b in zip(("softmax", "log_softmax"), compiled(x, t), f(x, t)):
            assert_same_bits(a, b, f"{name}, temperature {t}")


@needs_kernel
def test_eager_autograd_and_registered_op_give_the_same_bits():
    # Eager calls with a gradient take a plain autograd.Function; traced ones take the registered
    # op and its autograd formula. Both launch the same kernels: same values, same gradients.
    x = _data((3, 300), torch.bfloat16, seed=18)
    dy = _data((3, 300), torch.bfloat16, scale=1.0, seed=19)
    for log in (False, True):
        grads = []
        for call in (lambda t: treefold.log_softmax(t, temperature=0.9) if log else treefold.softmax(t, temperature=0.9),
                     lambda t: ops._softmax_op(t, log, 0.9, None, "auto")):
            xg = x.clone().requires_grad_()
            y = call(xg)
            y.backward(dy)
            grads.append((y.detach(), xg.grad))
        assert_same_bits(grads[0][0], grads[1][0], f"log={log} forward")
        assert_same_bits(grads[0][1], grads[1][1], f"log={log} backward")
    xg = x.float().requires_grad_()
    treefold.logsumexp(xg).backward(dy[:, 0].float())
    x2 = x.float().requires_grad_()
    ops._logsumexp_op(x2, "auto").backward(dy[:, 0].float())
    assert_same_bits(xg.grad, x2.grad, "logsumexp backward")


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_registered_ops_pass_opcheck(path_device, layout):
    """Schema, fake (meta) implementation, autograd registration and AOT dispatch of each op, on
    the kernels and on the reference path (CPU tensors without the interpreter). A softmax over
    dim 0 hands the op a transposed view: every path must return the contiguous layout its fake
    promises, or code compiled by Inductor fails its stride assertions."""
    device = path_device
    x = _data((40, 3) if layout == "transposed" else (3, 40), torch.float32, seed=17).to(device)
    x = (x.t() if layout == "transposed" else x).requires_grad_()
    y = torch.softmax(x.detach(), -1)
    lse = torch.logsumexp(x.detach(), -1)
    dy, dlse = _data((3, 40), seed=18).to(device), _data((3,), seed=19).to(device)
    cases = [(ops._softmax_op, (x, False, 0.5, torch.bfloat16, "auto")), (ops._logsumexp_op, (x, "split")),
             (ops._softmax_backward_op, (dy, y, True, 2.0, torch.float32, "online")),
             (ops._softmax_backward_op, (y.t().contiguous().t(), y, True, 1.0, torch.float32, "auto")),
             (ops._logsumexp_backward_op, (dlse, x.detach(), lse, "auto"))]
    for op, args in cases:
        results = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in results.values()), (op, results)


def test_reference_path_without_the_interpreter(monkeypatch):
    monkeypatch.setattr(backend, "INTERPRETED", False)
    x = _data((3, 77), torch.bfloat16, seed=15).cpu()
    for op in ("softmax", "log_softmax", "logsumexp"):
        got = _call(op, x)
        assert compare(got, _float64(op, x)).ok, op
    xg = _data((3, 77), torch.float32, seed=16).cpu().requires_grad_()
    treefold.softmax(xg, temperature=3.0).pow(2).sum().backward()
    x64 = xg.detach().double().requires_grad_()
    torch.softmax(x64 * float(np.float32(1 / 3.0)), -1).pow(2).sum().backward()
    assert compare(xg.grad, x64.grad).ok


def test_launch_plans_are_cached_and_explain_themselves():
    p = ops.plan(0, False, 151936, 64, 132, 2)
    assert p is ops.plan(0, False, 151936, 64, 132, 2)  # one dictionary lookup per eager call
    # decode batches of long rows: two launches, the second reading the rows again from L2
    assert p.strategy == "split" and len(p.phases) == 2 and p.partials == "pq"
    assert p.phases[0].grid == (64 * 38,)  # one segment of 4096 per program
    # larger batches: programs that share a row and run at once, one read
    coop = ops.plan(0, False, 151936, 1024, 132, 2)
    assert coop.strategy == "cooperative" and len(coop.phases) == 1 and coop.partials == "pq" and coop.arrivals
    assert coop.phases[0].grid == (1024 * 19,)  # 38 segments, 2 per program
    # rows of up to 32768 whose second read hits L2: streamed, 4 warps, blocks of 8192 elements
    online = ops.plan(0, False, 32768, 4096, 132, 2)
    assert online.strategy == "online" and online.num_warps == 4 and online.seg_block == 2  # 2 x 4096 lanes
    assert ops.plan(1, False, 32768, 4096, 132, 2).strategy == "online"
    assert ops.plan(2, False, 32768, 4096, 132, 2).strategy == "cooperative"  # logsumexp reads once
    # a row never gets more programs than SMs: 38 segments on 8 SMs, 8 segments per program
    assert ops.plan(0, False, 151936, 1, 8, 2, "cooperative").phases[0].grid == (5,)
    # in the interpreter, whose programs run one after another: a second read
    assert ops.plan(0, False, 151936, 1024, 132, 2, concurrent=False).strategy == "online"
    block = ops.plan(0, False, 4096, 8192, 132, 2)
    assert block.strategy == "block" and block.rows_per_program == 2 and block.num_warps == 8
    assert ops.plan(0, False, 512, 8192, 132, 2).strategy == "warp"
    # the backward keeps y and dy in registers up to twice the forward's tile
    assert ops.plan(0, True, 32768, 4096, 132, 2).strategy == "block"
    assert ops.plan(0, True, 151936, 256, 132, 2).strategy == "cooperative"
    assert ops.plan(2, False, 151936, 256, 132, 2).strategy == "cooperative"
    assert ops.plan(2, True, 151936, 256, 132, 2).strategy == "online"  # elementwise, from the saved lse
    assert ops.plan(2, False, 4096, 8192, 132, 2).num_warps == 8  # logsumexp only reads: more warps
    lse_backward = ops.plan(2, True, 151936, 1, 132, 2, "split")  # elementwise: no partials
    assert len(lse_backward.phases) == 1 and lse_backward.partials == ""


def test_cooperative_rows_never_get_more_programs_than_sms():
    # The programs of a row wait for one another, so all of them must fit on the device at once.
    for n in (4097, 9000, 32768, 131072, 151936, 262144, 1 << 20, 1 << 24):
        for sms in (8, 132):
            for backward in (False, True):
                factor = 2 if backward else 1
                try:
                    p = ops.plan(0, backward, n, 4096, sms, 2, "cooperative")
                except ValueError as e:  # rows too long for sms programs of register-sized shares
                    assert "held by at most" in str(e)
                    assert order.next_pow2(order.cdiv(order.num_segments(n), sms)) * order.lanes(n) * factor \
                        > ops.REGISTER_ELEMENTS_LIMIT
                    continue
                assert p.phases[0].programs_per_row <= sms
                assert p.segments_per_program * order.lanes(n) * factor <= ops.REGISTER_ELEMENTS_LIMIT
                assert p.phases[0].grid == (4096 * p.phases[0].programs_per_row,)


# ---- bad inputs ----------------------------------------------------------------------------

@pytest.mark.parametrize("call, error, message", [
    (lambda: treefold.softmax([1.0, 2.0]), TypeError, "softmax: x must be a torch.Tensor, got list"),
    (lambda: treefold.log_softmax(torch.ones(3, dtype=torch.int64)), TypeError,
     "log_softmax: x has dtype int64, expected one of float32, bfloat16, float16"),
    (lambda: treefold.softmax(torch.ones(3, dtype=torch.float64)), TypeError, "softmax: x has dtype float64"),
    (lambda: treefold.softmax(torch.ones(2, 3), dim=2), ValueError,
     r"softmax: dim=2 is out of range for a tensor with 2 dimension\(s\)"),
    (lambda: treefold.softmax(torch.ones(2, 3), dim=1.0), TypeError, "softmax: dim must be an int, got float"),
    (lambda: treefold.softmax(torch.ones(3), temperature=0), ValueError, "softmax: temperature must be > 0.0, got 0"),
    (lambda: treefold.softmax(torch.ones(3), temperature=-2.0), ValueError, "softmax: temperature must be > 0.0"),
    (lambda: treefold.log_softmax(torch.ones(3), temperature=float("inf")), ValueError,
     "log_softmax: temperature must be finite, got inf"),
    (lambda: treefold.softmax(torch.ones(3), temperature="hot"), TypeError,
     "softmax: temperature must be a number, got str"),
    # the kernels multiply by float32(1 / temperature): it must hold in float32
    (lambda: treefold.softmax(torch.ones(3), temperature=1e46), ValueError,
     r"softmax: temperature=1e\+46 has an inverse that rounds to 0 in float32"),
    (lambda: treefold.log_softmax(torch.ones(3), temperature=2e-39), ValueError,
     r"log_softmax: temperature=2e-39 has an inverse that rounds to inf in float32"),
    (lambda: treefold.softmax(torch.ones(2, 3, device="meta")), ValueError,
     "softmax: x is on meta; treefold runs on cuda and cpu tensors"),
    (lambda: treefold.logsumexp(torch.ones(2, 3, device="meta")), ValueError,
     "logsumexp: x is on meta; treefold runs on cuda and cpu tensors"),
    (lambda: treefold.softmax(torch.ones(2, 3).to_sparse()), TypeError,
     "softmax: x is a sparse_coo tensor; treefold takes dense"),
    (lambda: treefold.logsumexp(torch.ones(2, 3).to_sparse()), TypeError,
     "logsumexp: x is a sparse_coo tensor; treefold takes dense"),
    (lambda: treefold.softmax(torch.ones(3), dtype=torch.float64), TypeError,
     "softmax: dtype=float64 is not supported, expected one of float32, bfloat16, float16"),
    (lambda: treefold.softmax(torch.ones(3), dtype="float32"), TypeError,
     "softmax: dtype must be a torch.dtype or None, got str"),
    (lambda: treefold.logsumexp(torch.ones(3), keepdim=1), TypeError, "logsumexp: keepdim must be a bool, got int"),
    (lambda: treefold.logsumexp(torch.ones(3), dim=(0,)), TypeError, "logsumexp: dim must be an int, got tuple"),
    (lambda: treefold.logsumexp("x"), TypeError, "logsumexp: x must be a torch.Tensor, got str"),
    (lambda: treefold.softmax(torch.empty(1, ops.MAX_ROW + 1, dtype=torch.bfloat16)), ValueError,
     "softmax: x has 16777217 elements along dim -1; rows longer than 16777216 elements are not supported"),
    (lambda: ops.softmax_forward(torch.ones(2, 8), strategy="fast"), ValueError,
     "softmax: strategy='fast' is not one of auto, warp, block, online, split, cooperative"),
    # the interpreter runs programs one after another; on a GPU the two programs run at once
    pytest.param(lambda: ops.softmax_forward(torch.ones(1, 9000), strategy="cooperative",
                                             tuning=ops.Tuning(segments_per_program=2)), ValueError,
                 "softmax: strategy='cooperative' with 2 programs per row needs them to run at once",
                 marks=pytest.mark.skipif(not INTERPRETED, reason="the interpreter's limit")),
    (lambda: ops.softmax_forward(torch.ones(2, 8), tuning=ops.Tuning(num_warps=3)), ValueError,
     "softmax: num_warps must be a power of two >= 1, got 3"),
    (lambda: ops.softmax_forward(torch.ones(2, 8), tuning=ops.Tuning(stages=0)), ValueError,
     "softmax: stages must be an int >= 1, got 0"),
    (lambda: ops.softmax_forward(torch.ones(2, 8), tuning=ops.Tuning(max_registers=300)), ValueError,
     "softmax: max_registers must be None or an int from 24 to 255, got 300"),
    (lambda: ops.logsumexp_forward(torch.ones(1, 200000), strategy="block"), ValueError,
     "logsumexp: strategy='block' holds whole rows in registers; a row of 200000 elements"),
])
def test_bad_inputs_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


# ---- long rows (interpreter time matters: one row of a decode vocabulary) -------------------

@needs_kernel
def test_decode_vocabulary_row():
    n = 151936
    x = _data((1, n), torch.bfloat16, scale=4.0, seed=21)
    split = ops.softmax_forward(x, strategy="split", out_dtype=torch.float32)
    online = ops.softmax_forward(x, strategy="online", out_dtype=torch.float32)
    assert_same_bits(split, online, "split vs online")
    assert compare(split, _float64("softmax", x)).ok
    assert_same_bits(ops.logsumexp_forward(x, strategy="split"), ops.logsumexp_forward(x, strategy="online"))
    # the backward over the whole vocabulary against float64 autograd, within 64 float32 ulps of
    # the largest gradient (the errors measure 2-3% of that bound for both ops)
    for op in ("softmax", "log_softmax"):
        xg = x.float().requires_grad_()
        dy = _data((1, n), torch.float32, scale=1.0, seed=23)
        FUNCS[op](xg).backward(dy)
        x64 = x.double().requires_grad_()
        {"softmax": torch.softmax, "log_softmax": torch.log_softmax}[op](x64, -1).backward(dy.double())
        err = (xg.grad.double() - x64.grad).abs().max().item()
        scale = x64.grad.abs().max().item()
        assert err <= 64 * 2.0 ** -24 * scale, (op, err, scale)


# ---- GPU tier ------------------------------------------------------------------------------

# (rows, n, dtype): batch sizes 1, 7 and 1000; rows in registers, streamed and split.
GPU_CASES = [(1, 151936, torch.bfloat16), (7, 4095, torch.float32), (1000, 4096, torch.bfloat16),
             (7, 32768, torch.bfloat16), (64, 151936, torch.float32), (1000, 257, torch.bfloat16)]


def _gpu_configs(n, held_factor=1, every=True):
    """Launch variants whose register tiles stay reasonable (backward holds y and dy: factor 2).
    ``every=False``: one variant per strategy (each variant is a compile on the device)."""
    configs = [("auto", ops.Tuning()), ("online", ops.Tuning()), ("split", ops.Tuning()),
               ("cooperative", ops.Tuning())]
    if every:
        configs += [("cooperative", ops.Tuning(segments_per_program=1, num_warps=4)),
                    ("cooperative", ops.Tuning(segments_per_program=2, num_warps=16))]
    if every:
        configs += [("online", ops.Tuning(num_warps=4, seg_block=1)),
                    # cache policies and a register cap that spills: the arithmetic is the same
                    ("online", ops.Tuning(store_hint="", max_registers=96)),
                    ("split", ops.Tuning(segments_per_program=1, num_warps=8)),
                    ("split", ops.Tuning(dependent_launch=True)), ("split", ops.Tuning(dependent_launch=False))]
    held = ops._tile_elements(n) * held_factor
    if every and _compiled_tile_fits("warp", held, 2):
        configs += [("warp", ops.Tuning(num_warps=2))]
    configs += [("block", ops.Tuning(num_warps=w)) for w in ((8, 16) if every else (16,))
                if _compiled_tile_fits("block", held, w)]
    return configs


@pytest.mark.gpu
@pytest.mark.parametrize("rows, n, dtype", GPU_CASES)
def test_gpu_strategies_num_warps_and_batches_agree_bitwise(rows, n, dtype):
    shape = (rows, n)
    x = _data(shape, dtype, seed=rows + n).cuda()
    dy = _data(shape, torch.float32, scale=1.0, seed=n).cuda()
    for op in ("softmax", "log_softmax", "logsumexp"):
        configs = _gpu_configs(n, every=op == "softmax")
        kw = {} if op == "logsumexp" else {"out_dtype": torch.float32}
        outs = [_study_forward(op, x, s, t, **kw) for s, t in configs]
        for (s, t), out in zip(configs, outs):
            assert_same_bits(out, outs[0], f"{op} {shape} {s} {t}")
        for b in (1, 7):
            assert_same_bits(_study_forward(op, x[-b:], "auto", ops.Tuning(), **kw), outs[0][-b:],
                             f"{op} last {b} rows alone")
        report = compare(outs[0].cpu(), _float64(op, x.cpu()))
        assert report.ok, str(report)
        if op != "logsumexp":
            backward_configs = _gpu_configs(n, held_factor=2, every=op == "softmax")
            dxs = [ops.softmax_backward(dy, outs[0], log=op == "log_softmax", x_dtype=torch.float32, strategy=s,
                                        tuning=t) for s, t in backward_configs]
            for (s, t), dx in zip(backward_configs, dxs):
                assert_same_bits(dx, dxs[0], f"{op} backward {shape} {s} {t}")


@pytest.mark.gpu
@pytest.mark.parametrize("rows, n", [(7, 4096), (1000, 4096), (7, 32768), (256, 131072)])
def test_gpu_holding_16bit_inputs_gives_the_same_bits(rows, n):
    x = _data((rows, n), torch.bfloat16, seed=n).cuda()
    dy = _data((rows, n), torch.bfloat16, scale=1.0, seed=rows).cuda()
    configs = [("cooperative", ops.Tuning()), ("cooperative", ops.Tuning(segments_per_program=1, num_warps=4))]
    configs += [("block", ops.Tuning(num_warps=w)) for w in (8, 16) if _compiled_tile_fits("block", 2 * n, w)]
    for strategy, tuning in configs:
        held = dataclasses.replace(tuning, hold_16bit=True)
        for op in ("softmax", "log_softmax", "logsumexp"):
            want = _study_forward(op, x, strategy, tuning)
            assert_same_bits(_study_forward(op, x, strategy, held), want, f"{op} {strategy} {tuning}")
            if op != "logsumexp":
                dx = ops.softmax_backward(dy, want, log=op == "log_softmax", strategy=strategy, tuning=held)
                float32_held = dataclasses.replace(tuning, hold_16bit=False)
                assert_same_bits(dx, ops.softmax_backward(dy, want, log=op == "log_softmax", strategy=strategy,
                                                          tuning=float32_held), f"{op} backward {strategy} {tuning}")


@pytest.mark.gpu
def test_gpu_batch_of_1000_rows_each_equal_to_alone():
    x = _data((1000, 5000), torch.bfloat16, seed=31).cuda()
    batch = treefold.softmax(x)
    for i in (0, 1, 499, 993):
        assert_same_bits(treefold.softmax(x[i:i + 1]), batch[i:i + 1], f"row {i}")
        assert_same_bits(treefold.softmax(x[i:i + 7]), batch[i:i + 7], f"rows {i}..{i + 6}")


@pytest.mark.gpu
def test_gpu_run_to_run_and_cuda_graph_capture():
    x = _data((64, 151936), torch.bfloat16, seed=32).cuda()
    first = treefold.softmax(x)
    for _ in range(3):
        assert_same_bits(treefold.softmax(x), first, "run to run")
    static_out = torch.empty_like(first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out.copy_(treefold.softmax(x))
    graph.replay()
    torch.cuda.synchronize()
    assert_same_bits(static_out, first, "graph replay")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 64])
def test_gpu_family_and_backward_inside_cuda_graph_capture(rows):
    # decode shapes: the two-launch split (its second launch dependent on the first), for every
    # op of the family, and their backward passes through autograd, captured in one graph and
    # replayed on new data
    x = _data((rows, 151936), torch.bfloat16, seed=40).cuda()
    dy = _data((rows, 151936), torch.bfloat16, seed=41).cuda()
    dl = _data((rows,), torch.bfloat16, seed=42).cuda()

    def step():
        xg = x.detach().requires_grad_()
        y, ls, lse = treefold.softmax(xg), treefold.log_softmax(xg), treefold.logsumexp(xg)
        dx = torch.autograd.grad((y, ls, lse), xg, (dy, dy, dl))[0]
        return y.detach(), ls.detach(), lse.detach(), dx

    static = [torch.empty_like(t) for t in step()]  # (compiles everything before the capture)
    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for out, t in zip(static, step()):
            out.copy_(t)
    for seed in (43, 44):
        x.copy_(_data((rows, 151936), torch.bfloat16, seed=seed).cuda())
        graph.replay()
        torch.cuda.synchronize()
        for out, want, name in zip(static, step(), ("softmax", "log_softmax", "logsumexp", "dx")):
            assert_same_bits(out, want, f"graph replay, {name}, {rows} rows, data {seed}")


@pytest.mark.gpu
def test_gpu_cooperative_launch_inside_cuda_graph_capture():
    # "cooperative" zeroes its per-row arrival counters on every call: captured, that is a memset
    # node before the kernel, so every replay starts from zero (a second replay on new data
    # would wait forever, or merge stale partials, if it did not)
    x = _data((256, 32768), torch.bfloat16, seed=34).cuda()
    static_y = torch.empty_like(x)
    static_lse = torch.empty(256, dtype=x.dtype, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y.copy_(ops.softmax_forward(x, strategy="cooperative"))
        static_lse.copy_(ops.logsumexp_forward(x, strategy="cooperative"))
    for seed in (35, 36):
        x.copy_(_data((256, 32768), torch.bfloat16, seed=seed).cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bits(static_y, ops.softmax_forward(x, strategy="block"), f"graph replay, data {seed}")
        assert_same_bits(static_lse, ops.logsumexp_forward(x, strategy="online"), f"graph replay lse, data {seed}")


@pytest.mark.gpu
def test_gpu_torch_compile_and_gradients():
    x = _data((256, 4096), torch.bfloat16, seed=33).cuda().requires_grad_()

    def f(t):
        return treefold.log_softmax(t, temperature=0.8).float().exp().sum(-1)

    torch._dynamo.reset()
    torch.compile(f, fullgraph=True)(x).sum().backward()
    g = x.grad.clone()
    x.grad = None
    f(x).sum().backward()
    assert_same_bits(g, x.grad, "compiled vs eager gradient")


@pytest.mark.gpu
def test_gpu_offsets_past_two_to_the_31():
    rows, n = (1 << 31) // 4096 + 8, 4096  # 2^31 + 32768 elements: row offsets need int64
    x = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16).normal_(0, 3)
    for strategy in ("auto", "online", "cooperative"):
        y = ops.softmax_forward(x, strategy=strategy)
        tail = ops.softmax_forward(x[-8:].clone(), strategy=strategy)
        assert_same_bits(y[-8:], tail, f"last rows, {strategy}")
        del y
    lse = treefold.logsumexp(x)
    assert_same_bits(lse[-8:], treefold.logsumexp(x[-8:].clone()), "logsumexp last rows")
