"""
PopDist for PopTorch: ``popdist.poptorch.Options``, PopTorch's options set up for this instance.

Standalone: PopTorch (imported on first use of ``Options``, not by ``import popdist.poptorch``)
and the standard library; never imports ``poprun``. Without PopTorch, using ``Options`` (also
``from popdist.poptorch import Options``) raises an ImportError naming the missing package.

``Options(ipus_per_replica=None)`` (also ``Options(n)``, as graphcore/examples call it) is a
subclass of ``poptorch.Options`` that:

- sets the replication factor to this instance's replicas (``getNumLocalReplicas()``);
- sets ``Distributed.configureProcessId(getInstanceIndex(), getNumInstances())``, so without
  poprun ``Distributed.processId == 0`` and ``numProcesses == 1``;
- with ``ipus_per_replica`` under a poprun launch that has a V-IPU partition (not offline),
  selects the device ``useIpuId(getDeviceId(ipus_per_replica))``;
- with ``POPDIST_EXECUTABLE_CACHE_PATH`` set, enables executable caching there;
- refuses, as real PopDist did, ``useIpuId``, ``replicationFactor``, ``Distributed.disable``,
  ``Distributed.setEnvVarNames`` and ``Distributed.configureProcessId`` with
  ``RuntimeError("Cannot call `<name>` with popdist.poptorch.Options")``.

PopTorch's option objects (``OptionsDict``) refuse any new public attribute and any private one
not set in their constructor, so nothing is set on them: the refusals are methods of classes.
``Distributed`` keeps its object (PopTorch's freezing and copying reach it as before); only its
class becomes a subclass that refuses the three calls. Followed: PopTorch 2.4.0 to 3.4.0 (SDK 2.4
to 3.4), whose option classes do not differ in anything used here.
"""

from __future__ import annotations

import os

from popdist import _contract as env
from popdist import _device, _framework

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


def _lock(distributed: Any) -> None:
    """Make ``distributed`` (an ``Options.Distributed``) refuse what poprun decides, keeping its values."""
    options, base = _options_class(), type(distributed)
    locked = options.__dict__.get("_Distributed")
    if locked is None or locked.__base__ is not base:
        namespace: dict[str, Any] = {name: _Refused(f"Distributed.{name}") for name in _REFUSED_DISTRIBUTED}
        # An attribute of Options, so that pickle finds it again by its qualified name.
        namespace.update(__module__=__name__, __qualname__="Options._Distributed",
                         __doc__="PopTorch's Distributed options, set by popdist (see popdist.poptorch).")
        locked = type("_Distributed", (base,), namespace)
        type.__setattr__(options, "_Distributed", locked)
    # object.__setattr__: OptionsDict.__setattr__ would take "__class__" for an option of its own.
    object.__setattr__(distributed, "__class__", locked)


def _configure(opts: Any, base: Any, ipus_per_replica: int | None) -> None:
    """Set ``opts`` (a fresh ``base`` instance) up for this instance, then lock what poprun decides."""
    environ = os.environ
    base.replicationFactor(opts, env.num_local_replicas(environ))
    distributed = opts.Distributed
    distributed.configureProcessId(env.instance_index(environ), env.num_instances(environ))
    _lock(distributed)
    if ipus_per_replica and env.is_set(environ) and environ.get(env.VIPU_API_PARTITION_ID):
        base.useIpuId(opts, _device.device_id(ipus_per_replica))
    cache = environ.get(env.EXECUTABLE_CACHE_PATH)
    if cache:
        opts.enableExecutableCaching(cache)


def _options_class() -> type:
    """Return the Options class, building it (and importing PopTorch) the first time."""
    if _Cache.options is None:
        base = _framework.require_poptorch().Options

        def init(self: Any, ipus_per_replica: int | None = None, *args: Any, **kwargs: Any) -> None:
            # ipus_per_replica first: graphcore/examples call Options(n). PopTorch's own Options takes
            # no argument, so anything more is its TypeError, as it would be without popdist.
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
