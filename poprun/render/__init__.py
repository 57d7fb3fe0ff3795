"""
Views of plans, diagnostics and run records: explain text, the topology table, diagnostics, ``ps`` and ``report``.

Layer: ``poprun.render``; imports ``poprun.planner`` and ``poprun.core``; never runs anything.
"""
