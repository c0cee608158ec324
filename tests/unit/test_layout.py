"""The house rules of the source tree (issue 24): no import circles between the project's
modules, no module over 800 lines, no function over 120 lines unless its docstring says
why, the planner never imports torch, and every package is in the distribution.

The import graph is read from the source with :mod:`ast` (every ``import`` and
``from ... import`` at any depth, function-level imports included), so a circle hidden
behind a lazy import counts too: lazy imports are for start-up time, not for circles."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

PACKAGES = ("planner", "executor")
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 120
#: a function over MAX_FUNCTION_LINES must say why in its docstring with this phrase
LONG_FUNCTION_NOTE = "long on purpose:"


def modules() -> dict[str, Path]:
    """Dotted name (as installed, ``edgepipe.planner...``) -> source file."""
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(("edgepipe", *parts))] = path
    return out


def imported(tree: ast.AST, module: str, names: set[str]) -> Iterator[str]:
    """The project modules a module's source imports (resolving ``from pkg import mod``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in names:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level:
                raise AssertionError(f"{module}: relative import of {node.module}")
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in names:
                    yield full
                elif node.module in names:
                    yield node.module


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    names = set(mods)
    return {m: set(imported(ast.parse(p.read_text()), m, names)) - {m} for m, p in mods.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle_and_passes_a_chain():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circles_between_the_projects_modules():
    # a package's __init__ importing its own submodule is not a circle of two jobs, but
    # the rule is simplest without exceptions: __init__ files import nothing of their own
    assert circles(import_graph()) == []


def test_the_planner_never_imports_torch_or_the_executor():
    for module, path in modules().items():
        if not module.startswith("edgepipe.planner"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] != "torch", f"{module} imports {name}"
                if name.startswith("edgepipe.executor"):
                    # only the CLI's commands that run torch reach into the executor
                    assert module.startswith("edgepipe.planner.cli"), f"{module} imports {name}"


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_module_is_over_800_lines(module):
    lines = len(modules()[module].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module}: {lines} lines"


def long_functions(source: str) -> list[tuple[str, int]]:
    """Functions longer than MAX_FUNCTION_LINES whose docstring does not say why."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            if length > MAX_FUNCTION_LINES and LONG_FUNCTION_NOTE not in doc:
                out.append((node.name, length))
    return out


def test_the_long_function_rule_sees_a_long_function_and_its_reason():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == [("f", MAX_FUNCTION_LINES + 1)]
    said = f'def f():\n    """{LONG_FUNCTION_NOTE} one table."""\n{body}\n'
    assert long_functions(said) == []


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_function_is_over_120_lines_unless_its_docstring_says_why(module):
    assert long_functions(modules()[module].read_text()) == []


def test_every_package_of_the_tree_is_in_the_distribution():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {m for m, p in modules().items() if p.name == "__init__.py"}
    assert on_disk - listed == set()
    assert {"edgepipe.planner.schemas", "edgepipe.planner.profiles"} <= listed


def test_no_test_module_imports_another_test_module():
    # what tests share lives in tests/helpers; a module of tests/unit or tests/integration
    # imports from there, never from another test module, at any depth (issue 24, item 7)
    tests = {
        ".".join(path.relative_to(REPO).with_suffix("").parts): path
        for folder in ("unit", "integration")
        for path in sorted((REPO / "tests" / folder).rglob("*.py"))
        if path.name != "__init__.py"
    }
    found = {m: sorted(set(imported(ast.parse(p.read_text()), m, set(tests))) - {m})
             for m, p in tests.items()}
    assert {m: names for m, names in found.items() if names} == {}
