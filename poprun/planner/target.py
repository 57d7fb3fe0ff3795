"""
Offline targets (``--offline-target``): the Pod systems a program can be compiled for.

Layer: ``poprun.planner``; imports ``poprun.core`` only.
"""

from __future__ import annotations

from poprun.core.record import positional_record

DEFAULT_ILD_SIZE = 64  # the IPUs of one IPU-Link domain of a Pod64


@positional_record
class Target:
    """A Pod system: its IPUs, the IPUs of one ILD and its IPU-Link layout."""

    name: str
    num_ipus: int
    ild_size: int
    link_configuration: str
    link_topology: str

    def target_options(self, *, instance_size: int) -> str:
        """Return POPLAR_TARGET_OPTIONS for an instance of ``instance_size`` IPUs, as poprun wrote it."""
        import json  # here, not at the top: only offline targets need it, and start-up stays lean

        options = {
            "ipuLinkDomainSize": str(self.ild_size),
            "ipuLinkConfiguration": self.link_configuration,
            "ipuLinkTopology": self.link_topology,
            "gatewayMode": "true",
            "instanceSize": str(instance_size),
        }
        return json.dumps(options, separators=(",", ":"))


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("pod4", 4, 4, "default", "mesh"),
        Target("pod16", 16, 16, "slidingWindow", "mesh"),
        Target("pod64", 64, 64, "slidingWindow", "torus"),
        Target("pod128", 128, 64, "slidingWindow", "torus"),
        Target("pod256", 256, 64, "slidingWindow", "torus"),
        Target("pod512", 512, 64, "slidingWindow", "torus"),
        Target("pod1024", 1024, 64, "slidingWindow", "torus"),
    )
}
