"""The server's modules import one way: no module of `app/` reaches itself again through its imports.

A circle works only while every module in it is imported in one order (or behind `TYPE_CHECKING`),
and it hides which module is the foundation: the settings that read the database URL and the engine
that reads the settings, or the pipeline's rooms that each name the others' types. Imports under
`TYPE_CHECKING` and inside functions count as well: they tie the modules as much for a reader.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"


def module_files() -> dict[str, Path]:
    """Every module of `app/` by its dotted name (a package by its own name, for its `__init__`)."""
    found: dict[str, Path] = {}
    for path in APP.rglob("*.py"):
        parts = path.relative_to(APP.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `app/` that a module names in its imports, wherever in it they stand.

    `from package import thing` is an import of the submodule when `thing` is one, else of the
    package's `__init__`. The packages a submodule's import loads on the way are not counted: each
    package's `__init__` gathers its own submodules, and that is no circle."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    targets.add(submodule)
                elif base in modules:
                    targets.add(base)
    targets.discard(name)
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        yield sorted(component)


def test_the_graph_sees_the_imports_it_must() -> None:
    """The reader of imports finds what the guarded modules are known to import."""
    graph = import_graph()
    assert "app.config.storage" in graph["app.config"]
    assert "app.config" in graph["app.db.engine"]  # under TYPE_CHECKING
    assert "app.domain.pipeline.services.deps" in graph["app.domain.pipeline.services.drain"]
    assert "app.domain.pipeline.services.failures" in graph["app.domain.pipeline.services.drain"]
    assert list(circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})) == [["a", "b", "c"]]


def test_no_import_circle_in_app() -> None:
    """Settings below the database plumbing, the pipeline's rooms below the drain, and no circle
    anywhere else: a module that needs another's name imports it, and that one does not import back."""
    found = list(circles(import_graph()))
    assert not found, "modules that import each other, through one another: " + "; ".join(
        " <-> ".join(circle) for circle in found
    )
