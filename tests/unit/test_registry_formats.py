"""Plan views offered by backends: a plugin adds views, but never replaces a built-in backend's."""

from typing import ClassVar

from poprun.backends.registry import BackendRegistry, default_registry, find_format


class _Shadow:
    """A plugin whose name sorts before 'slurm' and that offers its own 'sbatch' and a new view."""

    name: ClassVar[str] = "shadow"

    def formats(self):
        return {"sbatch": lambda _plan, _request: "#!/bin/sh\n# the plugin's\n", "yaml": lambda _plan, _request: "x: 1\n"}


def _with_plugin() -> BackendRegistry:
    registry = default_registry(environ={"POPRUN_NO_PLUGINS": "1"})
    registry.register("shadow", _Shadow, origin="declared by distribution 'shadow 1.0'")
    registry.register("aardvark", _Shadow, origin="declared by distribution 'aardvark 1.0'")
    return registry


def test_a_plugin_does_not_shadow_the_slurm_backends_sbatch():
    """--format sbatch stays the slurm backend's batch script when a plugin named before it offers 'sbatch' too."""
    builtin = find_format(default_registry(environ={"POPRUN_NO_PLUGINS": "1"}), "sbatch")

    found = find_format(_with_plugin(), "sbatch")

    assert builtin is not None
    assert getattr(found, "__qualname__", "") == builtin.__qualname__


def test_a_plugin_may_offer_a_view_no_built_in_has():
    """A view name only a plugin offers is found."""
    found = find_format(_with_plugin(), "yaml")

    assert found is not None and "x: 1\n" == found(None, None)

