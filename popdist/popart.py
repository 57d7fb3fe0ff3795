"""
PopDist for PopART: ``configureSessionOptions(opts)`` and ``getDevice(ipusPerReplica)``.

Standalone: PopART (imported on first call, not by ``import popdist.popart``) and the standard
library; never imports ``poprun``. The functions keep PopDist's camelCase names, so they live in
:mod:`popdist.compat` (the one camelCase module) and are re-exported here. Without PopART,
calling them raises an ImportError naming the missing package.
"""

from __future__ import annotations

from popdist.compat import configureSessionOptions, getDevice

__all__ = ["configureSessionOptions", "getDevice"]
