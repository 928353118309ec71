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

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(SANITIZER is None, reason="needs compute-sanitizer on the PATH"),
]

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


def _memcheck(args: list, log: pathlib.Path) -> tuple:
    """Run ``python *args`` under memcheck (child processes too), its output written to ``log``
    as it comes; returns (exit status, output). ``SANITIZER_TIMEOUT`` (seconds) ends a run that
    takes longer: the status is then None and the log shows how far it got."""
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    env.pop("TRITON_INTERPRET", None)
    # the checkout's own package, installed or not
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS.parent / "src"), env.get("PYTHONPATH")]))
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


def test_memcheck_reports_a_planted_read_past_the_end(tmp_path):
    script = tmp_path / "planted.py"
    script.write_text(_PLANTED)
    status, output = _memcheck([str(script)], _log_dir(tmp_path) / "memcheck-planted.txt")
    assert status == REPORTED_ERRORS, output[-3000:]
    assert "Invalid __global__ read" in output, output[-3000:]


@pytest.mark.parametrize("family", ["softmax", "cross_entropy", "norms", "reductions", "sampling",
                                    "launch", "demo"])
def test_cpu_tier_under_memcheck(family, tmp_path):
    workers = os.environ.get("SANITIZER_WORKERS", "2")
    args = ["-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "not gpu", "-n", workers,
            str(TESTS / f"test_{family}.py")]
    status, output = _memcheck(args, _log_dir(tmp_path) / f"memcheck-{family}.txt")
    summaries = re.findall(r"ERROR SUMMARY: (\d+) error", output)  # (one for the run, its workers included)
    assert status == 0 and summaries and set(summaries) == {"0"}, output[-4000:]
