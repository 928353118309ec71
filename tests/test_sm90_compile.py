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
    # whole-tensor sums as tree nodes, finished by a programmatic dependent launch (sm_90)
    reduce._dependent_launch = lambda device_type, index: True
    reduce.tree_sum_rows(torch.randn(1, 1 << 22), tuning=reduce.SumTuning(node_stride=64, segments_per_program=2))
    reduce.tree_sum_rows(bf16(1, 1 << 22), accurate=True, tuning=reduce.SumTuning(node_stride=256))
    logits = torch.randn(4, 5000)
    sampling.sample_rows(logits, 0.0)
    sampling.sample_rows(logits, 0.7, top_k=50, top_p=0.9, min_p=0.05, seed=1, offset=3)
    sampling.top_k_rows(logits, 50)
    sampling.filter_rows(logits.bfloat16(), top_p=0.9, probs=True)
    # the row passes loading each segment ahead (the default where a program reads several)
    sampling.sample_rows(logits, 0.0, prefetch=True)
    sampling.sample_rows(logits, 0.7, top_p=0.9, seed=1, prefetch=True)
    # every pass after a call's first as a programmatic dependent launch (sm_90): the race and its
    # combine; the filtered passes with the sure-kept race after the compaction
    sampling.dependent_launch = lambda device_type, index: True
    sampling.sample_rows(logits, 0.7, seed=1)
    sampling.sample_rows(logits, 0.7, top_p=0.9, seed=1, prefetch=True)
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


def test_reduction_norm_and_sampling_kernels_compile_for_sm90():
    ptxas = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("Triton's bundled ptxas is not available")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split("compiled")[-1]) >= 78, done.stdout  # every launch above
