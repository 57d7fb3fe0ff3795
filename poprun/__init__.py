"""
poprun: a drop-in PopRun launcher built as a declarative plan compiler.

front ends (flags, TOML, DSL) -> Spec -> solve -> LaunchPlan -> render | backends.
"""

__version__ = "0.1.0"
