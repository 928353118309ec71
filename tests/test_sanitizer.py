"""GPU tier: the compiled kernels under compute-sanitizer's memcheck.

The CPU tier checks every interpreted access against the launch's tensor views
(conftest's ``accesses_inside_the_launch_tensors``); this is the same promise for the code the
GPU runs. Each family's CPU-tier tests (small, odd shapes, NaN and Inf rows, strided views,
empty batches, every launch path the tests force) run again on CUDA inside
``compute-sanitizer --tool memcheck``, with PyTorch's caching allocator off so that every tensor
is an allocation of its own and a read one element past its end is an error, not a read of a
neighbour's bytes. A first test plants an out-of-bounds load in a Triton kernel and requires
memcheck to report it, so that a silent sanitizer cannot pass the others.

Skipped without a CUDA device or without ``compute-sanitizer`` on the PATH. The runs are slow
(each allocation is a cudaMalloc, each launch is instrumented): on a fresh compile cache expect
minutes per family. ``SANITIZER_LOGS=<dir>`` keeps each run's whole output there,
``SANITIZER_WORKERS`` sets each run's pytest-xdist workers (2) and ``SANITIZER_TIMEOUT`` its limit.
``SANITIZER_SHARDS=k`` splits each family's tests into k runs of their own (every k-th test of
the family's collection order, so that a family's long parametrized cases spread over the
shards), each a test of its own (``[sampling-2of3]``): a family that takes longer under memcheck
than one device call allows (sampling, about 15 minutes) is then taken a shard per call with
``-k``.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

SANITIZER = shutil.which("compute-sanitizer")
TESTS = pathlib.Path(__file__).resolve().parent
REPORTED_ERRORS = 86  # memcheck's exit status when it reported an error (--error-exitcode)

FAMILIES = ["softmax", "cross_entropy", "norms", "reductions", "sampling", "launch", "demo"]

needs_sanitizer = [
    pytest.mark.gpu,
    pytest.mark.skipif(SANITIZER is None, reason="needs compute-sanitizer on the PATH"),
]


def _shard_count() -> int:
    value = os.environ.get("SANITIZER_SHARDS", "1")
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"SANITIZER_SHARDS must be a whole number >= 1, got {value!r}")
    return int(value)


SHARDS = _shard_count()


def _run_name(family: str, shard: int) -> str:
    return family if SHARDS == 1 else f"{family}-{shard + 1}of{SHARDS}"

_PLANTED = textwrap.dedent("""
    import torch, triton, triton.language as tl

    @triton.jit
    def copy_one_past(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i <= n), mask=i < n)  # reads x[n]

    x = torch.randn(1000, device="cuda")
    y = torch.empty(1000, device="cuda")
    copy_one_past[(1,)](x, y, 1000, BLOCK=1024)
    torch.cuda.synchronize()
""")


def _test_env() -> dict:
    """The environment of the runs: the compiled kernels (no interpreter), PyTorch's caching
    allocator off, and the checkout's own package, installed or not."""
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS.parent / "src"), env.get("PYTHONPATH")]))
    return env


def _shard(family: str, shard: int, shards: int) -> list:
    """The node ids of the family's CPU-tier tests that shard ``shard`` (of ``shards``) runs: every
    ``shards``-th from the ``shard``-th, in the order pytest collects them."""
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-m", "not gpu", str(TESTS / f"test_{family}.py")],
                            cwd=TESTS.parent, env=_test_env(), capture_output=True, text=True)
    ids = [line for line in listed.stdout.splitlines() if line.startswith(f"tests/test_{family}.py::")]
    if listed.returncode != 0 or not ids:
        raise RuntimeError(f"collecting test_{family}.py failed (status {listed.returncode}):\n"
                           f"{listed.stdout[-3000:]}{listed.stderr[-3000:]}")
    return ids[shard::shards]


def _memcheck(args: list, log: pathlib.Path) -> tuple:
    """Run ``python *args`` under memcheck (child processes too), its output written to ``log``
    as it comes; returns (exit status, output). ``SANITIZER_TIMEOUT`` (seconds) ends a run that
    takes longer: the status is then None and the log shows how far it got."""
    env = _test_env()
    command = [SANITIZER, "--tool", "memcheck", "--error-exitcode", str(REPORTED_ERRORS),
               "--target-processes", "all", "--print-limit", "20", sys.executable, *args]
    limit = float(os.environ["SANITIZER_TIMEOUT"]) if os.environ.get("SANITIZER_TIMEOUT") else None
    with open(log, "w") as out:
        out.write(" ".join(command) + "\n")
        out.flush()
        try:
            status = subprocess.run(command, cwd=TESTS.parent, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            status = None
    return status, log.read_text()


def _log_dir(tmp_path) -> pathlib.Path:
    kept = os.environ.get("SANITIZER_LOGS")
    if not kept:
        return tmp_path
    path = pathlib.Path(kept)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("shards", [1, 3])
def test_shards_split_a_family_into_parts_that_cover_it_once(shards):
    whole = _shard("launch", 0, 1)
    parts = [_shard("launch", i, shards) for i in range(shards)]
    assert sorted(sum(parts, [])) == sorted(whole) and len(set(whole)) == len(whole) > shards
    assert all(parts), "every shard has tests"


@pytest.mark.parametrize("value", ["0", "-1", "two", ""])
def test_shard_count_refuses_what_is_not_a_positive_whole_number(value, monkeypatch):
    monkeypatch.setenv("SANITIZER_SHARDS", value)
    with pytest.raises(ValueError, match="SANITIZER_SHARDS must be a whole number >= 1, got"):
        _shard_count()


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_sanitizer, id="memcheck")])
def test_memcheck_reports_a_planted_read_past_the_end(_, tmp_path):
    script = tmp_path / "planted.py"
    script.write_text(_PLANTED)
    status, output = _memcheck([str(script)], _log_dir(tmp_path) / "memcheck-planted.txt")
    assert status == REPORTED_ERRORS, output[-3000:]
    assert "Invalid __global__ read" in output, output[-3000:]


@pytest.mark.parametrize("family, shard", [
    pytest.param(family, shard, marks=needs_sanitizer, id=_run_name(family, shard))
    for family in FAMILIES for shard in range(SHARDS)])
def test_cpu_tier_under_memcheck(family, shard, tmp_path):
    workers = os.environ.get("SANITIZER_WORKERS", "2")
    tests = [str(TESTS / f"test_{family}.py")] if SHARDS == 1 else _shard(family, shard, SHARDS)
    args = ["-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "not gpu", "-n", workers, *tests]
    status, output = _memcheck(args, _log_dir(tmp_path) / f"memcheck-{_run_name(family, shard)}.txt")
    summaries = re.findall(r"ERROR SUMMARY: (\d+) error", output)  # (one for the run, its workers included)
    assert status == 0 and summaries and set(summaries) == {"0"}, output[-4000:]
