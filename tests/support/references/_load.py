"""Loading parts of a reference release without running its package's `__init__` (which imports the
framework's whole stack and, for Mem0, writes `~/.mem0` and starts telemetry), and without touching a
release of the same package that the environment itself has installed (Mem0 2.2.1 is a dev dependency).
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def load_modules(root: Path, package: str, names: Iterable[str]) -> dict[str, types.ModuleType]:
    """Import `names` of `package` from `root`, its `__init__` skipped; the environment's own modules
    of that package are put back afterwards (the loaded ones keep their references to each other)."""

    def ours(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    saved = {k: v for k, v in sys.modules.items() if ours(k)}
    for key in saved:
        del sys.modules[key]
    try:
        stub = types.ModuleType(package)
        stub.__path__ = [str(root / package)]
        sys.modules[package] = stub
        return {name: importlib.import_module(name) for name in names}
    finally:
        for key in [k for k in sys.modules if ours(k)]:
            del sys.modules[key]
        sys.modules.update(saved)


def functions(
    path: Path,
    module_funcs: Iterable[str],
    class_name: str,
    methods: Iterable[str],
    namespace: dict[str, Any],
) -> dict[str, Callable[..., Any]]:
    """Top-level functions and methods of a class of `path`, compiled from its syntax tree alone
    (nothing else of the module runs), their globals `namespace`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    wanted_funcs, wanted_methods = set(module_funcs), set(methods)
    found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted_funcs:
            found[node.name] = node
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef) and sub.name in wanted_methods:
                    found[f"{class_name}.{sub.name}"] = sub
    missing = wanted_funcs | {f"{class_name}.{m}" for m in wanted_methods}
    assert missing <= set(found), f"not in {path}: {sorted(missing - set(found))}"
    compiled: dict[str, Callable[..., Any]] = {}
    for key, node in found.items():
        node.decorator_list = []
        local: dict[str, Any] = {}
        exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace, local)
        compiled[key] = local[node.name]
        if "." not in key:
            namespace[node.name] = local[node.name]
    return compiled


class _Anything(type):
    """A stand-in class for a name of a module that is not installed: any attribute is another one."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Anything(name, (), {})
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class MissingModuleStubs(importlib.abc.MetaPathFinder):
    """Stand-ins for the third-party modules a reference imports at module level but that the path
    under test never uses (its storage, model and document stacks), only for imports made from the
    reference's own files, and only for modules that are not installed."""

    def __init__(self, root: Path, never: Iterable[str] = ()) -> None:
        self.root = str(root)
        self.never = set(never)
        self.stubbed: set[str] = set()

    def _from_reference(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(self.root):
                return True
            if "importlib" not in name and not name.startswith("<frozen"):
                return False
            frame = frame.f_back
        return False

    def find_spec(
        self, name: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        top = name.split(".", maxsplit=1)[0]
        if top in self.never or not self._from_reference():
            return None
        if top in self.stubbed:
            return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)
        if top != name or name in sys.builtin_module_names:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                if finder.find_spec(name, path, target) is not None:
                    return None
            except Exception:  # noqa: BLE001 (a finder that fails finds nothing)
                continue
        self.stubbed.add(top)
        return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)


def quiet_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
