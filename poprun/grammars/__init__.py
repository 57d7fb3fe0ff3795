"""The lark grammars of the DSL (package data)."""
