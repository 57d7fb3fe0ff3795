"""
A test double of PopTorch (graphcore/poptorch, sdk/poptorch/2.4.0 to 3.4.0): its option classes only.

The real package loads its compiled core (``poptorch_core``, built against the Poplar SDK) on
import; that cannot exist here, so this double has none and offers only ``Options`` (see
``options.py`` for what it keeps and leaves out). Tests put this folder's parent on
``sys.path`` (or ``PYTHONPATH``) to make ``import poptorch`` find it.
"""

from .options import Options

__all__ = ["Options"]
