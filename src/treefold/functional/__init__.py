"""The public functions, one module per family, re-exported here and from ``treefold``."""
from .norms import *  # noqa: F401,F403
from .reductions import *  # noqa: F401,F403
from .sampling import *  # noqa: F401,F403
from .softmax import *  # noqa: F401,F403
from . import norms, reductions, sampling, softmax

__all__ = [*softmax.__all__, *norms.__all__, *reductions.__all__, *sampling.__all__]
