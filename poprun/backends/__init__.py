"""
Backends: what executes a finished :class:`~poprun.planner.plan.LaunchPlan`.

Layer: ``poprun.backends``; imports ``poprun.core`` and ``poprun.planner.plan`` only. A
backend never imports the spec and never re-solves: it runs every instance of the plan with
exactly the plan's argv, working directory and environment. :mod:`base` holds the protocol
and the values a launch returns, :mod:`registry` finds a backend by name, and :mod:`local`
and :mod:`offline` are the built-ins of this version (:mod:`supervisor`, :mod:`output` and
:mod:`watchdog` are their machinery). :mod:`testing` ships ``RecordingBackend``, a test double,
and :mod:`conformance` the checks any backend package can run. Nothing here prints: output
goes to the :class:`~poprun.backends.base.OutputSink` the caller passes in.
"""
