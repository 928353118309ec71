"""The compiled path, without a GPU: the launches the softmax, reduction, norm and sampling launchers
make compile for sm_90 with Triton's bundled ptxas. The interpreter accepts constructs the compiler
rejects, so the CPU tier alone would not catch a kernel that fails to build."""
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import inspect

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import treefold.backend as backend
    from treefold._ops import launch, norms, reduce

    captured = []

    class Captured(Exception):
        pass

    stop_at_first_launch = True

    def record(self, grid, *args, **kwargs):
        captured.append((self.kernel, args, kwargs))
        if stop_at_first_launch:
            raise Captured

    launch.Launcher.__call__ = record
    backend.use_kernel = lambda t: True
    TYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float64: "*fp64",
             torch.int64: "*i64", torch.int32: "*i32"}

    def type_of(v):
        if isinstance(v, torch.Tensor):
            return TYPES[v.dtype]
        if isinstance(v, float):
            return "fp32"
        return "i64" if abs(v) >= 2 ** 31 else "i32"

    bf16 = lambda *s: torch.randn(*s).bfloat16()  # noqa: E731
    calls = [
        lambda: reduce.tree_sum_rows(torch.randn(8, 4096)),
        lambda: reduce.tree_sum_rows(torch.randn(1, 1 << 20)),
        lambda: reduce.tree_sum_rows(bf16(8, 4096), square=True),
        lambda: reduce.tree_sum_rows(torch.randn(1, 1 << 20), accurate=True),
        lambda: reduce.tree_sum_rows(torch.randn(8, 4096), accurate=True, final="mean", out_dtype=torch.float32),
        lambda: reduce.extreme_rows(bf16(8, 4096), True),
        lambda: reduce.extreme_rows(torch.randn(1, 1 << 20), False),
        lambda: norms.rms_norm_impl(bf16(8, 4096), bf16(4096), bf16(8, 4096), 1e-6, 0.0, "llama", torch.bfloat16),
        lambda: norms.rms_norm_impl(torch.randn(8, 4096), None, None, 1e-6, 1.0, "gemma", torch.float32),
        lambda: norms.layer_norm_impl(bf16(8, 4096), bf16(4096), bf16(4096), 1e-5),
        # rows shared among programs (the exchange and the counter compile the same for any share)
        lambda: norms.rms_norm_impl(bf16(8, 16384), bf16(16384), bf16(8, 16384), 1e-6, 1.0, "llama", torch.bfloat16,
                                    segments_per_program=4),
        lambda: norms.layer_norm_impl(bf16(8, 16384), bf16(16384), bf16(16384), 1e-5, segments_per_program=4),
        # the backward kernel, its row loop pipelined (the default at these lengths), loading each
        # row's successor ahead in registers, and neither; 1024 rows, so that each block folds
        # several (4) rows in its loop
        lambda: norms.rms_norm_backward_impl(bf16(1024, 4096), None, bf16(1024, 4096), bf16(4096), torch.ones(1024),
                                             0.0, "llama", torch.bfloat16, None, True),
        lambda: norms.rms_norm_backward_impl(bf16(1024, 4096), None, bf16(1024, 4096), bf16(4096), torch.ones(1024),
                                             0.0, "llama", torch.bfloat16, None, True, prefetch=True),
        lambda: norms.rms_norm_backward_impl(bf16(1024, 4096), None, bf16(1024, 4096), bf16(4096), torch.ones(1024),
                                             0.0, "llama", torch.bfloat16, None, True, prefetch=False, num_stages=1),
        lambda: norms.layer_norm_backward_impl(bf16(1024, 8192), bf16(1024, 8192), bf16(8192), torch.zeros(1024),
                                               torch.ones(1024), True, torch.bfloat16),
        # LayerNorm's two row sums as one tree (the default at 4096), rows of 16384 read twice,
        # float16 squares contracted into FMAs
        lambda: norms.layer_norm_backward_impl(bf16(1024, 4096), bf16(1024, 4096), bf16(4096), torch.zeros(1024),
                                               torch.ones(1024), True, torch.bfloat16),
        lambda: norms.rms_norm_impl(bf16(8, 16384), bf16(16384), None, 1e-6, 0.0, "llama", torch.bfloat16),
        lambda: norms.rms_norm_impl(torch.randn(8, 4096).half(), torch.randn(4096).half(), None, 1e-6, 0.0, "llama",
                                    torch.float16),
    ]
    for call in calls:
        try:
            call()
        except Captured:
            pass
    # the sampling pipeline's launches read only device buffers, so every one of them is recorded
    from treefold._ops import sampling
    stop_at_first_launch = False
    # softmax: every strategy, forward and backward, with a temperature; "split" with its FINISH
    # phase as a programmatic dependent launch (sm_90) and without
    from treefold._ops import softmax as softmax_ops
    softmax_ops._dependent_launch = lambda device_type, index: True
    empty = lambda *s: torch.empty(*s, dtype=torch.bfloat16)  # noqa: E731 (nothing runs)
    softmax_ops.softmax_forward(empty(8192, 4096), temperature=0.7, strategy="block")
    softmax_ops.softmax_forward(empty(8192, 512), log=True, temperature=0.7, strategy="warp")
    softmax_ops.logsumexp_forward(empty(256, 151936), strategy="online")
    softmax_ops.softmax_backward(empty(4096, 32768), empty(4096, 32768), temperature=0.7, strategy="online")
    # the streaming loops software-pipelined (asynchronous copies into shared memory)
    pipelined = softmax_ops.Tuning(stages=3)
    softmax_ops.softmax_forward(empty(4096, 32768), strategy="online", tuning=pipelined)
    softmax_ops.softmax_backward(empty(4096, 32768), empty(4096, 32768), strategy="online", tuning=pipelined)
    softmax_ops.softmax_forward(empty(64, 151936), strategy="split", tuning=pipelined)
    softmax_ops.logsumexp_backward(empty(8), empty(8, 9000), empty(8), strategy="split")
    for pdl in (True, False):
        split = softmax_ops.Tuning(dependent_launch=pdl)
        softmax_ops.softmax_forward(empty(64, 151936), temperature=0.7, strategy="split", tuning=split)
        softmax_ops.softmax_backward(empty(2, 300000), empty(2, 300000), strategy="split", tuning=split)
    # "cooperative": the arrival counter and the wait (the same code for any programs per row)
    whole_row = softmax_ops.Tuning(segments_per_program=8)
    softmax_ops.softmax_forward(empty(64, 32768), temperature=0.7, strategy="cooperative", tuning=whole_row)
    softmax_ops.softmax_forward(empty(64, 32768), log=True, strategy="cooperative", tuning=whole_row)
    softmax_ops.softmax_backward(empty(8, 32768), empty(8, 32768), strategy="cooperative", tuning=whole_row)
    softmax_ops.logsumexp_forward(empty(64, 151936), strategy="cooperative")
    # cross-entropy: the logsumexp launches with targets, with and without label smoothing (whose
    # row sums are one more launch), forward and backward
    targets = torch.zeros(64, dtype=torch.int64)
    # (rows of one class: n = 1 arrives as a constexpr; "warp": several rows per program)
    for strategy, n, smoothing in (("block", 4096, 0.0), ("online", 32768, 0.1), ("split", 151936, 0.0),
                                   ("cooperative", 151936, 0.1), ("warp", 1, 0.1), ("warp", 100, 0.1)):
        softmax_ops.cross_entropy_forward(empty(64, n), targets, -100, smoothing, strategy=strategy)
        softmax_ops.cross_entropy_backward(torch.empty(64), empty(64, n), targets, torch.empty(2, 64), -100, smoothing,
                                           strategy=strategy)
        # the forward that writes dx too (the softmax forward's launches), and the backward into it
        dx = softmax_ops.cross_entropy_forward(empty(64, n), targets, -100, smoothing, dloss=torch.ones(()),
                                               strategy=strategy)[2]
        softmax_ops.cross_entropy_backward(torch.ones(()), empty(64, n), targets, torch.empty(2, 64), -100,
                                           smoothing, written=(dx, torch.ones(())), strategy=strategy)
    # whole-tensor sums as tree nodes, finished by a programmatic dependent launch (sm_90)
    reduce._dependent_launch = lambda device_type, index: True
    reduce.tree_sum_rows(torch.randn(1, 1 << 22), tuning=reduce.SumTuning(node_stride=64, segments_per_program=2))
    reduce.tree_sum_rows(bf16(1, 1 << 22), accurate=True, tuning=reduce.SumTuning(node_stride=256))
    logits = torch.randn(4, 5000)
    sampling.sample_rows(logits, 0.0)
    sampling.sample_rows(logits, 0.7, top_k=50, top_p=0.9, min_p=0.05, seed=1, offset=3)
    sampling.top_k_rows(logits, 50)
    sampling.top_k_lanes_rows(logits, 50)  # the two launches of top_k by group maxima
    sampling.sample_top_k_lanes_rows(logits, 0.7, 50, seed=torch.arange(4), offset=3)  # and their race
    sampling.sample_top_k_lanes_rows(logits, 0.7, 50, torch.full((4,), 0.9), 0.05, 1, 3)  # top-p, min-p in the k
    sampling.filter_rows(logits.bfloat16(), top_p=0.9, probs=True)
    # the row passes loading each segment ahead (the default where a program reads several)
    sampling.sample_rows(logits, 0.0, prefetch=True)
    sampling.sample_rows(logits, 0.7, top_p=0.9, seed=1, prefetch=True)
    # every pass after a call's first as a programmatic dependent launch (sm_90): the race and its
    # combine; the filtered passes with the sure-kept race after the compaction
    sampling.dependent_launch = lambda device_type, index: True
    sampling.sample_rows(logits, 0.7, seed=1)
    sampling.sample_rows(logits, 0.7, top_p=0.9, seed=1, prefetch=True)
    # min-p alone: the maxima of programs and segments, the race over the segments that keep a token
    sampling.sample_min_p_rows(logits, 0.7, 0.05, seed=1, offset=3)
    sampling.sample_min_p_rows(logits.bfloat16(), torch.ones(4), torch.full((4,), 0.1), torch.arange(4), 3)
    # the norm backward with its column sums as its dependent launch (sm_90), a block count that is
    # not a power of two (1100 rows of 8192: 9 per block, at run time), with and without the next
    # row loaded ahead, and LayerNorm's dw and db summed in one launch
    norms.dependent_launch = lambda device_type, index: True
    wide = lambda *s: torch.empty(*s, dtype=torch.bfloat16)  # noqa: E731 (nothing runs)
    norms.rms_norm_backward_impl(wide(1100, 8192), None, wide(1100, 8192), wide(8192), torch.ones(1100), 0.0,
                                 "llama", torch.bfloat16, None, True)
    norms.rms_norm_backward_impl(wide(1100, 8192), None, wide(1100, 8192), wide(8192), torch.ones(1100), 0.0,
                                 "llama", torch.bfloat16, None, True, prefetch=True)
    norms.layer_norm_backward_impl(wide(1100, 8192), wide(1100, 8192), wide(8192), torch.zeros(1100),
                                   torch.ones(1100), True, torch.bfloat16)
    # the in-place add + norm as a programmatic dependent launch (enable_pdl)
    norms.fused_add_rms_norm_impl(wide(8, 4096), wide(8, 4096), wide(4096), 1e-6, enable_pdl=True)
    for kernel, args, kwargs in captured:
        params = list(inspect.signature(kernel.fn).parameters)
        runtime = [p for p in params if p not in kwargs]
        signature = {p: type_of(v) for p, v in zip(runtime, args)}
        constexprs = {k: v for k, v in kwargs.items() if k in params}
        signature.update({k: "constexpr" for k in constexprs})
        options = {k: v for k, v in kwargs.items() if k not in params}
        triton.compile(ASTSource(kernel, signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options=options)
    print("compiled", len(captured))
""")


def _compiled_run(script: str, timeout: int) -> str:
    """The standard output of ``script`` run by this Python without Triton's interpreter (so that
    its launches compile for sm_90); skips where Triton's bundled ptxas is missing, fails with the
    end of its standard error where the script fails."""
    ptxas = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("Triton's bundled ptxas is not available")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_reduction_norm_and_sampling_kernels_compile_for_sm90():
    out = _compiled_run(_SCRIPT, 600)
    assert int(out.split("compiled")[-1]) >= 134, out  # every launch above


# The norm kernels meet the levels of a row's trees that cross warps in one exchange
# (``kernels.combine.halving_tree``), which pairs the same partials as level by level only when
# every index bit of the exchanged axis is a warp bit. The launcher picks those levels from a model
# of Triton's layout (``_ops.launch.block_bits``); this compiles launches of many shapes as the
# launcher plans them and reads the layout of every reduction in the TTGIR: each reduction over an
# axis of more than two (an exchange) must have its axis in warps alone, no register or lane bit
# and no warp that holds other coordinates too.
_EXCHANGE_SCRIPT = textwrap.dedent("""
    import ast
    import inspect
    import re

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import treefold.backend as backend
    from treefold._ops import launch, norms

    captured = []

    def record(self, grid, *args, **kwargs):
        captured.append((self.kernel, args, kwargs))

    launch.Launcher.__call__ = record
    backend.use_kernel = lambda t: True
    TYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}
    bf16 = lambda *s: torch.empty(*s, dtype=torch.bfloat16)  # noqa: E731 (nothing runs)
    f32 = lambda *s: torch.empty(*s, dtype=torch.float32)  # noqa: E731
    rms = lambda x, w, r=None, **o: norms.rms_norm_impl(x, w, r, 1e-6, 0.0, "llama", x.dtype, **o)  # noqa: E731
    ln = lambda x, w, b, **o: norms.layer_norm_impl(x, w, b, 1e-5, **o)  # noqa: E731
    rms(bf16(16384, 8192), bf16(8192))
    rms(bf16(16384, 8192), bf16(8192), num_warps=32)
    rms(bf16(16384, 8192), bf16(8192), runs=4)
    rms(bf16(16384, 8192), bf16(8192), runs=1, num_warps=32)
    rms(f32(8192, 4096), f32(4096))
    rms(f32(8192, 4096), f32(4096), num_warps=32)
    rms(bf16(32768, 4096), bf16(4096))
    rms(bf16(32768, 4096), bf16(4096), bf16(32768, 4096))
    rms(bf16(32768, 4096), f32(4096), f32(32768, 4096))
    rms(bf16(4096, 16384), bf16(16384))
    rms(bf16(65536, 1024), bf16(1024))
    rms(bf16(8192, 1024), bf16(1024), rows_per_program=2, num_warps=8)
    rms(bf16(64, 8192), bf16(8192))
    rms(bf16(1, 4096), bf16(4096))
    rms(bf16(64, 5120), bf16(5120))
    rms(bf16(64, 14336), bf16(14336))
    rms(bf16(8, 151936), bf16(151936))
    rms(bf16(256, 32768), bf16(32768))
    rms(torch.empty(64, 4096, dtype=torch.float16), torch.empty(4096, dtype=torch.float16))
    ln(bf16(16384, 8192), bf16(8192), bf16(8192))
    ln(bf16(8192, 4096), bf16(4096), bf16(4096))
    ln(f32(256, 12288), f32(12288), f32(12288))
    # the backward kernel's row sums (LayerNorm's two paired in one tree at 4096)
    ones, zeros = torch.ones, torch.zeros
    norms.rms_norm_backward_impl(bf16(32768, 4096), None, bf16(32768, 4096), bf16(4096), ones(32768), 0.0, "llama",
                                 torch.bfloat16, None, True)
    norms.rms_norm_backward_impl(bf16(16384, 8192), None, bf16(16384, 8192), bf16(8192), ones(16384), 0.0, "llama",
                                 torch.bfloat16, None, True)
    norms.rms_norm_backward_impl(bf16(1024, 4096), bf16(1024, 4096), bf16(1024, 4096), f32(4096), ones(1024), 0.0,
                                 "llama", torch.bfloat16, None, True)
    norms.rms_norm_backward_impl(f32(1024, 4096), None, f32(1024, 4096), f32(4096), ones(1024), 0.0, "llama",
                                 torch.float32, None, True)
    norms.layer_norm_backward_impl(bf16(16384, 8192), bf16(16384, 8192), bf16(8192), zeros(16384), ones(16384), True,
                                   torch.bfloat16)
    norms.layer_norm_backward_impl(bf16(1024, 4096), bf16(1024, 4096), bf16(4096), zeros(1024), ones(1024), True,
                                   torch.bfloat16)
    planned = len(captured)
    # rows that Triton cannot load 16 bytes at a time: no exchange is planned
    rms(bf16(64, 4095), bf16(4095))
    rms(bf16(64, 4097)[:, 1:], bf16(4096))
    norms.rms_norm_backward_impl(bf16(64, 4097)[:, 1:], None, bf16(64, 4096), bf16(4096), ones(64), 0.0, "llama",
                                 torch.bfloat16, None, True)
    unaligned = [kwargs.get("EXCHANGES") for _, _, kwargs in captured[planned:]]
    assert len(unaligned) >= 3 and not any(unaligned), unaligned

    def bases(layout, shape, defs):
        sliced = re.match(r"#ttg\\.slice<\\{dim = (\\d+), parent = (.*)\\}>$", layout)
        if sliced:
            d = int(sliced.group(1))
            parent = bases(sliced.group(2), shape[:d] + [1] + shape[d:], defs)
            return [[b[:d] + b[d + 1:] for b in kind] for kind in parent]
        kind, body = defs[layout]
        assert kind == "linear", layout  # the trees' reshapes give linear layouts
        lists = dict(re.findall(r"(\\w+) = (\\[(?:[^\\[\\]]|\\[[^\\]]*\\])*\\])", body))
        return [ast.literal_eval(lists[k]) for k in ("register", "lane", "warp")]

    exchanges = 0
    for kernel, args, kwargs in captured[:planned]:
        params = list(inspect.signature(kernel.fn).parameters)
        runtime = [p for p in params if p not in kwargs]
        signature = {p: TYPES[v.dtype] if isinstance(v, torch.Tensor) else "fp32" if isinstance(v, float)
                     else "i32" for p, v in zip(runtime, args)}
        attrs = {(params.index(p),): [["tt.divisibility", 16]] for p, v in zip(runtime, args)
                 if isinstance(v, torch.Tensor) or (isinstance(v, int) and v and v % 16 == 0)}
        constexprs = {k: v for k, v in kwargs.items() if k in params}
        signature.update({k: "constexpr" for k in constexprs})
        options = {k: v for k, v in kwargs.items() if k not in params}
        ttgir = triton.compile(ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs),
                               target=GPUTarget("cuda", 90, 32), options=options).asm["ttgir"]
        defs = {m.group(1): (m.group(2), m.group(3)) for m in
                re.finditer(r"^(#\\w+) = #ttg\\.(linear|blocked)<\\{(.*)\\}>\\s*$", ttgir, re.M)}
        for m in re.finditer(r'"tt\\.reduce"\\([^)]*\\) <\\{axis = (\\d+) : i32\\}> \\(\\{\\n.*?\\}\\) : '
                             r'\\(tensor<([0-9x]+)xf32, ([^\\n]*?)>\\) ->', ttgir, re.S):
            axis, shape = int(m.group(1)), [int(v) for v in m.group(2).split("x")]
            if shape[axis] <= 2:
                continue
            register, lane, warp = bases(m.group(3), shape, defs)
            on_axis = [b for b in warp if b[axis]]
            assert not any(b[axis] for b in register + lane), (kwargs, shape, axis, register, lane)
            assert all(sum(1 for v in b if v) == 1 for b in on_axis), (kwargs, shape, axis, warp)
            assert sorted(b[axis] for b in on_axis) == [1 << i for i in range(len(on_axis))], (kwargs, warp)
            assert 1 << len(on_axis) == shape[axis], (kwargs, shape, axis, warp)
            exchanges += 1
    print("exchanges", exchanges)
""")


def test_norm_tree_exchanges_cross_warps_only():
    out = _compiled_run(_EXCHANGE_SCRIPT, 900)
    assert int(out.split("exchanges")[-1]) >= 22, out
