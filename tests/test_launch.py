"""The lean launch path: same results as Triton's own, cache keyed on what Triton specialises."""
import os

import pytest
import torch

from treefold._ops.launch import Launcher, _specialise
import numpy as np

from treefold import order
import triton
import triton.language as tl

from treefold.kernels.combine import tree_sum


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, row_stride, LANES: tl.constexpr, LOG2_LANES: tl.constexpr,
                    GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr):
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * row_stride + tl.arange(0, LANES)[None, :])
    tl.store(out_ptr + row + tl.arange(0, 1), tree_sum(x, 1, LANES, LOG2_LANES, GROUP, LOG2_GROUP))


def _spec(value):
    return _specialise((value,))[0][0]


def test_spec_separates_what_triton_specialises_on():
    assert _spec(1) != _spec(2)          # == 1
    assert _spec(16) != _spec(17)        # divisible by 16
    assert _spec(1 << 31) != _spec(16)   # needs 64 bits
    a = torch.empty(8, dtype=torch.float32)
    assert _spec(a) != _spec(a.to(torch.bfloat16))
    assert _spec(a[1:]) != _spec(a)      # 16-byte alignment
    assert _spec(True) != _spec(1) and _spec(2.0) != _spec(2)


def test_integers_are_keyed_as_triton_specialises_them():
    # a seed or an offset that changes on every call keeps its compiled launch
    assert _spec(12345) == _spec(12347) and _spec(-5) == _spec(7) and _spec(32) == _spec(4096)
    assert _spec(0) == _spec(16) and _spec((1 << 31) + 1) == _spec((1 << 40) + 3)
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:
        pytest.skip("this Triton has no native_specialize_impl")
    values = [0, 1, 2, 3, 15, 16, 17, 31, 32, -1, -16, -17, (1 << 31) - 16, (1 << 31) - 1, 1 << 31,
              (1 << 31) + 16, -(1 << 31), -(1 << 31) - 1, -(1 << 31) - 16, (1 << 62) + 5, (1 << 63) - 16,
              1 << 63, (1 << 63) + 1, (1 << 64) - 16]
    triton_key = {v: native_specialize_impl(BaseBackend, v, False, True, True) for v in values}
    for a in values:
        for b in values:
            assert (_spec(a) == _spec(b)) == (triton_key[a] == triton_key[b]), (a, b, triton_key[a], triton_key[b])


def test_integers_triton_does_not_specialise_are_keyed_by_their_type():
    # a kernel's do_not_specialize arguments (the sampling kernels' seed and offset): one key for
    # 1, multiples of 16 and any other 32-bit value, as Triton compiles one kernel for them
    from treefold._ops.launch import int_type_key
    assert int_type_key(1) == int_type_key(16) == int_type_key(3) == int_type_key(-(1 << 31))
    assert int_type_key(1 << 31) != int_type_key(3) and int_type_key(1 << 63) != int_type_key(1 << 31)
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:
        pytest.skip("this Triton has no native_specialize_impl")
    values = [0, 1, 2, 15, 16, 17, -1, -16, (1 << 31) - 1, 1 << 31, -(1 << 31), -(1 << 31) - 1, (1 << 63) - 16,
              1 << 63, (1 << 64) - 16]
    triton_key = {v: native_specialize_impl(BaseBackend, v, False, False, True) for v in values}
    for a in values:
        for b in values:
            assert (int_type_key(a) == int_type_key(b)) == (triton_key[a] == triton_key[b]), (a, b)


@triton.jit(do_not_specialize=["step"])
def _stepped_kernel(out_ptr, step, scale):
    tl.store(out_ptr + tl.arange(0, 1), (step * scale).to(tl.float32))


def test_launcher_keys_unspecialised_integers_by_type_and_specialised_ones_by_value():
    launcher = Launcher(_stepped_kernel)
    assert launcher._unspecialised == (1,)
    out = torch.empty(1)
    keys = {v: launcher._typed(_specialise((out, v, 5))[0], (out, v, 5)) for v in (1, 3, 16)}
    assert keys[1] == keys[3] == keys[16]  # step: its type alone
    scale_keys = {v: launcher._typed(_specialise((out, 3, v))[0], (out, 3, v)) for v in (1, 3, 16)}
    assert len(set(scale_keys.values())) == 3  # scale: as Triton specialises it
    assert launcher.int_key_of(1)(1) == launcher.int_key_of(1)(16) and launcher.int_key_of(2)(1) != launcher.int_key_of(2)(16)


def test_sampling_kernels_do_not_specialise_seeds_and_offsets():
    # a decode loop's offset meets 1 and multiples of 16: no kernel that draws random numbers
    # may compile again for them, nor its prepared launches decline them
    from treefold._ops import sampling as ops
    launchers = [v for v in vars(ops).values() if isinstance(v, Launcher)]
    drawing = [l for l in launchers if l.takes("seed") or l.takes("offset")]
    assert len(drawing) >= 5
    for launcher in drawing:
        assert {launcher._runtime_names[i] for i in launcher._unspecialised} == {"seed", "offset"}, launcher.kernel
        assert launcher.int_key_of(launcher._runtime_names.index("offset"))(1) == \
            launcher.int_key_of(launcher._runtime_names.index("offset"))(16)


def test_prepared_launch_takes_any_value_of_an_unspecialised_integer():
    from treefold._ops.launch import PreparedLaunch, int_type_key
    launched = []
    prepared = PreparedLaunch((lambda *a: launched.append(a), False, False), (1, 1, 1), None, None,
                              [0, 5], ((0,),), 0, ((1, int_type_key(5), int_type_key),))
    assert all(prepared.accepts((v,)) for v in (1, 16, 7, -3))
    assert not prepared.accepts((1 << 40,))  # another type: another kernel


def test_tensors_are_passed_as_their_addresses():
    a = torch.empty(8, dtype=torch.float32)
    _, run = _specialise((a, 3, 0.5))
    assert run == (a.data_ptr(), 3, 0.5)


class _RecordingLaunch:
    """Stands for a PreparedLaunch: records the addresses it would launch with."""

    def __init__(self):
        self.calls = []

    def __call__(self, *tensors):
        self.calls.append([t.data_ptr() for t in tensors])
        return True


@pytest.mark.parametrize("rows,segments,partials,arrivals", [(1, 38, "pq", False), (3, 5, "pq", True),
                                                             (64, 38, "", False), (7, 1, "p", False)])
def test_prepared_call_places_its_buffers_on_16_byte_boundaries(rows, segments, partials, arrivals):
    # the buffers a prepared call allocates anew: one partials array per letter, each starting
    # on a 16-byte boundary whatever rows * segments is, after the input and output, then the
    # arrival counters; every launch gets the same addresses
    from treefold._ops.softmax import _PreparedCall
    launches = (_RecordingLaunch(), _RecordingLaunch())
    call = _PreparedCall(launches, partials, arrivals, rows, segments)
    x, out = torch.empty(rows, 64, dtype=torch.bfloat16), torch.empty(rows, 64, dtype=torch.bfloat16)
    assert call(x, out)
    addresses = launches[0].calls[0]
    assert launches[1].calls == [addresses]
    assert addresses[:2] == [x.data_ptr(), out.data_ptr()]
    assert len(addresses) == 2 + len(partials) + arrivals
    assert all(a % 16 == 0 for a in addresses)
    parts = addresses[2:2 + len(partials)]
    assert all(b - a >= 4 * rows * segments for a, b in zip(parts, parts[1:]))  # no overlap


def test_prepared_call_launches_nothing_when_one_launch_would_decline():
    from treefold._ops.softmax import _PreparedCall
    launches = (_RecordingLaunch(), _RecordingLaunch())
    call = _PreparedCall(launches, "pq", False, 1, 38)
    base = torch.empty(65, dtype=torch.bfloat16)
    assert not call(base[1:], torch.empty(64, dtype=torch.bfloat16))  # input off the 16-byte grid
    assert launches[0].calls == [] and launches[1].calls == []


def test_prepared_launch_takes_integers_specialised_as_the_one_it_was_made_with(monkeypatch):
    # Triton specialises an integer on being 1 and on divisibility by 16: a prepared launch made
    # with 5 in a scalar slot takes 7 or 2^31 - 3, and declines 1, 16 and 2^40 without launching
    from treefold._ops.launch import PreparedLaunch, int_key
    from treefold._ops import launch as launch_module
    # (no current device to compare: a CUDA build of torch on a machine without a driver would
    # raise when asked for one, before the launch could decline)
    monkeypatch.setattr(launch_module, "_current_device", None)
    launched = []
    prepared = PreparedLaunch((lambda *a: launched.append(a), False, False), (1, 1, 1), None, None,
                              [0, 5], ((0,),), 0, ((1, int_key(5), int_key),))
    assert prepared.accepts((7,)) and prepared.accepts(((1 << 31) - 3,))
    assert not any(prepared.accepts((v,)) for v in (1, 16, 1 << 40))
    x = torch.empty(4)
    assert not prepared(x, scalars=(16,)) and not prepared(x, scalars=(1,))
    assert launched == []


def test_prepared_launch_calls_the_c_launcher_as_triton_does(monkeypatch):
    # Triton 3.6's C entry point: grid, stream, function, cooperative and PDL flags, no scratch
    # buffers, the packed metadata, no launch metadata or hooks, then the kernel's arguments
    from treefold._ops.launch import PreparedLaunch, int_key
    from treefold._ops import launch as launch_module
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1000 + device, raising=False)
    monkeypatch.setattr(launch_module, "_current_device", lambda: 1)  # the launch's own device is current
    launched = []
    prepared = PreparedLaunch((lambda *a: launched.append(a), True, False), (5, 2, 1), "function", (4, 1, 0),
                              [0, 5, "constexpr", 0], ((0, 3),), 1, ((1, int_key(5), int_key),))
    x = torch.empty(4)
    assert prepared(x, scalars=(7,))
    assert launched == [(5, 2, 1, 1001, "function", True, False, None, None, (4, 1, 0), None, None, None,
                         x.data_ptr(), 7, "constexpr", x.data_ptr())]
    assert prepared(x.data_ptr() + 16)  # an address as an int; the scalar slot keeps its value
    assert launched[-1][13:] == (x.data_ptr() + 16, 5, "constexpr", x.data_ptr() + 16)
    # a pipeline's launches, checked by the pipeline, take the same list
    prepared.launch_addresses([x.data_ptr()], (7,))
    assert launched[-1] == launched[0]


def test_prepared_launch_runs_with_its_own_device_current(monkeypatch):
    # a model split over GPUs calls with tensors on a device other than the current one: Triton's
    # kernels are loaded per device, so the launch (and the stream it takes) must be that device's
    from treefold._ops import launch as launch_module
    from treefold._ops.launch import PreparedLaunch
    current, entered = [0], []

    class DeviceGuard:  # torch.cuda.device's part in this: make its index current, then restore
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)
            self.before, current[0] = current[0], self.index

        def __exit__(self, *exc):
            current[0] = self.before

    monkeypatch.setattr(launch_module, "_current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", DeviceGuard)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1000 + device, raising=False)
    launched = []
    prepared = PreparedLaunch((lambda *a: launched.append((current[0], a[3])), False, False), (1, 1, 1),
                              None, None, [0], ((0,),), 1)
    assert prepared(torch.empty(4))
    assert launched == [(1, 1001)] and entered == [1] and current == [0]
    current[0] = 1  # already current: no guard
    assert prepared(torch.empty(4))
    assert launched[-1] == (1, 1001) and entered == [1]


def test_wrong_argument_count_names_the_kernel():
    launch = Launcher(_row_sum_kernel)
    with pytest.raises(TypeError, match="_row_sum_kernel: expected 3 runtime arguments"):
        launch((1,), torch.empty(4))


def test_plain_path_gives_the_reference_bits():
    x = torch.randn(3, 64)
    if not x.is_cuda and not __import__("treefold").backend.INTERPRETED:
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU-only machine")
    out = torch.full((3,), float("nan"))
    Launcher(_row_sum_kernel)((3,), x, out, x.stride(0), LANES=64, LOG2_LANES=6, GROUP=4, LOG2_GROUP=2)
    assert out.numpy().tobytes() == order.reference_sum(x.numpy()).tobytes()


@pytest.mark.gpu
def test_lean_path_matches_reference_and_works_in_graph_capture():
    launch = Launcher(_row_sum_kernel)
    x = torch.randn(64, 4096, device="cuda")
    out = torch.full((64, 1), float("nan"), device="cuda")

    def run():
        launch((64,), x, out, x.stride(0), LANES=4096, LOG2_LANES=12, GROUP=4, LOG2_GROUP=2, num_warps=8)

    want = order.reference_sum(x.cpu().numpy())
    for _ in range(3):  # the first call goes through Triton, the next ones take the lean path
        out.fill_(float("nan"))
        run()
        assert out[:, 0].cpu().numpy().tobytes() == want.tobytes()
    assert len(launch._cache) == 1
    g = torch.cuda.CUDAGraph()
    out.fill_(float("nan"))
    with torch.cuda.graph(g):
        run()
    g.replay()
    torch.cuda.synchronize()
    assert out[:, 0].cpu().numpy().tobytes() == want.tobytes()


@pytest.mark.gpu
def test_prepared_eager_calls_give_the_same_bits_with_new_tensors():
    import treefold
    from treefold._ops import norms as norm_ops
    from treefold._ops import softmax as softmax_ops
    torch.manual_seed(0)
    softmax_ops._PREPARED.clear()
    norm_ops._PREPARED.clear()
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    for step in range(4):  # the first call prepares, later ones take the prepared launch
        x = torch.randn(3, 4096, device="cuda", dtype=torch.bfloat16) * (step + 1)
        want_softmax = softmax_ops.softmax_forward(x)
        want_rms = norm_ops.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", torch.bfloat16, store_stats=False)[0]
        assert torch.equal(treefold.softmax(x), want_softmax)
        assert torch.equal(treefold.log_softmax(x), softmax_ops.softmax_forward(x, log=True))
        assert torch.equal(treefold.logsumexp(x), softmax_ops.logsumexp_forward(x))
        assert torch.equal(treefold.rms_norm(x, w), want_rms)
        r = torch.randn_like(x)
        want_y, want_h, _ = norm_ops.rms_norm_impl(x, w, r, 1e-6, 0.0, "llama", torch.bfloat16, store_stats=False)
        y, h = treefold.rms_norm(x, w, residual=r)
        assert torch.equal(y, want_y) and torch.equal(h, want_h)
        b = torch.randn_like(w)
        want_ln = norm_ops.layer_norm_impl(x, w, b, 1e-5, store_stats=False)[0]
        assert torch.equal(treefold.layer_norm(x, (4096,), w, b), want_ln)
        assert torch.equal(treefold.layer_norm(x, (4096,), w), norm_ops.layer_norm_impl(x, w, None, 1e-5, store_stats=False)[0])
        # outputs of other dtypes than x's: y in float32 (casting "none" with a float32 weight,
        # out_dtype, and a float32 residual, whose h and normalised row are float32)
        w32, r32 = w.float(), r.float()
        want_none = norm_ops.rms_norm_impl(x, w32, None, 1e-6, 0.0, "none", torch.float32, store_stats=False)[0]
        got_none = treefold.rms_norm(x, w32, casting="none")
        assert got_none.dtype == torch.float32 and torch.equal(got_none, want_none)
        want_out = norm_ops.rms_norm_impl(x, w, None, 1e-6, 0.0, "llama", torch.float32, store_stats=False)[0]
        got_out = treefold.rms_norm(x, w, out_dtype=torch.float32)
        assert got_out.dtype == torch.float32 and torch.equal(got_out, want_out)
        want_y, want_h, _ = norm_ops.rms_norm_impl(x, w, r32, 1e-6, 0.0, "llama", torch.float32, store_stats=False)
        y, h = treefold.rms_norm(x, w, residual=r32)
        assert (y.dtype, h.dtype) == (torch.float32, torch.float32)
        assert torch.equal(y, want_y) and torch.equal(h, want_h)
    assert any(k[1] == (3, 4096) for k in softmax_ops._PREPARED)
    assert any(k[1] == (3, 4096) and k[0] for k in norm_ops._PREPARED)
    assert any(k[1] == (3, 4096) and not k[0] for k in norm_ops._PREPARED)
    # rms_norm with and without residual (of x's dtype and of float32), casting "none" and
    # out_dtype; layer_norm with and without bias
    assert len(norm_ops._PREPARED) == 7
    # same shape and strides, an address off the 16-byte alignment the kernel was built for:
    # the prepared launch declines and the ordinary path answers
    base = torch.randn(3 * 4096 + 1, device="cuda", dtype=torch.bfloat16)
    odd = base[1:].view(3, 4096)
    assert torch.equal(treefold.softmax(odd), softmax_ops.softmax_forward(odd))
    assert torch.equal(treefold.rms_norm(odd, w),
                       norm_ops.rms_norm_impl(odd, w, None, 1e-6, 0.0, "llama", torch.bfloat16, store_stats=False)[0])
    # a gradient still goes through autograd, not the prepared launch
    xg = torch.randn(3, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    assert treefold.rms_norm(xg, w).grad_fn is not None
    assert treefold.softmax(xg).grad_fn is not None


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(3, 4096), (2, 5, 1024), (64, 8192)])
def test_prepared_training_norm_calls_give_the_same_bits_with_new_tensors(shape):
    # rms_norm and layer_norm calls that need a gradient prepare their forward (which writes the
    # statistics) and their eager backward (the kernel and the weight gradients' column sums) on
    # the first call of a kind, and take them afterwards: outputs and gradients equal the
    # ordinary launches' for new tensors at every step
    import treefold
    from treefold._ops import norms as norm_ops
    torch.manual_seed(3)
    norm_ops._PREPARED.clear()
    n = shape[-1]
    for step in range(3):
        x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * (step + 1)).requires_grad_()
        w = torch.nn.Parameter(torch.randn(n, device="cuda", dtype=torch.bfloat16))
        b = torch.nn.Parameter(torch.randn(n, device="cuda", dtype=torch.bfloat16))
        r = torch.randn(shape, device="cuda", dtype=torch.float32, requires_grad=True)
        dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        dh = torch.randn(shape, device="cuda", dtype=torch.float32)
        xd, wd, rd = x.detach(), w.detach(), r.detach()
        y = treefold.rms_norm(x, w)
        want_y, _, rstd = norm_ops.rms_norm_impl(xd, wd, None, 1e-6, 0.0, "llama", torch.bfloat16)
        assert torch.equal(y, want_y)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        want_dx, _, want_dw = norm_ops.rms_norm_backward_impl(dy, None, xd, wd, rstd, 0.0, "llama", torch.bfloat16,
                                                              None, True)
        assert torch.equal(dx, want_dx) and torch.equal(dw, want_dw)
        # with a float32 residual: h and y in float32, the residual's own gradient
        y, h = treefold.rms_norm(x, w, residual=r)
        want_y, want_h, rstd = norm_ops.rms_norm_impl(xd, wd, rd, 1e-6, 0.0, "llama", torch.float32)
        assert torch.equal(y, want_y) and torch.equal(h, want_h)
        grads = torch.autograd.grad((y, h), (x, w, r), (dy.float(), dh))
        want_dx, want_dres, want_dw = norm_ops.rms_norm_backward_impl(
            dy.float(), dh, want_h, wd, rstd, 0.0, "llama", torch.bfloat16, torch.float32, True)
        for got, want in zip(grads, (want_dx, want_dw, want_dres)):
            assert torch.equal(got, want)
        y = treefold.layer_norm(x, (n,), w, b)
        want_y, mean, rstd = norm_ops.layer_norm_impl(xd, wd, b.detach(), 1e-5)
        assert torch.equal(y, want_y)
        grads = torch.autograd.grad(y, (x, w, b), dy)
        for got, want in zip(grads, norm_ops.layer_norm_backward_impl(dy, xd, wd, mean, rstd, True, torch.bfloat16)):
            assert torch.equal(got, want)
    # three forwards with statistics and three backwards kept, and the prepared ones launch
    forward_keys = [k for k in norm_ops._PREPARED if k[0] != "backward" and k[-1]]
    backward_keys = [k for k in norm_ops._PREPARED if k[0] == "backward"]
    assert len(forward_keys) == 3 and len(backward_keys) == 3
    for key in backward_keys:
        if not key[1]:  # LayerNorm's: dx, dw, db in new outputs
            dx, dw, db = norm_ops._PREPARED[key](dy, {"saved": xd, "weight": wd, "mean": mean, "rstd": rstd}, {})
            want = norm_ops.layer_norm_backward_impl(dy, xd, wd, mean, rstd, True, torch.bfloat16)
            assert torch.equal(dx, want[0]) and torch.equal(dw, want[1]) and torch.equal(db, want[2])


@pytest.mark.gpu
@pytest.mark.parametrize("rows,n", [(1, 151936), (64, 151936), (256, 131072), (300, 32768)])
def test_prepared_calls_of_several_launches_give_the_same_bits(rows, n):
    # decode batches take "split" (two launches, the second a dependent launch on sm_90, and the
    # partials in between), larger batches of long rows "cooperative" (zeroed arrival counters
    # every call) or "online": each prepared call allocates its buffers anew
    import treefold
    from treefold._ops import softmax as softmax_ops
    torch.manual_seed(1)
    softmax_ops._PREPARED.clear()
    for step in range(3):  # the first call prepares, later ones take the prepared launches
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) * (step + 2)
        x[0, :7] = float("-inf")
        assert torch.equal(treefold.softmax(x), softmax_ops.softmax_forward(x))
        assert torch.equal(treefold.log_softmax(x), softmax_ops.softmax_forward(x, log=True))
        assert torch.equal(treefold.logsumexp(x), softmax_ops.logsumexp_forward(x))
        assert torch.equal(treefold.softmax(x), softmax_ops.softmax_forward(x, strategy="online"))
    assert sum(k[1] == (rows, n) for k in softmax_ops._PREPARED) == 3
    # the prepared call itself launches (a call that always declined would pass the checks above
    # through the ordinary path)
    key = next(k for k in softmax_ops._PREPARED if k[0] == softmax_ops._SOFTMAX and k[1] == (rows, n))
    out = torch.full_like(x, float("nan"))
    assert softmax_ops._PREPARED[key](x, out)
    assert torch.equal(out, softmax_ops.softmax_forward(x))


@pytest.mark.gpu
@pytest.mark.parametrize("rows,n", [(3, 4096), (64, 151936), (300, 32768)])
def test_prepared_backward_calls_give_the_same_bits_with_new_tensors(rows, n):
    # the eager backward of softmax / log_softmax prepares its launches on the first call and
    # takes them afterwards; the forward with a gradient takes the forward's prepared launches
    import treefold
    from treefold._ops import softmax as softmax_ops
    torch.manual_seed(2)
    softmax_ops._PREPARED.clear()
    for step in range(3):
        for log, fn in ((False, treefold.softmax), (True, treefold.log_softmax)):
            x = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) * (step + 1)).requires_grad_()
            y = fn(x)
            assert torch.equal(y, softmax_ops.softmax_forward(x.detach(), log=log))
            dy = torch.randn_like(y)
            (dx,) = torch.autograd.grad(y, x, dy)
            assert torch.equal(dx, softmax_ops.softmax_backward(dy, y.detach(), log=log, x_dtype=x.dtype))
    backward_keys = [k for k in softmax_ops._PREPARED if k[0] == "backward"]
    assert len(backward_keys) == 2
    # the prepared backward itself launches
    key = next(k for k in backward_keys if k[1] == softmax_ops._SOFTMAX)
    y = torch.softmax(torch.randn(rows, n, device="cuda"), -1).to(torch.bfloat16)
    dy = torch.randn_like(y)
    dx = torch.full_like(y, float("nan"))
    assert softmax_ops._PREPARED[key](y, dy, dx)
    assert torch.equal(dx, softmax_ops.softmax_backward(dy, y, x_dtype=torch.bfloat16))
    # a gradient off the 16-byte grid: the prepared launch declines, the ordinary path answers
    base = torch.randn(rows * n + 1, device="cuda", dtype=torch.bfloat16)
    odd = base[1:].view(rows, n)
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = treefold.softmax(x)
    (dx,) = torch.autograd.grad(y, x, odd)
    assert torch.equal(dx, softmax_ops.softmax_backward(odd, y.detach(), x_dtype=x.dtype))


def test_launch_hooks_are_seen_however_they_are_installed(monkeypatch):
    # a profiler adds to Triton's hook chains, or sets a hook of its own: prepared launches then
    # decline, so that every launch goes through Triton's path, which calls the hooks
    from triton import knobs
    from treefold._ops.launch import PreparedLaunch, launch_hooks_active
    assert not launch_hooks_active()
    launched = []
    prepared = PreparedLaunch((lambda *a: launched.append(a), False, False), (1, 1, 1), None, None,
                              [0], ((0,),), 0)
    x = torch.empty(4)

    def hook(metadata):
        return None

    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):  # Triton's HookChain
        chain.add(hook)
        try:
            assert launch_hooks_active() and not prepared(x)
        finally:
            chain.remove(hook)
        assert not launch_hooks_active()
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", hook)
    assert launch_hooks_active() and not prepared(x)
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", None)
    assert not launch_hooks_active()
    assert launched == []


def test_block_bits_and_warp_levels_follow_tritons_layouts():
    """The layout model behind the trees' exchange between warps (``launch.block_bits``), on
    blocks whose layouts were read from Triton 3.6's TTGIR (``test_sm90_compile`` checks the
    compiled kernels themselves): bits lowest first, "R" registers, "L" lanes, "W" warps."""
    from treefold._ops.launch import block_bits, warp_levels
    # RMSNorm 16384 x 8192 bf16, 16 warps: [rows, segments, runs, 256]; the warps go to the two
    # segments, then to the runs' low bits; the runs' top bit is a register
    rows, segments, runs, span = block_bits((1, 2, 16, 256), 8, 16)
    assert (rows, segments, runs) == ([], ["W"], ["W", "W", "W", "R"])
    assert span == ["R"] * 3 + ["L"] * 5
    assert warp_levels(runs) == (1, 3) and warp_levels(segments) == (0, 0)
    # float32 8192 x 4096, one run: lanes, then 16 warps, then a register over the 1024 groups
    groups = block_bits((1, 1, 1, 4096), 4, 16)[3][2:]
    assert groups == ["L"] * 5 + ["W"] * 4 + ["R"]
    assert warp_levels(groups) == (1, 4)
    # 4096 x 16384 bf16, 8 warps: four segments take two warp bits, the runs one
    _, segments, runs, _ = block_bits((1, 4, 16, 256), 8, 8)
    assert segments == ["W", "W"] and runs == ["W", "R", "R", "R"]
    assert warp_levels(runs) == (0, 0) and warp_levels(segments) == (0, 2)
    # eight rows of a warp each: no level of a row's tree crosses warps
    assert block_bits((8, 1, 4, 256), 8, 8)[2] == ["R", "R"]
    # more warps than the block has room for: the last dimension in order takes the rest
    assert block_bits((1, 1, 2, 256), 8, 8)[2] == ["W"]
    # a run of warp levels must be at least two long to be worth an exchange; the longest wins
    assert warp_levels(["W", "R", "W", "W", "R", "W", "W", "W"]) == (0, 3)
    assert warp_levels(["W"]) == (0, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_gpu_calls_on_another_device_than_the_current_one_give_its_bits():
    # a model split over GPUs (Hugging Face's device_map="auto") calls with tensors on cuda:1 while
    # cuda:0 is current: every launch must run on the tensors' device, ordinary, prepared (second
    # and third calls) and through autograd, with the bits the same call gives on cuda:0
    import treefold
    torch.manual_seed(5)
    x0 = torch.randn(64, 4096, device="cuda:0", dtype=torch.bfloat16)
    w0 = torch.randn(4096, device="cuda:0", dtype=torch.bfloat16)
    logits0 = torch.randn(8, 151936, device="cuda:0") * 4
    calls = {
        "rms_norm": lambda x, w, z: treefold.rms_norm(x, w),
        "rms_norm residual": lambda x, w, z: treefold.rms_norm(x, w, residual=x.flip(0)),
        "layer_norm": lambda x, w, z: treefold.layer_norm(x, (4096,), w, w),
        "softmax": lambda x, w, z: treefold.softmax(z),
        "logsumexp": lambda x, w, z: treefold.logsumexp(z),
        "sum": lambda x, w, z: treefold.sum(x.float()),
        "argmax": lambda x, w, z: treefold.argmax(z, dim=-1),
        "top_k": lambda x, w, z: treefold.top_k(z, 50),
        "sample top-p": lambda x, w, z: treefold.sample(z, top_p=0.9, seed=7, offset=3),
        "sample top-k": lambda x, w, z: treefold.sample(z, top_k=20, seed=7),
        "sample greedy": lambda x, w, z: treefold.sample(z, temperature=0.0),
    }
    torch.cuda.set_device(0)
    for name, call in calls.items():
        want = call(x0, w0, logits0)
        for step in range(3):
            got = call(x0.to("cuda:1"), w0.to("cuda:1"), logits0.to("cuda:1"))
            for a, b in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
                assert b.device == torch.device("cuda:1"), name
                assert torch.equal(a, b.to("cuda:0")), (name, step)
    # training: forward and backward of the norms on cuda:1
    for fn in (lambda x, w: treefold.rms_norm(x, w), lambda x, w: treefold.layer_norm(x, (4096,), w)):
        grads = []
        for device in ("cuda:0", "cuda:1", "cuda:1"):
            x = x0.to(device).requires_grad_()
            w = w0.to(device).requires_grad_()
            y = fn(x, w)
            grads.append([t.to("cuda:0") for t in (y, *torch.autograd.grad(y, (x, w), torch.ones_like(y)))])
        for other in grads[1:]:
            assert all(torch.equal(a, b) for a, b in zip(grads[0], other))
    assert torch.cuda.current_device() == 0


@triton.jit
def _bfloat16_casts_kernel(wide_ptr, narrow_in_ptr, widened_ptr, narrowed_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = i < n
    tl.store(widened_ptr + i, tl.load(narrow_in_ptr + i, mask=keep).to(tl.float32), mask=keep)
    tl.store(narrowed_ptr + i, tl.load(wide_ptr + i, mask=keep).to(tl.bfloat16), mask=keep)


@pytest.mark.skipif(not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")),
                    reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_bfloat16_casts_in_kernels_are_torchs():
    # every kernel widens bfloat16 loads and narrows float32 results: compiled, the casts are
    # exact and round to nearest even; interpreted, treefold.backend makes them so (Triton's
    # interpreter got subnormals wrong both ways and truncated)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    every_bf16 = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    bits = torch.randint(-(1 << 31), (1 << 31) - 1, (1 << 16,), generator=g, dtype=torch.int64)
    bits[: 1 << 14] &= 0x807FFFFF  # subnormals (and zeros) of both signs
    bits[1 << 14: 1 << 15] = (bits[1 << 14: 1 << 15] & ~0xFFFF) | 0x8000  # ties: to even
    edges = [0x7F7FFFFF, 0x7F7F8000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x00008000,
             0x00018000, 0x807FFFFF, 0x00000001, 0x80000000]
    bits[-len(edges):] = torch.tensor(edges, dtype=torch.int64)
    wide = bits.to(torch.int32).view(torch.float32)
    n = wide.numel()
    widened = torch.full((n,), 7.0, device=device)
    narrowed = torch.full((n,), 7.0, device=device, dtype=torch.bfloat16)
    _bfloat16_casts_kernel[(triton.cdiv(n, 1024),)](wide.to(device), every_bf16.to(device), widened, narrowed, n,
                                                     BLOCK=1024)
    assert torch.equal(widened.cpu().view(torch.int32), every_bf16.float().view(torch.int32))
    want = wide.to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(narrowed.cpu()), nan)  # a NaN stays a NaN (its payload may differ)
    assert torch.equal(narrowed.cpu()[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.skipif(not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")),
                    reason="the kernels need TRITON_INTERPRET=1 or a GPU")
def test_bfloat16_subnormals_give_the_references_bits():
    import treefold
    from treefold.reference import norms as norms_ref
    from treefold.reference import softmax as softmax_ref
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bf = torch.bfloat16
    tiny = torch.full((4,), 9.1835e-40, dtype=bf)
    assert treefold.sum(tiny.to(device), dtype=torch.float32).item() == 4 * tiny[0].item()
    x = torch.tensor([1, 16], dtype=torch.int16).view(bf)
    assert treefold.argmax(x.to(device)).item() == 1 and treefold.amax(x.to(device)).cpu() == x[1]
    row = torch.tensor([[0.0, -88.5, -89.0, -90.0, -91.0, -92.0]], dtype=bf)
    want = torch.from_numpy(softmax_ref.order_forward(row)).to(bf)  # float32 result, rounded once
    if device == "cuda":
        # compiled, each exp is the hardware's fast one, which returns 0 below 2^-126 (documented
        # in treefold.softmax): those outputs are 0 there, not the interpreter's subnormals
        want = torch.where(want.float() < 2.0 ** -126, torch.zeros_like(want), want)
    assert torch.equal(treefold.softmax(row.to(device)).cpu().view(torch.int16), want.view(torch.int16))
    row = torch.tensor([[1.0, 9.1835e-40, -2e-39, 3e-39]], dtype=bf)
    assert torch.equal(treefold.rms_norm(row.to(device)).cpu().view(torch.int16),
                       norms_ref.rms_norm(row)[0].view(torch.int16))
