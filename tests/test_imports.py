"""No two modules of planlm import each other through any chain: every import counts, at the top of a module, inside
a function or under ``if TYPE_CHECKING:`` (test_layers.py checks the layers, with import-linter, which leaves the
last out). Read from the source alone, so the check costs no imports."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "planlm"


def modules(package: Path) -> dict[str, Path]:
    """Dotted name -> file of every module of ``package`` (a package by its ``__init__.py``)."""
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (``from a.b import c`` is a.b.c when c is a module, else a.b;
    a module's own package is not counted as imported by it)."""
    known = modules(package)

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in known.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
        graph[name] = {found for found in map(owner, targets) if found and found != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of two modules or more (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_module_of_planlm_imports_itself_through_others():
    found = cycles(import_graph(PACKAGE))
    assert not found, "import circles (each a set of modules that import each other):\n" + "\n".join(
        " <-> ".join(circle) for circle in found)


def test_a_circle_is_found(tmp_path):
    """The check fails on a circle: one under TYPE_CHECKING, one through a relative import inside a function."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (package / "b.py").write_text("import pkg.a\n")
    (package / "sub" / "c.py").write_text("def f():\n    from . import d\n")
    (package / "sub" / "d.py").write_text("from pkg.sub.c import f\n")
    (package / "e.py").write_text("from pkg import a\n")  # imports a, which imports nothing back
    assert cycles(import_graph(package)) == [["pkg.a", "pkg.b"], ["pkg.sub.c", "pkg.sub.d"]]
