"""
Compile poprun's and popdist's bytecode before a benchmark, as an installed copy has it.

``pip install .`` compiles every module at install time; an editable install (``pip install
-e .``, as the tests use) compiles nothing, and with ``PYTHONDONTWRITEBYTECODE`` set no run ever
writes it, so every start would compile the sources again (about 100 ms here) and a benchmark
would measure the compiler, not poprun.
"""

from __future__ import annotations

import compileall
import importlib.util


def compile_bytecode() -> str:
    """Compile both packages' modules where they are imported from (``__pycache__``, ignored by git); return a line saying so."""
    folders = []
    for package in ("poprun", "popdist"):
        spec = importlib.util.find_spec(package)
        for folder in spec.submodule_search_locations or () if spec else ():
            compileall.compile_dir(folder, quiet=1)  # py_compile writes whatever PYTHONDONTWRITEBYTECODE says
            folders.append(folder)
    return f"bytecode compiled in {', '.join(folders)} (as an installed copy has it)"
