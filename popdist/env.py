"""
The environment contract as applications and the launcher import it: names, readers, config.

The variables' names, their readers, and (on use) :class:`~popdist.config.PopdistConfig` and
``from_environ``.

Standalone: standard library only; never imports ``poprun``. The names and readers live in
:mod:`popdist._contract` (which imports no other popdist module) and are re-exported here, so
that the launcher imports them from one public place. ``PopdistConfig`` and ``from_environ``
live in :mod:`popdist.config`, which reads through :mod:`popdist._contract`; this module sits
above both and imports ``popdist.config`` on first use only (it needs ``dataclasses``).
"""

from __future__ import annotations

from popdist import _contract
from popdist._contract import *  # noqa: F403 - the names and readers, as _contract.__all__ lists them

TYPE_CHECKING = False
if TYPE_CHECKING:
    # Re-exported for type checkers: at run time, __getattr__ below imports them on use.
    from popdist.config import PopdistConfig as PopdistConfig  # noqa: PLC0414
    from popdist.config import from_environ as from_environ  # noqa: PLC0414

__all__ = [*_contract.__all__, "PopdistConfig", "from_environ"]  # noqa: PLE0604 - the contract's, and two more


def __getattr__(name: str) -> object:
    """Return ``PopdistConfig`` or ``from_environ``, which moved to :mod:`popdist.config` (imported on use)."""
    if name in {"PopdistConfig", "from_environ"}:
        from popdist import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
