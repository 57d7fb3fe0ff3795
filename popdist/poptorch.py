"""
PopDist for PopTorch: ``popdist.poptorch.Options``, PopTorch's options set up for this instance.

Standalone: PopTorch (imported on first use of ``Options``, not by ``import popdist.poptorch``)
and the standard library; never imports ``poprun``. Without PopTorch, using ``Options`` (also
``from popdist.poptorch import Options``) raises an ImportError naming the missing package.

``Options(*args, ipus_per_replica=None, **kwargs)`` is a subclass of ``poptorch.Options`` that:

- sets the replication factor to this instance's replicas (``getNumLocalReplicas()``);
- sets ``Distributed.configureProcessId(getInstanceIndex(), getNumInstances())``, so without
  poprun ``Distributed.processId == 0`` and ``numProcesses == 1``;
- with ``ipus_per_replica`` under a poprun launch that has a V-IPU partition (not offline),
  selects the device ``useIpuId(getDeviceId(ipus_per_replica))``;
- with ``POPDIST_EXECUTABLE_CACHE_PATH`` set, enables executable caching there;
- refuses, as real PopDist did, ``useIpuId``, ``replicationFactor``, ``Distributed.disable``,
  ``Distributed.setEnvVarNames`` and ``Distributed.configureProcessId`` with
  ``RuntimeError("Cannot call `<name>` with popdist.poptorch.Options")``.
"""

from __future__ import annotations

import os

from popdist import _device, _framework, env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_REFUSED_DISTRIBUTED = ("disable", "setEnvVarNames", "configureProcessId")


class _Refused:
    """A method popdist.poptorch.Options refuses: calling it raises RuntimeError."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *_args: object, **_kwargs: object) -> None:
        """Raise: poprun decides this option."""
        raise RuntimeError(f"Cannot call `{self.name}` with popdist.poptorch.Options")


class _Cache:
    """The Options class, built once PopTorch has been imported."""

    options: type | None = None


def _configure(opts: Any, base: Any, ipus_per_replica: int | None) -> None:
    """Set ``opts`` (a fresh ``base`` instance) up for this instance, then lock what poprun decides."""
    environ = os.environ
    base.replicationFactor(opts, env.num_local_replicas(environ))
    distributed = opts.Distributed
    distributed.configureProcessId(env.instance_index(environ), env.num_instances(environ))
    for name in _REFUSED_DISTRIBUTED:
        setattr(distributed, name, _Refused(f"Distributed.{name}"))
    if ipus_per_replica and env.is_set(environ) and environ.get(env.VIPU_API_PARTITION_ID):
        base.useIpuId(opts, _device.device_id(ipus_per_replica))
    cache = environ.get(env.EXECUTABLE_CACHE_PATH)
    if cache:
        opts.enableExecutableCaching(cache)


def _options_class() -> type:
    """Return the Options class, building it (and importing PopTorch) the first time."""
    if _Cache.options is None:
        base = _framework.require_poptorch().Options

        def init(self: Any, *args: Any, ipus_per_replica: int | None = None, **kwargs: Any) -> None:
            base.__init__(self, *args, **kwargs)
            _configure(self, base, ipus_per_replica)

        namespace = {"__init__": init, "__module__": __name__, "__qualname__": "Options",
                     "__doc__": "PopTorch's Options, set up by popdist for this instance (see popdist.poptorch).",
                     "useIpuId": _Refused("useIpuId"), "replicationFactor": _Refused("replicationFactor")}
        _Cache.options = type("Options", (base,), namespace)
    return _Cache.options


def __getattr__(name: str) -> Any:
    """Return ``Options`` (importing PopTorch); ImportError when PopTorch is missing."""
    if name == "Options":
        return _options_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
