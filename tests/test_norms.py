"""RMSNorm and LayerNorm: bits against the NumPy reference, accuracy against float64 and against
Hugging Face's code, autograd, the nn modules, torch.compile, and argument errors.

CPU tier: the Triton kernels through the interpreter (TRITON_INTERPRET=1), small shapes; on a
machine with a GPU the same tests run the compiled kernels on ``DEVICE``.
GPU tier (``gpu`` marker): the compiled kernels, bigger shapes, invariance across launches.
"""
import copy

import numpy as np
import pytest
import torch

import treefold
import treefold.nn as tnn
from treefold import order
from treefold._ops import norms as ops
from treefold.backend import INTERPRETED, use_kernel
from treefold.reference import norms as ref

from conftest import DEVICE

LENGTHS_CPU = [1, 33, 4095, 5120, 14336]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
CASTINGS = ["llama", "gemma", "none"]

# Accuracy against float64, relative to each element: at most two roundings to the output
# format (the "llama" casting rounds the normalised row, then the product with the weight), each
# within the unit roundoff u (2^-8 bfloat16, 2^-11 float16, 2^-24 float32), plus the float32
# statistics (< 1e-6 relative at these lengths).
TOL = {torch.float32: 4e-6, torch.bfloat16: 2.0 ** -7 + 1e-5, torch.float16: 2.0 ** -10 + 1e-5}
# Values near zero in LayerNorm come from x - mean, whose error is relative to the row's scale,
# not to the value: the bound gets this fraction of the largest magnitude as an absolute floor.
ABS_FLOOR = 1e-2
# Gradients: one rounding of each result to its format (u as above), plus float32 sums whose
# cancellation (g - n * mean(g * n)) makes the error relative to the largest gradient, not to
# each element; the bound is twice the unit roundoff of the largest gradient.
TOL_GRAD = {torch.float32: 2e-5, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}


def kernel_or_skip(t):
    if not use_kernel(t):
        pytest.skip("runs the kernel: needs TRITON_INTERPRET=1 (CPU) or a GPU")


def randn(shape, dtype=torch.float32, seed=0, scale=1.0, device=DEVICE):
    """Normal values, never exactly zero, rounded to dtype."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    x = torch.where(x == 0, torch.full_like(x, 0.5), x)
    return x.to(dtype).to(device)


def weight_like(n, dtype, seed=1, device=DEVICE):
    return (1.0 + 0.25 * randn(n, torch.float64, seed)).to(dtype).to(device)


def assert_bits(got, want):
    """Same dtype, shape and bits (any NaN equals any NaN: payloads differ between CPU and GPU)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    got, want = got.detach().cpu(), want.detach().cpu()
    int_type = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    same = (got.view(int_type) == want.view(int_type)) | (torch.isnan(got) & torch.isnan(want))
    assert bool(same.all()), f"{int((~same).sum())} of {same.numel()} elements differ"


def assert_close(got, want64, dtype, floor=ABS_FLOOR):
    want64 = want64.detach().cpu()
    err = (got.detach().cpu().double() - want64).abs()
    bound = TOL[dtype] * (want64.abs() + floor * want64.abs().max())
    bad = err > bound
    assert not bool(bad.any()), f"{int(bad.sum())} elements off; worst error {err.max().item():.3g}"


def assert_grad_close(got, want64, dtype):
    want64 = want64.detach().cpu()
    err = (got.detach().cpu().double() - want64).abs().max().item()
    scale = want64.abs().max().item()
    assert err <= TOL_GRAD[dtype] * scale + 1e-30, f"error {err:.3g} vs scale {scale:.3g}"


# --------------------------------------------------------------------------------------------
# The models' own code (a few lines each, written out; transformers is not imported)
# --------------------------------------------------------------------------------------------

def hf_llama_rms_norm(hidden_states, weight, eps):
    """LlamaRMSNorm.forward (also Mistral, Qwen2, Qwen3, Phi-3, DeepSeek-V3)."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def hf_gemma_rms_norm(x, weight, eps):
    """GemmaRMSNorm.forward (Gemma, Gemma 2, Gemma 3): weight stored without the 1."""
    output = x.float()
    output = output * torch.rsqrt(output.pow(2).mean(-1, keepdim=True) + eps)
    output = output * (1.0 + weight.float())
    return output.type_as(x)


def hf_t5_layer_norm(hidden_states, weight, eps):
    """T5LayerNorm.forward (also mT5, UMT5, LongT5, Pix2Struct): a float32 weight's product unrounded."""
    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    if weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(weight.dtype)
    return weight * hidden_states


def vllm_fused_add_rms_norm(x, residual, weight, eps):
    """The serving engines' in-place semantics, written out of place."""
    residual = x + residual
    h = residual.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h.to(x.dtype) * weight, residual


# --------------------------------------------------------------------------------------------
# float64 references (the same functions in float64; the "llama" rounding kept where it happens)
# --------------------------------------------------------------------------------------------

def rms_norm64(x, weight, eps, residual=None, offset=0.0):
    """float64 RMSNorm of the row the kernel normalises (h is rounded to the residual's dtype)."""
    v = x.double() if residual is None else (x.double() + residual.double()).to(residual.dtype).double()
    n = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    return n if weight is None else n * (offset + weight.double())


def straight_through(v64, dtype):
    """``v64`` rounded to ``dtype`` in value, with the gradient of ``v64`` (a cast's gradient)."""
    return v64 + (v64.detach().to(dtype).double() - v64.detach())


def layer_norm64(x, weight, bias, eps):
    return torch.nn.functional.layer_norm(x.double(), x.shape[-1:], None if weight is None else weight.double(),
                                          None if bias is None else bias.double(), eps)


# --------------------------------------------------------------------------------------------
# CPU tier: bits against the reference
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", LENGTHS_CPU)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("casting", CASTINGS)
def test_rms_norm_matches_reference_bits(n, dtype, casting):
    x = randn((5, n), dtype, seed=n)
    kernel_or_skip(x)
    w = weight_like(n, dtype)
    r = randn((5, n), dtype, seed=n + 1, scale=2.0)
    want, _, _ = ref.rms_norm(x, w, 1e-6, casting=casting)
    assert_bits(treefold.rms_norm(x, w, casting=casting), want)
    y, h = treefold.rms_norm(x, w, 1e-5, residual=r, offset=1.0, casting=casting)
    want_y, want_h, _ = ref.rms_norm(x, w, 1e-5, r, 1.0, casting)
    assert_bits(y, want_y)
    assert_bits(h, want_h)
    want, _, _ = ref.rms_norm(x, None, 1e-6, casting=casting)
    assert_bits(treefold.rms_norm(x, casting=casting), want)


@pytest.mark.parametrize("n", LENGTHS_CPU)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_matches_reference_bits(n, dtype):
    x = randn((5, n), dtype, seed=n, scale=3.0) + 0.5
    kernel_or_skip(x)
    w, b = weight_like(n, dtype), randn(n, dtype, seed=7)
    want, _, _ = ref.layer_norm(x, w, b, 1e-5)
    assert_bits(treefold.layer_norm(x, n, w, b), want)
    want, _, _ = ref.layer_norm(x, None, None, 1e-5)
    assert_bits(treefold.layer_norm(x, (n,)), want)


def test_group_width_is_part_of_the_order():
    """The bitwise tests have teeth: the statistics group lanes by the input dtype's vector."""
    n = 4096
    base = randn((16, n), torch.float64, seed=3) * torch.logspace(-6, 6, n, dtype=torch.float64, device=DEVICE)
    x = base.to(torch.bfloat16)
    v = x.float().cpu().numpy()
    by_bf16 = order.reference_sum(v * v, dtype=torch.bfloat16)
    by_fp32 = order.reference_sum(v * v, dtype=torch.float32)
    assert by_bf16.tobytes() != by_fp32.tobytes()
    if use_kernel(x):
        _, _, rstd = ops.rms_norm_impl(x, None, None, 0.0, 0.0, "llama", torch.bfloat16)
        want = (np.float32(1) / np.sqrt(by_bf16 / np.float32(n))).astype(np.float32)
        assert rstd.cpu().numpy().tobytes() == want.tobytes()


def test_a_quotient_by_a_power_of_two_is_the_product_by_its_inverse():
    """The kernels' means over rows of a power-of-two length multiply by 1/N (N_POW2) instead of
    dividing: the same correctly rounded float32 for every total, subnormal quotients included."""
    rng = np.random.default_rng(0)
    totals = np.concatenate([
        rng.standard_normal(20000) * np.float64(10.0) ** rng.uniform(-45, 38, 20000),
        np.array([0.0, -0.0, np.inf, -np.inf, 1.4e-45, 3e-38, 1.17549435e-38, 3.4028235e38]),
    ]).astype(np.float32)
    with np.errstate(over="ignore", under="ignore"):
        for log2_n in range(0, 21):
            n = np.float32(2.0 ** log2_n)
            assert (totals * (np.float32(1.0) / n)).tobytes() == (totals / n).tobytes(), n

    def plan(n, dtype=torch.float32, is_rms=True):
        return ops._forward_plan(n, dtype, is_rms, False, True, not is_rms, False, True, False, None, None)[2]
    assert plan(4096)["N_POW2"] and plan(1)["N_POW2"] and not plan(4095)["N_POW2"] and not plan(5120)["N_POW2"]
    # float16 RMSNorm lets products fuse into FMAs: a fused mean + eps would round once
    assert plan(4096, torch.float16)["N_POW2"] is False
    assert plan(4096, torch.float16, is_rms=False)["N_POW2"]
    assert ops._backward_plan(64, 8192, torch.bfloat16, True, False, True, False, True, False, True, False, 8,
                              None, None)["N_POW2"]


@pytest.mark.parametrize("n", [2, 256])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 1e-21])
def test_power_of_two_rows_match_reference_bits(n, dtype, scale):
    """Rows whose means are products by 1/N, forward and backward, against the reference's
    divisions; at a scale of 1e-21 (eps 0) the float32 statistics of float32 rows are subnormal."""
    if dtype == torch.float16 and scale < 1:
        pytest.skip("float16 holds no 1e-21")
    rms_eps, ln_eps = (0.0, 0.0) if scale < 1 else (1e-6, 1e-5)
    x = (randn((6, n), torch.float64, seed=n, scale=scale) + (2 * scale if scale < 1 else 0.5)).to(dtype)
    kernel_or_skip(x)
    x.requires_grad_()
    w, b = weight_like(n, dtype).requires_grad_(), randn(n, dtype, seed=5).requires_grad_()
    y = treefold.rms_norm(x, w, rms_eps)
    want_y, _, rstd = ref.rms_norm(x, w, rms_eps)
    assert_bits(y, want_y)
    dy = randn(y.shape, dtype, seed=9)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    want_dx, _, want_dw = ref.rms_norm_backward(dy, x, w, rstd, x_dtype=dtype)
    assert_bits(dx, want_dx)
    assert_bits(dw, want_dw)
    y = treefold.layer_norm(x, n, w, b, ln_eps)
    want_y, mean, rstd = ref.layer_norm(x, w, b, ln_eps)
    assert_bits(y, want_y)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    want_dx, want_dw, want_db = ref.layer_norm_backward(dy, x, w, mean, rstd, bias_dtype=dtype)
    assert_bits(dx, want_dx)
    assert_bits(dw, want_dw)
    assert_bits(db, want_db)


@pytest.mark.parametrize("n", [1, 33, 4095, 5120, 14336])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("casting", CASTINGS)
@pytest.mark.parametrize("residual_dtype", ["same", torch.float32])
def test_rms_norm_backward_matches_reference_bits(n, dtype, casting, residual_dtype):
    residual_dtype = dtype if residual_dtype == "same" else residual_dtype  # float32: a wide stream
    x = randn((6, n), dtype, seed=n).requires_grad_()
    kernel_or_skip(x)
    w = weight_like(n, dtype).requires_grad_()
    r = randn((6, n), residual_dtype, seed=n + 2).requires_grad_()
    y, h = treefold.rms_norm(x, w, residual=r, offset=0.5, casting=casting, out_dtype=dtype)
    dy, dh = randn(y.shape, dtype, seed=11), randn(h.shape, residual_dtype, seed=12)
    dx, dw, dr = torch.autograd.grad((y, h), (x, w, r), (dy, dh))
    _, want_h, rstd = ref.rms_norm(x, w, 1e-6, r, 0.5, casting, dtype)
    want_dx, want_dr, want_dw = ref.rms_norm_backward(dy, want_h, w, rstd, offset=0.5, casting=casting,
                                                      dh_out=dh, x_dtype=dtype, residual_dtype=residual_dtype)
    assert_bits(dx, want_dx)
    assert_bits(dr, want_dr)
    assert_bits(dw, want_dw)


@pytest.mark.parametrize("residual", [False, True])
def test_eager_autograd_equals_the_registered_ops_bit_for_bit(residual):
    # eager calls that need a gradient take plain autograd Functions (no dispatcher); the
    # registered ops (what torch.compile sees) must give the same outputs and gradients, and a
    # gradient of a gradient is taken on both paths (test_second_derivatives_are_torchs: its values)
    x = randn((5, 300), torch.bfloat16, seed=31).requires_grad_()
    kernel_or_skip(x)
    w = torch.nn.Parameter(weight_like(300, torch.bfloat16))
    r = randn((5, 300), torch.float32, seed=32).requires_grad_() if residual else None
    b = randn(300, torch.bfloat16, seed=33).requires_grad_()
    dy = randn((5, 300), torch.bfloat16, seed=34)
    dh = randn((5, 300), torch.float32, seed=35)
    inputs = (x, w) + ((r,) if residual else ())

    def grads(outputs):
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return outputs, torch.autograd.grad(outputs, inputs, (dy, dh)[:len(outputs)])

    eager = treefold.rms_norm(x, w, residual=r, offset=0.25, casting="gemma")
    assert "RmsNormFunction" in type((eager[0] if residual else eager).grad_fn).__name__
    y_dtype = (eager[0] if residual else eager).dtype
    y, h, _ = torch.ops.treefold.rms_norm(x, w, r, 1e-6, 0.25, "gemma", y_dtype)
    for got, want in zip(grads(eager), grads((y, h) if residual else y)):
        for a, c in zip(got, want):
            assert_bits(a, c)
    ln = treefold.layer_norm(x, (300,), w, b)
    assert "LayerNormFunction" in type(ln.grad_fn).__name__
    want_ln = torch.ops.treefold.layer_norm(x, w, b, 1e-5)[0]
    got = torch.autograd.grad(ln, (x, w, b), dy)
    want = torch.autograd.grad(want_ln, (x, w, b), dy)
    assert_bits(ln, want_ln)
    for a, c in zip(got, want):
        assert_bits(a, c)
    for out in (treefold.rms_norm(x, w), treefold.layer_norm(x, (300,), w, b)):
        dyg = dy.clone().requires_grad_()
        (dx,) = torch.autograd.grad(out, x, dyg, create_graph=True)
        second = torch.autograd.grad(dx.float().pow(2).sum(), (x, dyg))
        assert all(torch.isfinite(t).all() and t.abs().sum() > 0 for t in second)


@pytest.mark.skipif(not INTERPRETED or torch.cuda.is_available(), reason="the interpreter stands in for the GPU here")
@pytest.mark.parametrize("residual_dtype", [None, torch.bfloat16, torch.float32])
def test_prepared_training_calls_through_the_interpreter(monkeypatch, poison_allocations, residual_dtype):
    # a training call's prepared launches, with Launcher.prepare standing in: the forward that
    # writes the statistics (through the eager autograd Function) and the backward's pipeline
    # (the kernel and the weight gradients' column sums), made by a first call and then taken by
    # calls with new tensors, give the ordinary path's bits in newly allocated outputs
    from conftest import InterpretedPrepared, prepare_through_the_interpreter
    prepare_through_the_interpreter(monkeypatch, ops)
    poison_allocations()
    shape, n = (2, 3, 40), 40
    x, w = randn(shape, torch.bfloat16, seed=61), weight_like(n, torch.bfloat16)
    r = None if residual_dtype is None else randn(shape, residual_dtype, seed=62)
    key = ops._prepared_key(True, x, r, w, None, 1e-6, 0.0, "llama", None, None, True)
    out_dtype = residual_dtype or torch.bfloat16
    ops.rms_norm_impl(x, w, r, 1e-6, 0.0, "llama", out_dtype, prepare_key=key)
    b = randn(n, torch.bfloat16, seed=63)
    ln_key = ops._prepared_key(False, x, None, w, b, 1e-5, 0.0, "", None, n, True)
    ops.layer_norm_impl(x, w, b, 1e-5, prepare_key=ln_key)
    for step in range(3):
        xs = (randn(shape, torch.bfloat16, seed=70 + step) * (step + 2)).requires_grad_()
        ws = weight_like(n, torch.bfloat16, seed=73 + step).requires_grad_()
        rs = None if r is None else randn(shape, residual_dtype, seed=76 + step).requires_grad_()
        dy, dh = randn(shape, out_dtype, seed=79 + step), randn(shape, out_dtype, seed=82 + step)
        want_y, want_h, rstd = ops.rms_norm_impl(xs.detach(), ws.detach(), None if rs is None else rs.detach(),
                                                 1e-6, 0.0, "llama", out_dtype)
        saved = xs.detach() if rs is None else want_h
        backward_args = (dy, None if rs is None else dh, saved, ws.detach(), rstd, 0.0, "llama", torch.bfloat16,
                         residual_dtype, True)
        want_grads = ops.rms_norm_backward_impl(*backward_args)
        launched = InterpretedPrepared.launched
        got = ops.RmsNormFunction.apply(xs, ws, rs, 1e-6, 0.0, "llama", None, ops._PREPARED[key], None)
        assert InterpretedPrepared.launched == launched + 1
        for a, c in zip(got if rs is not None else (got,), (want_y, want_h)):
            assert_bits(a, c)
        # the backward as the Function calls it on a GPU: prepared by the first call, taken after
        launched = InterpretedPrepared.launched
        got_grads = ops.rms_norm_backward_eager(*backward_args)
        assert InterpretedPrepared.launched == launched + (0 if step == 0 else 2)
        for a, c in zip(got_grads, want_grads):
            assert (a is None) == (c is None)
            if a is not None:
                assert_bits(a, c)
        y_ln = ops.LayerNormFunction.apply(xs, ws, b, 1e-5, ops._PREPARED[ln_key], None)
        want_ln, mean, rstd = ops.layer_norm_impl(xs.detach(), ws.detach(), b, 1e-5)
        assert_bits(y_ln, want_ln)
        ln_args = (dy.to(torch.bfloat16), xs.detach(), ws.detach(), mean, rstd, True, torch.bfloat16)
        want_ln_grads = ops.layer_norm_backward_impl(*ln_args)
        launched = InterpretedPrepared.launched
        for a, c in zip(ops.layer_norm_backward_eager(*ln_args), want_ln_grads):
            assert_bits(a, c)
        # the backward kernel, then dw's and db's column sums in one launch
        assert InterpretedPrepared.launched == launched + (0 if step == 0 else 2)
    assert sum(k[0] == "backward" for k in ops._PREPARED) == 2


@pytest.mark.parametrize("n", [1, 33, 4095, 5120, 14336])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_backward_matches_reference_bits(n, dtype):
    x = (randn((6, n), dtype, seed=n) + 2).requires_grad_()
    kernel_or_skip(x)
    w, b = weight_like(n, dtype).requires_grad_(), randn(n, dtype, seed=5).requires_grad_()
    y = treefold.layer_norm(x, n, w, b)
    dy = randn(y.shape, dtype, seed=9)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    _, mean, rstd = ref.layer_norm(x, w, b, 1e-5)
    want_dx, want_dw, want_db = ref.layer_norm_backward(dy, x, w, mean, rstd, bias_dtype=dtype)
    assert_bits(dx, want_dx)
    assert_bits(dw, want_dw)
    assert_bits(db, want_db)


@pytest.mark.parametrize("shape", [(5, 4095), (260, 33)])
def test_every_output_is_written(shape, poison_allocations):
    """Outputs, gradients and the weight-gradient partials start as NaN (integers as a sentinel):
    every element the kernels owe is written and nothing is read before it is (260 rows: each
    backward block folds several rows). The results equal those of clean buffers, bit for bit."""
    m, n = shape
    x = randn(shape, torch.bfloat16, seed=41).requires_grad_()
    kernel_or_skip(x)
    w = weight_like(n, torch.bfloat16).requires_grad_()
    b = randn(n, torch.bfloat16, seed=42).requires_grad_()
    r = randn(shape, torch.float32, seed=43).requires_grad_()
    dy, dh = randn(shape, torch.bfloat16, seed=44), randn(shape, torch.float32, seed=45)

    def results():
        y, h = treefold.rms_norm(x, w, residual=r, casting="llama")
        plain = treefold.rms_norm(x.detach(), w.detach(), offset=1.0, casting="gemma")
        z = treefold.layer_norm(x, (n,), w, b)
        return ((y, h, plain, z) + torch.autograd.grad((y, h), (x, w, r), (dy, dh))
                + torch.autograd.grad(z, (x, w, b), dy))

    clean = results()
    poison_allocations()
    for got, want in zip(results(), clean):
        assert not torch.isnan(got).any()
        assert_bits(got, want)


def test_weight_gradient_over_many_blocks_matches_reference_bits():
    """More rows than blocks: each block folds several rows, the partials go through the tree."""
    m, n = 260, 33
    assert ref.weight_grad_rows_per_block(m, n) == 2
    x = randn((m, n), torch.float32, seed=1).requires_grad_()
    kernel_or_skip(x)
    w = weight_like(n, torch.float32).requires_grad_()
    dy = randn((m, n), torch.float32, seed=2)
    dw = torch.autograd.grad(treefold.rms_norm(x, w), w, dy)[0]
    _, _, rstd = ref.rms_norm(x, w, 1e-6)
    rstd = rstd.to(x.device)
    assert_bits(dw, ref.rms_norm_backward(dy, x, w, rstd)[2])
    # loading each block's next row ahead, in registers or through a pipeline, changes no bits
    for launch in (dict(prefetch=False, num_stages=1), dict(prefetch=True), dict(prefetch=False, num_stages=3)):
        got = ops.rms_norm_backward_impl(dy, None, x.detach(), w.detach(), rstd, 0.0, "llama", torch.float32,
                                         None, True, **launch)
        assert_bits(got[2], dw)
        want_ln = ref.layer_norm_backward(dy, x, w, *ref.layer_norm(x, w, w, 1e-5)[1:], bias_dtype=torch.float32)
        _, mean, rstd_ln = ops.layer_norm_impl(x.detach(), w.detach(), w.detach(), 1e-5)
        got_ln = ops.layer_norm_backward_impl(dy, x.detach(), w.detach(), mean, rstd_ln, True, torch.float32,
                                              **launch)
        for g, g_want in zip(got_ln, want_ln):
            assert_bits(g, g_want)
    # rows of 2049..8192 run a pipelined row loop by default: blocks of two rows, with a residual
    # stream whose gradient is stored in its own dtype, and LayerNorm's three gradients
    assert ops.backward_config(m, 2100)[2] == 3
    assert not ops._backward_plan(m, 2100, torch.bfloat16, True, False, True, False, True, False, True, False,
                                  ops.backward_config(m, 2100)[0], None, None)["PREFETCH"]
    x2 = randn((m, 2100), torch.bfloat16, seed=3).requires_grad_()
    w2 = weight_like(2100, torch.bfloat16).requires_grad_()
    r2 = randn((m, 2100), torch.float32, seed=4).requires_grad_()
    y2, h2 = treefold.rms_norm(x2, w2, residual=r2, offset=0.5)
    dy2, dh2 = randn(y2.shape, torch.bfloat16, seed=5), randn(h2.shape, torch.float32, seed=6)
    got = torch.autograd.grad((y2, h2), (x2, w2, r2), (dy2, dh2))
    _, want_h, rstd2 = ref.rms_norm(x2, w2, 1e-6, r2, 0.5, "llama", torch.bfloat16)
    want_dx, want_dr, want_dw = ref.rms_norm_backward(dy2, want_h, w2, rstd2, offset=0.5, dh_out=dh2,
                                                      x_dtype=torch.bfloat16, residual_dtype=torch.float32)
    for g, g_want in zip(got, (want_dx, want_dw, want_dr)):
        assert_bits(g, g_want)
    b2 = randn(2100, torch.bfloat16, seed=7).requires_grad_()
    got = torch.autograd.grad(treefold.layer_norm(x2, 2100, w2, b2), (x2, w2, b2), dy2)
    _, mean2, rstd_ln2 = ref.layer_norm(x2, w2, b2, 1e-5)
    for g, g_want in zip(got, ref.layer_norm_backward(dy2, x2, w2, mean2, rstd_ln2, bias_dtype=torch.bfloat16)):
        assert_bits(g, g_want)
    # a different block size is a different order: the rule, not the launch, fixes it
    dy, x, rstd, dw = (t.detach().cpu() for t in (dy, x, rstd, dw))
    other = ref.column_sum(dy.numpy() * (x.numpy() * rstd.numpy()[:, None]), 1)
    assert other.tobytes() != dw.numpy().tobytes()


def test_weight_gradient_of_rows_longer_than_4096_takes_at_most_132_blocks():
    """Rows longer than WIDE_ROW fold ceil(M / 132) rows per block, a count that need not be a
    power of two: 298 rows of 4097 make 99 blocks of three and a last block of one, and dx, dw and
    db keep the reference's bits, with each block's next row loaded ahead or not."""
    assert ref.weight_grad_rows_per_block(16384, 8192) == 125
    assert ref.weight_grad_rows_per_block(16384, 4096) == 64  # (rows of 4096: powers of two)
    assert ref.weight_grad_rows_per_block(100, 5120) == 1
    m, n = 298, ref.WIDE_ROW + 1
    assert ref.weight_grad_rows_per_block(m, n) == 3 and order.cdiv(m, 3) == 100
    x = randn((m, n), torch.float32, seed=11).requires_grad_()
    kernel_or_skip(x)
    w = weight_like(n, torch.float32).requires_grad_()
    b = randn(n, torch.float32, seed=12).requires_grad_()
    dy = randn((m, n), torch.float32, seed=13)
    got = torch.autograd.grad(treefold.rms_norm(x, w), (x, w), dy)
    _, _, rstd = ref.rms_norm(x, w, 1e-6)
    want = ref.rms_norm_backward(dy, x, w, rstd.to(x.device))
    assert_bits(got[0], want[0])
    assert_bits(got[1], want[2])
    ahead = ops.rms_norm_backward_impl(dy, None, x.detach(), w.detach(), rstd.to(x.device), 0.0, "llama",
                                       torch.float32, None, True, prefetch=True)
    assert_bits(ahead[0], want[0])
    assert_bits(ahead[2], want[2])
    got = torch.autograd.grad(treefold.layer_norm(x, n, w, b), (x, w, b), dy)
    _, mean, rstd_ln = ref.layer_norm(x, w, b, 1e-5)
    for g, g_want in zip(got, ref.layer_norm_backward(dy, x, w, mean, rstd_ln, bias_dtype=torch.float32)):
        assert_bits(g, g_want)


def test_backward_launches_chain_and_take_their_blocks(monkeypatch):
    """The launches of the norm backward, recorded instead of run, as compiled on a device with
    programmatic dependent launches (sm_90): the backward kernel releases the column sums, which
    wait for it; LayerNorm's dw and db take one launch of two grid columns; a block count that is
    not a power of two goes to the kernel at run time (BLOCK_ROWS 0), a power of two as a
    constant. Without dependent launches neither option is set."""
    launches = []
    monkeypatch.setattr(ops, "_run", lambda launcher, grid, args, kwargs, pending: launches.append(
        (launcher, grid, args, kwargs)))
    monkeypatch.setattr(ops.backend, "INTERPRETED", False)
    monkeypatch.setattr(ops.backend, "use_kernel", lambda t: True)
    bf16 = lambda *s: torch.empty(*s, dtype=torch.bfloat16)  # noqa: E731 (nothing runs)

    def backward_launches(dependent, m, n, layer_norm=False):
        monkeypatch.setattr(ops, "dependent_launch", lambda device_type, index: dependent)
        launches.clear()
        if layer_norm:
            ops.layer_norm_backward_impl(bf16(m, n), bf16(m, n), bf16(n), torch.zeros(m), torch.ones(m), True,
                                         torch.bfloat16)
        else:
            ops.rms_norm_backward_impl(bf16(m, n), None, bf16(m, n), bf16(n), torch.ones(m), 0.0, "llama",
                                       torch.bfloat16, None, True)
        return list(launches)

    try:
        (bk, b_grid, b_args, b_kw), (ck, c_grid, c_args, c_kw) = backward_launches(True, 1100, 8192)
        assert bk is ops._backward_kernel and ck is ops._column_sum_kernel
        assert b_grid == (123,) and b_args[11] == 9 and b_kw["BLOCK_ROWS"] == 0  # ceil(1100 / 132) = 9
        assert b_kw["RELEASE_DEPENDENTS"] and c_kw["WAIT_FOR_PRIOR"] and c_kw["launch_pdl"]
        assert c_grid[1] == 1 and c_args[0] is c_args[2]
        (_, _, b_args, b_kw), (_, c_grid, c_args, _) = backward_launches(True, 1024, 4096, layer_norm=True)
        assert b_args[11] == 4 and b_kw["BLOCK_ROWS"] == 4 and c_grid[1] == 2
        assert c_args[0] is not c_args[2] and c_args[1].shape == c_args[3].shape == (4096,)
        (_, _, _, b_kw), (_, _, _, c_kw) = backward_launches(False, 1100, 8192)
        assert not b_kw["RELEASE_DEPENDENTS"] and "WAIT_FOR_PRIOR" not in c_kw and "launch_pdl" not in c_kw
    finally:
        # plans made for the compiled path must not serve the interpreted tests after this one
        ops._backward_plan.cache_clear()
        ops._column_sum_plan.cache_clear()


# --------------------------------------------------------------------------------------------
# CPU tier: accuracy against float64 and against Hugging Face's code
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", LENGTHS_CPU)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("casting", CASTINGS)
def test_rms_norm_close_to_float64(n, dtype, casting):
    x, w = randn((3, n), dtype, seed=n, scale=5.0), weight_like(n, dtype)
    assert_close(treefold.rms_norm(x, w, casting=casting), rms_norm64(x, w, 1e-6), dtype)
    r = randn((3, n), dtype, seed=n + 1)
    y, h = treefold.rms_norm(x, w, residual=r, offset=1.0, casting=casting)
    assert_close(y, rms_norm64(x, w, 1e-6, residual=r, offset=1.0), dtype)
    assert_close(h, x.double() + r.double(), dtype, floor=0.0)


@pytest.mark.parametrize("n", LENGTHS_CPU)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_close_to_float64(n, dtype):
    x = randn((3, n), dtype, seed=n, scale=2.0) - 1.5
    w, b = weight_like(n, dtype), randn(n, dtype, seed=3)
    assert_close(treefold.layer_norm(x, n, w, b), layer_norm64(x, w, b, 1e-5), dtype)


@pytest.mark.parametrize("n", [1, 33, 4095])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_close_to_float64(n, dtype):
    x = randn((4, n), dtype, seed=n, scale=3.0).requires_grad_()
    w = weight_like(n, dtype).requires_grad_()
    r = randn((4, n), dtype, seed=n + 3).requires_grad_()
    y, h = treefold.rms_norm(x, w, residual=r)
    dy, dh = randn(y.shape, dtype, seed=4), randn(h.shape, dtype, seed=5)
    got = torch.autograd.grad((y, h), (x, w, r), (dy, dh))
    x64, w64, r64 = (t.detach().double().requires_grad_() for t in (x, w, r))
    v64 = straight_through(x64 + r64, dtype)  # h is rounded to the residual's dtype
    n64 = v64 * torch.rsqrt(v64.pow(2).mean(-1, keepdim=True) + 1e-6)
    # the llama casting rounds the normalised row before the weight: the weight sees those values
    n64 = straight_through(n64, dtype)
    want = torch.autograd.grad((n64 * w64, v64), (x64, w64, r64), (dy.double(), dh.double()))
    for g, g64 in zip(got, want):
        assert_grad_close(g, g64, dtype)

    b = randn(n, dtype, seed=6).requires_grad_()
    xd = x.detach().requires_grad_()
    got = torch.autograd.grad(treefold.layer_norm(xd, n, w, b), (xd, w, b), dy)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (xd, w, b))
    want = torch.autograd.grad(torch.nn.functional.layer_norm(x64, (n,), w64, b64, 1e-5), (x64, w64, b64),
                               dy.double())
    if n == 1:
        # x - mean is 0 in every row, so dx and dw are exactly 0; float64 leaves its
        # cancellation (1e-14), which no tolerance relative to them can take
        assert not bool(got[0].any()) and not bool(got[1].any())
        got, want = got[2:], want[2:]
    for g, g64 in zip(got, want):
        assert_grad_close(g, g64, dtype)


def ulp(t, dtype):
    """Spacing of ``dtype`` values at each element of ``t`` (float64)."""
    _, exponent = torch.frexp(t.double().abs())
    digits = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[dtype]
    return torch.pow(2.0, (exponent - digits).double())


def agreement(got, want, max_ulps=1):
    """Fraction of elements equal bit for bit; asserts the others are at most ``max_ulps`` apart."""
    assert got.dtype == want.dtype and got.shape == want.shape
    got, want = got.cpu(), want.cpu()
    same = got == want
    a, b = got[~same].double(), want[~same].double()
    apart = (a - b).abs() / torch.maximum(ulp(a, got.dtype), ulp(b, got.dtype))
    assert bool((apart <= max_ulps).all()), f"a mismatch of {apart.max().item()} ulps (at most {max_ulps} allowed)"
    return same.double().mean().item()


def hf_llama_normalised(x, eps):
    """LlamaRMSNorm.forward up to the weight: the normalised row rounded to x's dtype."""
    h = x.to(torch.float32)
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def check_llama_agreement(x, w, eps=1e-6):
    """treefold's "llama" casting against LlamaRMSNorm, stage by stage.

    The statistics differ in their last float32 bits (another summation order; on the GPU also
    CUDA's approximate rsqrt), so the normalised row, rounded to bfloat16, lands one ulp from
    Hugging Face's in a few elements in 10^5. The weight then multiplies that rounded value once,
    in both codes: treefold's y is exactly ``w * normalised`` (asserted bit for bit), so every
    difference in y comes from the normalised row. One ulp of a normalised value times w is the
    weight's significand (1 to 2) times at most one ulp of the product, so the rounded products
    can be two ulps apart, never more, for any w that is not a power of two, whatever |w|. Measured on CPU at 4096 x 4096: 99.9996% of normalised values equal
    (the rest one ulp apart), 99.9997% of y equal, two elements two ulps apart.
    """
    normalised = treefold.rms_norm(x, None, eps)
    assert agreement(normalised, hf_llama_normalised(x, eps), max_ulps=1) >= 0.9999
    y = treefold.rms_norm(x, w, eps)
    assert_bits(y, w * normalised)
    assert agreement(y, hf_llama_rms_norm(x, w, eps), max_ulps=2) >= 0.9999
    return y


@pytest.mark.parametrize("n", [33, 4095, 4096, 5120])
def test_bf16_matches_hugging_face_llama_and_gemma(n):
    # at least 2^17 elements: the agreements below are fractions of 10^-4
    x = randn((max(64, (1 << 17) // n), n), torch.bfloat16, seed=21, scale=3.0)
    w = weight_like(n, torch.bfloat16)
    check_llama_agreement(x, w)
    wg = randn(n, torch.bfloat16, seed=22, scale=0.3)
    # one rounding at the end in both codes: the float32 statistics' last bits move y by one ulp at most
    got = treefold.rms_norm(x, wg, 1e-6, casting="gemma", offset=1.0)
    assert agreement(got, hf_gemma_rms_norm(x, wg, 1e-6)) >= 0.9999
    # torch's own functional: the "gemma" arithmetic with no offset
    got = treefold.rms_norm(x, w, 1e-6, casting="gemma")
    assert agreement(got, torch.nn.functional.rms_norm(x, (n,), w, 1e-6)) >= 0.9999


def test_none_casting_is_t5_layer_norm_with_a_float32_weight():
    # T5LayerNorm leaves a float32 weight's product unrounded (float32 out): "none". Its rsqrt and
    # its order of the two products against treefold's IEEE square root and division move the
    # last float32 bits (about 80% of elements equal on the CPU, at most 2 ulps apart; CUDA's
    # rsqrt is itself within 2 ulps, hence the bound of 8). With a 16-bit weight it rounds the
    # normalised row to the weight's dtype first: "llama" (check_llama_agreement's bound).
    x = randn((32, 4096), torch.bfloat16, seed=21, scale=3.0)
    w32 = weight_like(4096, torch.float32)
    got, want = treefold.rms_norm(x, w32, 1e-6, casting="none"), hf_t5_layer_norm(x, w32, 1e-6)
    assert got.dtype == want.dtype == torch.float32
    agreement(got, want, max_ulps=8)
    wb = weight_like(4096, torch.bfloat16)
    assert agreement(treefold.rms_norm(x, wb, 1e-6), hf_t5_layer_norm(x, wb, 1e-6), max_ulps=2) >= 0.9999


def test_fused_add_rms_norm_in_place_serving_semantics():
    n = 4096
    x = randn((8, n), torch.bfloat16, seed=1)
    r = randn((8, n), torch.bfloat16, seed=2, scale=4.0)
    w = weight_like(n, torch.bfloat16)
    want_y, want_h = treefold.rms_norm(x, w, 1e-6, residual=r)
    engine_y, engine_h = vllm_fused_add_rms_norm(x, r, w, 1e-6)
    x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
    assert treefold.fused_add_rms_norm_(x, r, w, 1e-6) is None
    assert x.data_ptr() == x_ptr and r.data_ptr() == r_ptr
    assert_bits(x, want_y)
    assert_bits(r, want_h)
    assert torch.equal(r, engine_h)
    assert agreement(x, engine_y, max_ulps=2) >= 0.9999  # the "llama" rounding (check_llama_agreement)


def test_fused_add_rms_norm_takes_flashinfers_enable_pdl():
    """FlashInfer's keyword: a programmatic dependent launch where the device takes one, an
    ordinary launch here; the bits never change. Anything but a bool or None is refused."""
    n = 33
    x = randn((3, n), torch.bfloat16, seed=3)
    r = randn((3, n), torch.bfloat16, seed=4)
    w = weight_like(n, torch.bfloat16)
    want_y, want_h = treefold.rms_norm(x, w, 1e-6, residual=r)
    for enable_pdl in (None, False, True):
        xi, ri = x.clone(), r.clone()
        treefold.fused_add_rms_norm_(xi, ri, w, 1e-6, enable_pdl=enable_pdl)
        assert_bits(xi, want_y)
        assert_bits(ri, want_h)
    with pytest.raises(TypeError, match="fused_add_rms_norm_: enable_pdl must be a bool or None, got int"):
        treefold.fused_add_rms_norm_(x.clone(), r.clone(), w, 1e-6, enable_pdl=1)


def test_fused_add_rms_norm_on_rows_that_need_a_copy():
    n = 33
    big_x = randn((4, 2 * n), torch.float32, seed=1)
    big_r = randn((4, n, 2), torch.float32, seed=2)
    x, r = big_x[:, ::2], big_r[:, :, 0]  # last dimension not contiguous: worked on a copy
    w = weight_like(n, torch.float32)
    want_y, want_h = treefold.rms_norm(x.contiguous(), w, residual=r.contiguous())
    treefold.fused_add_rms_norm_(x, r, w)
    assert_bits(big_x[:, ::2].contiguous(), want_y)
    assert_bits(big_r[:, :, 0].contiguous(), want_h)
    assert_bits(big_x[:, 1::2], randn((4, 2 * n), torch.float32, seed=1)[:, 1::2])


# --------------------------------------------------------------------------------------------
# CPU tier: layouts, launches, edge cases
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [33, 4095])
def test_bits_independent_of_batch_position_and_launch(n):
    x = randn((7, n), torch.bfloat16, seed=n)
    kernel_or_skip(x)
    w = weight_like(n, torch.bfloat16)
    full = treefold.rms_norm(x, w)
    for i in (0, 3, 6):
        assert_bits(treefold.rms_norm(x[i:i + 1], w), full[i:i + 1])
    for rows_per_program in (1, 2, 4, 8):
        y = torch.full_like(full, float("nan"))
        ops.launch_forward(x, None, w, None, y, None, None, None, eps=1e-6, offset=0.0, is_rms=True,
                           round_normalised=True, rows_per_program=rows_per_program)
        assert_bits(y, full)
    ln = treefold.layer_norm(x, n, w, w)
    for i in (0, 5):
        assert_bits(treefold.layer_norm(x[i:i + 1], n, w, w), ln[i:i + 1])


def test_rows_shared_among_programs_give_the_same_bits():
    # The interpreter runs programs one after another, so there a row is "shared" by one program
    # (the exchange through memory and the arrival counter, without waiting); the GPU tier shares
    # rows among several. Rows of 2 and 3 segments (the 3 padded to 4 in the tree); 8192, a power
    # of two, takes its means as products by 1/N.
    for n in (5120, 8192, 9000):
        x = randn((5, n), torch.bfloat16, seed=n)
        kernel_or_skip(x)
        w, b = weight_like(n, torch.bfloat16), randn(n, torch.bfloat16, seed=4)
        r = randn((5, n), torch.bfloat16, seed=n + 1)
        whole = 1 << (order.num_segments(n) - 1).bit_length()
        for casting in ("llama", "gemma"):
            want = ops.rms_norm_impl(x, w, r, 1e-6, 1.0, casting, torch.bfloat16)
            got = ops.rms_norm_impl(x, w, r, 1e-6, 1.0, casting, torch.bfloat16, segments_per_program=whole)
            for g, g_want in zip(got, want):
                assert_bits(g, g_want)
        want = ops.layer_norm_impl(x, w, b, 1e-5)
        got = ops.layer_norm_impl(x, w, b, 1e-5, segments_per_program=whole)
        for g, g_want in zip(got, want):
            assert_bits(g, g_want)
        xi, ri = x.clone(), r.clone()
        ops.fused_add_rms_norm_impl(xi, ri, w, 1e-6, segments_per_program=whole)
        assert_bits(xi, treefold.rms_norm(x, w, residual=r)[0])
        assert_bits(ri, (x.float() + r.float()).bfloat16())
    if INTERPRETED:
        with pytest.raises(ValueError, match="shares rows of 3 segments among programs that must run at once"):
            ops.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", torch.bfloat16, segments_per_program=1)
    with pytest.raises(ValueError, match="segments_per_program must be a power of two >= 1, got 3"):
        ops.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", torch.bfloat16, segments_per_program=3)
    with pytest.raises(ValueError, match="read_policy must be one of None, '', 'evict_first', got 'evict_last'"):
        ops.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", torch.bfloat16, read_twice=False, read_policy="evict_last")


def test_forward_launch_defaults():
    # (rows per program, warps), as measured on the H200 (see forward_config's constants)
    assert ops.forward_config(4096, True) == (1, 8)  # RMSNorm: one row of 4096, 16 elements per thread
    assert ops.forward_config(1024, True) == (4, 8)  # four rows of 1024, 16 per thread ...
    assert ops.forward_config(1024, True, has_residual=True) == (4, 4)  # ... 32 with a residual
    assert ops.forward_config(1024, False) == (2, 2)  # LayerNorm: a warp per row of 1024, two rows ...
    assert ops.forward_config(4096, False) == (1, 4)  # ... one row, 4 warps, at 4096 and 8192
    assert ops.forward_config(8192, False) == (1, 4)
    assert ops.forward_config(16384, True) == (1, 8)  # wide rows: 64 elements per thread ...
    assert ops.forward_config(8192, True) == (1, 4)  # ... from a block of 8192 on
    assert ops.forward_config(4096, True, has_residual=True) == (1, 4)  # a residual: 4 warps at 4096
    def plan(n, residual=False, rows_per_program=None):
        return ops._forward_plan(n, torch.bfloat16, True, residual, True, False, False, True, False,
                                 rows_per_program, None)
    assert plan(4096, True)[2]["num_warps"] == 4 and plan(4096)[2]["num_warps"] == 8
    assert plan(16384)[2]["num_warps"] == 8 and not plan(16384)[2]["READ_TWICE"]  # held, 64 per thread
    assert plan(8192, True)[2]["num_warps"] == 4 and plan(16384, True)[2]["num_warps"] == 8
    assert plan(4096, True, rows_per_program=2)[2]["num_warps"] == 8  # asked for rows: 32 per thread
    # a rows_per_program asked for alone gets warps for the tile it makes (32 per thread)
    rows, _, plan = ops._forward_plan(4096, torch.bfloat16, False, False, True, True, False, False, False, 2, None)
    assert rows == 2 and plan["num_warps"] == 8


def test_non_contiguous_inputs():
    n = 33
    wide = randn((6, 2 * n + 3), torch.float16, seed=1)
    x = wide[:, 3:n + 3]  # evenly strided rows: viewed in place, no copy
    assert x.stride() == (2 * n + 3, 1)
    w = weight_like(n, torch.float16)
    assert_bits(treefold.rms_norm(x, w), treefold.rms_norm(x.contiguous(), w))
    assert_bits(treefold.layer_norm(x, n, w, w), treefold.layer_norm(x.contiguous(), n, w, w))
    t = randn((n, 6), torch.float16, seed=2).t()  # last dimension strided: copied
    assert_bits(treefold.rms_norm(t, w), treefold.rms_norm(t.contiguous(), w))
    p = randn((3, 4, n), torch.float16, seed=3).permute(1, 0, 2)  # leading dims permuted
    r = randn((4, 3, n), torch.float16, seed=4)
    y, h = treefold.rms_norm(p, w, residual=r)
    y2, h2 = treefold.rms_norm(p.contiguous(), w, residual=r)
    assert y.shape == (4, 3, n)
    assert_bits(y, y2)
    assert_bits(h, h2)
    xg = p.detach().clone().requires_grad_()
    dy = randn((4, 3, n), torch.float16, seed=5).permute(1, 0, 2)  # strided upstream gradient too
    dx = torch.autograd.grad(treefold.rms_norm(xg, w), xg, dy.permute(1, 0, 2))[0]
    xc = p.contiguous().requires_grad_()
    dx2 = torch.autograd.grad(treefold.rms_norm(xc, w), xc, dy.permute(1, 0, 2).contiguous())[0]
    assert dx.shape == p.shape
    assert_bits(dx.contiguous(), dx2)
    wg, bg = w.clone().requires_grad_(), w.clone().requires_grad_()
    got = torch.autograd.grad(treefold.layer_norm(xg, n, wg, bg), (xg, wg, bg), dy.permute(1, 0, 2))
    want = torch.autograd.grad(treefold.layer_norm(xc, n, wg, bg), (xc, wg, bg), dy.permute(1, 0, 2).contiguous())
    for g, g_want in zip(got, want):
        assert_bits(g.contiguous(), g_want)


def test_rows_that_a_dimension_of_one_entry_does_not_space_evenly():
    # [B, 1, T, K] cut to [B, 1, q, K]: the 1's stride equals the B's, and the rows are not one
    # stride apart (copied); [B, 1, T, K] cut to [B, 1, T, n] is (read in place)
    n = 33
    w = weight_like(n, torch.float32)
    for x in (randn((2, 1, 7, n), torch.float32, seed=6)[:, :, :3],
              randn((2, 1, 7, n + 5), torch.float32, seed=7)[:, :, :, :n]):
        r = randn(x.shape, torch.float32, seed=8)
        assert_bits(treefold.rms_norm(x, w), treefold.rms_norm(x.contiguous(), w))
        assert_bits(treefold.layer_norm(x, n, w, w), treefold.layer_norm(x.contiguous(), n, w, w))
        y, h = treefold.rms_norm(x, w, residual=r)
        assert_bits(y, treefold.rms_norm(x.contiguous(), w, residual=r)[0])
    assert ops._checks.row_stride(randn((2, 1, 7, n), torch.float32, seed=6)[:, :, :3]) == (6, None)
    assert ops._checks.row_stride(randn((2, 1, 7, n + 5), torch.float32, seed=7)[:, :, :, :n]) == (14, n + 5)


def test_vectors_strided_or_flattened_and_stride_0_gradients():
    # a 1-D x whose elements are not adjacent is copied (and written back in place); the
    # stride-0 gradient of out.sum().backward() is read as a gradient of ones, also where the
    # whole input is normalized_shape (flattened to one row)
    n = 7
    v = randn((2 * n,), torch.float32, seed=9)[::2]
    w = weight_like(n, torch.float32)
    assert_bits(treefold.rms_norm(v, w), treefold.rms_norm(v.contiguous(), w))
    assert_bits(treefold.layer_norm(v, n, w, w), treefold.layer_norm(v.contiguous(), n, w, w))
    for x, call in ((randn((33,), torch.float32, seed=10), lambda t, wt: treefold.rms_norm(t, wt)),
                    (randn((33,), torch.float32, seed=11), lambda t, wt: treefold.layer_norm(t, 33, wt, wt)),
                    (randn((4, 5), torch.float32, seed=12), lambda t, wt: treefold.layer_norm(t, (4, 5)))):
        wt = weight_like(33, torch.float32).requires_grad_()
        xg, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        call(xg, wt).sum().backward()
        gw = wt.grad.clone() if wt.grad is not None else None
        wt.grad = None
        call(xc, wt).backward(torch.ones_like(x))
        assert_bits(xg.grad, xc.grad)
        if gw is not None:
            assert_bits(gw, wt.grad)
    buf_x, buf_r = randn((2 * n,), torch.float32, seed=13), randn((2 * n,), torch.float32, seed=14)
    keep_x, keep_r = buf_x[1::2].clone(), buf_r[1::2].clone()
    want_y, want_h = treefold.rms_norm(buf_x[::2].clone(), w, residual=buf_r[::2].clone())
    treefold.fused_add_rms_norm_(buf_x[::2], buf_r[::2], w)
    assert_bits(buf_x[::2], want_y)
    assert_bits(buf_r[::2], want_h)
    assert_bits(buf_x[1::2], keep_x)  # nothing written between the elements
    assert_bits(buf_r[1::2], keep_r)


def test_strided_and_expanded_weights_and_biases():
    """A weight or bias that is a strided view or an expanded scalar is read element by element:
    every entry point gives the bits of its contiguous copy, forward and backward."""
    n = 33
    x = randn((5, n), torch.bfloat16, seed=1)
    r = randn((5, n), torch.float32, seed=2)
    wide = weight_like(2 * n, torch.bfloat16, seed=3)
    b = randn(2 * n, torch.bfloat16, seed=4)[1::2]
    for w in (wide[::2], torch.tensor(1.25, dtype=torch.bfloat16, device=DEVICE).expand(n)):
        assert not w.is_contiguous()
        wc = w.contiguous()
        assert_bits(treefold.rms_norm(x, w), treefold.rms_norm(x, wc))
        got = treefold.rms_norm(x, w, residual=r, offset=1.0, casting="gemma")
        want = treefold.rms_norm(x, wc, residual=r, offset=1.0, casting="gemma")
        for g, v in zip(got, want):
            assert_bits(g, v)
        assert_bits(treefold.layer_norm(x, n, w, b), treefold.layer_norm(x, n, wc, b.contiguous()))
        xs, rs, xc, rc = x.clone(), x.flip(0).clone(), x.clone(), x.flip(0).clone()
        treefold.fused_add_rms_norm_(xs, rs, w)
        treefold.fused_add_rms_norm_(xc, rc, wc)
        assert_bits(xs, xc)
        assert_bits(rs, rc)
    # gradients through a strided view of a leaf weight reach the right elements of the leaf
    xg = x.float().requires_grad_()
    leaf = wide.float().requires_grad_()
    dx, dleaf = torch.autograd.grad(treefold.rms_norm(xg, leaf[::2]).sum(), (xg, leaf))
    wcg = wide[::2].float().requires_grad_()
    dx2, dw2 = torch.autograd.grad(treefold.rms_norm(xg, wcg).sum(), (xg, wcg))
    assert_bits(dx, dx2)
    assert_bits(dleaf[::2], dw2)
    assert bool((dleaf[1::2] == 0).all())
    bleaf = randn(2 * n, torch.float32, seed=6).requires_grad_()
    dx, dleaf, dbleaf = torch.autograd.grad(treefold.layer_norm(xg, n, leaf[::2], bleaf[1::2]).sum(), (xg, leaf, bleaf))
    wcg, bcg = wide[::2].float().requires_grad_(), bleaf[1::2].detach().clone().requires_grad_()
    dx2, dw2, db2 = torch.autograd.grad(treefold.layer_norm(xg, n, wcg, bcg).sum(), (xg, wcg, bcg))
    assert_bits(dx, dx2)
    assert_bits(dleaf[::2], dw2)
    assert_bits(dbleaf[1::2], db2)


def test_layer_norm_over_several_trailing_dims():
    x = randn((3, 4, 5, 7), torch.float32, seed=1)
    w, b = weight_like(35, torch.float32).view(5, 7), randn((5, 7), torch.float32, seed=2)
    got = treefold.layer_norm(x, (5, 7), w, b)
    want = treefold.layer_norm(x.reshape(3, 4, 35), 35, w.reshape(35), b.reshape(35)).view(3, 4, 5, 7)
    assert_bits(got, want)
    assert_close(got, torch.nn.functional.layer_norm(x.double(), (5, 7), w.double(), b.double()), torch.float32)


def test_empty_inputs_give_empty_results():
    w = weight_like(16, torch.bfloat16)
    for shape in [(0, 16), (2, 0, 16)]:
        x = torch.empty(shape, dtype=torch.bfloat16, device=DEVICE)
        assert treefold.rms_norm(x, w).shape == shape
        y, h = treefold.rms_norm(x, w, residual=torch.empty(shape, dtype=torch.float32, device=DEVICE))
        assert y.shape == shape and h.shape == shape and h.dtype == torch.float32
        assert treefold.layer_norm(x, 16, w, w).shape == shape
        treefold.fused_add_rms_norm_(x, x.clone(), w)
    x = torch.empty((3, 0))
    assert treefold.rms_norm(x).shape == (3, 0)
    assert treefold.layer_norm(x, 0).shape == (3, 0)
    xg = torch.empty((0, 16), requires_grad=True)
    wg, bg = torch.ones(16, requires_grad=True), torch.ones(16, requires_grad=True)
    dx, dw = torch.autograd.grad(treefold.rms_norm(xg, wg).sum(), (xg, wg))
    assert dx.shape == (0, 16) and torch.equal(dw, torch.zeros(16))
    dx, dw, db = torch.autograd.grad(treefold.layer_norm(xg, 16, wg, bg).sum(), (xg, wg, bg))
    assert dx.shape == (0, 16) and torch.equal(dw, torch.zeros(16)) and torch.equal(db, torch.zeros(16))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_and_inf_stay_in_their_row(dtype):
    n = 33  # many rows per program: poisoned rows share a program with clean ones
    x = randn((9, n), dtype, seed=1)
    w = weight_like(n, dtype)
    clean_rms, clean_ln = treefold.rms_norm(x, w), treefold.layer_norm(x, n, w, w)
    bad = x.clone()
    bad[2, 5] = float("nan")
    bad[4, 0] = float("inf")
    bad[6, 32] = float("-inf")
    rms, ln = treefold.rms_norm(bad, w), treefold.layer_norm(bad, n, w, w)
    for i in range(9):
        if i in (2, 4, 6):
            assert not bool(torch.isfinite(rms[i]).all()) and not bool(torch.isfinite(ln[i]).all())
        else:
            assert_bits(rms[i], clean_rms[i])
            assert_bits(ln[i], clean_ln[i])
    assert_bits(rms, ref.rms_norm(bad, w, 1e-6)[0])
    assert_bits(ln, ref.layer_norm(bad, w, w, 1e-5)[0])
    clean = [0, 1, 3, 5, 7, 8]
    xg, xc = bad.clone().requires_grad_(), x.clone().requires_grad_()
    dy = randn((9, n), dtype, seed=2)
    for norm in (lambda v: treefold.rms_norm(v, w), lambda v: treefold.layer_norm(v, n, w, w)):
        dx = torch.autograd.grad(norm(xg), xg, dy)[0]
        clean_dx = torch.autograd.grad(norm(xc), xc, dy)[0]
        assert_bits(dx[clean], clean_dx[clean])
    # a poisoned residual poisons its own rows only, in y and in h, and so does the in-place form
    r = randn((9, n), dtype, seed=3)
    y_clean, h_clean = treefold.rms_norm(x, w, residual=r)
    y, h = treefold.rms_norm(x, w, residual=bad)
    y_rows, h_rows = treefold.rms_norm(x[clean], w, residual=bad[clean])
    assert_bits(y[clean], y_rows)
    assert_bits(h[clean], h_rows)
    assert not bool(torch.isfinite(y[[2, 4, 6]]).all(dim=-1).any())
    xi, ri = x.clone(), r.clone()
    ri[[2, 4, 6]] = bad[[2, 4, 6]]
    treefold.fused_add_rms_norm_(xi, ri, w)
    assert_bits(xi[clean], y_clean[clean])
    assert_bits(ri[clean], h_clean[clean])
    assert not bool(torch.isfinite(xi[[2, 4, 6]]).all(dim=-1).any())


def test_gradients_without_a_weight_and_with_a_bias_alone():
    n = 33
    x = randn((4, n), torch.float32, seed=7)
    dy = randn((4, n), torch.float32, seed=8)
    xg, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
    dx = torch.autograd.grad(treefold.rms_norm(xg), xg, dy)[0]
    assert_grad_close(dx, torch.autograd.grad(rms_norm64(x64, None, 1e-6), x64, dy.double())[0], torch.float32)
    b = randn(n, torch.float32, seed=9).requires_grad_()
    b64 = b.detach().double().requires_grad_()
    dx, db = torch.autograd.grad(treefold.layer_norm(xg, n, None, b), (xg, b), dy)
    want_dx, want_db = torch.autograd.grad(layer_norm64(x64, None, b64, 1e-5), (x64, b64), dy.double())
    assert_grad_close(dx, want_dx, torch.float32)
    assert_grad_close(db, want_db, torch.float32)


def test_layer_norm_offset_rows_have_no_nan_and_accurate_variance():
    """Rows at 10,000 with std 1: the one-pass E[x^2] - E[x]^2 loses everything here."""
    m, n = 256, 1024
    x = (randn((m, n), torch.float64, seed=5) + 10_000.0).to(torch.float32)
    y, mean, rstd = ops.layer_norm_impl(x, None, None, 1e-5)
    assert not bool(torch.isnan(y).any())
    var64 = x.double().var(-1, unbiased=False)
    var = 1.0 / rstd.double() ** 2 - 1e-5
    assert ((var - var64).abs() / var64).max().item() <= 1e-5
    # The float32 mean of a row at 10,000 is off by up to a few ulps of 10,000 (2^-10 each), and
    # every x - mean inherits that; with std 1 it is the output's absolute error.
    err = (y.double() - layer_norm64(x, None, None, 1e-5)).abs().max().item()
    assert err <= 4 * 2.0 ** -10


def test_output_dtypes_follow_the_casting():
    x = randn((2, 8), torch.bfloat16)
    w32 = weight_like(8, torch.float32)
    assert treefold.rms_norm(x, w32).dtype == torch.float32  # weight * x.to(bf16) promotes
    assert treefold.rms_norm(x, w32, casting="gemma").dtype == torch.bfloat16  # type_as(x)
    assert treefold.rms_norm(x, w32, casting="none").dtype == torch.float32
    assert treefold.rms_norm(x, w32, out_dtype=torch.float16).dtype == torch.float16
    y, h = treefold.rms_norm(x, weight_like(8, torch.bfloat16), residual=randn((2, 8), torch.float32))
    assert y.dtype == torch.float32 and h.dtype == torch.float32  # normalises h, a float32 row
    assert treefold.layer_norm(x, 8, w32, w32).dtype == torch.bfloat16


def test_eager_fast_path_and_custom_op_agree():
    x = randn((3, 33), torch.bfloat16)
    w = weight_like(33, torch.bfloat16)
    fast = treefold.rms_norm(x, w, residual=x)
    via_op = torch.ops.treefold.rms_norm(x, w, x, 1e-6, 0.0, "llama", torch.bfloat16)
    assert_bits(fast[0], via_op[0])
    assert_bits(fast[1], via_op[1])
    assert_bits(treefold.layer_norm(x, 33, w, w), torch.ops.treefold.layer_norm(x, w, w, 1e-5)[0])


def test_gradient_through_h_only_and_without_weight_grad():
    x = randn((3, 33), torch.float32).requires_grad_()
    r = randn((3, 33), torch.float32, seed=1).requires_grad_()
    w = weight_like(33, torch.float32)  # no grad wanted
    _, h = treefold.rms_norm(x, w, residual=r)
    dx, dr = torch.autograd.grad(h.sum(), (x, r))
    assert torch.equal(dx, torch.ones_like(x)) and torch.equal(dr, torch.ones_like(r))
    y = treefold.rms_norm(x, w)
    (dx,) = torch.autograd.grad(y.sum(), (x,))
    assert dx.shape == x.shape


# --------------------------------------------------------------------------------------------
# CPU tier: modules, torch.compile, custom ops
# --------------------------------------------------------------------------------------------

def test_modules_load_torch_state_dicts():
    torch.manual_seed(0)
    x = randn((4, 3, 32), torch.float32, seed=2)
    src = torch.nn.RMSNorm(32, eps=1e-6, device=DEVICE)
    with torch.no_grad():
        src.weight.copy_(weight_like(32, torch.float32))
    mod = tnn.RMSNorm(32, eps=1e-6, casting="gemma").to(DEVICE)
    mod.load_state_dict(src.state_dict())
    assert_close(mod(x), copy.deepcopy(src).double()(x.double()), torch.float32)

    gemma = tnn.RMSNorm(32, casting="gemma", offset=1.0).to(DEVICE)
    assert torch.equal(gemma.weight, torch.zeros(32, device=DEVICE))  # a fresh module scales by 1 + 0
    assert_close(gemma(x), rms_norm64(x, None, 1e-6), torch.float32)

    # eps=None is float32's machine epsilon for every input dtype, as torch.nn.RMSNorm takes it
    # (not the input's: bfloat16's 2^-7 would swamp the mean square of small activations)
    small = 0.05 * randn((4, 3, 32), torch.bfloat16, seed=4)
    src = torch.nn.RMSNorm(32, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        src.weight.copy_(weight_like(32, torch.bfloat16))
    mod = tnn.RMSNorm(32, eps=None, casting="gemma", dtype=torch.bfloat16).to(DEVICE)
    mod.load_state_dict(src.state_dict())
    assert_bits(mod(small), treefold.rms_norm(small, src.weight, torch.finfo(torch.float32).eps, casting="gemma"))
    assert_close(mod(small), src.double()(small.double()), torch.bfloat16)

    two_dims = tnn.RMSNorm((3, 32), eps=None).to(DEVICE)
    src = torch.nn.RMSNorm((3, 32), device=DEVICE)
    with torch.no_grad():
        src.weight.copy_(weight_like(96, torch.float32).view(3, 32))
    two_dims.load_state_dict(src.state_dict())
    assert_close(two_dims(x), copy.deepcopy(src).double()(x.double()), torch.float32)

    for bias in (True, False):
        src = torch.nn.LayerNorm(32, bias=bias, device=DEVICE)
        with torch.no_grad():
            src.weight.copy_(weight_like(32, torch.float32))
            if bias:
                src.bias.copy_(randn(32, torch.float32, seed=9))
        mod = tnn.LayerNorm(32, bias=bias).to(DEVICE)
        mod.load_state_dict(src.state_dict())
        assert_close(mod(x), copy.deepcopy(src).double()(x.double()), torch.float32)
    y, h = tnn.RMSNorm(32).to(DEVICE)(x, x)
    assert y.shape == x.shape and torch.equal(h, x + x)
    # the modules print as torch's do, bias included
    for kwargs in ({}, {"bias": False}, {"elementwise_affine": False}):
        assert repr(tnn.LayerNorm(32, **kwargs)) == repr(torch.nn.LayerNorm(32, **kwargs))


def test_rms_norm_module_refuses_an_offset_without_a_weight():
    # as the function does: the offset is added to a weight, and there would be none to add it to
    with pytest.raises(ValueError, match=r"RMSNorm: offset=1.0 needs elementwise_affine=True"):
        tnn.RMSNorm(32, elementwise_affine=False, offset=1.0)
    plain = tnn.RMSNorm(32, elementwise_affine=False).to(DEVICE)
    x = randn((3, 32), torch.float32, seed=6)
    assert_bits(plain(x), treefold.rms_norm(x))


def test_modules_without_affine_gemma_checkpoints_and_compile():
    x = randn((4, 3, 32), torch.bfloat16, seed=2)
    # a LayerNorm without parameters is the functional call without weight and bias
    plain = tnn.LayerNorm(32, elementwise_affine=False).to(DEVICE)
    assert not list(plain.parameters())
    assert_bits(plain(x), treefold.layer_norm(x, 32))
    # a Gemma checkpoint stores the weight with the 1 taken out; the module adds it back
    stored = 0.25 * randn(32, torch.bfloat16, seed=3)
    gemma = tnn.RMSNorm(32, casting="gemma", offset=1.0, dtype=torch.bfloat16).to(DEVICE)
    gemma.load_state_dict({"weight": stored})
    assert_bits(gemma(x), treefold.rms_norm(x, stored, casting="gemma", offset=1.0))
    # one rounding at the end in both codes (as test_bf16_matches_hugging_face_llama_and_gemma)
    assert agreement(gemma(x), hf_gemma_rms_norm(x, stored, 1e-6)) >= 0.99
    # the modules under torch.compile(fullgraph=True): the same bits as eager
    for mod in (gemma, plain, tnn.RMSNorm(32).to(DEVICE)):
        assert_bits(torch.compile(mod, fullgraph=True, backend="aot_eager")(x), mod(x))


def test_modules_train():
    mod = tnn.LayerNorm(33).to(DEVICE)
    rms = tnn.RMSNorm(33).to(DEVICE)
    x = randn((5, 33), torch.float32, seed=3).requires_grad_()
    (mod(x).sum() + (rms(x) ** 2).sum()).backward()
    assert mod.weight.grad.shape == (33,) and mod.bias.grad.shape == (33,) and rms.weight.grad.shape == (33,)
    assert x.grad.shape == x.shape


def test_torch_compile_fullgraph_matches_eager():
    x = randn((4, 64), torch.bfloat16).requires_grad_()
    r = randn((4, 64), torch.bfloat16, seed=1).requires_grad_()
    # one use per parameter, so that no gradient is a sum whose order the compiler may choose
    w, w2, b2 = (weight_like(64, torch.bfloat16, seed=s).requires_grad_() for s in (1, 2, 3))

    def step(x, r, w, w2, b2):
        y, h = treefold.rms_norm(x, w, residual=r)
        return y, treefold.layer_norm(h, 64, w2, b2)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    inputs = (x, r, w, w2, b2)
    outs, outs_c = step(*inputs), compiled(*inputs)
    for o, o_c in zip(outs, outs_c):
        assert_bits(o_c, o)
    # y's gradient alone: the path through h would add two gradients at h
    dy = randn(outs[0].shape, outs[0].dtype, seed=4)
    grads = torch.autograd.grad(outs[0], (x, r, w), dy, retain_graph=True)
    grads_c = torch.autograd.grad(outs_c[0], (x, r, w), dy, retain_graph=True)
    for g, g_c in zip(grads, grads_c):
        assert_bits(g_c, g)
    dz = randn(outs[1].shape, outs[1].dtype, seed=5)
    for g, g_c in zip(torch.autograd.grad(outs[1], (w2, b2), dz), torch.autograd.grad(outs_c[1], (w2, b2), dz)):
        assert_bits(g_c, g)

    def serve(x, r, w):
        treefold.fused_add_rms_norm_(x, r, w)
        return x * 2

    with torch.no_grad():
        xa, ra, xb, rb = x.clone(), r.clone(), x.clone(), r.clone()
        out = torch.compile(serve, fullgraph=True, backend="aot_eager")(xa, ra, w)
        treefold.fused_add_rms_norm_(xb, rb, w)
    assert_bits(out, xb * 2)
    assert_bits(ra, rb)


def test_custom_ops_pass_opcheck():
    x = randn((3, 40), torch.bfloat16).requires_grad_()
    w = weight_like(40, torch.bfloat16).requires_grad_()
    r = randn((3, 40), torch.float32, seed=1).requires_grad_()
    checks = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    for op, args in [
        (torch.ops.treefold.rms_norm.default, (x, w, r, 1e-6, 1.0, "gemma", torch.bfloat16)),
        (torch.ops.treefold.rms_norm.default, (x, None, None, 1e-6, 0.0, "llama", torch.float32)),
        (torch.ops.treefold.layer_norm.default, (x, w, w, 1e-5)),
        (torch.ops.treefold.fused_add_rms_norm_.default, (x.detach().clone(), r.detach().clone(), w.detach(), 1e-6)),
    ]:
        torch.library.opcheck(op, args, test_utils=checks)


# --------------------------------------------------------------------------------------------
# CPU tier: argument errors
# --------------------------------------------------------------------------------------------

def test_bad_arguments_name_themselves():
    x = randn((2, 8), torch.float32, device="cpu")
    w = torch.ones(8)
    with pytest.raises(ValueError, match=r"rms_norm: weight has shape \(7,\), expected \(8,\) \(x.shape\[-1\]\)"):
        treefold.rms_norm(x, torch.ones(7))
    with pytest.raises(ValueError, match=r"rms_norm: weight has shape \(1, 8\)"):
        treefold.rms_norm(x, torch.ones(1, 8))
    with pytest.raises(ValueError, match=r"rms_norm: residual has shape \(2, 7\), expected \(2, 8\)"):
        treefold.rms_norm(x, w, residual=torch.ones(2, 7))
    with pytest.raises(ValueError, match=r"fused_add_rms_norm_: residual has shape \(8,\)"):
        treefold.fused_add_rms_norm_(x, torch.ones(8), w)
    with pytest.raises(ValueError, match=r"fused_add_rms_norm_: weight has shape \(9,\)"):
        treefold.fused_add_rms_norm_(x, x.clone(), torch.ones(9))
    with pytest.raises(ValueError, match=r"layer_norm: weight has shape \(7,\), expected \(8,\) \(normalized_shape\)"):
        treefold.layer_norm(x, 8, torch.ones(7))
    with pytest.raises(ValueError, match=r"layer_norm: bias has shape \(8, 1\), expected \(8,\)"):
        treefold.layer_norm(x, 8, w, torch.ones(8, 1))
    with pytest.raises(ValueError, match=r"layer_norm: normalized_shape=\(4,\) does not match"):
        treefold.layer_norm(x, 4)
    with pytest.raises(ValueError, match=r"layer_norm: normalized_shape=\(3, 2, 8\) does not match"):
        treefold.layer_norm(x, (3, 2, 8))
    with pytest.raises(TypeError, match=r"layer_norm: normalized_shape must be an int"):
        treefold.layer_norm(x, 8.0)
    for bad in (True, [8, True], torch.tensor(8), []):
        with pytest.raises(TypeError, match=r"layer_norm: normalized_shape must be an int"):
            treefold.layer_norm(x, bad)
    with pytest.raises(ValueError, match=r"rms_norm: casting must be one of 'llama', 'gemma', 'none', got 'qwen'"):
        treefold.rms_norm(x, w, casting="qwen")
    with pytest.raises(ValueError, match=r"rms_norm: eps must be >= 0.0, got -1"):
        treefold.rms_norm(x, w, eps=-1)
    with pytest.raises(ValueError, match=r"layer_norm: eps must be finite, got nan"):
        treefold.layer_norm(x, 8, eps=float("nan"))
    with pytest.raises(ValueError, match=r"rms_norm: offset=1.0 needs a weight"):
        treefold.rms_norm(x, offset=1.0)
    with pytest.raises(TypeError, match=r"rms_norm: x must be a torch.Tensor, got list"):
        treefold.rms_norm([1.0, 2.0])
    with pytest.raises(TypeError, match=r"rms_norm: x has dtype int64"):
        treefold.rms_norm(torch.ones(2, 8, dtype=torch.int64))
    # (the prepared path reads tensors' attributes first: a list must still reach the checks)
    with pytest.raises(TypeError, match=r"rms_norm: weight must be a torch.Tensor, got list"):
        treefold.rms_norm(x, [1.0] * 8)
    with pytest.raises(TypeError, match=r"rms_norm: residual must be a torch.Tensor, got ndarray"):
        treefold.rms_norm(x, residual=np.zeros((2, 8), np.float32))
    with pytest.raises(TypeError, match=r"layer_norm: bias must be a torch.Tensor, got list"):
        treefold.layer_norm(x, 8, None, [0.0] * 8)
    with pytest.raises(TypeError, match=r"rms_norm: out_dtype must be one of"):
        treefold.rms_norm(x, out_dtype=torch.int32)
    with pytest.raises(ValueError, match=r"rms_norm: x must have at least one dimension"):
        treefold.rms_norm(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"rms_norm: weight is on meta; treefold runs on cuda and cpu tensors"):
        treefold.rms_norm(x, torch.ones(8, device="meta"))
    with pytest.raises(ValueError, match=r"rms_norm: rows of 65537 elements are longer than 65536"):
        treefold.rms_norm(torch.ones(1, 65537))
    with pytest.raises(ValueError, match=r"fused_add_rms_norm_: x and residual share memory"):
        treefold.fused_add_rms_norm_(x, x, w)
    with pytest.raises(ValueError, match=r"fused_add_rms_norm_: an input requires grad"):
        treefold.fused_add_rms_norm_(x.clone().requires_grad_(), x.clone(), w)
    with pytest.raises(ValueError, match=r"fused_add_rms_norm_: x may have elements that share memory"):
        treefold.fused_add_rms_norm_(torch.ones(8).expand(2, 8), x.clone(), w)
    # refused before anything is written: both keep their values
    for bad_x, bad_r in ((torch.ones(2, 1).expand(2, 8), x.clone()),
                         (x.clone(), torch.arange(18.0).as_strided((2, 8), (2, 2)))):
        before = bad_x.clone(), bad_r.clone()
        with pytest.raises(ValueError, match=r"fused_add_rms_norm_: (x|residual) may have elements that share memory"):
            treefold.fused_add_rms_norm_(bad_x, bad_r, w)
        assert torch.equal(bad_x, before[0]) and torch.equal(bad_r, before[1])


def test_malformed_casting_and_normalized_shape_name_their_argument():
    x = randn((2, 8), torch.float32, seed=1)
    with pytest.raises(TypeError, match=r"rms_norm: casting must be a str \(one of 'llama', 'gemma', 'none'\), got list"):
        treefold.rms_norm(x, casting=["llama"])
    with pytest.raises(TypeError, match=r"layer_norm: normalized_shape must be an int or a non-empty sequence"):
        treefold.layer_norm(x, np.array([2, 8]))


def test_layer_norm_takes_numpy_integers_as_torch_does():
    x, w = randn((3, 2, 8), torch.float32, seed=1), weight_like(8, torch.float32)
    want = treefold.layer_norm(x, 8, w)
    assert_bits(treefold.layer_norm(x, np.int64(8), w), want)
    assert_bits(treefold.layer_norm(x, (np.int32(2), 8)), treefold.layer_norm(x, (2, 8)))


def test_fused_add_rms_norm_on_column_ranges_of_one_buffer():
    """x and residual as two column ranges of one buffer share no element: the call works and
    gives the out-of-place bits; ranges that share columns are refused."""
    n = 33
    buf = randn((5, 3 * n), torch.bfloat16, seed=3)
    w = weight_like(n, torch.bfloat16)
    x, r = buf[:, n:2 * n], buf[:, :n]  # the residual's rows before x's in each row of buf
    want_y, want_h = treefold.rms_norm(x.clone(), w, residual=r.clone())
    treefold.fused_add_rms_norm_(x, r, w)
    assert_bits(x, want_y)
    assert_bits(r, want_h)
    flat = randn(4 * n, torch.float32, seed=4)  # two rows each, adjacent halves of one vector
    x, r = flat[:2 * n].view(2, n), flat[2 * n:].view(2, n)
    want_y, want_h = treefold.rms_norm(x.clone(), weight_like(n, torch.float32), residual=r.clone())
    treefold.fused_add_rms_norm_(x, r, weight_like(n, torch.float32))
    assert_bits(x, want_y)
    assert_bits(r, want_h)
    with pytest.raises(ValueError, match=r"fused_add_rms_norm_: x and residual share memory"):
        treefold.fused_add_rms_norm_(buf[:, 1:n + 1], buf[:, :n], w)  # columns 1..n-1 in both
    x, r = buf[1:, :n], buf[:-1, 2 * n:]  # spans that interleave, rows that never meet
    want_y, want_h = treefold.rms_norm(x.clone(), w, residual=r.clone())
    treefold.fused_add_rms_norm_(x, r, w)
    assert_bits(x, want_y)
    assert_bits(r, want_h)
    flat = randn(8 * n, torch.float32, seed=5)
    with pytest.raises(ValueError, match=r"fused_add_rms_norm_: x and residual share memory"):
        # residual's rows 0 and 1 reach into x's rows 2 and 3 across a row boundary
        treefold.fused_add_rms_norm_(flat[:4 * n].view(4, n), flat[2 * n + 3:6 * n + 3].view(4, n),
                                     weight_like(n, torch.float32))
    with pytest.raises(ValueError, match=r"fused_add_rms_norm_: x and residual have memory ranges that "
                                         r"intersect, with strides too irregular"):
        # every other element of one buffer: disjoint, but a strided last dimension is outside
        # what the exact test covers, so intersecting ranges are refused (and say so)
        treefold.fused_add_rms_norm_(flat[0::2][:2 * n].view(2, n), flat[1::2][:2 * n].view(2, n),
                                     weight_like(n, torch.float32))
    # views of one storage in two dtypes: the test is in bytes
    raw = torch.zeros(4 * n, dtype=torch.float32, device=flat.device)
    with pytest.raises(ValueError, match=r"fused_add_rms_norm_: x and residual share memory"):
        treefold.fused_add_rms_norm_(raw[:2 * n].view(2, n), raw.view(torch.bfloat16)[2 * n - 2:4 * n - 2].view(2, n),
                                     weight_like(n, torch.float32))


@pytest.mark.parametrize("n", [33, 4096])
def test_fused_add_rms_norm_refuses_a_weight_inside_x_or_the_residual(n):
    """The weight as a row of x or of the residual would be overwritten by the programs that
    write that row while others still read it (at 4096 a program per row: every row after the
    first came out wrong): refused, before anything is written."""
    x, r = randn((4, n), torch.float32, seed=n), randn((4, n), torch.float32, seed=n + 1)
    for name, w in (("x", x[0]), ("residual", r[1]), ("x", x.view(-1)[3:n + 3])):
        before = x.clone(), r.clone()
        with pytest.raises(ValueError, match=rf"fused_add_rms_norm_: weight and {name} share memory"):
            treefold.fused_add_rms_norm_(x, r, w)
        assert torch.equal(x, before[0]) and torch.equal(r, before[1])
    # the same values from a buffer of their own: the out-of-place bits
    w = x[0].clone()
    want_y, want_h = treefold.rms_norm(x.clone(), w, residual=r.clone())
    treefold.fused_add_rms_norm_(x, r, w)
    assert_bits(x, want_y)
    assert_bits(r, want_h)


@pytest.mark.parametrize("n", [33, 4096, 16384])
def test_reading_the_row_twice_gives_the_same_bits(n):
    x, w = randn((3, n), torch.bfloat16, seed=n), weight_like(n, torch.bfloat16)
    kernel_or_skip(x)
    want = ops.rms_norm_impl(x, w, None, 1e-6, 1.0, "llama", torch.bfloat16)
    for twice in (True, False):
        got = ops.rms_norm_impl(x, w, None, 1e-6, 1.0, "llama", torch.bfloat16, read_twice=twice)
        assert_bits(got[0], want[0])
        assert_bits(got[2], want[2])
    assert_bits(want[0], ref.rms_norm(x, w, 1e-6, offset=1.0)[0])
    # with a residual the row read again is h, read back from its own store; in place too
    r = randn((3, n), torch.bfloat16, seed=n + 1)
    want = ops.rms_norm_impl(x, w, r, 1e-6, 0.0, "llama", torch.bfloat16)
    for twice, hint in ((True, None), (True, "evict_first"), (False, None)):
        got = ops.rms_norm_impl(x, w, r, 1e-6, 0.0, "llama", torch.bfloat16, read_twice=twice, h_store_hint=hint)
        for g, g_want in zip(got, want):
            assert_bits(g, g_want)
    xi, ri = x.clone(), r.clone()
    ops.fused_add_rms_norm_impl(xi, ri, w, 1e-6, read_twice=True)
    assert_bits(xi, want[0])
    assert_bits(ri, want[1])
    # LayerNorm reads it again for its centred squares and for its output
    b = randn(n, torch.bfloat16, seed=n + 2)
    want = ops.layer_norm_impl(x, w, b, 1e-5)
    for launch in (dict(read_twice=True), dict(read_twice=True, read_policy=""), dict(read_twice=False)):
        got = ops.layer_norm_impl(x, w, b, 1e-5, **launch)
        for g, g_want in zip(got, want):
            assert_bits(g, g_want)


def assert_all_bits(got, want):
    """Every tensor of a launcher's result tuple equal bit for bit (None where absent in both)."""
    for a, c in zip(got, want):
        assert (a is None) == (c is None)
        if a is not None:
            assert_bits(a, c)


@pytest.mark.parametrize("n", [1, 33, 5120])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_holding_16bit_rows_gives_the_same_bits(n, dtype):
    # Rows held as loaded and widened again where used: the same values, so the same bits as the
    # float32 copies, NaN and Inf included (the widening is exact; only its place moves).
    x, r = randn((3, n), dtype, seed=n), randn((3, n), dtype, seed=n + 1)
    w, b = weight_like(n, dtype), randn(n, dtype, seed=3)
    dy = randn((3, n), dtype, seed=n + 2)
    kernel_or_skip(x)
    x[0, 0], x[1, -1] = float("nan"), float("inf")
    for residual, offset in ((None, 0.0), (None, 1.0), (r, 0.0)):
        want = ops.rms_norm_impl(x, w, residual, 1e-6, offset, "llama", dtype)
        assert_all_bits(ops.rms_norm_impl(x, w, residual, 1e-6, offset, "llama", dtype, hold_16bit=True), want)
    assert_bits(want[0], ref.rms_norm(x, w, 1e-6, r)[0])
    want = ops.layer_norm_impl(x, w, b, 1e-5)
    assert_all_bits(ops.layer_norm_impl(x, w, b, 1e-5, hold_16bit=True), want)
    assert_bits(want[0], ref.layer_norm(x, w, b, 1e-5)[0])
    # the backward, holding dy and x: RMSNorm with and without a weight, LayerNorm paired or not
    _, mean, rstd = want
    _, _, rms_rstd = ops.rms_norm_impl(x, w, None, 1e-6, 1.0, "llama", dtype)
    for weight in (w, None):
        want = ops.rms_norm_backward_impl(dy, None, x, weight, rms_rstd, 1.0, "llama", dtype, None, True,
                                          hold_16bit=False)
        assert_all_bits(ops.rms_norm_backward_impl(dy, None, x, weight, rms_rstd, 1.0, "llama", dtype, None, True,
                                                   hold_16bit=True), want)
    want = ops.layer_norm_backward_impl(dy, x, w, mean, rstd, True, dtype, hold_16bit=False)
    for paired in (True, False):
        assert_all_bits(ops.layer_norm_backward_impl(dy, x, w, mean, rstd, True, dtype, hold_16bit=True,
                                                     paired_sums=paired), want)


@pytest.mark.parametrize("n", [33, 1000, 5120])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_segments_cut_into_runs_give_the_same_bits(n, dtype):
    # Runs change the block's shape and where the warps sit, never the additions: every forward
    # and backward output equal bit for bit, whatever the runs (up to one group per run). N = 1000
    # is a program of several rows (their default cuts them into runs too), 5120 a row of two
    # segments.
    x, r = randn((5, n), dtype, seed=n), randn((5, n), dtype, seed=n + 1)
    w, b, dy = weight_like(n, dtype), randn(n, dtype, seed=3), randn((5, n), dtype, seed=n + 2)
    kernel_or_skip(x)
    x[0, 0], x[1, -1] = float("nan"), float("inf")
    most = ops.row_layout(n, dtype)["LANES"] // ops.row_layout(n, dtype)["GROUP"]
    runs_tried = [None] + sorted({2, most})  # None: the default
    want_rms = ops.rms_norm_impl(x, w, r, 1e-6, 1.0, "llama", dtype, runs=1)
    want_ln = ops.layer_norm_impl(x, w, b, 1e-5, runs=1)
    _, mean, rstd = want_ln
    _, _, rms_rstd = ops.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", dtype, runs=1)
    want_rms_dx = ops.rms_norm_backward_impl(dy, None, x, w, rms_rstd, 0.0, "llama", dtype, None, True, runs=1)
    want_ln_dx = ops.layer_norm_backward_impl(dy, x, w, mean, rstd, True, dtype, runs=1)
    if n == 1000:  # the default launch holds several rows per program, in runs
        plan = ops._forward_plan(n, dtype, True, False, True, False, False, True, False, None, None)
        assert plan[0] > 1 and plan[2]["RUNS"] > 1
    for runs in runs_tried:
        assert_all_bits(ops.rms_norm_impl(x, w, r, 1e-6, 1.0, "llama", dtype, runs=runs), want_rms)
        assert_all_bits(ops.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", dtype, runs=runs),
                        ops.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", dtype, runs=1))
        assert_all_bits(ops.layer_norm_impl(x, w, b, 1e-5, runs=runs), want_ln)
        assert_all_bits(ops.rms_norm_backward_impl(dy, None, x, w, rms_rstd, 0.0, "llama", dtype, None, True,
                                                   runs=runs), want_rms_dx)
        for paired in (True, False):
            assert_all_bits(ops.layer_norm_backward_impl(dy, x, w, mean, rstd, True, dtype, runs=runs,
                                                         paired_sums=paired), want_ln_dx)
    assert_bits(want_rms[0], ref.rms_norm(x, w, 1e-6, r, offset=1.0)[0])
    assert_bits(want_ln[0], ref.layer_norm(x, w, b, 1e-5)[0])


def test_runs_refusals():
    def plan(n, **kw):
        return ops._forward_plan(n, torch.bfloat16, True, False, True, False, False, True, False, None, None,
                                 **kw)[2]
    assert plan(16384, runs=16)["RUNS"] == 16 and plan(16384, runs=16)["LOG2_RUNS"] == 4
    # the default: runs of 32 vectors where a row has more than one segment, none otherwise
    assert plan(16384)["RUNS"] == 16 and plan(5000)["RUNS"] == 16 and plan(4096)["RUNS"] == 1
    assert plan(16384, runs=1)["RUNS"] == 1 and plan(33)["RUNS"] == 1
    assert plan(1024)["RUNS"] == 4  # several rows per program: a row on its own warps
    assert ops._forward_plan(1024, torch.bfloat16, True, False, True, False, False, True, False, 1, None)[2][
        "RUNS"] == 1
    assert ops._forward_plan(16384, torch.float32, True, False, True, False, False, True, False, None,
                             None)[2]["RUNS"] == 32
    assert ops._backward_plan(64, 8192, torch.bfloat16, True, False, True, False, True, False, True, False, 8,
                              None, None)["RUNS"] == 16
    for bad in (0, 3, 1024):
        with pytest.raises(ValueError, match=rf"norm: runs must be a power of two from 1 to 512 \(groups per "
                                             rf"segment\), got {bad!r}"):
            plan(16384, runs=bad)


def test_launch_choices_of_other_types_are_checked_after_a_cached_plan():
    # the plans are cached; an equal value of another type (2.0, True) must not hit a checked 2's entry
    def plan(**kw):
        return ops._forward_plan(16384, torch.bfloat16, True, False, True, False, False, True, False, None, None,
                                 **kw)
    assert plan(runs=2)[2]["RUNS"] == 2
    with pytest.raises(ValueError, match="norm: runs must be a power of two from 1 to 512 \\(groups per segment\\), "
                                         "got 2.0"):
        plan(runs=2.0)
    with pytest.raises(ValueError, match="got True"):
        ops._forward_plan(16384, torch.bfloat16, True, False, True, False, False, True, False, None, None, runs=1)
        plan(runs=True)


def test_store_hint_defaults_to_rows_read_twice():
    def plan(n, **kw):
        return ops._forward_plan(n, torch.bfloat16, True, False, True, False, False, True, False, None, None,
                                 **kw)[2]
    # the stores keep out of L2's way while a row waits for its second read
    assert plan(16384, read_twice=True)["STORE_POLICY"] == ops._READ_TWICE_STORE_POLICY
    assert plan(4096)["STORE_POLICY"] == ops._READ_TWICE_STORE_POLICY  # read twice by default
    assert "STORE_POLICY" not in plan(16384) and "STORE_POLICY" not in plan(2048)
    assert "STORE_POLICY" not in plan(16384, store_hint="") and "STORE_POLICY" not in plan(4096, store_hint="")
    assert plan(4096, store_hint="evict_first")["STORE_POLICY"] == "evict_first"
    with pytest.raises(ValueError, match="norm: store_hint must be one of None, '', 'evict_first', got 'evict_last'"):
        plan(4096, store_hint="evict_last")
    with pytest.raises(ValueError, match="norm: max_registers must be None or an int from 24 to 255, got 8"):
        plan(4096, max_registers=8)


def test_hold_16bit_refusals():
    def plan(n, dtype=torch.bfloat16, **kw):
        return ops._forward_plan(n, dtype, True, False, True, False, False, True, False, None, None, **kw)[2]
    assert not plan(4096)["HOLD_16BIT"] and not plan(16384)["HOLD_16BIT"]  # a launch choice, off by default
    assert plan(16384, hold_16bit=True)["HOLD_16BIT"] and not plan(16384, hold_16bit=True)["READ_TWICE"]
    with pytest.raises(ValueError, match="hold_16bit=True holds 16-bit rows, got torch.float32"):
        plan(4096, torch.float32, hold_16bit=True)
    with pytest.raises(ValueError, match="hold_16bit=True holds the row that read_twice=True reads again"):
        plan(16384, hold_16bit=True, read_twice=True)
    def backward_holds(n, is_rms, dtype=torch.bfloat16, **kw):
        return ops._backward_plan(64, n, dtype, is_rms, False, True, False, True, False, True, not is_rms, 8, None,
                                  None, **kw)["HOLD_16BIT"]
    assert backward_holds(4096, False) and backward_holds(3000, False)  # LayerNorm rows of a 4096 block
    assert not backward_holds(8192, False) and not backward_holds(2048, False) and not backward_holds(4096, True)
    assert not backward_holds(4096, False, torch.float32) and not backward_holds(4096, False, hold_16bit=False)
    with pytest.raises(ValueError, match="hold_16bit=True holds 16-bit rows, got torch.float32"):
        backward_holds(4096, True, torch.float32, hold_16bit=True)


@pytest.mark.parametrize("n", [33, 5120])
def test_layer_norm_backward_sums_paired_or_not_give_the_same_bits(n):
    x, w, dy = randn((5, n), torch.float32, seed=n), weight_like(n, torch.float32), randn((5, n), torch.float32, seed=2)
    kernel_or_skip(x)
    _, mean, rstd = ops.layer_norm_impl(x, w, None, 1e-5)
    paired = ops.layer_norm_backward_impl(dy, x, w, mean, rstd, False, torch.float32, paired_sums=True)
    single = ops.layer_norm_backward_impl(dy, x, w, mean, rstd, False, torch.float32, paired_sums=False)
    want = ref.layer_norm_backward(dy, x, w, mean, rstd)
    for a, b in zip(paired, single):
        if a is not None:
            assert_bits(a, b)
    assert_bits(paired[0], want[0])  # dx: the order of the two sums, not just their agreement


def test_layer_norm_backward_pairs_its_sums_on_rows_of_4096_or_less():
    def paired(n):
        return ops._backward_plan(1024, n, torch.bfloat16, False, False, True, False, False, False, True, True,
                                  ops.backward_config(1024, n)[0], None, None)["PAIRED_SUMS"]
    assert paired(4096) and paired(1000) and not paired(8192) and not paired(5120)


def test_read_twice_defaults_and_refusals():
    def plan(n, is_rms=True, residual=False, num_warps=None, dtype=torch.bfloat16, rows=None, **kw):
        return ops._forward_plan(n, dtype, is_rms, residual, True, not is_rms, False, True, False, rows,
                                 num_warps, **kw)[2]
    # RMSNorm rows of 8 and 16 KiB blocks are read twice by one warp per KiB, the first read kept in L2
    for n, dtype, warps in ((4096, torch.bfloat16, 8), (8192, torch.bfloat16, 16), (5120, torch.bfloat16, 16),
                            (4096, torch.float32, 16), (3000, torch.float32, 16)):
        p = plan(n, dtype=dtype)
        assert p["READ_TWICE"] and p["num_warps"] == warps and p["READ_POLICY"] == "evict_last", (n, dtype)
        assert p["STORE_POLICY"] == ops._READ_TWICE_STORE_POLICY
    # longer and shorter blocks hold their rows, as do residuals, LayerNorm and programs of several rows
    assert not plan(16384)["READ_TWICE"] and plan(16384)["num_warps"] == 8
    assert not plan(8192, dtype=torch.float32)["READ_TWICE"] and not plan(2048)["READ_TWICE"]
    assert not plan(1024)["READ_TWICE"] and not plan(4096, rows=2)["READ_TWICE"]
    assert not plan(8192, residual=True)["READ_TWICE"] and not plan(8192, is_rms=False)["READ_TWICE"]
    # with a residual, rows of 8 KiB blocks: h read back, kept in L2, by one warp per 2 KiB
    with_h = plan(4096, residual=True)
    assert with_h["READ_TWICE"] and with_h["num_warps"] == 4 and with_h["H_STORE_POLICY"] == "evict_last"
    assert with_h["READ_POLICY"] == "" and not plan(4096, residual=True, few_rows=True)["READ_TWICE"]
    assert not plan(8192, hold_16bit=True)["READ_TWICE"]
    assert not plan(8192, few_rows=True)["READ_TWICE"]  # decode batches hold their rows
    held = plan(8192, read_twice=False)
    assert not held["READ_TWICE"] and held["READ_POLICY"] == "" and "STORE_POLICY" not in held
    # asked for, it keeps the warps asked for, or one per KiB of the block up to 16
    assert plan(16384, read_twice=True, num_warps=8)["num_warps"] == 8
    assert plan(16384, read_twice=True)["num_warps"] == 16
    assert plan(8192, read_policy="")["READ_POLICY"] == ""
    assert not plan(8192, is_rms=False)["READ_TWICE"] and plan(8192, is_rms=False, read_twice=True)["READ_TWICE"]
    # with a residual, asked for: h is read back, its store kept in L2, x and the residual read plainly
    twice_h = plan(4096, residual=True, read_twice=True)
    assert twice_h["READ_TWICE"] and twice_h["H_STORE_POLICY"] == "evict_last" and twice_h["READ_POLICY"] == ""
    assert plan(4096, residual=True, read_twice=True, h_store_hint="")["H_STORE_POLICY"] == ""
    assert plan(8192, residual=True)["H_STORE_POLICY"] == "" and plan(8192)["H_STORE_POLICY"] == ""
    with pytest.raises(ValueError, match="h_store_hint='evict_last' is for rows read twice with a residual "
                                         "\\(their h is read back\\); this launch holds its rows"):
        plan(4096, residual=True, read_twice=False, h_store_hint="evict_last")
    with pytest.raises(ValueError, match="this launch has no residual"):
        plan(8192, h_store_hint="evict_first")
    with pytest.raises(ValueError, match="norm: h_store_hint must be one of None, '', 'evict_first', 'evict_last', "
                                         "got 'keep'"):
        plan(4096, residual=True, read_twice=True, h_store_hint="keep")
    with pytest.raises(ValueError, match="read_policy must be one of None, '', 'evict_first', got 'evict_last'"):
        plan(8192, read_twice=False, read_policy="evict_last")


def test_squares_fuse_only_where_they_are_exact():
    def fusion(is_rms, dtype, **kw):
        return ops._forward_plan(4096, dtype, is_rms, False, True, not is_rms, False, True, False, None, None,
                                 **kw)[2]["enable_fp_fusion"]
    # float16 squares are exact in float32; bfloat16 squares below ~2^-63 are float32 subnormals
    assert fusion(True, torch.float16)
    assert not fusion(True, torch.bfloat16) and not fusion(True, torch.float32)
    assert not fusion(False, torch.float16) and not fusion(True, torch.float16, fused_squares=False)
    with pytest.raises(ValueError, match="fused_squares=True needs RMSNorm of a float16 row"):
        fusion(False, torch.float16, fused_squares=True)
    for dtype in (torch.bfloat16, torch.float32):
        with pytest.raises(ValueError, match=str(dtype)):
            fusion(True, dtype, fused_squares=True)


# --------------------------------------------------------------------------------------------
# GPU tier
# --------------------------------------------------------------------------------------------

LENGTHS_GPU = [1, 33, 4095, 4096, 5120, 8192, 14336, 65536]


@pytest.mark.gpu
@pytest.mark.parametrize("n", LENGTHS_GPU)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_forward_matches_cpu_reference_bits(n, dtype):
    m = 64 if n <= 16384 else 8
    x, w = randn((m, n), dtype, seed=n, scale=2.0), weight_like(n, dtype)
    r = randn((m, n), torch.float32, seed=n + 1)
    xc, wc, rc = x.cuda(), w.cuda(), r.cuda()
    for casting in CASTINGS:
        assert_bits(treefold.rms_norm(xc, wc, casting=casting), ref.rms_norm(x, w, 1e-6, casting=casting)[0])
        y, h = treefold.rms_norm(xc, wc, residual=rc, offset=1.0, casting=casting, out_dtype=dtype)
        want_y, want_h, _ = ref.rms_norm(x, w, 1e-6, r, 1.0, casting, dtype)
        assert_bits(y, want_y)
        assert_bits(h, want_h)
    assert_bits(treefold.layer_norm(xc, n, wc, wc), ref.layer_norm(x, w, w, 1e-5)[0])
    assert_bits(treefold.layer_norm(xc, n), ref.layer_norm(x, None, None, 1e-5)[0])


TINY_ROWS = (4096, 33)
TINY_BF16_SCALE = 2.0 ** -72


def test_tiny_bf16_rows_would_show_fused_squares():
    # The GPU test below is only a guard if fusing bfloat16 squares would change its outputs:
    # emulate the first tree level (lane j meets lane j + 4 of each group of 8) with either
    # square fused (exact, then one rounding) and check that some rows' rstd changes, whichever
    # operand the compiler would fuse.
    x = randn(TINY_ROWS, torch.bfloat16, seed=7, scale=TINY_BF16_SCALE, device="cpu").float().numpy()
    x = np.concatenate([x, np.zeros((x.shape[0], 64 - x.shape[1]), np.float32)], axis=1)  # C(33) = 64
    rounded = (x * x).astype(np.float32)
    exact = x.astype(np.float64) ** 2
    groups = rounded.reshape(-1, 8, 8)
    exact_groups = exact.reshape(-1, 8, 8)

    def mean(level1):
        return (order.grouped_tree(level1.reshape(len(x), 32), 4) / np.float32(33)).astype(np.float32)
    plain = mean(groups[..., :4] + groups[..., 4:])
    assert np.array_equal(plain, (order.reference_sum(rounded[:, :33], dtype=torch.bfloat16)
                                  / np.float32(33)).astype(np.float32))
    assert np.all(plain > 0) and np.any(plain < np.finfo(np.float32).tiny)  # subnormal, not zero
    def rstd(m):
        return (np.float32(1.0) / np.sqrt(m)).astype(np.float32)
    for fused in (exact_groups[..., :4] + groups[..., 4:], groups[..., :4] + exact_groups[..., 4:]):
        other = rstd(mean(fused.astype(np.float32)))
        changed = other != rstd(plain)
        assert changed.sum() >= 1
        # a subnormal mean has a few significant bits: one step moves rstd by more than a
        # bfloat16 ulp, so those rows' outputs change too
        assert np.all(np.abs(other[changed] / rstd(plain)[changed] - 1) > 2.0 ** -8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,scale", [(torch.bfloat16, TINY_BF16_SCALE), (torch.float16, 2.0 ** -12)])
def test_gpu_tiny_rows_match_cpu_reference_bits(dtype, scale):
    # bfloat16 values below about 2^-63 have float32-subnormal squares, which a fused
    # multiply-add would not round as the reference does (why only float16 rows fuse theirs;
    # ``test_tiny_bf16_rows_would_show_fused_squares`` checks these rows would tell); eps = 0 and
    # rows of 33 keep the bfloat16 mean square, itself subnormal, in the output. float16 squares
    # are exact: its case checks tiny, partly subnormal float16 inputs against the reference.
    x, w = randn(TINY_ROWS, dtype, seed=7, scale=scale), weight_like(TINY_ROWS[1], dtype)
    want = ref.rms_norm(x, w, 0.0)[0]
    assert torch.isfinite(want.float()).all()
    assert_bits(treefold.rms_norm(x.cuda(), w.cuda(), eps=0.0), want)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [33, 1000, 4096, 5120, 14336])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_bits_independent_of_batch_position_and_launch(n, dtype):
    x = randn((300, n), dtype, seed=n).cuda()
    w, b = weight_like(n, dtype).cuda(), randn(n, dtype, seed=3).cuda()
    full, full_ln = treefold.rms_norm(x, w), treefold.layer_norm(x, n, w, b)
    for i in (0, 1, 129, 299):
        assert_bits(treefold.rms_norm(x[i:i + 1], w), full[i:i + 1])
        assert_bits(treefold.rms_norm(x[i:i + 37], w), full[i:i + 37])
        assert_bits(treefold.layer_norm(x[i:i + 3], n, w, b), full_ln[i:i + 3])

    def rms(**launch):
        y = torch.full_like(full, float("nan"))
        ops.launch_forward(x, None, w, None, y, None, None, None, eps=1e-6, offset=0.0, is_rms=True,
                           round_normalised=True, **launch)
        return y

    def ln(**launch):
        y = torch.full_like(full, float("nan"))
        ops.launch_forward(x, None, w, b, y, None, None, None, eps=1e-5, offset=0.0, is_rms=False,
                           round_normalised=False, **launch)
        return y

    block = ops.row_block(n)
    for rows_per_program in (1, 2, 4, 16):
        for num_warps in (1, 4, 8, 16, 32):
            if rows_per_program * block > 32 * num_warps * 64:
                continue  # at most 64 elements per thread: tiles that fit the register file
            assert_bits(rms(rows_per_program=rows_per_program, num_warps=num_warps), full)
            assert_bits(ln(rows_per_program=rows_per_program, num_warps=num_warps), full_ln)
    assert_bits(rms(read_policy="evict_first"), full)  # a cache hint on the reads changes no bits
    assert_bits(rms(store_hint="evict_first"), full)  # nor one on the stores
    assert_bits(ln(store_hint="evict_first"), full_ln)
    assert_bits(rms(read_twice=True, store_hint=""), full)
    assert_bits(rms(max_registers=96), full)  # nor a cap on the registers that makes them spill
    assert_bits(rms(fused_squares=False), full)  # nor do squares left unfused
    for read_twice in (True, False):  # nor does reading the row again after its reduction
        assert_bits(rms(read_twice=read_twice), full)
        for num_warps in (None, 8, 16):
            assert_bits(rms(read_twice=read_twice, num_warps=num_warps, read_policy="evict_last" if read_twice else ""),
                        full)
            assert_bits(ln(read_twice=read_twice, num_warps=num_warps), full_ln)
        if block <= 4096:
            assert_bits(ln(read_twice=read_twice, rows_per_program=2, read_policy=""), full_ln)
    r = randn((300, n), dtype, seed=n + 1).cuda()
    want_y, want_h, _ = ops.rms_norm_impl(x, w, r, 1e-6, 0.0, "llama", dtype)
    for launch in ({}, dict(read_twice=True), dict(read_twice=True, num_warps=16, h_store_hint="")):
        got_y, got_h, _ = ops.rms_norm_impl(x, w, r, 1e-6, 0.0, "llama", dtype, **launch)
        assert_bits(got_y, want_y)  # nor, with a residual, reading h back from its store
        assert_bits(got_h, want_h)
    if dtype != torch.float32:  # nor holding 16-bit rows as loaded, at any warps
        for num_warps in (None, 4, 16):
            assert_bits(rms(hold_16bit=True, num_warps=num_warps), full)
            assert_bits(ln(hold_16bit=True, num_warps=num_warps), full_ln)
    most = ops.row_layout(n, dtype)["LANES"] // ops.row_layout(n, dtype)["GROUP"]
    for runs in (1, 2, min(16, most), min(32, most)):  # nor cutting the segments into runs, at any warps
        for num_warps in (None, 4, 8):
            assert_bits(rms(runs=runs, num_warps=num_warps), full)
            assert_bits(ln(runs=runs, num_warps=num_warps), full_ln)
        assert_bits(rms(runs=runs, read_twice=True), full)


@pytest.mark.gpu
@pytest.mark.parametrize("n,dtype", [(4096, torch.bfloat16), (8192, torch.bfloat16), (4096, torch.float32),
                                     (5120, torch.float16)])
def test_gpu_large_batches_read_twice_give_the_bits_of_small_ones(n, dtype):
    # launches of _READ_TWICE_MIN_ROWS rows or more read rows of 8 and 16 KiB twice, smaller ones
    # hold them: a row's bits must not depend on which its batch took
    m = ops._READ_TWICE_MIN_ROWS
    x = randn((m, n), dtype, seed=n).cuda()
    r = randn((m, n), dtype, seed=n + 1).cuda()
    w = weight_like(n, dtype).cuda()
    assert ops._forward_plan(n, dtype, True, False, True, False, False, True, False, None, None)[2]["READ_TWICE"]
    full = treefold.rms_norm(x, w)
    full_y, full_h = treefold.rms_norm(x, w, residual=r)
    for i in (0, 1, m - 37):
        assert_bits(treefold.rms_norm(x[i:i + 37], w), full[i:i + 37])
        y, h = treefold.rms_norm(x[i:i + 37], w, residual=r[i:i + 37])
        assert_bits(y, full_y[i:i + 37])
        assert_bits(h, full_h[i:i + 37])
    xi, ri = x.clone(), r.clone()  # in place, h read back from the residual's memory
    treefold.fused_add_rms_norm_(xi, ri, w, 1e-6)
    assert_bits(xi, full_y)
    assert_bits(ri, full_h)
    assert_bits(full[:64].cpu(), ref.rms_norm(x[:64].cpu(), w.cpu(), 1e-6)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [5120, 14336, 16384, 65536])
def test_gpu_rows_shared_among_programs_give_the_same_bits(n):
    m = 1000 if n <= 16384 else 64
    x = randn((m, n), torch.bfloat16, seed=n).cuda()
    r = randn((m, n), torch.bfloat16, seed=n + 1).cuda()
    w, b = weight_like(n, torch.bfloat16).cuda(), randn(n, torch.bfloat16, seed=3).cuda()
    segments = order.num_segments(n)
    want = ops.rms_norm_impl(x, w, r, 1e-6, 1.0, "llama", torch.bfloat16, rows_per_program=1)
    want_ln = ops.layer_norm_impl(x, w, b, 1e-5, rows_per_program=1)
    for held in (1, 2, 4):
        if held >= segments:
            continue
        for _ in range(2):  # run to run, the arrival counters new each time
            got = ops.rms_norm_impl(x, w, r, 1e-6, 1.0, "llama", torch.bfloat16, segments_per_program=held)
            for g, g_want in zip(got, want):
                assert_bits(g, g_want)
            got = ops.layer_norm_impl(x, w, b, 1e-5, segments_per_program=held)
            for g, g_want in zip(got, want_ln):
                assert_bits(g, g_want)
    rows = slice(0, 64)  # the CPU reference, bit for bit
    want_y, want_h, _ = ref.rms_norm(x[rows].cpu(), w.cpu(), 1e-6, r[rows].cpu(), 1.0, "llama", torch.bfloat16)
    assert_bits(treefold.rms_norm(x[rows], w, residual=r[rows], offset=1.0)[0].cpu(), want_y)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 33, 4095, 4096, 5120, 14336, 65536])
def test_gpu_backward_matches_cpu_reference_bits(n):
    # blocks of rows longer than 4096: 1100 rows fold 9 per block, 300 rows 3 (the row loop's
    # trip count at run time; 8 at 4096, a constant); each block's next row loaded ahead below
    m = 1100 if n <= 16384 else 300
    x = randn((m, n), torch.float32, seed=n)
    w, b = weight_like(n, torch.float32), randn(n, torch.float32, seed=2)
    r = randn((m, n), torch.float32, seed=n + 1)
    dy, dh = randn((m, n), torch.float32, seed=5), randn((m, n), torch.float32, seed=6)
    xc, wc, rc = (t.cuda().requires_grad_() for t in (x, w, r))
    y, h = treefold.rms_norm(xc, wc, residual=rc)
    got = torch.autograd.grad((y, h), (xc, wc, rc), (dy.cuda(), dh.cuda()))
    _, want_h, rstd = ref.rms_norm(x, w, 1e-6, r)
    want_dx, _, want_dw = ref.rms_norm_backward(dy, want_h, w, rstd, dh_out=dh)
    assert_bits(got[0], want_dx)
    assert_bits(got[1], want_dw)
    assert_bits(got[2], want_dx)
    ahead = ops.rms_norm_backward_impl(dy.cuda(), dh.cuda(), want_h.cuda(), wc.detach(), rstd.cuda(), 0.0, "llama",
                                       torch.float32, None, True, prefetch=True)
    assert_bits(ahead[0], want_dx)
    assert_bits(ahead[2], want_dw)
    bc = b.cuda().requires_grad_()
    got = torch.autograd.grad(treefold.layer_norm(xc, n, wc, bc), (xc, wc, bc), dy.cuda())
    _, mean, rstd = ref.layer_norm(x, w, b, 1e-5)
    want = ref.layer_norm_backward(dy, x, w, mean, rstd, bias_dtype=torch.float32)
    for g, g_want in zip(got, want):
        assert_bits(g, g_want)


@pytest.mark.gpu
def test_gpu_backward_is_deterministic_and_launch_independent():
    m, n = 4096, 4096
    x = randn((m, n), torch.bfloat16, seed=1).cuda().requires_grad_()
    w = weight_like(n, torch.bfloat16).cuda().requires_grad_()
    dy = randn((m, n), torch.bfloat16, seed=2).cuda()
    first = torch.autograd.grad(treefold.rms_norm(x, w), (x, w), dy)
    for _ in range(3):
        again = torch.autograd.grad(treefold.rms_norm(x, w), (x, w), dy)
        assert_bits(again[0], first[0])
        assert_bits(again[1], first[1])
    _, _, rstd = ops.rms_norm_impl(x.detach(), w.detach(), None, 1e-6, 0.0, "llama", torch.bfloat16)
    for num_warps in (4, 8, 16):
        for num_stages in (1, 2, 3):
            for prefetch in (False, True):
                dx, _, dw = ops.rms_norm_backward_impl(dy, None, x.detach(), w.detach(), rstd, 0.0, "llama",
                                                       torch.bfloat16, None, True, num_warps=num_warps,
                                                       num_stages=num_stages, prefetch=prefetch)
                assert_bits(dx, first[0])
                assert_bits(dw, first[1])


@pytest.mark.gpu
def test_gpu_layer_norm_backward_is_deterministic_and_launch_independent():
    # dw and db are column sums of per-program partials in the treefold order: the same bits
    # run to run and under every launch choice that keeps the programs' rows
    m, n = 4096, 4096
    x = randn((m, n), torch.bfloat16, seed=1).cuda().requires_grad_()
    w = weight_like(n, torch.bfloat16).cuda().requires_grad_()
    b = randn(n, torch.bfloat16, seed=3).cuda().requires_grad_()
    dy = randn((m, n), torch.bfloat16, seed=2).cuda()
    first = torch.autograd.grad(treefold.layer_norm(x, n, w, b), (x, w, b), dy)
    for _ in range(3):
        again = torch.autograd.grad(treefold.layer_norm(x, n, w, b), (x, w, b), dy)
        for g, g_first in zip(again, first):
            assert_bits(g, g_first)
    _, mean, rstd = ops.layer_norm_impl(x.detach(), w.detach(), b.detach(), 1e-5)
    for num_warps in (4, 8, 16):
        for prefetch in (False, True):
            got = ops.layer_norm_backward_impl(dy, x.detach(), w.detach(), mean, rstd, True, torch.bfloat16,
                                               num_warps=num_warps, prefetch=prefetch)
            for g, g_first in zip(got, first):
                assert_bits(g, g_first)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4096, 14336])
def test_gpu_bf16_matches_hugging_face(n):
    x = randn((4096 if n == 4096 else 1024, n), torch.bfloat16, seed=3, scale=3.0).cuda()
    w = weight_like(n, torch.bfloat16).cuda()
    check_llama_agreement(x, w)
    wg = randn(n, torch.bfloat16, seed=4, scale=0.3).cuda()
    got = treefold.rms_norm(x, wg, casting="gemma", offset=1.0).cpu()
    assert agreement(got, hf_gemma_rms_norm(x, wg, 1e-6).cpu()) >= 0.9999
    r = randn(x.shape, torch.bfloat16, seed=5).cuda()
    y, h = treefold.rms_norm(x, w, residual=r)
    engine_y, engine_h = vllm_fused_add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(h, engine_h)
    assert agreement(y.cpu(), engine_y.cpu(), max_ulps=2) >= 0.9999  # the "llama" rounding, as above


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(1, 4096), (64, 8192), (4096, 5120)])
def test_gpu_fused_add_rms_norm_with_pdl_waits_for_the_kernel_before_it(m, n):
    """With enable_pdl the norm may start before the kernel that writes its x finishes: it must
    still read what that kernel wrote (the bits of the ordinary launch), call after call."""
    base = randn((m, n), torch.bfloat16, seed=n, device="cuda")
    r0 = randn((m, n), torch.bfloat16, seed=n + 1, device="cuda")
    w = weight_like(n, torch.bfloat16).cuda()
    want_x, want_r = torch.empty_like(base), r0.clone()
    torch.mul(base, 3.0, out=want_x)
    treefold.fused_add_rms_norm_(want_x, want_r, w, 1e-6)
    x, r = torch.empty_like(base), torch.empty_like(r0)
    for _ in range(20):
        r.copy_(r0)
        torch.mul(base, 3.0, out=x)  # the kernel just before writes x
        treefold.fused_add_rms_norm_(x, r, w, 1e-6, enable_pdl=True)
        assert_bits(x, want_x)
        assert_bits(r, want_r)


@pytest.mark.gpu
def test_gpu_layer_norm_offset_rows():
    x = (randn((1024, 4096), torch.float64, seed=5) + 10_000.0).to(torch.float32).cuda()
    y, _, rstd = ops.layer_norm_impl(x, None, None, 1e-5)
    assert not bool(torch.isnan(y).any())
    var64 = x.double().var(-1, unbiased=False)
    assert ((1.0 / rstd.double() ** 2 - 1e-5 - var64).abs() / var64).max().item() <= 1e-5


@pytest.mark.gpu
def test_gpu_torch_compile_inductor_matches_eager():
    x = randn((64, 4096), torch.bfloat16).cuda().requires_grad_()
    r = randn((64, 4096), torch.bfloat16, seed=1).cuda()
    # one use per parameter, so that no gradient is a sum whose order the compiler may choose
    w, w2, b2 = (weight_like(4096, torch.bfloat16, seed=s).cuda().requires_grad_() for s in (1, 2, 3))

    def step(x, r, w, w2, b2):
        y, h = treefold.rms_norm(x, w, residual=r)
        return treefold.layer_norm(y, 4096, w2, b2), h

    inputs = (x, r, w, w2, b2)
    outs, outs_c = step(*inputs), torch.compile(step, fullgraph=True)(*inputs)
    for o, o_c in zip(outs, outs_c):
        assert_bits(o_c, o)
    dz = randn(outs[0].shape, torch.bfloat16, seed=7).cuda()
    params = (x, w, w2, b2)
    for g, g_c in zip(torch.autograd.grad(outs[0], params, dz), torch.autograd.grad(outs_c[0], params, dz)):
        assert_bits(g_c, g)


def test_modules_reject_bad_arguments_by_name():
    from treefold.nn import LayerNorm, RMSNorm
    with pytest.raises(ValueError, match=r"RMSNorm: normalized_shape must be one or more positive ints, got \(-1,\)"):
        RMSNorm(-1)
    with pytest.raises(TypeError, match="LayerNorm: normalized_shape must be an int or a sequence of ints, got str"):
        LayerNorm("8")
    with pytest.raises(ValueError, match="RMSNorm: casting must be one of 'llama', 'gemma', 'none', got 'bad'"):
        RMSNorm(8, casting="bad")
    with pytest.raises(TypeError, match="RMSNorm: casting must be a str .*, got NoneType"):
        RMSNorm(8, casting=None)
    # flags are bools (a string "False" would otherwise be taken as true)
    with pytest.raises(TypeError, match="RMSNorm: elementwise_affine must be a bool, got str"):
        RMSNorm(8, elementwise_affine="False")
    with pytest.raises(TypeError, match="LayerNorm: elementwise_affine must be a bool, got NoneType"):
        LayerNorm(8, elementwise_affine=None)
    with pytest.raises(TypeError, match="LayerNorm: bias must be a bool, got int"):
        LayerNorm(8, bias=1)
    # the parameters' dtype and device, named before torch's factory sees them
    with pytest.raises(TypeError, match="RMSNorm: dtype must be a floating-point torch.dtype or None, got torch.int64"):
        RMSNorm(8, dtype=torch.int64)
    with pytest.raises(TypeError, match="LayerNorm: dtype must be a floating-point torch.dtype or None, got str"):
        LayerNorm(8, dtype="float32")
    with pytest.raises(ValueError, match="RMSNorm: device 'nope' names no device torch knows"):
        RMSNorm(8, device="nope")
    with pytest.raises(TypeError, match="LayerNorm: device must be a torch.device, a str, an int or None, got float"):
        LayerNorm(8, device=1.5)
    assert LayerNorm(8, dtype=torch.float64, device="cpu").weight.dtype == torch.float64
    with pytest.raises(TypeError, match=r"RMSNorm: normalized_shape must be an int or a sequence of ints, got a tensor "
                                        r"of dtype torch.float32 and shape \(\)"):
        RMSNorm(torch.tensor(8.0))
    with pytest.raises(TypeError, match=r"LayerNorm: normalized_shape must be an int or a sequence of ints, got a NumPy "
                                        r"array of dtype int64 and shape \(1, 2\)"):
        LayerNorm(np.array([[2, 4]]))
    assert RMSNorm(torch.tensor([2, 4])).normalized_shape == (2, 4) == LayerNorm(np.array([2, 4])).normalized_shape
    with pytest.raises(TypeError, match="RMSNorm: x must be a torch.Tensor, got list"):
        RMSNorm(8)([1.0])
    with pytest.raises(ValueError, match=r"RMSNorm: expected residual with trailing shape \(2, 4\), got \(5,\)"):
        RMSNorm((2, 4))(torch.randn(3, 2, 4), torch.randn(5))
    with pytest.raises(ValueError, match=r"RMSNorm: residual has shape \(1, 2, 4\), expected x's shape \(3, 2, 4\)"):
        RMSNorm((2, 4))(torch.randn(3, 2, 4), torch.randn(1, 2, 4))
    # the constructor checks what forward would (a string offset is not taken as a number)
    with pytest.raises(TypeError, match="RMSNorm: offset must be a number, got str"):
        RMSNorm(8, offset="1")
    with pytest.raises(TypeError, match="RMSNorm: offset must be a number, got NoneType"):
        RMSNorm(8, offset=None)
    with pytest.raises(ValueError, match="RMSNorm: eps must be >= 0.0, got -1.0"):
        RMSNorm(8, eps=-1.0)
    with pytest.raises(ValueError, match="LayerNorm: eps must be finite, got nan"):
        LayerNorm(8, eps=float("nan"))
    with pytest.raises(TypeError, match="RMSNorm: normalized_shape must be an int or a sequence of ints, got float"):
        RMSNorm((4.0,))
    # a weight replaced after construction must still have the normalised shape
    for wrong in (8, 16):
        m = RMSNorm((4, 4))
        m.weight = torch.nn.Parameter(torch.ones(wrong))
        with pytest.raises(ValueError, match=rf"RMSNorm: weight has shape \({wrong},\), expected normalized_shape \(4, 4\)"):
            m(torch.randn(2, 4, 4))


def _second_derivatives(fn, tensors, parameters=False):
    """First gradients of fn's outputs (fixed cotangents) and the gradients of a penalty on them
    (the outputs' sums plus the squared first gradients), as float64."""
    ts = [t.clone().requires_grad_() for t in tensors]
    if parameters:
        ts = [torch.nn.Parameter(t.detach()) for t in ts]
    out = fn(*ts)
    outs = out if isinstance(out, tuple) else (out,)
    dys = [torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o) + 0.3 for o in outs]
    grads = torch.autograd.grad(outs, ts, dys, create_graph=True)
    penalty = torch.autograd.grad(sum(o.sum() for o in outs) + sum(g.pow(2).sum() for g in grads), ts)
    return [g.detach().double() for g in grads] + [p.double() for p in penalty]


@pytest.mark.parametrize("casting", ["llama", "gemma", "none"])
def test_second_derivatives_are_torchs(casting):
    # a backward recorded with create_graph is torch's operations (float32, statistics recomputed
    # from x), so a gradient penalty differentiates through rstd's dependence on x too; plain
    # tensors take the eager Functions, parameters the registered ops' autograd
    g = torch.Generator().manual_seed(31)
    x, w, r, b = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((3, 33), (33,), (3, 33), (33,)))

    def rms64(x, w, offset, r=None):
        h = x if r is None else x + r
        y = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6) * (w + offset)
        return y if r is None else (y, h)

    cases = [(lambda x, w: treefold.rms_norm(x, w, 1e-6, offset=o, casting=casting), lambda x, w: rms64(x, w, o), (x, w))
             for o in (0.0, 1.0)]
    cases.append((lambda x, w, r: treefold.rms_norm(x, w, 1e-6, residual=r, casting=casting),
                  lambda x, w, r: rms64(x, w, 0.0, r), (x, w, r)))
    if casting == "llama":
        cases.append((lambda x, w, b: treefold.layer_norm(x, 33, w, b, 1e-5),
                      lambda x, w, b: torch.nn.functional.layer_norm(x, (33,), w, b, 1e-5), (x, w, b)))
    for ours, theirs, tensors in cases:
        want = _second_derivatives(theirs, tensors)
        for parameters in (False, True):
            got = _second_derivatives(ours, [t.float() for t in tensors], parameters)
            for a, e in zip(got, want):
                torch.testing.assert_close(a, e, rtol=1e-5, atol=2e-5)


def test_numpy_scalars_are_accepted_like_python_numbers():
    import numpy as np
    from treefold.nn import LayerNorm, RMSNorm
    x = torch.randn(3, 8)
    assert torch.equal(treefold.rms_norm(x, None, np.float32(1e-6)), treefold.rms_norm(x, None, 1e-6))
    # as torch's modules take them
    assert RMSNorm(np.int64(8)).normalized_shape == (8,) and LayerNorm((np.int32(2), 4)).normalized_shape == (2, 4)
    assert RMSNorm(np.array([4, 4])).normalized_shape == (4, 4) and LayerNorm(torch.Size([3])).normalized_shape == (3,)


def test_tensors_on_other_devices_are_refused_by_name():
    with pytest.raises(ValueError, match="rms_norm: x is on meta; treefold runs on cuda and cpu tensors"):
        treefold.rms_norm(torch.randn(3, 8, device="meta"))


def test_prepared_keys_hold_only_values_the_full_path_accepts():
    from treefold._ops import norms as ops
    x = torch.randn(2, 8)
    w = torch.randn(8)
    key = ops._prepared_key(False, x, None, w, None, 1e-5, 0.0, "", None, 8)
    assert key is not None and key == ops._prepared_key(False, x, None, w, None, 1e-5, 0, "", None, (8,)[0])
    # values equal to a valid key but of types the full path rejects never form a key
    for shape in (8.0, (8.0,), [8], True):
        assert ops._prepared_key(False, x, None, w, None, 1e-5, 0.0, "", None, shape) is None
    assert ops._prepared_key(True, x, None, w, None, 1e-6, 0.0, "llama", "bf16", None) is None
    assert ops._prepared_key(True, x, None, w, None, True, 0.0, "llama", None, None) is None
    # parameters are plain enough (the nn modules pass them); other subclasses are not
    assert ops._prepared_key(True, x, None, torch.nn.Parameter(w), None, 1e-6, 0.0, "llama", None, None) is not None

    class Sub(torch.Tensor):
        pass

    assert ops._prepared_key(True, x, None, w.as_subclass(Sub), None, 1e-6, 0.0, "llama", None, None) is None
