"""
The DSL front end: a ``.pop`` spec that reads aloud, to a :class:`~poprun.planner.spec.Spec`, and back.

Layer: ``poprun.planner``. :mod:`.grammar` builds the language (``poprun/grammars/spec.lark``
plus the one-field statements of the option table), :mod:`.read` reads a file into a spec
(``parse_dsl``, ``load_dsl``) and :mod:`.write` writes a spec back (``to_dsl``). This package
imports none of them, so that importing one half never loads the other; ``docs/spec-dsl.md``
documents the language.
"""
