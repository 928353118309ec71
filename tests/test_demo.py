"""``treefold demo``: the experiments measure what the sources describe, and report it."""
import argparse
import contextlib
import copy
import io
import json
import math

import numpy as np
import pytest
import torch

from treefold import demo
from treefold.backend import use_kernel

#: Small enough for the Triton interpreter, which runs the device columns in the CPU tier.
TINY = demo.Sizes(serial_n=5000, tenth_count=300, var_rows=8, var_cols=4096,
                  var_offset=10_000.0, determinism_runs=3)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One ``treefold demo --quick --json PATH`` run shared by the tests below."""
    path = tmp_path_factory.mktemp("demo") / "out" / "demo.json"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = demo.main(argparse.Namespace(json=str(path), quick=True))
    def reject(constant):
        raise AssertionError(f"{constant} in the JSON: not strict JSON")
    return code, json.loads(path.read_text(), parse_constant=reject), stdout.getvalue(), stderr.getvalue()


def test_main_returns_zero_and_writes_strict_json(quick_run):
    code, results, stdout, _ = quick_run
    assert code == 0 and results["errors"] == []
    assert results["meta"]["quick"] is True and results["meta"]["sizes"]["serial_n"] == demo.QUICK.serial_n
    assert "numbers written to" in stdout


def test_serial_float32_sum_stalls_and_the_tree_does_not(quick_run):
    _, results, _, _ = quick_run
    s = results["serial_sum"]
    n = demo.QUICK.serial_n
    assert s["n"] == n and abs(s["fp64"] - n / 2) < 0.001 * n  # uniform [0, 1): mean 0.5
    assert s["cpu"]["serial_fp32"]["value"] == 2.0 ** 24
    assert s["cpu"]["serial_fp32"]["rel_err"] < -0.15
    tree = s["cpu"]["treefold_order"]
    assert abs(tree["rel_err"]) < 1e-6 and abs(tree["ulps_from_correctly_rounded"]) <= 8
    assert s["correctly_rounded_fp32"] == float(np.float32(s["fp64"]))
    assert s["serial_spacing"] == 2.0


def test_tenths_bfloat16_stalls_at_32(quick_run):
    _, results, _, _ = quick_run
    t = results["tenth_sum"]
    exact = 10_000 * 0.10009765625
    assert t["stored_value"] == 0.10009765625 and t["exact_sum_of_stored"] == exact
    cpu = t["cpu"]
    assert cpu["sequential_bf16"] == 32.0
    assert cpu["sequential_fp32"] == exact and cpu["treefold_order_fp32"] == exact
    assert abs(cpu["kahan_bf16"] - exact) <= 4.0  # within one bfloat16 spacing at 1000
    assert cpu["torch_sum_bf16"] == t["nearest_bf16_to_exact"] == 1000.0
    assert abs(cpu["fp32_values_sequential_fp32"] - 1000.0) < 0.2


def test_variance_naive_goes_negative_and_the_stable_ones_do_not(quick_run):
    _, results, _, _ = quick_run
    v = results["variance"]["cpu"]
    rows = demo.QUICK.var_rows
    for naive in ("naive_treefold", "naive_torch"):
        assert 0 < v[naive]["negative_rows"] <= v[naive]["nan_std_rows"] <= rows
        assert v[naive]["median_rel_err"] > 0.5
    for stable in ("welford_sequential", "welford_chan_tree", "two_pass_treefold", "torch_var"):
        assert v[stable]["negative_rows"] == v[stable]["nan_std_rows"] == 0, stable
        assert v[stable]["max_rel_err"] < 1e-2, stable
    assert v["two_pass_treefold"]["median_rel_err"] < 1e-5


def test_softmax_overflow_and_masked_row(quick_run):
    _, results, _, _ = quick_run
    sm = results["softmax"]["cpu"]
    assert sm["naive"] == ["NaN", "NaN", "NaN"]
    assert sm["stable"] == pytest.approx([0.6652, 0.2447, 0.0900], abs=5e-5)
    assert sm["naive_of_shifted"] == pytest.approx(sm["stable"], rel=1e-6)
    assert sm["stable_vs_fp64"]["ok"] is True
    assert sm["masked_naive"] == ["NaN"] * 4 and sm["masked_torch_softmax"] == ["NaN"] * 4
    assert sm["masked_convention"] == [0.0] * 4
    partly = sm["partly_masked_convention"]
    assert partly[1] == partly[3] == 0.0 and sum(partly) == pytest.approx(1.0)


def test_determinism_says_it_needs_a_gpu(quick_run):
    _, results, stdout, _ = quick_run
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the GPU tier checks this section")
    assert "needs a CUDA GPU" in results["determinism"]["skipped"]
    assert "skipped: needs a CUDA GPU" in stdout


def test_report_shows_the_measured_numbers(quick_run):
    _, results, stdout, stderr = quick_run
    for heading in ("1. Summing", "2. Adding 0.1", "3. Variance", "4. Softmax", "5. A fully masked row",
                    "6. Determinism"):
        assert heading in stdout
    assert "16,777,216" in stdout and "2^24" in stdout
    assert f"{results['serial_sum']['cpu']['treefold_order']['value']:,.0f}" in stdout
    assert "[nan, nan, nan]" in stdout and "[0.6652, 0.2447, 0.0900]" in stdout
    negative = results["variance"]["cpu"]["naive_treefold"]["negative_rows"]
    assert f" {negative} " in stdout
    assert "treefold demo: drawing" in stderr  # progress goes to stderr, the report to stdout
    assert "treefold demo:" not in stdout.splitlines()[1:]


@pytest.mark.parametrize("shape", [(3, 1000), (2, 1), (1, 4097)])
def test_variance_methods_on_well_conditioned_rows(shape, rng):
    x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32) * 3 + 1)
    exact = x.double().var(dim=1, correction=0)
    for name, var in demo.variances(x, kernel=False).items():
        assert var.dtype == torch.float32 and var.shape == (shape[0],), name
        assert torch.allclose(var.double(), exact, rtol=2e-5, atol=1e-6), name


def test_masked_softmax_rows_independently():
    x = torch.tensor([[-math.inf, -math.inf], [0.0, math.log(3.0)], [5.0, -math.inf]])
    want = torch.tensor([[0.0, 0.0], [0.25, 0.75], [1.0, 0.0]])
    assert torch.allclose(demo.masked_softmax(x), want, rtol=1e-6, atol=0)


def test_main_accepts_an_argument_list(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(demo, "QUICK", TINY)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert demo.main(["--quick", "--json", str(tmp_path / "d.json")]) == 0
    results = json.loads((tmp_path / "d.json").read_text())
    assert results["meta"]["sizes"]["serial_n"] == TINY.serial_n
    assert results["serial_sum"]["cuda"] is None
    assert "1. Summing 5,000" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# The device columns, run through the interpreter on the CPU
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def device_run():
    if not use_kernel(torch.empty(1)):
        pytest.skip("needs TRITON_INTERPRET=1 to run the device columns on the CPU")
    return demo.run(TINY, device="cpu", progress=demo._Progress(io.StringIO()))


def test_device_columns_run_and_match_the_cpu_reference(device_run):
    r = device_run
    assert r["errors"] == []
    assert r["meta"]["device"] == "cpu"
    assert r["serial_sum"]["cuda"]["treefold_order"]["same_bits_as_cpu_reference"] is True
    assert r["tenth_sum"]["cuda"]["treefold_order_fp32"] == r["tenth_sum"]["cpu"]["treefold_order_fp32"]
    # The treefold-order methods give the same bits through the kernel as through the reference.
    for key in ("naive_treefold", "two_pass_treefold", "welford_chan_tree", "torch_var"):
        assert r["variance"]["cuda"][key] == r["variance"]["cpu"][key], key
    assert r["softmax"]["cuda"]["masked_convention"] == [0.0] * 4
    d = r["determinism"]
    assert d["runs"] == 3 and d["treefold_order"]["distinct"] == 1
    # The interpreter runs programs one after another: its atomic adds have a single order.
    assert d["atomic_add"]["distinct"] == 1


def test_report_with_device_columns(device_run):
    text = demo.render(device_run)
    assert "device columns: cpu" in text
    assert "same bits as" in text and "host only" in text
    assert "one pass, atomic adds: 1 distinct value(s)" in text


def test_report_shows_a_failed_device_column(device_run):
    broken = copy.deepcopy(device_run)
    broken["tenth_sum"]["cuda"] = {"error": "RuntimeError: out of memory"}
    broken["errors"] = ["0.1 sum: RuntimeError: out of memory"]
    text = demo.render(broken)
    assert "cuda column failed: RuntimeError: out of memory" in text
    assert "Failures (the CPU results above stand)" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="launches kernels with meta tensors; "
                    "only harmless where no GPU could run them")
def test_failing_device_columns_are_recorded_and_the_cpu_results_stand():
    # Nothing can be computed on the meta device: every device column fails, and says why.
    results = demo.run(TINY, device="meta", progress=demo._Progress(io.StringIO()))
    for section in ("serial_sum", "tenth_sum", "variance", "softmax"):
        assert "error" in results[section]["cuda"], section
        assert "error" not in results[section]["cpu"], section
    assert "error" in results["determinism"]
    assert len(results["errors"]) == 5
    assert results["tenth_sum"]["cpu"]["sequential_bf16"] == 32.0
    text = demo.render(results)
    assert text.count("cuda column failed:") == 5 and "Failures (the CPU results above stand)" in text


# --------------------------------------------------------------------------------------------
# GPU tier
# --------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_columns():
    results = demo.run(demo.QUICK, device="cuda", progress=demo._Progress(io.StringIO()))
    assert results["errors"] == []
    serial = results["serial_sum"]
    assert serial["cuda"]["treefold_order"]["same_bits_as_cpu_reference"] is True
    assert results["tenth_sum"]["cuda"]["treefold_order_fp32"] == results["tenth_sum"]["cpu"]["treefold_order_fp32"]
    # Sums in the treefold order give the CPU reference's bits, so the naive variance fails on
    # exactly the same rows on both.
    for key in ("naive_treefold", "two_pass_treefold"):
        assert results["variance"]["cuda"][key] == results["variance"]["cpu"][key], key
    cuda_softmax = results["softmax"]["cuda"]
    assert all(math.isnan(v) for v in cuda_softmax["naive"])
    assert cuda_softmax["masked_convention"] == [0.0] * 4
    d = results["determinism"]
    assert d["treefold_order"]["distinct"] == 1
    assert d["treefold_order"]["values"][0]["value"] == serial["cpu"]["treefold_order"]["value"]
    assert sum(e["runs"] for e in d["atomic_add"]["values"]) == d["runs"]
    text = demo.render(results)
    assert "one pass, atomic adds:" in text and "same bits as" in text
