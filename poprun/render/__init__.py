"""
Views of plans and diagnostics: explain text, the topology table, diagnostics.

Layer: ``poprun.render``; imports ``poprun.planner`` and ``poprun.core``; never runs anything.
"""
