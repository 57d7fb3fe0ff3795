"""
The plan compiler: front ends (flags, TOML, DSL) to :class:`Spec`, then :func:`solve` to a LaunchPlan.

Layer: ``poprun.planner``; imports ``poprun.core``, ``popdist.env`` and libraries only.
"""
