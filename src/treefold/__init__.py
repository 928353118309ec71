"""treefold: deterministic reduction kernels for LLM workloads, at the memory roof.

Every reduction follows one documented order that depends on the reduced length alone
(``treefold.order``), so results are the same bits run to run, for any batch size and launch.
"""
__version__ = "0.1.0"

from . import nn, order  # noqa: F401
from .functional import *  # noqa: F401,F403
from .functional import __all__ as _functional_all

__all__ = ["nn", "order", "__version__", *_functional_all]
