"""The code's shape: a long module or function says why, and nothing circles.

A module over 600 lines, or a function over 50 lines of code (blank lines, comments and its
docstring not counted), carries a ``Length:`` line in its docstring saying why it stays whole
(style.md: a newcomer should find the seams). Import cycles among poprun's modules are checked
from the source, so a circle between two sibling modules is caught even where no import-linter
contract names them.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("poprun", "popdist")
MODULE_LINES = 600
FUNCTION_LINES = 50


def _sources() -> list[str]:
    found = []
    for package in PACKAGES:
        for folder, _dirs, files in os.walk(os.path.join(ROOT, package)):
            found += [os.path.join(folder, name) for name in files if name.endswith(".py")]
    return sorted(found)


def _lines_with_code(source: str) -> set[int]:
    """The lines holding a token of code: not blank, not only a comment."""
    code = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):
            code.update(range(token.start[0], token.end[0] + 1))
    return code


def _code_lines(code: set[int], node: ast.AST) -> int:
    """A function's lines of code, its docstring not counted."""
    docstring = _docstring_node(node)
    skip = set(range(docstring.lineno, (docstring.end_lineno or docstring.lineno) + 1)) if docstring else set()
    return sum(1 for line in range(node.lineno, (node.end_lineno or node.lineno) + 1) if line in code and line not in skip)


def _docstring_node(node: ast.AST) -> ast.AST | None:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        return body[0]
    return None


def _long_without_reason() -> list[str]:
    offenders = []
    for path in _sources():
        with open(path, encoding="utf-8") as file:
            source = file.read()
        tree = ast.parse(source)
        name = os.path.relpath(path, ROOT)
        lines = source.count("\n")
        if lines > MODULE_LINES and "Length:" not in (ast.get_docstring(tree) or ""):
            offenders.append(f"{name}: {lines} lines, no 'Length:' in the module docstring")
        code = _lines_with_code(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                count = _code_lines(code, node)
                if count > FUNCTION_LINES and "Length:" not in (ast.get_docstring(node) or ""):
                    offenders.append(f"{name}:{node.lineno} {node.name}: {count} lines of code, no 'Length:' in its docstring")
    return offenders


def test_a_long_module_or_function_says_why_it_stays_whole() -> None:
    """Every module over 600 lines and function over 50 lines of code has a ``Length:`` reason."""
    assert _long_without_reason() == []


def _imports(path: str, module: str, modules: set[str]) -> set[str]:
    with open(path, encoding="utf-8") as file:
        tree = ast.parse(file.read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in _run_time_nodes(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:  # a submodule imported from its package is an edge to it, not to the package
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return found


def _run_time_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (imports for type checkers never run)."""
    found: list[ast.AST] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        found.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                pending.extend(child.orelse)
                continue
            pending.append(child)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {}
    for path in _sources():
        relative = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        modules[relative.removesuffix(".__init__")] = path
    names = set(modules)
    return {name: {i for i in _imports(path, name, names) if i in names and i != name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle among poprun's and popdist's modules, lazy imports inside functions included (not type checkers')."""
    assert _cycles(_graph()) == []


@pytest.mark.parametrize(("graph", "expected"), [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_finder_finds_circles_and_only_circles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    """The checker itself: a two-module circle is found, a chain is not."""
    assert _cycles(graph) == expected


def _is_thread(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) in ("Thread", "threading.Thread")


def _threads_started_bare(source: str) -> list[int]:
    """Return the lines of ``.start()`` calls on threads made in ``source`` (``X = Thread(...)``, lists of them)."""
    tree = ast.parse(source)
    threads: set[str] = set()
    lists: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if _is_thread(node.value):
                threads.update(ast.unparse(target) for target in targets)
            elif isinstance(node.value, ast.ListComp | ast.List) and any(_is_thread(n) for n in ast.walk(node.value)):
                lists.update(ast.unparse(target) for target in targets)
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and ast.unparse(node.iter) in lists:
            threads.add(ast.unparse(node.target))
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "start"
                  and not node.args and (_is_thread(node.func.value) or ast.unparse(node.func.value) in threads))


def test_every_thread_is_started_with_the_stop_signals_blocked() -> None:
    """poprun.core.threads says why: a stop signal a thread takes is not acted on while the main thread waits."""
    allowed = {os.path.join("poprun", "core", "threads.py"),  # the one place that starts them
               os.path.join("poprun", "process", "instance.py")}  # start_supervising: blocks them itself (STOPS)
    offenders = []
    for path in _sources():
        name = os.path.relpath(path, ROOT)
        if name.startswith("poprun") and name not in allowed:
            with open(path, encoding="utf-8") as file:
                offenders += [f"{name}:{line}" for line in _threads_started_bare(file.read())]
    assert [] == offenders, "start threads with poprun.core.threads.spawn or start_thread"


@pytest.mark.parametrize(("source", "lines"), [
    ("import threading\nthreading.Thread(target=f).start()\n", [2]),
    ("t = Thread(target=f)\nt.start()\n", [2]),
    ("self.t: Thread = Thread(target=f)\nself.t.start()\n", [2]),
    ("ts = [Thread(target=f) for _ in x]\nfor t in ts:\n    t.start()\n", [3]),
    ("t = Thread(target=f)\nstart_thread(t)\nm = re.match(a, b)\nm.start()\n", []),
])
def test_the_bare_start_finder_finds_threads_and_only_threads(source: str, lines: list[int]) -> None:
    assert lines == _threads_started_bare(source)
