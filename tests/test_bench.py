"""The bench harness: byte counting, timing helpers, accuracy, peers, reports (CPU tier).

Runs use a stand-in treefold (torch ops under treefold's names) so the harness is tested on its
own, fast, whatever kernels have landed; tests/test_cli.py runs it on the real package.
"""
import json
import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from treefold.bench import accuracy, cases, plots, report, runner
from treefold.bench.cases import CASES, CASES_BY_NAME, Shape, select_cases
from treefold.bench.check import CheckConfig, render_check, run_check
from treefold.bench.progress import Progress
from treefold.bench.providers import (HuggingFaceProvider, Impl, LigerProvider, Provider, QuackProvider,
                                      TorchProvider, TreefoldProvider, Unsupported, parse_peers)
from treefold.bench.runner import BenchConfig, run_bench, summarize
from treefold.bench.timing import CpuTimer, count_distinct, host_overhead_us, interleaved_us

CPU = torch.device("cpu")


def fake_treefold(**override):
    """torch ops under treefold's public names and signatures."""
    def rms_norm(x, weight=None, eps=1e-6, *, residual=None, offset=0.0, casting="llama", out_dtype=None):
        h = x if residual is None else x + residual
        y = F.rms_norm(h, (h.shape[-1],), weight, eps)
        return y if residual is None else (y, h)

    ns = dict(
        __version__="stand-in",
        softmax=lambda x, dim=-1, *, temperature=1.0, dtype=None: torch.softmax(x, dim),
        log_softmax=lambda x, dim=-1, *, temperature=1.0, dtype=None: torch.log_softmax(x, dim),
        rms_norm=rms_norm,
        cross_entropy=lambda x, t, reduction="none": F.cross_entropy(x.float(), t, reduction=reduction),
        sum=lambda x, dim=None, keepdim=False, *, dtype=None, accurate=False:
            x.sum() if dim is None else x.sum(dim),
        argmax=lambda x, dim=None, keepdim=False: torch.argmax(x) if dim is None else torch.argmax(x, dim),
        top_k=lambda x, k: torch.topk(x, k),
        sample=lambda logits, **kw: torch.argmax(logits, -1),  # greedy: always inside the top-p set
    )
    ns.update(override)
    return types.SimpleNamespace(**ns)


def quick_config(tmp_path, ops, **kw):
    base = dict(ops=ops, shapes="small", peers=["torch"], cpu=True, runs=3, rounds=2, host_calls=3,
                out=str(tmp_path), name="t", roof_bytes=1 << 20)
    base.update(kw)
    return BenchConfig(**base)


# ----------------------------------------------------------------------------------------------
# bytes
# ----------------------------------------------------------------------------------------------

def _nbytes(out):
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size()
    return sum(_nbytes(o) for o in out)


@pytest.mark.parametrize("case", [c for c in CASES if c.backward is None], ids=lambda c: c.name)
def test_declared_bytes_are_the_tensors_read_and_written(case):
    """Each forward case's byte count equals its inputs' bytes plus its outputs' bytes."""
    shape = case.shapes["small"][0]
    gen = torch.Generator().manual_seed(0)
    inputs = case.make_inputs(shape, CPU, gen)
    read = sum(_nbytes(v) for v in inputs.values() if isinstance(v, torch.Tensor))
    if case.base == "cross_entropy":
        written = shape.rows * 4  # the loss is declared float32 whatever torch returns for bf16
    elif case.base == "cross_entropy_mean":
        written = 4
    else:
        written = _nbytes(case.eager(inputs))
    assert case.count_bytes(shape) == read + written


def test_byte_counts_at_the_perf_shapes():
    s = Shape(8192, 4096, "bf16")
    mn2 = 8192 * 4096 * 2
    assert CASES_BY_NAME["softmax"].count_bytes(s) == 2 * mn2
    # PERF.md: backward bytes = read y or x, read dy, write dx = 3 x M x N x 2
    assert CASES_BY_NAME["softmax.bwd"].count_bytes(s) == 3 * mn2
    assert CASES_BY_NAME["rms_norm"].count_bytes(s) == 2 * mn2 + 4096 * 2
    assert CASES_BY_NAME["rms_norm.bwd"].count_bytes(s) == 3 * mn2 + 2 * 4096 * 2
    assert CASES_BY_NAME["rms_norm+residual"].count_bytes(s) == 4 * mn2 + 4096 * 2
    assert CASES_BY_NAME["layer_norm.bwd"].count_bytes(s) == 3 * mn2 + 3 * 4096 * 2
    ce = Shape(8192, 128256, "bf16")
    # per row: the int64 target, the float32 loss and the float32 dy the step reads
    assert CASES_BY_NAME["cross_entropy.bwd"].count_bytes(ce) == 2 * 8192 * 128256 * 2 + 8192 * 16
    # a training step: read the logits and targets, write dx and the loss
    assert CASES_BY_NAME["cross_entropy_mean.bwd"].count_bytes(ce) == 2 * 8192 * 128256 * 2 + 8192 * 8 + 4
    assert CASES_BY_NAME["cross_entropy_mean.bwd"].backward.unit_grad
    assert CASES_BY_NAME["sum"].count_bytes(Shape(1, 1 << 28, "fp32")) == (1 << 30) + 4
    assert CASES_BY_NAME["top_k"].count_bytes(Shape(64, 151936, "fp32")) == 64 * 151936 * 4 + 64 * 50 * 12


def test_shape_sets():
    for c in CASES:
        for set_name in ("small", "llm", "sweep", "check"):
            assert c.shapes_for(set_name), (c.name, set_name)
        assert all(s.dtype == "fp16" for s in c.shapes_for("small", "fp16"))
        if not c.whole_tensor:
            sweep = c.shapes_for("sweep")
            assert [s.n for s in sweep] == [1 << k for k in range(8, 19)]
            assert {s.rows * s.n for s in sweep} == {cases.SWEEP_ELEMENTS}
    assert CASES_BY_NAME["sum"].label(Shape(1, 1 << 26, "fp32")) == "2^26"
    assert CASES_BY_NAME["softmax"].label(Shape(64, 151936)) == "64x151936"
    with pytest.raises(ValueError, match="shapes must be one of"):
        CASES_BY_NAME["softmax"].shapes_for("huge")


def test_select_cases():
    names = [c.name for c in select_cases(["rms_norm"], backward=False)]
    assert names == ["rms_norm", "rms_norm+residual"]
    names = [c.name for c in select_cases(["rms_norm"], backward=True)]
    assert names == ["rms_norm", "rms_norm.bwd", "rms_norm+residual"]
    assert [c.name for c in select_cases(["sum.accurate"], backward=False)] == ["sum.accurate"]
    assert [c.name for c in select_cases(["softmax.bwd"], backward=False)] == ["softmax.bwd"]
    assert all(c.backward is None for c in select_cases([], backward=False))
    with pytest.raises(ValueError, match="unknown op.*softmaxx"):
        select_cases(["softmaxx"], backward=False)


# ----------------------------------------------------------------------------------------------
# timing helpers
# ----------------------------------------------------------------------------------------------

def test_count_distinct_compares_bytes():
    x = torch.arange(8, dtype=torch.float32)
    assert count_distinct(lambda: x * 2, runs=5) == 1
    calls = iter(range(100))
    assert count_distinct(lambda: x + (next(calls) % 2), runs=6) == 2
    # -0.0 == 0.0 as numbers but not as bytes; NaN != NaN as numbers but equal as bytes
    signs = iter([0.0, -0.0] * 3)
    assert count_distinct(lambda: torch.tensor([next(signs)]), runs=6) == 2
    assert count_distinct(lambda: torch.tensor([math.nan, 1.0]), runs=4) == 1
    pair = iter(range(100))
    assert count_distinct(lambda: (x, torch.tensor([next(pair) // 3])), runs=6) == 2
    assert count_distinct(lambda: torch.tensor([True, False]), runs=3) == 1
    with pytest.raises(ValueError, match="runs must be >= 1"):
        count_distinct(lambda: x, runs=0)
    with pytest.raises(TypeError, match="outputs must be tensors"):
        count_distinct(lambda: 3.0, runs=1)


def test_cpu_timer_and_host_overhead():
    timer = CpuTimer(min_runs=3, max_runs=5, budget_s=0.01)
    calls = []
    us = timer(lambda: calls.append(1))
    assert us >= 0 and 4 <= len(calls) <= 6  # one warm-up, then 3 to 5 timed
    calls.clear()
    per_call = host_overhead_us(lambda: calls.append(1), CPU, calls=20, warmup_calls=5)
    assert per_call >= 0 and len(calls) == 25


def test_interleaved_rounds_visit_every_call_once_per_round():
    order = []
    fake_clock = iter(range(1, 100))

    def timer(fn):
        fn()
        return next(fake_clock)

    times = interleaved_us({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, timer, rounds=3)
    assert order == ["a", "b"] * 3
    assert times == {"a": [1.0, 3.0, 5.0], "b": [2.0, 4.0, 6.0]}
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        interleaved_us({}, timer, rounds=0)


# ----------------------------------------------------------------------------------------------
# accuracy
# ----------------------------------------------------------------------------------------------

def test_ulp():
    one = torch.tensor([1.0, 3.0, 0.0, -1.0], dtype=torch.float64)
    assert accuracy.ulp(one, torch.bfloat16).tolist() == [2.0 ** -7, 2.0 ** -6, 2.0 ** -133, 2.0 ** -7]
    assert accuracy.ulp(one, torch.float32).tolist()[:2] == [2.0 ** -23, 2.0 ** -22]
    assert accuracy.ulp(torch.tensor([0.0], dtype=torch.float64), torch.float16).item() == 2.0 ** -24
    with pytest.raises(TypeError, match="ulp: dtype must be one of"):
        accuracy.ulp(one, torch.int32)


@pytest.mark.parametrize("use_numerics", [True, False])
def test_float_accuracy(monkeypatch, use_numerics):
    if not use_numerics:
        monkeypatch.setattr(accuracy, "_numerics_compare", lambda: None)
    ref = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    rounded = ref.to(torch.bfloat16)
    acc = accuracy.float_accuracy(rounded, ref)
    assert acc["max_ulp"] <= 0.5 and 0 < acc["relative_l2"] <= 2.0 ** -8
    assert acc["nonfinite_mismatches"] == 0
    # one element pushed one bf16 ulp further: between 0.5 and 1.5 ulp off
    bumped = rounded.clone()
    bumped[0] = (rounded[0].double() + accuracy.ulp(ref[:1], torch.bfloat16)[0]).to(torch.bfloat16)
    assert 0.5 < accuracy.float_accuracy(bumped, ref)["max_ulp"] <= 1.5
    # a NaN where the reference is finite is counted, not averaged in
    broken = rounded.clone()
    broken[3] = math.nan
    assert accuracy.float_accuracy(broken, ref)["nonfinite_mismatches"] == 1
    # matching infinities are fine
    both = torch.tensor([math.inf, 1.0], dtype=torch.float64)
    assert accuracy.float_accuracy(both.float(), both)["nonfinite_mismatches"] == 0
    # a tuple combines as one long vector
    combined = accuracy.float_accuracy((rounded, rounded), (ref, ref))
    assert combined["relative_l2"] == pytest.approx(acc["relative_l2"], rel=1e-9)
    with pytest.raises(ValueError, match="shape"):
        accuracy.float_accuracy(rounded[:10], ref)


def test_exact_accuracy():
    got = torch.tensor([3, 1, 2])
    assert accuracy.exact_accuracy(got, torch.tensor([3, 1, 2]))["mismatches"] == 0
    assert accuracy.exact_accuracy(got, torch.tensor([3, 0, 0]))["mismatches"] == 2
    vals = torch.tensor([1.5, math.nan])
    assert accuracy.exact_accuracy(vals, vals.double())["mismatches"] == 0


# ----------------------------------------------------------------------------------------------
# a run, its JSON and markdown
# ----------------------------------------------------------------------------------------------

def _strict_json(path):
    def no_constants(name):
        raise AssertionError(f"JSON holds {name}")
    with open(path) as f:
        return json.load(f, parse_constant=no_constants)


def test_cpu_run_writes_json_and_markdown(tmp_path):
    lines = []
    ops = ["softmax", "softmax.bwd", "cross_entropy.bwd", "sum", "argmax.rows", "top_k", "sample.top_p"]
    config = quick_config(tmp_path, ops, backward=True)
    checkpoints = []
    result = run_bench(config, treefold_namespace=fake_treefold(), log=lines.append, use_rich=False,
                       checkpoint=lambda r: checkpoints.append(len(r["results"])))
    json_path = report.write_json(result, str(tmp_path / "t.json"))
    md_path = report.write_markdown(result, str(tmp_path / "t.md"))
    data = _strict_json(json_path)
    roof = data["roof"]["gbs"]
    assert roof > 0 and data["roof"]["bytes_moved"] == 2 * (1 << 20)
    assert checkpoints == sorted(checkpoints) and checkpoints[-1] == len(data["results"])

    rows = data["results"]
    # "sum" names a kind: the whole-tensor, accurate and row sums
    assert {r["case"] for r in rows} == set(ops) | {"sum.accurate", "sum.rows"}
    assert {r["provider"] for r in rows} == {"treefold", "torch"}
    for r in rows:
        case = CASES_BY_NAME[r["case"]]
        assert r["status"] == "ok", r
        assert r["bytes"] == case.count_bytes(Shape(**r["shape"]))
        assert r["gbs"] == pytest.approx(r["bytes"] / r["us"] / 1e3)
        assert r["pct_roof"] == pytest.approx(100 * r["gbs"] / roof)
        assert r["distinct"] == 1 and r["runs"] == 3
        assert len(r["rounds_us"]) == 2 and r["us"] == pytest.approx(sum(r["rounds_us"]) / 2)
        acc = r["accuracy"]
        if case.outputs == "float":
            assert acc["relative_l2"] < 2.0 ** -6 and acc["nonfinite_mismatches"] == 0, r
        elif case.outputs == "exact":
            assert acc["mismatches"] == 0, r
        else:
            assert acc["invalid_tokens"] == 0, r

    summary = {(s["case"], s["label"]): s for s in data["summary"]}
    s = summary[("softmax", "4x256")]
    tf = next(r for r in rows if r["case"] == "softmax" and r["label"] == "4x256" and r["provider"] == "treefold")
    peer = next(r for r in rows if r["case"] == "softmax" and r["label"] == "4x256" and r["provider"] == "torch")
    assert s["best_peer"] == "torch"
    assert s["speedup_vs_best_peer"] == pytest.approx(peer["us"] / tf["us"])
    assert {h["case"] for h in data["host_overhead"]} == {"softmax", "argmax.rows"}
    assert all(h["us_per_call"] > 0 and h["calls"] == 3 for h in data["host_overhead"])
    assert data["command"].startswith("treefold bench softmax softmax.bwd")

    md = open(md_path).read()
    assert "| softmax | 4x256 | bf16 |" in md
    assert "| 3x1000 | bf16 | torch | ok |" in md
    assert f"Reproduce: `{data['command']}`" in md
    assert "## Host time per eager call" in md
    assert "mismatched" in md and "invalid" in md
    assert "Torch eager is Hugging Face's sort-based top-p path with torch.multinomial." in md
    assert any(line.startswith("roof: ") for line in lines)


def test_the_providers_of_a_shape_are_timed_round_robin():
    order = []
    calls = [runner._Timed({"provider": name, "status": "ok"}, None, None, name, None) for name in "abc"]

    def timer(fn):
        order.append(fn)
        if fn == "b" and order.count("b") == 2:
            raise RuntimeError("out of memory")
        return float(len(order))

    runner.time_rounds(calls, timer, rounds=3)
    # b fails in round 2: its row says so, it is not timed again, and the others go on
    assert order == ["a", "b", "c", "a", "b", "c", "a", "c"]
    assert [c.times for c in calls] == [[1.0, 4.0, 7.0], [2.0], [3.0, 6.0, 8.0]]
    assert calls[1].row["status"] == "error" and "out of memory" in calls[1].row["message"]


def test_missing_treefold_op_skips_the_case(tmp_path):
    lines = []
    ns = fake_treefold()
    del ns.log_softmax
    result = run_bench(quick_config(tmp_path, ["softmax", "log_softmax"], host=False), treefold_namespace=ns,
                       log=lines.append, use_rich=False)
    assert "treefold has no log_softmax() yet: log_softmax skipped" in lines
    assert result["skipped"] == ["treefold has no log_softmax() yet: log_softmax skipped"]
    assert {r["case"] for r in result["results"]} == {"softmax"}


def test_a_wrong_treefold_output_is_named_in_its_row(tmp_path):
    ns = fake_treefold(softmax=lambda x, dim=-1, **kw: torch.softmax(x, dim) * 2.0)
    result = run_bench(quick_config(tmp_path, ["softmax"], host=False), treefold_namespace=ns,
                       log=lambda line: None, use_rich=False)
    notes = [r["note"] for r in result["results"] if r["provider"] == "treefold"]
    assert notes and all(n == "wrong output (relative L2 error 1)" for n in notes)


def test_time_budget_stops_before_the_next_shape(tmp_path):
    lines = []
    result = run_bench(quick_config(tmp_path, ["softmax"], budget_s=1e-9), treefold_namespace=fake_treefold(),
                       log=lines.append, use_rich=False)
    assert result["results"] == [] and result["host_overhead"] == []
    assert any("time budget of 1e-09 s spent; not measured: softmax 4x256 bf16, softmax 3x1000 bf16" in s
               for s in result["skipped"])
    assert "--budget 1e-09" in result["command"]


# ----------------------------------------------------------------------------------------------
# peers: missing, refusing, failing
# ----------------------------------------------------------------------------------------------

class MissingPeer(Provider):
    name, title = "missing", "a peer that is not installed"

    def load(self):
        raise ImportError("No module named 'missing_lib'")


class RefusingPeer(Provider):
    name, title = "quack", "a peer that refuses every shape"

    def build(self, case, inputs, shape):
        raise Unsupported(f"unsupported shape: N must be a power of two, got {shape.n}")


class FailingPeer(Provider):
    """Builds, then raises when called (as a peer rejecting a shape inside its kernel launcher)."""
    title = "a peer whose call raises"

    def __init__(self, name):
        self.name = name

    def build(self, case, inputs, shape):
        def fn():
            raise RuntimeError(f"cannot launch: n = {shape.n} exceeds the block size")
        return Impl(fn, inputs)


class AbsentOpPeer(Provider):
    name, title = "absent", "a peer without this op"

    def build(self, case, inputs, shape):
        return None


class WrongPeer(Provider):
    name, title = "wrong", "a peer with a wrong answer"

    def build(self, case, inputs, shape):
        return Impl(lambda: torch.softmax(inputs["x"], -1) * 1.5, inputs)


def test_peer_failures_are_reported_not_fatal(tmp_path):
    lines = []
    providers = [TreefoldProvider(fake_treefold()), TorchProvider(), MissingPeer(), RefusingPeer(),
                 FailingPeer("liger"), FailingPeer("custom"), AbsentOpPeer(), WrongPeer()]
    result = run_bench(quick_config(tmp_path, ["softmax"], host=False), providers=providers,
                       log=lines.append, use_rich=False)
    assert "missing: not available (ImportError: No module named 'missing_lib'); skipped" in lines
    assert [p["name"] for p in result["providers"]] == ["treefold", "torch", "quack", "liger", "custom",
                                                        "absent", "wrong"]
    by = {}
    for r in result["results"]:
        by.setdefault(r["provider"], []).append(r)
    assert "absent" not in by and "missing" not in by
    assert [r["status"] for r in by["quack"]] == ["unsupported", "unsupported"]
    assert by["quack"][1]["message"] == "unsupported shape: N must be a power of two, got 1000"
    # a peer with known limits that raises has "unsupported" that shape; anyone else has an error
    assert by["liger"][0]["status"] == "unsupported"
    assert by["liger"][0]["message"] == "RuntimeError: cannot launch: n = 256 exceeds the block size"
    assert by["custom"][0]["status"] == "error"
    assert all(r["status"] == "ok" for r in by["treefold"] + by["torch"] + by["wrong"])
    assert by["wrong"][0]["accuracy"]["relative_l2"] > 0.4
    assert any("quack: unsupported: unsupported shape" in line for line in lines)
    assert all(r["note"] == "wrong output (relative L2 error 0.5): not counted as a peer" for r in by["wrong"])
    assert not any("wrong output" in r["note"] for r in by["treefold"] + by["torch"])
    for s in result["summary"]:
        assert s["best_peer"] == "torch"
    md = report.render_markdown(result)
    assert "| 3x1000 | bf16 | quack | unsupported |" in md and "N must be a power of two, got 1000" in md


def test_liger_and_quack_calls(monkeypatch):
    """The peers' Python APIs are called as published; limits and devices give Unsupported."""
    calls = []

    def record(name, result=None):
        def fn(*args, **kwargs):
            calls.append((name, args, kwargs))
            return result if result is not None else args[0]
        return fn

    functional = types.ModuleType("liger_kernel.transformers.functional")
    functional.liger_rms_norm = record("liger_rms_norm")
    functional.liger_fused_add_rms_norm = lambda x, r, w, eps, **kw: (calls.append(("fused", kw)) or (x, r))
    functional.liger_layer_norm = record("liger_layer_norm")
    functional.liger_cross_entropy = record("liger_cross_entropy")
    functional.liger_softmax = record("liger_softmax")
    quack = types.ModuleType("quack")
    quack.softmax = record("quack.softmax")

    def rmsnorm(x, weight=None, bias=None, residual=None, out_dtype=None, residual_dtype=None, eps=1e-6,
                prenorm=False):
        calls.append(("quack.rmsnorm", residual is not None, prenorm, eps))
        return (x, residual) if prenorm else x
    quack.rmsnorm = rmsnorm
    quack.cross_entropy = lambda x, target, reduction="mean": calls.append(("quack.ce", reduction)) or x
    topk_mod = types.ModuleType("quack.topk")
    topk_mod.topk = lambda x, k: (x[:, :k], torch.zeros(x.shape[0], k, dtype=torch.int32))
    for name, mod in {"liger_kernel": types.ModuleType("liger_kernel"),
                      "liger_kernel.transformers": types.ModuleType("liger_kernel.transformers"),
                      "liger_kernel.transformers.functional": functional, "quack": quack,
                      "quack.topk": topk_mod}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    liger, q = LigerProvider(), QuackProvider()
    liger.load()
    q.load()
    gen = torch.Generator().manual_seed(0)
    small = Shape(4, 256, "bf16")

    def inputs(name, shape=small):
        return CASES_BY_NAME[name].make_inputs(shape, CPU, gen)

    # on CPU tensors every peer kernel refuses
    with pytest.raises(Unsupported, match="Liger-Kernel needs a CUDA device"):
        liger.build(CASES_BY_NAME["rms_norm"], inputs("rms_norm"), small)
    with pytest.raises(Unsupported, match="QuACK needs a CUDA device"):
        q.build(CASES_BY_NAME["softmax"], inputs("softmax"), small)
    with pytest.raises(Unsupported, match=r"power of two <= 4096, got 1000"):
        q.build(CASES_BY_NAME["top_k"], inputs("top_k", Shape(3, 1000, "fp32")), Shape(3, 1000, "fp32"))
    assert liger.build(CASES_BY_NAME["logsumexp"], inputs("logsumexp"), small) is None
    assert q.build(CASES_BY_NAME["layer_norm.bwd"], inputs("layer_norm"), small) is None

    # with the device check lifted, the calls carry the right arguments
    monkeypatch.setattr("treefold.bench.providers._needs_cuda", lambda name, i: None)
    i = inputs("rms_norm")
    liger.build(CASES_BY_NAME["rms_norm"], i, small).fn()
    assert calls[-1][0] == "liger_rms_norm"
    assert calls[-1][2] == {"offset": 0.0, "casting_mode": "llama", "in_place": False}
    i = inputs("rms_norm+residual")
    y, h = liger.build(CASES_BY_NAME["rms_norm+residual"], i, small).fn()
    assert calls[-1] == ("fused", {"offset": 0.0, "casting_mode": "llama", "in_place": False})
    q.build(CASES_BY_NAME["rms_norm+residual"], i, small).fn()
    assert calls[-1] == ("quack.rmsnorm", True, True, cases.RMS_EPS)
    ce = inputs("cross_entropy")
    q.build(CASES_BY_NAME["cross_entropy"], ce, small).fn()
    assert calls[-1] == ("quack.ce", "none")
    ce["x"].requires_grad_(True)
    impl = liger.build(CASES_BY_NAME["cross_entropy.bwd"], ce, small)
    assert impl.mutates_input and "writes dx into its input" in impl.note
    p2 = Shape(2, 512, "fp32")
    values, idx = q.build(CASES_BY_NAME["top_k"], inputs("top_k", p2), p2).fn()
    assert values.shape == (2, cases.TOP_K) and idx.dtype == torch.int32


def test_hugging_face_peer_runs_the_model_code_where_it_is_not_torchs_call():
    hf = HuggingFaceProvider()
    s = Shape(3, 64, "bf16")
    gen = torch.Generator().manual_seed(0)

    def inputs(name, shape=s):
        return CASES_BY_NAME[name].make_inputs(shape, CPU, gen)

    i = inputs("rms_norm", s)
    got = hf.build(CASES_BY_NAME["rms_norm"], i, s).fn()
    x = i["x"].float()
    want = i["weight"] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cases.RMS_EPS)).to(i["x"].dtype)
    assert torch.equal(got, want)  # the float32 row cast back before the weight, as Llama's RMSNorm
    i = inputs("rms_norm+residual", s)
    y, h = hf.build(CASES_BY_NAME["rms_norm+residual"], i, s).fn()
    assert torch.equal(h, i["x"] + i["residual"]) and torch.equal(y, cases.hf_llama_rms_norm(h, i["weight"]))
    # backward cases differentiate the same code; elsewhere the models call torch: no row of their own
    assert hf.build(CASES_BY_NAME["rms_norm.bwd"], inputs("rms_norm", s), s) is not None
    for name in ("layer_norm", "softmax", "sum", "sample.top_p"):
        assert hf.build(CASES_BY_NAME[name], {}, s) is None


def test_parse_peers():
    assert parse_peers("torch, compile,torch") == ["torch", "compile"]
    assert parse_peers("hf,quack") == ["hf", "quack"]
    with pytest.raises(ValueError, match="unknown peer.*cub"):
        parse_peers("torch,cub")


# ----------------------------------------------------------------------------------------------
# reports from saved results, merging, plots
# ----------------------------------------------------------------------------------------------

def _small_result(tmp_path, ops, **kw):
    return run_bench(quick_config(tmp_path, ops, host=False, **kw), treefold_namespace=fake_treefold(),
                     log=lambda line: None, use_rich=False)


def test_merge_results(tmp_path):
    a = _small_result(tmp_path, ["softmax"])
    b = _small_result(tmp_path, ["sum.rows"])
    merged = report.merge_results([a, b], "both")
    assert merged["name"] == "both"
    assert len(merged["results"]) == len(a["results"]) + len(b["results"])
    assert {s["case"] for s in merged["summary"]} == {"softmax", "sum.rows"}
    assert [p["roof_gbs"] for p in merged["parts"]] == [a["roof"]["gbs"], b["roof"]["gbs"]]
    assert merged["command"] == f"{a['command']} && {b['command']}"
    assert "Merged from 2 runs" in report.render_markdown(merged)
    other = dict(b, machine=dict(b["machine"], cpu="another-cpu"))
    with pytest.raises(ValueError, match="different machines"):
        report.merge_results([a, other], "x")
    with pytest.raises(ValueError, match="no results"):
        report.merge_results([], "x")
    path = tmp_path / "bad.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a treefold bench result"):
        report.read_json(str(path))


class FakeAxes:
    def plot(self, xs, ys, *args, **kwargs):
        assert list(xs) == sorted(xs) and len(xs) == len(ys)

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class FakeFigure:
    def savefig(self, path, dpi=None):
        with open(path, "wb") as f:
            f.write(b"\x89PNG fake")

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def test_plots(tmp_path, monkeypatch):
    result = _small_result(tmp_path, ["softmax", "sum.rows"])
    series = plots.plot_series(result)
    assert set(series) == {"softmax", "sum.rows"}
    assert [n for n, _ in series["softmax"]["treefold (bf16)"]] == [256, 1000]
    assert plots.slug("rms_norm+residual") == "rms_norm-residual"

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    assert plots.write_plots(result, str(tmp_path), "t") == ([], plots.MISSING)

    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda **kw: (FakeFigure(), FakeAxes())
    pyplot.close = lambda fig: None
    mpl = types.ModuleType("matplotlib")
    mpl.use = lambda backend: None
    mpl.pyplot = pyplot
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    paths, why_not = plots.write_plots(result, str(tmp_path / "png"), "h200")
    assert why_not is None
    assert sorted(p.split("/")[-1] for p in paths) == ["h200-softmax.png", "h200-sum-rows.png"]

    single = _small_result(tmp_path, ["softmax"], dtype="fp32")
    single["results"] = [r for r in single["results"] if r["label"] == "4x256"]
    assert plots.write_plots(single, str(tmp_path), "t")[1].startswith("no op was measured at two")


def test_summarize_without_treefold_or_peers():
    row = {"case": "softmax", "label": "4x256", "shape": {"dtype": "bf16"}, "provider": "treefold",
           "status": "error", "us": None, "gbs": None, "pct_roof": None, "accuracy": None, "distinct": None,
           "runs": None}
    (s,) = summarize([row])
    assert s["treefold_status"] == "error" and s["best_peer"] is None and s["speedup_vs_best_peer"] is None
    assert "| softmax | 4x256 | bf16 | error |" in "\n".join(report.summary_table({"summary": [s]}))


def test_a_peer_with_a_wrong_output_is_never_the_best_peer():
    def row(provider, us, accuracy):
        return {"case": "softmax", "label": "64x151936", "shape": {"dtype": "bf16"}, "provider": provider,
                "status": "ok", "us": us, "gbs": 1.0, "pct_roof": 1.0, "accuracy": accuracy, "distinct": 1,
                "runs": 20, "graph_us": us / 2, "note": ""}
    right = {"relative_l2": 1.7e-3, "nonfinite_mismatches": 0}
    rows = [row("treefold", 21.0, right), row("torch", 45.0, right),
            row("quack", 16.8, {"relative_l2": 0.0, "nonfinite_mismatches": 9723904})]
    (s,) = summarize(rows)
    assert (s["best_peer"], s["best_peer_us"], s["best_peer_graph"]) == ("torch", 45.0, "torch")
    assert summarize(rows[:2] + [row("quack", 16.8, right)])[0]["best_peer"] == "quack"


def test_kernel_times_pick_their_own_best_peer():
    def row(provider, us, kernel):
        return {"case": "rms_norm", "label": "16384x8192", "shape": {"dtype": "bf16"}, "provider": provider,
                "status": "ok", "us": us, "gbs": 1.0, "pct_roof": 1.0, "accuracy": None, "distinct": 1,
                "runs": 20, "graph_us": None, "kernel_us": kernel, "note": ""}
    # do_bench puts compile level with treefold; the kernels put it ahead
    rows = [row("treefold", 130.3, 128.2), row("compile", 129.8, 126.0), row("quack", 136.0, 131.3),
            row("liger", 125.0, None)]
    (s,) = summarize(rows)
    assert (s["best_peer"], s["best_kernel_peer"], s["best_kernel_peer_us"]) == ("liger", "compile", 126.0)
    assert s["kernel_speedup_vs_best_peer"] == pytest.approx(126.0 / 128.2)
    table = "\n".join(report.summary_table({"summary": [s]}))
    assert "| 128.2 (compile 126.0; 0.983) |" in table
    (s,) = summarize([row("treefold", 130.3, None), rows[1]])
    assert s["treefold_kernel_us"] is None and s["kernel_speedup_vs_best_peer"] is None
    assert "| - | - |" in "\n".join(report.summary_table({"summary": [s]}))


def test_rounds_take_kernel_times_where_the_timer_gives_them():
    calls = [runner._Timed({"provider": name, "status": "ok"}, None, None, name, None) for name in "ab"]
    kernels = iter([5.0, None, 4.0, None, 6.0, None])
    runner.time_rounds(calls, lambda fn: 10.0, rounds=3, kernel_timer=lambda fn: next(kernels))
    assert [c.times for c in calls] == [[10.0] * 3, [10.0] * 3]
    # a round whose profile recorded nothing adds no kernel time
    assert [c.kernel_times for c in calls] == [[5.0, 4.0, 6.0], []]

    def profiler_fails(fn):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")
    call = runner._Timed({"provider": "quack", "status": "ok", "note": ""}, None, None, "q", None)
    runner.time_rounds([call], lambda fn: 10.0, rounds=2, kernel_timer=profiler_fails)
    assert call.row["status"] == "ok" and call.times == [10.0, 10.0] and call.kernel_times == []
    assert call.row["note"] == "no kernel time: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"


@pytest.mark.parametrize("intervals, busy", [
    ([], 0.0),
    ([(2.0, 5.0)], 3.0),
    ([(0.0, 1.0), (3.0, 4.5)], 2.5),                  # a gap between launches is not counted
    ([(0.0, 4.0), (1.0, 6.0)], 6.0),                  # a dependent launch started early: once
    ([(1.0, 6.0), (0.0, 4.0), (2.0, 3.0)], 6.0),      # any order; one inside another
    ([(0.0, 2.0), (2.0, 3.0), (5.0, 5.0)], 3.0),      # touching; empty
])
def test_busy_time_counts_every_instant_once(intervals, busy):
    from treefold.bench.timing import busy_us
    assert busy_us(intervals) == busy


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU tier: the profiler's kernel durations")
def test_gpu_kernel_time_is_the_kernels_alone():
    import treefold
    from treefold.bench.timing import CudaTimer, kernel_us
    x = torch.randn(1 << 26, device="cuda")
    one = kernel_us(lambda: x.mul(2.0))
    two = kernel_us(lambda: (x.mul(2.0), x.mul(3.0)))
    # the flush is not counted: the kernel reads and writes 512 MiB, about 130 us on an H200
    assert 0 < one <= CudaTimer()(lambda: x.mul(2.0))
    assert two == pytest.approx(2 * one, rel=0.1)
    # launches chained as sampling chains them (programmatic dependent launches, each started
    # before its producer ends): the overlap counts once, and the time lies inside the window
    logits = torch.randn(64, 151936, device="cuda")
    sampled = kernel_us(lambda: treefold.sample(logits, top_p=0.9, seed=1))
    assert 0 < sampled <= CudaTimer()(lambda: treefold.sample(logits, top_p=0.9, seed=1))


@pytest.mark.parametrize("accuracy, reason", [
    (None, ""),
    ({"error": "RuntimeError: boom"}, ""),
    ({"relative_l2": 2e-3, "nonfinite_mismatches": 0}, ""),
    ({"relative_l2": 0.05, "nonfinite_mismatches": 0}, ""),
    ({"relative_l2": 0.06, "nonfinite_mismatches": 0}, "relative L2 error 0.06"),
    ({"relative_l2": float("inf"), "nonfinite_mismatches": 0}, "relative L2 error inf"),
    ({"relative_l2": float("nan"), "nonfinite_mismatches": 0}, "relative L2 error nan"),
    ({"relative_l2": 0.0, "nonfinite_mismatches": 3}, "3 NaN/Inf where the reference differs"),
    ({"mismatches": 0}, ""),
    ({"mismatches": 2}, "2 mismatched elements"),
    ({"invalid_tokens": 0}, ""),
    ({"invalid_tokens": 1}, "1 invalid token"),
])
def test_wrong_output_reasons(accuracy, reason):
    from treefold.bench.accuracy import wrong_output
    assert wrong_output(accuracy) == reason


def test_progress_lines(capsys):
    p = Progress(2, use_rich=True)  # stderr is not a terminal here: numbered lines
    p.begin("softmax 4x256 bf16 treefold")
    p.done()
    p.log("liger: not available")
    p.close()
    out, err = capsys.readouterr()
    assert err == "[1/2] softmax 4x256 bf16 treefold\n"
    assert out == "liger: not available\n"


# ----------------------------------------------------------------------------------------------
# check
# ----------------------------------------------------------------------------------------------

def test_check_budget_verdicts():
    wrong = fake_treefold(softmax=lambda x, dim=-1, **kw: torch.softmax(x, dim) * 1.01,
                          argmax=lambda x, dim=None, keepdim=False: torch.argmin(x, dim))
    lines = []
    result = run_check(CheckConfig(ops=["softmax", "log_softmax", "argmax.rows", "logsumexp"], dtype="fp32",
                                   cpu=True), treefold_namespace=wrong, log=lines.append)
    verdicts = {(r["case"], r["label"]): r["verdict"] for r in result["rows"]}
    assert verdicts[("softmax", "4x256")] == "OVER"
    assert verdicts[("log_softmax", "4x256")] == "ok"
    assert verdicts[("argmax.rows", "4x256")] == "OVER"
    assert "treefold has no logsumexp() yet: logsumexp not checked" in lines
    assert result["over_budget"] >= 4
    text = render_check(result)
    assert "| softmax | fp32 | 4x256 |" in text and "OVER" in text
    # three_way runs for the unary float ops and fails the wrong softmax
    notes = {n["case"]: n for n in result["three_way"]}
    assert notes["softmax"]["failed"] and not notes["log_softmax"]["failed"]


def test_graph_times_reach_the_summary_and_the_tables():
    def row(provider, us, graph_us):
        return {"case": "argmax_rows", "label": "1x151936", "shape": {"dtype": "fp32"}, "provider": provider,
                "status": "ok", "us": us, "gbs": 1.0, "pct_roof": 1.0, "accuracy": None, "distinct": 1,
                "runs": 20, "graph_us": graph_us, "title": "argmax", "message": "", "note": ""}
    rows = [row("treefold", 40.0, 3.4), row("torch", 12.0, 8.5), row("compile", 30.0, None)]
    (s,) = summarize(rows)
    assert s["treefold_graph_us"] == 3.4
    assert (s["best_peer"], s["best_peer_graph"], s["best_peer_graph_us"]) == ("torch", "torch", 8.5)
    summary = "\n".join(report.summary_table({"summary": [s]}))
    assert "CUDA graph us (best peer)" in summary and "3.4 (torch 8.5)" in summary
    detail = "\n".join(report.detail_tables({"results": rows}))
    assert "| 1x151936 | fp32 | compile | ok |" in detail and "| 3.4 |" in detail


def test_roof_percent_counts_bytes_against_the_copy_bandwidth():
    from treefold.bench.roofs import Roof
    roof = Roof(gbs=4000.0, us=500.0, bytes_moved=2 << 30, device="cuda:0", how="copy")
    assert roof.percent(4e8, 100.0) == pytest.approx(100.0)  # 400 MB in 100 us = 4000 GB/s
    assert roof.percent(1e8, 100.0) == pytest.approx(25.0)
