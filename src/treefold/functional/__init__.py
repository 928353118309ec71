"""The public functions, one module per family, re-exported here and from ``treefold``."""
# The family modules are bound under private names first: a star import of a module that
# exports a function of the module's own name (``softmax``) rebinds that package attribute.
from . import norms as _norms
from . import reductions as _reductions
from . import sampling as _sampling
from . import softmax as _softmax
from .norms import *  # noqa: F401,F403
from .reductions import *  # noqa: F401,F403
from .sampling import *  # noqa: F401,F403
from .softmax import *  # noqa: F401,F403

__all__ = [*_softmax.__all__, *_norms.__all__, *_reductions.__all__, *_sampling.__all__]
