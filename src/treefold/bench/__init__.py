"""The harness behind ``treefold bench``, ``treefold check`` and ``treefold info``.

- ``cases``: what is measured (shapes, inputs, float64 references, bytes per op);
- ``providers``: treefold and its peers (torch eager, torch.compile, Liger-Kernel, QuACK);
- ``timing`` and ``roofs``: median times with L2 flushed, the same-run copy roof, host overhead,
  determinism over repeated calls;
- ``accuracy``: relative L2 and max-ulp against float64;
- ``runner`` and ``check``: the two runs; ``report`` and ``plots``: JSON, markdown, PNG;
- ``env``: the machine and which peers import.
"""
from .cases import CASES, Case, Shape, select_cases  # noqa: F401
from .runner import BenchConfig, run_bench  # noqa: F401
