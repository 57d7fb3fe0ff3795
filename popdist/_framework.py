"""
Importing a Graphcore framework on use, with an ImportError that names what is missing.

Standalone: standard library only; never imports ``poprun``. ``import popdist`` never imports
PopTorch, TensorFlow or PopART: ``popdist.poptorch`` and friends call these on first use.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

POPTORCH = "PopTorch (the 'poptorch' package from the Poplar SDK)"
TENSORFLOW = "TensorFlow for the IPU (Graphcore's 'tensorflow' wheel from the Poplar SDK)"
POPART = "PopART (the 'popart' package from the Poplar SDK)"


def require(module: str, *, user: str, package: str) -> ModuleType:
    """
    Return module ``module``, imported now.

    Raises:
        ImportError: naming ``user`` (e.g. ``popdist.poptorch``) and ``package`` when the module is
            not installed, or when importing it failed (then with the reason).
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = exc.name or ""
        if missing == module.partition(".")[0]:
            raise ImportError(f"{user} needs {package}; it is not installed", name=module) from exc
        if module == missing or module.startswith(f"{missing}."):
            raise ImportError(f"{user} needs {package}; {missing!r} is not installed (not the IPU build?)",
                              name=module) from exc
        raise ImportError(f"{user} needs {package}, but importing {module!r} failed: {exc}", name=module) from exc


def require_poptorch() -> ModuleType:
    """Return ``poptorch``; ImportError when it is missing."""
    return require("poptorch", user="popdist.poptorch", package=POPTORCH)


def require_popart() -> ModuleType:
    """Return ``popart``; ImportError when it is missing."""
    return require("popart", user="popdist.popart", package=POPART)


def require_tensorflow(module: str = "tensorflow") -> ModuleType:
    """Return ``module`` of TensorFlow (``tensorflow`` itself by default); ImportError when it is missing."""
    return require(module, user="popdist.tensorflow", package=TENSORFLOW)
