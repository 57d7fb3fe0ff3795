"""
Runs you can come back to: the record of every launch, kept without a daemon.

Layer: ``poprun.runs``, beside ``poprun.render``, ``poprun.backends`` and ``poprun.partitions``;
imports ``poprun.planner.plan`` and ``poprun.core``. :mod:`~poprun.runs.record` writes a run's
directory as it happens (the apply step feeds it), :mod:`~poprun.runs.store` finds and reads
runs for ``poprun ps``, ``logs``, ``report`` and ``stop``. The layout is in ``docs/runs.md``.
"""
