"""
Partition providers (the V-IPU model).

Layer: ``poprun.partitions``; imports ``poprun.planner.plan`` and ``poprun.core``.
"""
