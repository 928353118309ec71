"""cross_entropy: losses and gradients against float64 torch, the order's bits, bad targets, autograd.

CPU tier: the Triton kernels run through the interpreter (TRITON_INTERPRET=1); tests that need
the kernels skip otherwise. On a machine with a GPU the same tests run the compiled kernels on
``DEVICE``. GPU tier (``gpu`` marker): vocabulary-sized rows, bitwise equality across
strategies and batch sizes, CUDA graph capture, torch.compile.

Tolerances are ``treefold.numerics.TOLERANCES`` for the result's dtype, applied by
``numerics.compare`` against torch's ``F.cross_entropy`` in float64 on the same input values:
the loss is float32 (rtol 1.3e-6, about 22 ulp: the lse's tree of exps, its log, and the one
or three float32 operations that form the loss), the gradient is in the logits' dtype
(rounded once from a float32 value a few float32 ulps from exact).
"""
import shutil

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import treefold
from treefold import backend
from treefold._ops import softmax as ops
from treefold.numerics import compare

from conftest import DEVICE, assert_same_bits

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

needs_kernel = pytest.mark.skipif(not backend.INTERPRETED and not torch.cuda.is_available(),
                                  reason="needs TRITON_INTERPRET=1 (or a GPU) to run the kernels")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
LENGTHS = [1, 33, 4095, 5120]
IGNORE = -100

def _logits(shape, dtype=torch.float32, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(DEVICE)


def _targets(rows, n, seed=1, ignored=()):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, n, (rows,), generator=g)
    for i in ignored:
        t[i] = IGNORE
    return t.to(DEVICE)


def _torch64(x, t, grad=None, **kw):
    """torch's loss (and dx for ``grad``) in float64 from the same input values."""
    x64 = x.detach().double().requires_grad_()
    loss = F.cross_entropy(x64, t, ignore_index=IGNORE, **kw)
    if grad is None:
        return loss.detach(), None
    return loss.detach(), torch.autograd.grad(loss, x64, grad.double())[0]


@pytest.fixture
def poisoned_outputs(poison_allocations):
    """Output and scratch buffers start as NaN (integers as a sentinel): an element a kernel
    forgets to write cannot pass."""
    poison_allocations()


# ---- accuracy against float64 torch ---------------------------------------------------------

@needs_kernel
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_losses_and_gradients_match_float64_torch(dtype, n, smoothing, poisoned_outputs):
    x = _logits((4, n), dtype, seed=n).requires_grad_()
    t = _targets(4, n, seed=n + 1, ignored=(2,))
    g = _logits((4,), torch.float32, scale=1.0, seed=n + 2)
    want, want_dx = _torch64(x, t, g, reduction="none", label_smoothing=smoothing)
    loss = treefold.cross_entropy(x, t, reduction="none", label_smoothing=smoothing)
    assert loss.dtype == torch.float32 and loss.shape == (4,)
    report = compare(loss, want.float())
    assert report.ok, str(report)
    (dx,) = torch.autograd.grad(loss, x, g)
    assert dx.dtype == dtype
    report = compare(dx, want_dx.to(dtype))
    assert report.ok, str(report)
    # the ignored row counts for nothing, exactly
    assert loss[2].item() == 0.0 and bool((dx[2] == 0).all())


@needs_kernel
@pytest.mark.parametrize("smoothing", [0.0, 0.25])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_reductions_are_the_order_sum_of_the_row_losses(reduction, smoothing):
    x = _logits((9, 300), torch.bfloat16, seed=3).requires_grad_()
    t = _targets(9, 300, seed=4, ignored=(0, 5))
    got = treefold.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing)
    rows = treefold.cross_entropy(x.detach(), t, reduction="none", label_smoothing=smoothing)
    total = treefold.sum(rows, dtype=torch.float32)
    assert_same_bits(got.detach(), total if reduction == "sum" else total / 7, reduction)
    want, want_dx = _torch64(x, t, torch.tensor(1.0, device=DEVICE), reduction=reduction, label_smoothing=smoothing)
    assert compare(got.detach(), want.float()).ok
    (dx,) = torch.autograd.grad(got, x)
    assert compare(dx, want_dx.to(dx.dtype)).ok


@needs_kernel
def test_mean_over_no_counted_row_is_nan_as_in_torch():
    x = _logits((3, 10), seed=5)
    t = torch.full((3,), IGNORE, device=DEVICE)
    assert torch.isnan(treefold.cross_entropy(x, t)).item()
    assert treefold.cross_entropy(x, t, reduction="sum").item() == 0.0
    empty = treefold.cross_entropy(x[:0], t[:0])
    assert empty.shape == () and torch.isnan(empty).item()
    assert treefold.cross_entropy(x[:0], t[:0], reduction="none").shape == (0,)


@needs_kernel
def test_loss_is_log_z_minus_the_shifted_target_logit_bit_for_bit():
    # the kernels keep each row's maximum M' and log Z (what the backward reads): the loss is
    # log Z - (x[t] - M'), rounded where torch's -log_softmax(x)[t] is, and M' + log Z is the
    # bits treefold.logsumexp gives the same row
    for n in (33, 5120):
        x = _logits((5, n), seed=n)
        t = _targets(5, n, seed=n)
        loss, stats = ops.cross_entropy_forward(x, t, IGNORE, 0.0)
        assert_same_bits(stats[0], x.amax(-1), f"n={n} M'")
        assert_same_bits(stats[0] + stats[1], treefold.logsumexp(x), f"n={n} lse")
        assert_same_bits(loss, stats[1] - (x.gather(1, t[:, None])[:, 0] - stats[0]), f"n={n} loss")
        assert_same_bits(treefold.cross_entropy(x, t, reduction="none"), loss, f"n={n} public")


# ---- the treefold order: strategies, batch position ------------------------------------------

STRATEGIES = [("warp", ops.Tuning()), ("block", ops.Tuning()), ("online", ops.Tuning()),
              ("online", ops.Tuning(seg_block=1)), ("split", ops.Tuning()), ("split", ops.Tuning(segments_per_program=1)),
              # the interpreter runs programs one after another: logsumexp's last program to
              # arrive finishes the row, so a row may be shared
              ("cooperative", ops.Tuning(segments_per_program=1)), ("cooperative", ops.Tuning(segments_per_program=4096))]


@needs_kernel
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("n", [1, 33, 4095, 9000])
def test_every_strategy_gives_the_same_bits(n, smoothing):
    x = _logits((3, n), torch.bfloat16, seed=7)
    t = _targets(3, n, seed=8, ignored=(1,))
    if smoothing:
        t = t.int()  # int32 targets: the same bits
    g = _logits((3,), seed=9)
    results = {}
    for strategy, tuning in STRATEGIES:
        if strategy in ("warp", "block") and ops._tile_elements(n) > (4096 if DEVICE == "cuda" else 65536):
            continue
        loss, stats = ops.cross_entropy_forward(x, t, IGNORE, smoothing, strategy=strategy, tuning=tuning)
        dx = ops.cross_entropy_backward(g, x, t, stats, IGNORE, smoothing, strategy=strategy, tuning=tuning)
        results[(strategy, tuning)] = (loss, stats, dx)
    first = next(iter(results.values()))
    for key, got in results.items():
        for name, a, b in zip(("loss", "stats", "dx"), got, first):
            assert_same_bits(a, b, f"{name} n={n} {key}")


@needs_kernel
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("n", [1, 33, 5120, 9000])
def test_the_forward_that_writes_dx_gives_the_backwards_bits(n, smoothing, poisoned_outputs):
    # cross_entropy_forward(dloss=...) writes dx in the softmax forward's launches; the backward
    # then writes over it only for another dloss. Every strategy: the plain backward's bits.
    x = _logits((4, n), torch.bfloat16, seed=36)
    t = _targets(4, n, seed=37, ignored=(0,))
    t[2] = n + 3  # out of range: NaN, as in the plain backward
    expected = torch.tensor(0.25, device=DEVICE)
    loss, stats = ops.cross_entropy_forward(x, t, IGNORE, smoothing)
    want = ops.cross_entropy_backward(expected.expand(4), x, t, stats, IGNORE, smoothing)
    other = ops.cross_entropy_backward(torch.full((4,), 0.5, device=DEVICE), x, t, stats, IGNORE, smoothing)
    for strategy, tuning in STRATEGIES:
        if strategy in ("warp", "block") and ops._tile_elements(n) > (4096 if DEVICE == "cuda" else 65536):
            continue
        if strategy == "cooperative" and tuning.segments_per_program == 1 and backend.INTERPRETED and n > 4096:
            continue  # programs that wait for one another
        got = ops.cross_entropy_forward(x, t, IGNORE, smoothing, dloss=expected, strategy=strategy, tuning=tuning)
        for name, a, b in zip(("loss", "stats", "dx"), got, (loss, stats, want)):
            assert_same_bits(a, b, f"{name} n={n} {strategy} {tuning}")
        dx = got[2]
        same = ops.cross_entropy_backward(expected.clone(), x, t, stats, IGNORE, smoothing, written=(dx, expected))
        assert same is dx
        assert_same_bits(same, want, f"the dloss it was written for n={n} {strategy} {tuning}")
        anew = ops.cross_entropy_backward(torch.tensor(0.5, device=DEVICE), x, t, stats, IGNORE, smoothing,
                                          written=(dx, expected))
        assert_same_bits(anew, other, f"another dloss n={n} {strategy} {tuning}")


@needs_kernel
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_reduced_losses_through_the_fused_forward_give_the_unfused_bits(reduction, monkeypatch):
    x = _logits((6, 300), torch.bfloat16, seed=38)
    t = _targets(6, 300, seed=39, ignored=(1,))
    results = {}
    for fused in (True, False):
        monkeypatch.setattr(ops, "FUSED_GRADIENT", fused)
        xg = x.clone().requires_grad_()
        loss = treefold.cross_entropy(xg, t, reduction=reduction, label_smoothing=0.1)
        (plain,) = torch.autograd.grad(loss, xg, retain_graph=True)  # the dloss the forward wrote for
        (scaled,) = torch.autograd.grad(loss, xg, torch.tensor(0.5, device=DEVICE), retain_graph=True)
        loss.backward(retain_graph=True)
        loss.backward()  # a second accumulation must not change the first one's tensor
        results[fused] = (loss.detach(), plain, scaled, xg.grad)
    for name, a, b in zip(("loss", "dx", "dx for 0.5", "accumulated"), results[True], results[False]):
        assert_same_bits(a, b, f"{reduction} {name}")
    assert_same_bits(results[True][3], results[True][1] * 2, "two accumulations")


@needs_kernel
def test_a_summed_loss_takes_in_place_scaling_and_checkpointing_computes_dx_in_the_backward():
    x = _logits((5, 40), seed=41)
    t = _targets(5, 40, seed=42)
    grads = []
    for fused in (True, False):
        ops.FUSED_GRADIENT, saved = fused, ops.FUSED_GRADIENT
        try:
            xg = x.clone().requires_grad_()
            loss = treefold.cross_entropy(xg, t, reduction="sum")
            loss /= 4  # gradient accumulation's scaling, in place
            loss.backward()
            grads.append(xg.grad)
        finally:
            ops.FUSED_GRADIENT = saved
    assert_same_bits(grads[0], grads[1], "sum scaled in place")
    # saved-tensor hooks would not see a dx held from the forward: under them, the two passes
    xg = x.clone().requires_grad_()
    assert ops.fuses_gradient(xg)
    with torch.autograd.graph.save_on_cpu():
        assert not ops.fuses_gradient(xg)
    checkpointed = torch.utils.checkpoint.checkpoint(lambda v: treefold.cross_entropy(v, t), xg, use_reentrant=False)
    assert type(checkpointed.grad_fn).__name__ != "_ReducedCrossEntropyFunctionBackward"
    (dx,) = torch.autograd.grad(checkpointed, xg)
    assert_same_bits(dx, torch.autograd.grad(treefold.cross_entropy(xg, t), xg)[0], "checkpointed")


@triton.jit
def _no_wait(arrivals_ptr, row, arrived, expected):
    """``combine.wait_for_arrivals`` that waits for no one (``test_cooperative_rows_shared_...``)."""
    tl.static_assert(True)


@pytest.mark.skipif(not backend.INTERPRETED, reason="the interpreter's stand-in for programs that run at once")
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("n", [5120, 9000, 40000])
def test_cooperative_rows_shared_by_several_programs(n, smoothing, monkeypatch):
    # Compiled, the programs of a "cooperative" row run at once and wait for one another; the
    # interpreter runs them one after another. Its stand-in: no wait, and the launch run twice,
    # so that the second run's programs merge every partial of the row (the first run's).
    from treefold.kernels import softmax as kernels
    real = ops._KERNEL

    def twice(grid, *args, **kwargs):
        real(grid, *args, **kwargs)
        if kwargs.get("PHASE") == kernels.COOPERATIVE.value:
            real(grid, *args, **kwargs)

    monkeypatch.setattr(kernels, "wait_for_arrivals", _no_wait)
    monkeypatch.setattr(ops, "_KERNEL", twice)
    x = _logits((3, n), torch.bfloat16, seed=43)
    t = torch.tensor([IGNORE, n - 1, min(n - 1, 2 * 4096 + 5)], device=DEVICE)  # targets in later shares
    expected = torch.tensor(0.25, device=DEVICE)
    loss, stats = ops.cross_entropy_forward(x, t, IGNORE, smoothing)
    want = ops.cross_entropy_backward(expected.expand(3), x, t, stats, IGNORE, smoothing)
    for spp in (1, 2):
        p = ops.plan(ops._SOFTMAX, False, n, 3, 4, 2, "cooperative", ops.Tuning(segments_per_program=spp), "softmax",
                     False, True)
        if p.phases[0].programs_per_row == 1:
            assert spp > 1
            continue  # (n = 5120: two segments)
        got_loss, got_stats, dx = (torch.full((3,), float("nan")), torch.full((2, 3), float("nan")),
                                   torch.full_like(x, float("nan")))
        row_sum = ops._reduce.tree_sum_rows(x, out_dtype=torch.float32) if smoothing else None
        ops._launch(p, x, expected, dx, got_stats, 3, n, n, 0, n, 1.0,
                    targets=ops._Targets(t, got_loss, row_sum, IGNORE, smoothing, fused=True))
        for name, a, b in zip(("loss", "stats", "dx"), (got_loss, got_stats, dx), (loss, stats, want)):
            assert_same_bits(a, b, f"{name} n={n} {spp} segments per program")


@needs_kernel
def test_fused_forward_on_no_counted_row_and_on_no_row():
    x = _logits((3, 10), seed=40).requires_grad_()
    t = torch.full((3,), IGNORE, device=DEVICE)
    loss = treefold.cross_entropy(x, t)
    (dx,) = torch.autograd.grad(loss, x)
    assert torch.isnan(loss).item() and bool((dx == 0).all())
    empty = x[:0].detach().requires_grad_()
    loss = treefold.cross_entropy(empty, t[:0], reduction="sum")
    assert loss.item() == 0.0 and torch.autograd.grad(loss, empty)[0].shape == (0, 10)


@needs_kernel
def test_a_row_gives_the_same_bits_in_any_batch_and_position():
    x = _logits((7, 5120), torch.bfloat16, seed=10)
    t = _targets(7, 5120, seed=11)
    g = _logits((7,), seed=12)
    xg = x.clone().requires_grad_()
    batch = treefold.cross_entropy(xg, t, reduction="none", label_smoothing=0.1)
    (dx,) = torch.autograd.grad(batch, xg, g)
    for i in (0, 3, 6):
        xi = x[i:i + 1].clone().requires_grad_()
        alone = treefold.cross_entropy(xi, t[i:i + 1], reduction="none", label_smoothing=0.1)
        assert_same_bits(alone, batch[i:i + 1].detach(), f"row {i}")
        assert_same_bits(torch.autograd.grad(alone, xi, g[i:i + 1])[0], dx[i:i + 1], f"row {i} dx")


# ---- shapes and layouts -----------------------------------------------------------------------

@needs_kernel
def test_strided_rows_are_read_in_place_and_one_dimensional_logits_work():
    wide = _logits((5, 80), seed=13)
    x = wide[:, :33]
    assert not x.is_contiguous()
    t = _targets(5, 33, seed=14)
    assert_same_bits(treefold.cross_entropy(x, t, reduction="none", label_smoothing=0.2),
                     treefold.cross_entropy(x.contiguous(), t, reduction="none", label_smoothing=0.2), "strided")
    # the backward reads the strided rows in place too
    leaf = wide.clone().requires_grad_()
    (dx,) = torch.autograd.grad(treefold.cross_entropy(leaf[:, :33], t, label_smoothing=0.2), leaf)
    contiguous = x.contiguous().requires_grad_()
    (want,) = torch.autograd.grad(treefold.cross_entropy(contiguous, t, label_smoothing=0.2), contiguous)
    assert_same_bits(dx[:, :33], want, "strided backward")
    assert bool((dx[:, 33:] == 0).all())
    one = treefold.cross_entropy(wide[2], t[2])
    assert one.shape == () and one.item() == treefold.cross_entropy(wide[2:3], t[2:3], reduction="none")[0].item()
    assert treefold.cross_entropy(wide[2], t[2], reduction="none").shape == ()


# ---- non-finite logits and bad targets -------------------------------------------------------

@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_finite_rows_stay_in_their_row(dtype):
    inf, nan = float("inf"), float("nan")
    x = _logits((6, 40), dtype, seed=15)
    t = _targets(6, 40, seed=16)
    x[0, 7] = nan
    x[1, 3] = inf
    x[2] = -inf
    x[3, t[3]] = -inf  # the target masked: the loss is +inf, the gradient finite
    x[4, (t[4] + 1) % 40] = -inf  # another token masked: finite throughout
    t[5] = IGNORE
    x[5, 0] = nan  # an ignored row's loss is 0 whatever it holds
    xg = x.clone().requires_grad_()
    loss = treefold.cross_entropy(xg, t, reduction="none")
    want, _ = _torch64(x, t, None, reduction="none")
    assert compare(loss, want.float()).ok, (loss, want)
    (dx,) = torch.autograd.grad(loss[:5], xg, torch.ones(5, device=DEVICE))
    assert bool(torch.isnan(dx[:3]).all())
    assert bool(torch.isfinite(dx[3:5]).all())
    assert dx[3, t[3]].item() == -1.0 and bool((dx[4, (t[4] + 1) % 40] == 0).all())


def test_a_target_out_of_range_is_named_on_the_host():
    x = torch.zeros(3, 10)
    for bad in (10, -1, -101):
        with pytest.raises(ValueError, match=rf"cross_entropy: target\[1\] = {bad} is not a class index in \[0, 10\) "
                                             rf"nor ignore_index=-100"):
            treefold.cross_entropy(x, torch.tensor([0, bad, 3]))


@needs_kernel
def test_the_kernels_give_a_target_out_of_range_nan_without_reading_it():
    # the GPU path does not check targets on the host (that would wait for the device): the
    # kernel reads nothing at the bad index, and that row's loss and gradient are NaN
    x = _logits((4, 50), seed=17)
    t = torch.tensor([3, 50, -7, 1], device=DEVICE)
    for smoothing in (0.0, 0.1):
        loss, stats = ops.cross_entropy_forward(x, t, IGNORE, smoothing)
        good = ops.cross_entropy_forward(x[[0, 3]], t[[0, 3]], IGNORE, smoothing)[0]
        assert bool(torch.isnan(loss[1:3]).all())
        assert_same_bits(loss[[0, 3]], good, "rows with good targets")
        dx = ops.cross_entropy_backward(torch.ones(4, device=DEVICE), x, t, stats, IGNORE, smoothing)
        assert bool(torch.isnan(dx[1:3]).all()) and bool(torch.isfinite(dx[[0, 3]]).all())


@needs_kernel
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_int32_targets_and_other_ignore_indices(reduction):
    x = _logits((4, 20), seed=18)
    t = torch.tensor([1, 0, 19, 5], device=DEVICE)
    # 0 inside the classes; 2^32, which an int32 comparison would wrap to 0
    for ignore, ignored in ((0, 1), (1 << 32, None)):
        got = treefold.cross_entropy(x, t.int(), ignore_index=ignore, reduction=reduction)
        want = F.cross_entropy(x.double(), t, ignore_index=ignore, reduction=reduction)
        assert compare(got, want.float()).ok, (ignore, got, want)
        if reduction == "none" and ignored is not None:
            assert got[ignored].item() == 0.0


@pytest.mark.parametrize("call, error, message", [
    (lambda: treefold.cross_entropy([[1.0]], torch.tensor([0])), TypeError,
     "cross_entropy: logits must be a torch.Tensor, got list"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3, dtype=torch.float64), torch.tensor([0, 1])), TypeError,
     "cross_entropy: logits has dtype float64, expected one of float32, bfloat16, float16"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.ones(2, 3)), TypeError,
     "cross_entropy: target has dtype float32; class probabilities are not supported"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1], dtype=torch.int16)), TypeError,
     "cross_entropy: target has dtype int16, expected one of int64, int32"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), [0, 1]), TypeError,
     "cross_entropy: target must be a torch.Tensor, got list"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1, 2])), ValueError,
     r"cross_entropy: target has shape \(3,\), expected \(2,\) \(logits.shape\[:-1\]\)"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3, 4), torch.zeros(2, 4, dtype=torch.int64)), ValueError,
     r"cross_entropy: logits must be \[batch, classes\] or \[classes\], got shape \(2, 3, 4\)"),
    (lambda: treefold.cross_entropy(torch.ones(2, 0), torch.zeros(2, dtype=torch.int64)), ValueError,
     "cross_entropy: logits has 0 classes"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1]), reduction="avg"), ValueError,
     "cross_entropy: reduction='avg' is not one of 'mean', 'sum', 'none'"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1]), reduction=None), TypeError,
     "cross_entropy: reduction must be a str, got NoneType"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1]), ignore_index=1.0), TypeError,
     "cross_entropy: ignore_index must be an int, got float"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1]), ignore_index=True), TypeError,
     "cross_entropy: ignore_index must be an int, got bool"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1]), label_smoothing=1.5), ValueError,
     "cross_entropy: label_smoothing must be <= 1.0, got 1.5"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1]), label_smoothing=-0.1), ValueError,
     "cross_entropy: label_smoothing must be >= 0.0, got -0.1"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1]), label_smoothing=float("nan")),
     ValueError, "cross_entropy: label_smoothing must be finite, got nan"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3, device="meta"), torch.tensor([0, 1])), ValueError,
     "cross_entropy: logits is on meta; treefold runs on cuda and cpu tensors"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1], device="meta")), ValueError,
     "cross_entropy: target is on meta"),
    (lambda: treefold.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1]), torch.ones(3)), TypeError,
     "positional argument"),
    (lambda: treefold.cross_entropy(torch.ones(5), torch.tensor(7)), ValueError,
     r"cross_entropy: target = 7 is not a class index in \[0, 5\) nor ignore_index=-100"),
    (lambda: treefold.nn.CrossEntropyLoss(reduction="max"), ValueError,
     "CrossEntropyLoss: reduction='max' is not one of 'mean', 'sum', 'none'"),
    (lambda: treefold.nn.CrossEntropyLoss(label_smoothing="0.1"), TypeError,
     "CrossEntropyLoss: label_smoothing must be a number, got str"),
    (lambda: treefold.nn.CrossEntropyLoss(torch.ones(3)), TypeError, "positional argument"),
])
def test_bad_inputs_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


# ---- autograd, torch.compile, the module --------------------------------------------------

@needs_kernel
def test_second_derivatives_are_torchs():
    # a gradient penalty: the backward recorded with create_graph runs torch's operations
    x = _logits((3, 40), seed=19).requires_grad_()
    t = _targets(3, 40, seed=20, ignored=(1,))
    x64 = x.detach().double().requires_grad_()
    for a, f in ((x, lambda v: treefold.cross_entropy(v, t, label_smoothing=0.1)),
                 (x64, lambda v: F.cross_entropy(v, t, ignore_index=IGNORE, label_smoothing=0.1))):
        (g,) = torch.autograd.grad(f(a), a, create_graph=True)
        (a.hess,) = torch.autograd.grad(g.pow(2).sum(), a)
    assert compare(x.hess, x64.hess.float()).ok


@pytest.fixture(params=["kernel", "reference"])
def path_device(request, monkeypatch):
    """The device for each path of the registered ops: the kernels (on DEVICE; skipped without
    the interpreter or a GPU) and the reference (CPU tensors, the kernels switched off)."""
    if request.param == "reference":
        monkeypatch.setattr(backend, "use_kernel", lambda t: False)
        return "cpu"
    if not (backend.INTERPRETED or DEVICE == "cuda"):
        pytest.skip("needs TRITON_INTERPRET=1 (or a GPU) to run the kernels")
    return DEVICE


def test_torch_compile_fullgraph(path_device):
    compiler = "inductor" if (shutil.which("g++") or shutil.which("c++")) else "aot_eager"
    x = _logits((6, 33), seed=21).to(path_device).requires_grad_()
    t = _targets(6, 33, seed=22, ignored=(4,)).to(path_device)

    def f(a, b):
        return (treefold.cross_entropy(a, b, reduction="none"),
                treefold.cross_entropy(a * 2.0, b, label_smoothing=0.1, reduction="sum"))

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend=compiler)(x, t)
    want = f(x, t)
    cot = (_logits((6,), seed=23).to(path_device), torch.tensor(0.5, device=path_device))
    for name, a, b in zip(("none", "sum"), got, want):
        assert_same_bits(a.detach(), b.detach(), f"{compiler} {name}")
    assert_same_bits(torch.autograd.grad(got[0], x, cot[0])[0], torch.autograd.grad(want[0], x, cot[0])[0],
                     f"{compiler} backward")


def test_torch_compile_with_a_label_smoothing_that_changes(path_device):
    # a float that changed between calls is traced as a symbolic float after the first recompile
    x = _logits((4, 33), seed=34).to(path_device)
    t = _targets(4, 33, seed=35).to(path_device)

    def f(a, b, eps):
        return treefold.cross_entropy(a, b, label_smoothing=eps, reduction="none")

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for eps in (0.1, 0.2, 0.3):
        assert_same_bits(compiled(x, t, eps), f(x, t, eps), f"label_smoothing {eps}")


def test_registered_ops_pass_opcheck(path_device):
    x = _logits((3, 40), seed=24).to(path_device).requires_grad_()
    t = _targets(3, 40, seed=25, ignored=(0,)).to(path_device)
    loss, stats = ops._cross_entropy_op(x.detach(), t, IGNORE, 0.1, "auto")
    g = _logits((3,), seed=26).to(path_device)
    t5 = torch.where(t == IGNORE, 5, t)  # (opcheck compares without equal NaNs: no bad target)
    for op, args in ((ops._cross_entropy_op, (x, t, IGNORE, 0.0, "auto")),
                     (ops._cross_entropy_op, (x, t5, 5, 0.25, "split")),
                     (ops._cross_entropy_backward_op, (g, x.detach(), t, stats, IGNORE, 0.1, "auto"))):
        results = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in results.values()), (op, results)


@needs_kernel
def test_eager_autograd_and_registered_op_give_the_same_bits():
    x = _logits((3, 300), torch.bfloat16, seed=27)
    t = _targets(3, 300, seed=28)
    g = _logits((3,), seed=29)
    grads = []
    for call in (lambda v: treefold.cross_entropy(v, t, reduction="none", label_smoothing=0.1),
                 lambda v: ops._cross_entropy_op(v, t, IGNORE, ops_smoothing(0.1), "auto")[0]):
        xg = x.clone().requires_grad_()
        loss = call(xg)
        loss.backward(g)
        grads.append((loss.detach(), xg.grad))
    assert_same_bits(grads[0][0], grads[1][0], "loss")
    assert_same_bits(grads[0][1], grads[1][1], "dx")


def ops_smoothing(eps):
    """eps as the float32 the public function hands the ops."""
    return float(torch.tensor(eps, dtype=torch.float32))


def test_module_is_the_function_with_torchs_options():
    m = treefold.nn.CrossEntropyLoss(ignore_index=2, reduction="sum", label_smoothing=0.05)
    assert "ignore_index=2, reduction='sum', label_smoothing=0.05" in repr(m)
    x = _logits((4, 9), seed=30)
    t = torch.tensor([2, 1, 8, 0], device=DEVICE)
    assert_same_bits(m(x, t), treefold.cross_entropy(x, t, ignore_index=2, reduction="sum", label_smoothing=0.05))
    ref = torch.nn.CrossEntropyLoss(ignore_index=2, reduction="sum", label_smoothing=0.05)
    assert compare(m(x, t), ref(x.double(), t).float()).ok


# ---- GPU tier ------------------------------------------------------------------------------

GPU_CASES = [(1, 151936, torch.bfloat16), (64, 151936, torch.float32), (1000, 4096, torch.bfloat16),
             (7, 32768, torch.bfloat16), (256, 128256, torch.bfloat16)]


@pytest.mark.gpu
@pytest.mark.parametrize("rows, n, dtype", GPU_CASES)
def test_gpu_strategies_and_batches_agree_bitwise(rows, n, dtype):
    x = _logits((rows, n), dtype, seed=rows + n)
    t = _targets(rows, n, seed=n, ignored=(0,) if rows > 1 else ())
    g = _logits((rows,), seed=rows)
    configs = [("auto", ops.Tuning()), ("online", ops.Tuning()), ("split", ops.Tuning()),
               ("cooperative", ops.Tuning()), ("cooperative", ops.Tuning(segments_per_program=1))]
    if ops._tile_elements(n) <= ops.REGISTER_ELEMENTS:
        configs.append(("block", ops.Tuning()))
    for smoothing in (0.0, 0.1):
        outs = []
        for strategy, tuning in configs:
            loss, stats = ops.cross_entropy_forward(x, t, IGNORE, smoothing, strategy=strategy, tuning=tuning)
            outs.append((loss, stats, ops.cross_entropy_backward(g, x, t, stats, IGNORE, smoothing, strategy=strategy,
                                                                 tuning=tuning)))
        for (strategy, tuning), got in zip(configs, outs):
            for name, a, b in zip(("loss", "stats", "dx"), got, outs[0]):
                assert_same_bits(a, b, f"{name} {rows}x{n} {strategy} {tuning} eps={smoothing}")
        for b in (1, 7):
            alone = ops.cross_entropy_forward(x[-b:], t[-b:], IGNORE, smoothing)[0]
            assert_same_bits(alone, outs[0][0][-b:], f"last {b} rows alone")
        want, want_dx = _torch64(x, t, g, reduction="none", label_smoothing=smoothing)
        assert compare(outs[0][0], want.float()).ok
        assert compare(outs[0][2], want_dx.to(dtype)).ok
        # the forward that writes dx (the softmax forward's launches), for one dloss on every row
        one = torch.tensor(0.5, device=DEVICE)
        plain = ops.cross_entropy_backward(one.expand(rows), x, t, outs[0][1], IGNORE, smoothing)
        for strategy, tuning in configs:
            got = ops.cross_entropy_forward(x, t, IGNORE, smoothing, dloss=one, strategy=strategy, tuning=tuning)
            for name, a, b in zip(("loss", "stats", "dx"), got, (outs[0][0], outs[0][1], plain)):
                assert_same_bits(a, b, f"fused {name} {rows}x{n} {strategy} {tuning} eps={smoothing}")
            resumed = ops.cross_entropy_backward(one.clone(), x, t, got[1], IGNORE, smoothing, written=(got[2], one))
            assert_same_bits(resumed, plain, f"backward into the dx written {rows}x{n} {strategy} {tuning}")


@pytest.mark.gpu
def test_gpu_training_step_inside_cuda_graph_capture_and_compiled():
    x = _logits((512, 128256), torch.bfloat16, seed=31)
    t = _targets(512, 128256, seed=32, ignored=(3, 100))

    def step():
        xg = x.detach().requires_grad_()
        loss = treefold.cross_entropy(xg, t, label_smoothing=0.1)
        return loss.detach(), torch.autograd.grad(loss, xg)[0]

    first = step()
    for _ in range(2):
        for a, b in zip(step(), first):
            assert_same_bits(a, b, "run to run")
    static = [torch.empty_like(v) for v in first]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for out, v in zip(static, step()):
            out.copy_(v)
    x.copy_(_logits((512, 128256), torch.bfloat16, seed=33))
    graph.replay()
    torch.cuda.synchronize()
    for out, want, name in zip(static, step(), ("loss", "dx")):
        assert_same_bits(out, want, f"graph replay {name}")
    # compiled: the registered ops' two passes give the eager (fused) bits; "sum", since the mean's
    # division and the gradient's division by the count are Inductor's to compute (its division
    # gave a loss one ulp from eager's on an H100)
    def summed(a):
        return treefold.cross_entropy(a, t, label_smoothing=0.1, reduction="sum")

    xg = x.detach().requires_grad_()
    torch._dynamo.reset()
    loss = torch.compile(summed, fullgraph=True)(xg)
    eager = summed(xg)
    assert_same_bits(loss.detach(), eager.detach(), "compiled loss")
    assert_same_bits(torch.autograd.grad(loss, xg)[0], torch.autograd.grad(eager, xg)[0], "compiled dx")
